"""What the scanners read: the chart rendered with each values file, and the children the
operator's pure builders make for the sample MonarchJob (no cluster, no API server).

``python -m tests.scan.manifests DIR`` writes them as YAML files (``DIR/chart/<values>.yaml``,
``DIR/children/children.yaml``), for ``scripts/scan.sh`` and for a checkov run by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from monarch_operator.controller.builders.hostfile import build_hostfile_configmap
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.networkpolicy import build_network_policy
from monarch_operator.controller.builders.secret import build_ssh_secret
from monarch_operator.controller.builders.service import build_worker_service
from monarch_operator.controller.builders.sshkeys import JobKeys
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from tests.chart import CHART, CI_VALUES, ROOT, helm

SAMPLE_JOB = ROOT / "crds" / "samples" / "demo.yaml"
# The operator's child manifests need keys; real ones are random, these stand in (the scanners
# check the Secret's shape, never the key material).
STAND_IN_KEYS = JobKeys(b"-----BEGIN OPENSSH PRIVATE KEY-----\nclient\n",
                        b"ssh-ed25519 AAAA client\n",
                        b"-----BEGIN OPENSSH PRIVATE KEY-----\nhost\n",
                        b"ssh-ed25519 BBBB host\n")


def operator_children(job_body: dict[str, Any], namespace: str = "team-a",
                      settings: Settings | None = None) -> list[dict[str, Any]]:
    """Every child the operator makes for ``job_body`` (a MonarchJob as applied), in the order a
    pass creates them: Secret, Service, NetworkPolicy, StatefulSet, hostfile ConfigMap and the
    first attempt's launcher pod. Uses the builders only, so what is scanned is what is applied.
    """
    settings = settings or Settings()
    body = {**job_body, "metadata": {**job_body["metadata"], "namespace": namespace,
                                     "uid": "00000000-0000-0000-0000-000000000001",
                                     "generation": 1}}
    job = JobSpec.from_body(body)
    return [
        build_ssh_secret(job, settings, STAND_IN_KEYS),
        build_worker_service(job),
        build_network_policy(job),
        build_worker_statefulset(job, settings),
        build_hostfile_configmap(job, settings),
        build_launcher_pod(job, settings, attempt=1),
    ]


def render_chart(values_file: Path) -> str:
    """``helm template`` of the chart with one values file (the pinned helm); the YAML text."""
    return helm("template", "monarch-operator", str(CHART), "--namespace", "monarch-system",
                "-f", str(values_file)).stdout


def write_manifests(directory: Path) -> dict[str, list[Path]]:
    """Write the chart, one file per ``ci/`` values file, into ``directory/chart/``, and the
    sample job's children into ``directory/children/children.yaml``; returns the files written
    under ``"chart"`` and ``"children"``."""
    written: dict[str, list[Path]] = {"chart": [], "children": []}
    (directory / "chart").mkdir(parents=True, exist_ok=True)
    (directory / "children").mkdir(parents=True, exist_ok=True)
    for values_file in CI_VALUES:
        path = directory / "chart" / f"{values_file.stem}.yaml"
        path.write_text(render_chart(values_file))
        written["chart"].append(path)
    children = operator_children(yaml.safe_load(SAMPLE_JOB.read_text()))
    path = directory / "children" / "children.yaml"
    path.write_text(yaml.safe_dump_all(children, sort_keys=False))
    written["children"].append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.scan.manifests DIR")
    for paths in write_manifests(Path(sys.argv[1])).values():
        for written_path in paths:
            print(written_path)
