"""Rendering the chart with the pinned helm client, for the chart's unit and cluster tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from monarch_operator.localcluster.binaries import ensure_helm

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "monarch-operator"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
# Namespaces the shared test operator (conftest.py) leaves alone: the chart's tests run the
# chart's own operator there (as a pod, or under the chart's ServiceAccount), and two operators
# must not both act on one job.
CHART_NAMESPACE_PREFIX = "chart-"


@cache
def helm_binary() -> Path:
    """The pinned helm (built on first use, see build-binaries.sh)."""
    return ensure_helm()


def helm(*args: str, env: dict[str, str] | None = None, check: bool = True,
         home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm; ``home`` keeps its cache, config and data out of ``~``."""
    helm_env = {**os.environ, **(env or {})}
    if home is not None:
        for kind in ("CACHE", "CONFIG", "DATA"):
            helm_env[f"HELM_{kind}_HOME"] = str(home / kind.lower())
    result = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True,
                            env=helm_env, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def render(*values_args: str, release: str = "mo", namespace: str = "monarch-system",
           ) -> list[dict[str, Any]]:
    """``helm template`` with extra arguments (``-f FILE``, ``--set K=V``); the objects."""
    out = helm("template", release, str(CHART), "--namespace", namespace, *values_args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of one kind."""
    return [obj for obj in objects if obj["kind"] == kind]


def token_kubeconfig(kubectl, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig for the local API server that authenticates as ``namespace/account`` only
    (a TokenRequest token, one hour)."""
    admin = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json"))
    cluster = admin["clusters"][0]["cluster"]
    token = kubectl("create", "token", account, "-n", namespace, "--duration=1h").strip()
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "chart",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "chart", "context": {"cluster": "local", "user": account,
                                                   "namespace": namespace}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


# The next release of the chart, as the upgrade tests (field case C33) make it.
NEW_VERSION = "0.1.1"
NEW_LABEL = ("upgrade.example.com/defaults", "v2")
NEW_ENV = ("MONARCH_UPGRADE_DEFAULT", "v2")
NEW_FIELD = ("upgradeProbe", "defaulted")


def newer_chart(tmp_path: Path) -> Path:
    """A copy of the chart as its next release: version and appVersion 0.1.1 (so another
    operator image tag), worker defaults the current one has not, and a CRD with one more
    optional spec field that has a default."""
    chart = tmp_path / "newer" / "monarch-operator"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = meta["appVersion"] = NEW_VERSION
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    values = yaml.safe_load((chart / "values.yaml").read_text())
    values["workerDefaults"] = {"labels": dict([NEW_LABEL]), "env": dict([NEW_ENV])}
    (chart / "values.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    [crd_path] = (chart / "crds").glob("*.yaml")
    crd = yaml.safe_load(crd_path.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"][NEW_FIELD[0]] = {"type": "string", "default": NEW_FIELD[1],
                                        "description": "added by the chart upgrade test"}
    crd_path.write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart
