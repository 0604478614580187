"""checkov (pinned, scripts/scanners.txt) over the rendered chart (each ci/ values file), the
children the operator makes for the sample job, and the Dockerfiles: no finding except the
justified exceptions of .checkov.yaml (chart), .checkov-children.yaml (children) and
.checkov-images.yaml (Dockerfiles), and each exception still needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.chart import CI_VALUES, ROOT
from tests.scan.manifests import write_manifests
from tests.scan.tools import run, scanner

CONFIGS = {"chart": ROOT / ".checkov.yaml", "children": ROOT / ".checkov-children.yaml",
           "images": ROOT / ".checkov-images.yaml"}
FRAMEWORKS = {"chart": "kubernetes", "children": "kubernetes", "images": "dockerfile"}
DOCKERFILES = [ROOT / "images" / "operator" / "Dockerfile",
               ROOT / "images" / "worker" / "Dockerfile", ROOT / "examples" / "Dockerfile",
               ROOT / "images" / "pause" / "Dockerfile", ROOT / "images" / "coredns" / "Dockerfile"]
# The objects each scan must see, so that a rendering that silently lost one fails (checkov has
# no check of a NetworkPolicy itself; CKV2_K8S_6 fails every pod that none selects).
EXPECTED_KINDS = {
    "chart": {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
              "RoleBinding", "Pod", "Service"},
    "children": {"Secret", "Service", "StatefulSet", "ConfigMap", "Pod"},
}


@pytest.fixture(scope="module")
def manifests(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("scan")
    write_manifests(directory / "out")
    return directory


def targets(manifests: Path, scan: str) -> list[str]:
    """checkov's arguments naming what ``scan`` covers."""
    if scan == "images":
        return [argument for path in DOCKERFILES for argument in ("-f", str(path))]
    return ["-d", str(manifests / "out" / scan)]


def checkov(workdir: Path, scan: str, *args: str) -> dict:
    """checkov's JSON report for ``scan``'s targets (see :func:`targets`). Run from ``workdir``
    (not the repository) so that it picks up no ``.checkov.yaml`` but the one passed."""
    result = run(scanner("checkov"), *targets(workdir, scan), "-o", "json", "--skip-download",
                 *args, cwd=workdir)
    assert result.returncode in (0, 1), result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(result.stdout)
    # One framework gives an object; an empty target gives a summary without results.
    assert isinstance(report, dict) and report.get("check_type") == FRAMEWORKS[scan], (
        result.stdout[:500])
    return report


def failures(report: dict) -> list[str]:
    return [f"{check['check_id']} {check['resource']} ({check['file_path']}): "
            f"{check['check_name']}" for check in report["results"]["failed_checks"]]


@pytest.mark.parametrize("scan", ["chart", "children", "images"])
def test_checkov_finds_nothing_but_the_justified_exceptions(manifests, scan):
    report = checkov(manifests, scan, "--config-file", str(CONFIGS[scan]))
    assert report["summary"]["parsing_errors"] == 0
    assert failures(report) == []
    if scan == "images":
        assert report["summary"]["resource_count"] == len(DOCKERFILES)
        return
    scanned_kinds = {resource.split(".")[0] for resource in _resources(report)}
    assert EXPECTED_KINDS[scan] <= scanned_kinds, scanned_kinds
    if scan == "chart":
        assert len(list((manifests / "out" / "chart").glob("*.yaml"))) == len(CI_VALUES)


@pytest.mark.parametrize("scan", ["chart", "children", "images"])
def test_every_exception_is_still_needed(manifests, scan):
    """Each check the config skips fails when run alone: so the exception is still needed, and
    the scanner does report a finding (the test can fail)."""
    skipped = yaml.safe_load(CONFIGS[scan].read_text())["skip-check"]
    report = checkov(manifests, scan, "--framework", FRAMEWORKS[scan], "--check", ",".join(skipped))
    failing = {check["check_id"] for check in report["results"]["failed_checks"]}
    assert sorted(set(skipped) - failing) == [], "exceptions no longer needed"


def _resources(report: dict) -> set[str]:
    results = report["results"]
    return {check["resource"] for kind in ("passed_checks", "failed_checks", "skipped_checks")
            for check in results.get(kind, [])}
