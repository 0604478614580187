"""The chart's high availability (issue 34 item 5): two replicas under leader election by
default, a PodDisruptionBudget, a preferred anti-affinity across nodes, the Lease Role in the
release's namespace granting exactly the elector's calls, the timings passed and checked."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monarch_operator.controller.leader import settings as election
from tests.chart import CHART, by_kind, helm, render
from tests.unit.test_chart_rbac import client_method_rule

LEASE_PY = (Path(__file__).resolve().parents[2] / "operator" / "monarch_operator" / "controller"
            / "leader" / "lease.py")


def elector_rules() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of each ``self._api.<method>(...)`` call in leader/lease.py
    (``self._api`` is the ``CoordinationV1Api``)."""
    rules = set()
    for node in ast.walk(ast.parse(LEASE_PY.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "_api"):
            rules.add(client_method_rule("CoordinationV1Api", node.func.attr))
    return rules


def leader_role(objects):
    return [role for role in by_kind(objects, "Role")
            if role["metadata"]["name"].endswith("-leader-election")]


def container(objects):
    [deployment] = by_kind(objects, "Deployment")
    return deployment, deployment["spec"]["template"]["spec"]["containers"][0]


def test_two_replicas_elect_a_leader_by_default_with_the_default_timings():
    objects = render()
    deployment, operator = container(objects)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    args = operator["args"]
    assert "--leader-elect" in args
    assert "--leader-elect-name=mo-monarch-operator" in args
    assert {f"--leader-elect-lease-duration={election.LEASE_DURATION:g}",
            f"--leader-elect-renew-deadline={election.RENEW_DEADLINE:g}",
            f"--leader-elect-retry-period={election.RETRY_PERIOD:g}"} <= set(args)
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.namespace"}}} in operator["env"]
    # Readiness does not wait for leadership: the same /healthz a standby answers.
    assert operator["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_pdb_and_anti_affinity_keep_one_replica_per_node():
    objects = render()
    deployment, _ = container(objects)
    labels = deployment["spec"]["selector"]["matchLabels"]
    [pdb] = by_kind(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": labels}}
    assert pdb["metadata"]["namespace"] == "monarch-system"
    [term] = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {"topologyKey": "kubernetes.io/hostname",
                                       "labelSelector": {"matchLabels": labels}}
    # Your own affinity replaces it; one replica needs neither.
    mine = render("--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuring"
                  "Execution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
                  "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuring"
                  "Execution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists")
    assert "podAntiAffinity" not in container(mine)[0]["spec"]["template"]["spec"]["affinity"]
    single = render("--set", "replicas=1")
    assert "affinity" not in container(single)[0]["spec"]["template"]["spec"]
    assert by_kind(single, "PodDisruptionBudget") == []


def test_the_lease_role_grants_exactly_the_elector_s_calls_in_the_release_namespace():
    used = elector_rules()
    assert used == {("coordination.k8s.io", "leases", verb)
                    for verb in ("get", "create", "update")}
    objects = render()
    [role] = leader_role(objects)
    assert role["metadata"]["namespace"] == "monarch-system"
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    assert granted == used
    for rule in role["rules"]:  # get/update only on the chart's Lease
        if set(rule["verbs"]) & {"get", "update"}:
            assert rule["resourceNames"] == ["mo-monarch-operator"]
    [binding] = [b for b in by_kind(objects, "RoleBinding")
                 if b["metadata"]["name"] == role["metadata"]["name"]]
    assert binding["metadata"]["namespace"] == "monarch-system"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # Namespaced mode: still only in the release's namespace.
    namespaced = render("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    assert [r["metadata"]["namespace"] for r in leader_role(namespaced)] == ["monarch-system"]
    # No Lease rule in the operator's ClusterRole beyond the node heartbeats' list.
    [cluster_role] = by_kind(objects, "ClusterRole")[:1]
    lease_verbs = {verb for rule in cluster_role["rules"] if "leases" in rule["resources"]
                   for verb in rule["verbs"]}
    assert lease_verbs == {"list"}


def test_election_off_is_one_replica_acting_alone():
    objects = render("--set", "leaderElection.enabled=false", "--set", "replicas=1")
    deployment, operator = container(objects)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not [arg for arg in operator["args"] if arg.startswith("--leader-elect")]
    assert leader_role(objects) == [] and by_kind(objects, "PodDisruptionBudget") == []


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "leaderElection.enabled=false"], "replicas > 1 needs leaderElection.enabled"),
    (["--set", "leaderElection.renewDeadline=15"], "leaseDuration must exceed"),
    (["--set", "leaderElection.retryPeriod=9"], "1.2 x leaderElection.retryPeriod"),
    (["--set", "leaderElection.leaseDuration=0"], "leaseDuration"),
    (["--set", "replicas=0"], "replicas"),
    (["--set", "podDisruptionBudget.maxUnavailable=1"], "maxUnavailable"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_bad_election_values_are_refused_naming_them(args, message):
    result = helm("template", "mo", str(CHART), *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


# -- the refusal to upgrade beside a lone replica (docs/ha.md, "Upgrading from a lone replica")

LOOKUP = '(lookup "v1" "Pod" .Release.Namespace "")'


def render_seeing(pods: list[dict], tmp_path: Path, *values: str) -> subprocess.CompletedProcess:
    """``helm template`` of a copy of the chart whose pod ``lookup`` (empty without a cluster)
    returns ``pods``: the template's own logic, without an API server (the cluster test
    tests/cluster/test_chart_upgrade.py runs the real lookup)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    helpers = chart / "templates" / "_helpers.tpl"
    assert helpers.read_text().count(LOOKUP) == 1
    helpers.write_text(helpers.read_text().replace(LOOKUP, ".Values.seenPods"))
    (chart / "values.schema.json").unlink()  # strict: it refuses the extra key
    (tmp_path / "seen.yaml").write_text(yaml.safe_dump({"seenPods": {"items": pods}}))
    return helm("template", "mo", str(chart), "-n", "ms", "-f", str(tmp_path / "seen.yaml"),
                *values, check=False)


def operator_pod(name: str, args: list[str], release: str = "mo",
                 phase: str = "Running") -> dict:
    return {"metadata": {"name": name, "labels": {
                "app.kubernetes.io/name": "monarch-operator",
                "app.kubernetes.io/instance": release, "pod-template-hash": "abc"}},
            "spec": {"containers": [{"name": "operator", "args": args}]},
            "status": {"phase": phase}}


def test_an_upgrade_to_leader_election_beside_a_lone_replica_is_refused(tmp_path):
    lone = operator_pod("mo-monarch-operator-1", ["--namespace=a", "--liveness=x"])
    refused = render_seeing([lone], tmp_path)
    assert refused.returncode != 0
    assert "pod mo-monarch-operator-1 runs the operator alone (leader election off)" in (
        refused.stderr)
    assert ("  kubectl scale deployment/mo-monarch-operator -n ms --replicas=0\n  kubectl wait "
            "--for=delete pod -n ms -l app.kubernetes.io/name=monarch-operator,"
            "app.kubernetes.io/instance=mo --timeout=120s\n") in refused.stderr


@pytest.mark.parametrize("pods", [
    [],  # a fresh install
    [operator_pod("mo-monarch-operator-2", ["--leader-elect", "--leader-elect-name=x"])],
    [operator_pod("mo-monarch-operator-3", [], phase="Failed")],  # ended: runs nothing
    [operator_pod("other-monarch-operator-1", [], release="other")],  # another release
    [{"metadata": {"name": "unlabelled"}, "spec": {"containers": [{"name": "operator"}]}}],
], ids=["none", "leader-elect", "ended", "other-release", "unlabelled"])
def test_no_lone_replica_of_the_release_no_refusal(tmp_path, pods):
    assert render_seeing(pods, tmp_path).returncode == 0


def test_staying_a_lone_replica_is_no_refusal(tmp_path):
    """Leader election off again: Recreate stops the old pod before the new one starts."""
    lone = operator_pod("mo-monarch-operator-1", [])
    assert render_seeing([lone], tmp_path, "--set", "leaderElection.enabled=false",
                         "--set", "replicas=1").returncode == 0
