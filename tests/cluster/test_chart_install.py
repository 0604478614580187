"""The Helm chart on the local control plane: server-side dry-run of each ci/ values file, a real
install, an upgrade that carries a CRD change the documented way, uninstall, and the CRD's
client-side apply (field case C15)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.chart import CHART, CI_VALUES, ROOT, helm

pytestmark = pytest.mark.cluster

CRD_FILE = ROOT / "crds" / "monarchjobs.monarch-operator.dev.yaml"
CRD_NAME = "monarchjobs.monarch-operator.dev"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# "far below 256 KiB" (the API server's limit on a whole object's annotations): a quarter.
LAST_APPLIED_BUDGET = 64 * 1024


@pytest.fixture
def original_crd(kubectl) -> Iterator[None]:
    """Put crds/ back as it is in the repository after a test that changes the CRD."""
    try:
        yield
    finally:
        kubectl("apply", "-f", str(CRD_FILE))


def test_crd_applies_with_plain_client_side_apply(kubectl):
    """C15: `kubectl apply -f crds/` (client side, the default) works; the last-applied
    annotation it stores stays far below the API server's 256 KiB limit."""
    out = kubectl("apply", "-f", str(ROOT / "crds"))
    assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}" in out
    crd = kubectl.json("crd", CRD_NAME)
    annotation = crd["metadata"]["annotations"][LAST_APPLIED]
    assert json.loads(annotation)["spec"] == yaml.safe_load(CRD_FILE.read_text())["spec"]
    assert len(annotation.encode()) < LAST_APPLIED_BUDGET, len(annotation)
    # Applying again is a no-op.
    assert "unchanged" in kubectl("apply", "-f", str(ROOT / "crds"))


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_rendered_chart_passes_server_side_dry_run(kubectl, helm_env, chart_namespace, values):
    """Every object of `helm template -f ci/<file>` is accepted by the API server (strict field
    validation, admission, RBAC escalation checks) without being stored."""
    settings = yaml.safe_load(values.read_text()) or {}
    created = []
    for namespace in settings.get("watchNamespaces", []):  # a Role needs its namespace
        if not kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name"):
            kubectl("create", "namespace", namespace)
            created.append(namespace)
    try:
        rendered = helm("template", "mo", str(CHART), "-n", chart_namespace, "-f", str(values),
                        "--skip-tests", env=helm_env).stdout
        _assert_server_dry_run(kubectl, chart_namespace, rendered)
        # The `helm test` pod: ServiceAccount admission wants its (hook) ServiceAccount to
        # exist, as it will when `helm test` creates the hooks in weight order.
        hooks = helm("template", "mo", str(CHART), "-n", chart_namespace, "-f", str(values),
                     "-s", "templates/tests/operator-healthy.yaml", env=helm_env).stdout
        [account] = [doc for doc in yaml.safe_load_all(hooks)
                     if doc and doc["kind"] == "ServiceAccount"]
        kubectl("apply", "-n", chart_namespace, "-f", "-", stdin=json.dumps(account))
        _assert_server_dry_run(kubectl, chart_namespace, hooks)
        assert kubectl("get", "deployments,roles", "-n", chart_namespace, "-o", "name") == ""
    finally:
        for namespace in created:
            kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _assert_server_dry_run(kubectl, namespace: str, manifests: str) -> None:
    """Every object is accepted; namespaced ones name their namespace (the release's, or a
    watched one for Roles), so that `kubectl apply` of the rendered chart needs no -n."""
    objects = [doc for doc in yaml.safe_load_all(manifests) if doc]
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    assert all(obj["metadata"].get("namespace") for obj in objects
               if obj["kind"] not in cluster_scoped)
    assert all(obj["metadata"]["namespace"] == namespace for obj in objects
               if obj["kind"] not in cluster_scoped | {"Role", "RoleBinding"})
    out = kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                  stdin=manifests)
    assert objects and out.count("(server dry run)") == len(objects), out


def _changed_chart(tmp_path: Path) -> Path:
    """A copy of the chart, version 0.1.1, whose CRD has one more (optional) spec field."""
    chart = tmp_path / "monarch-operator"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = "0.1.1"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    crd_path = chart / "crds" / CRD_FILE.name
    crd = yaml.safe_load(crd_path.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema["properties"]["upgradeProbe"] = {"type": "string",
                                            "description": "added by the chart upgrade test"}
    crd_path.write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def _served_spec_fields(kubectl) -> set[str]:
    crd = kubectl.json("crd", CRD_NAME)
    return set(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
               ["properties"])


def _release(helm_env, namespace: str, name: str) -> dict:
    out = helm("list", "-n", namespace, "--filter", f"^{name}$", "-o", "json", env=helm_env).stdout
    [release] = json.loads(out)
    return release


def test_install_upgrade_with_crd_change_and_uninstall(kubectl, helm_env, chart_namespace,
                                                       tmp_path, original_crd):
    release = "mo"
    kubectl("apply", "-f", str(CRD_FILE))  # as docs/install.md says, before the chart
    result = helm("install", release, str(CHART), "-n", chart_namespace,
                  "--set", f"watchNamespaces={{{chart_namespace}}}", env=helm_env)
    assert f"helm test {release} -n {chart_namespace}" in result.stdout  # NOTES
    assert _release(helm_env, chart_namespace, release)["status"] == "deployed"
    deployment = kubectl.json("deployment", f"{release}-monarch-operator", "-n", chart_namespace)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == (
        f"{release}-monarch-operator")
    assert kubectl("get", "role,rolebinding,serviceaccount", "-n", chart_namespace,
                   "-l", f"app.kubernetes.io/instance={release}", "-o", "name").split() == [
        f"role.rbac.authorization.k8s.io/{release}-monarch-operator",
        f"role.rbac.authorization.k8s.io/{release}-monarch-operator-leader-election",
        f"rolebinding.rbac.authorization.k8s.io/{release}-monarch-operator",
        f"rolebinding.rbac.authorization.k8s.io/{release}-monarch-operator-leader-election",
        f"serviceaccount/{release}-monarch-operator"]
    # Two replicas under leader election (docs/ha.md), kept available through drains.
    assert deployment["spec"]["replicas"] == 2
    pdb = kubectl.json("poddisruptionbudget", f"{release}-monarch-operator", "-n",
                       chart_namespace)
    assert pdb["spec"]["minAvailable"] == 1
    assert "upgradeProbe" not in _served_spec_fields(kubectl)

    # A newer chart whose CRD changed: `helm upgrade` alone leaves the CRD as it was ...
    new_chart = _changed_chart(tmp_path)
    helm("upgrade", release, str(new_chart), "-n", chart_namespace, "--reuse-values",
         env=helm_env)
    assert "upgradeProbe" not in _served_spec_fields(kubectl)
    # ... so docs/install.md's upgrade applies the chart's CRDs first, then upgrades.
    crds = helm("show", "crds", str(new_chart), env=helm_env).stdout
    kubectl("apply", "-f", "-", stdin=crds)
    helm("upgrade", release, str(new_chart), "-n", chart_namespace, "--reuse-values",
         env=helm_env)
    assert "upgradeProbe" in _served_spec_fields(kubectl)
    upgraded = _release(helm_env, chart_namespace, release)
    assert (upgraded["status"], upgraded["chart"], upgraded["revision"]) == (
        "deployed", "monarch-operator-0.1.1", "3")

    helm("uninstall", release, "-n", chart_namespace, "--wait", env=helm_env)
    left = kubectl("get", "deployment,role,rolebinding,serviceaccount,poddisruptionbudget",
                   "-n", chart_namespace,
                   "-l", f"app.kubernetes.io/instance={release}", "-o", "name")
    assert left == ""
    # Helm never deletes crds/: the MonarchJob CRD (and so every job) stays.
    assert kubectl.json("crd", CRD_NAME)["metadata"]["name"] == CRD_NAME
