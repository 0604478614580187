"""checkov (pinned, scripts/scanners.txt) over the rendered chart (each ci/ values file) and the
children the operator makes for the sample job: no finding except the justified exceptions of
.checkov.yaml (chart) and .checkov-children.yaml (children), and each exception still needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.chart import CI_VALUES, ROOT
from tests.scan.manifests import write_manifests
from tests.scan.tools import run, scanner

CONFIGS = {"chart": ROOT / ".checkov.yaml", "children": ROOT / ".checkov-children.yaml"}
# The objects each scan must see, so that a rendering that silently lost one fails (checkov has
# no check of a NetworkPolicy itself; CKV2_K8S_6 fails every pod that none selects).
EXPECTED_KINDS = {
    "chart": {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
              "RoleBinding", "Pod", "Service"},
    "children": {"Secret", "Service", "StatefulSet", "ConfigMap", "Job"},
}


@pytest.fixture(scope="module")
def manifests(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("scan")
    write_manifests(directory / "out")
    return directory


def checkov(workdir: Path, target: Path, *args: str) -> dict:
    """checkov's JSON report for the manifests under ``target``. Run from ``workdir`` (not the
    repository) so that it picks up no ``.checkov.yaml`` but the one passed."""
    result = run(scanner("checkov"), "-d", str(target), "-o", "json",
                 "--skip-download", *args, cwd=workdir)
    assert result.returncode in (0, 1), result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads(result.stdout)
    # One framework gives an object; an empty target gives a summary without results.
    assert isinstance(report, dict) and report.get("check_type") == "kubernetes", (
        result.stdout[:500])
    return report


def failures(report: dict) -> list[str]:
    return [f"{check['check_id']} {check['resource']} ({check['file_path']}): "
            f"{check['check_name']}" for check in report["results"]["failed_checks"]]


@pytest.mark.parametrize("scan", ["chart", "children"])
def test_checkov_finds_nothing_but_the_justified_exceptions(manifests, scan):
    report = checkov(manifests, manifests / "out" / scan, "--config-file", str(CONFIGS[scan]))
    assert report["summary"]["parsing_errors"] == 0
    assert failures(report) == []
    scanned_kinds = {resource.split(".")[0] for resource in _resources(report)}
    assert EXPECTED_KINDS[scan] <= scanned_kinds, scanned_kinds
    if scan == "chart":
        assert len(list((manifests / "out" / "chart").glob("*.yaml"))) == len(CI_VALUES)


@pytest.mark.parametrize("scan", ["chart", "children"])
def test_every_exception_is_still_needed(manifests, scan):
    """Each check the config skips fails when run alone: so the exception is still needed, and
    the scanner does report a finding (the test can fail)."""
    skipped = yaml.safe_load(CONFIGS[scan].read_text())["skip-check"]
    report = checkov(manifests, manifests / "out" / scan, "--framework", "kubernetes",
                     "--check", ",".join(skipped))
    failing = {check["check_id"] for check in report["results"]["failed_checks"]}
    assert sorted(set(skipped) - failing) == [], "exceptions no longer needed"


def _resources(report: dict) -> set[str]:
    results = report["results"]
    return {check["resource"] for kind in ("passed_checks", "failed_checks", "skipped_checks")
            for check in results.get(kind, [])}
