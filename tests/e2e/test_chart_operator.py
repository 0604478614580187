"""The chart's permissions are enough: the end-to-end job succeeds with the operator holding
only the chart's ServiceAccount token (namespaced mode, a Role in the job's namespace).

The operator runs as a local process whose kubeconfig carries nothing but a token of the
chart's ServiceAccount, so every API call it makes is authorised by the chart's Role alone; the
API server's audit log then shows no write refused to that account.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from monarch_operator.localcluster.cli import pod_log_path
from monarch_operator.localcluster.demo import (
    launcher_log,
    start_operator,
    stop_process,
    wait_for_phase,
)
from tests.chart import (
    CHART,
    NEW_ENV,
    NEW_LABEL,
    ROOT,
    helm,
    newer_chart,
    token_kubeconfig,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

SAMPLE = ROOT / "examples" / "rl_kl" / "monarchjob.yaml"
RELEASE = "mo"
FULLNAME = f"{RELEASE}-monarch-operator"  # the chart's fullname: Deployment, Lease, account


def run_sample_job(kubectl, namespace: str, state_dir: Path) -> tuple[dict, str]:
    """Apply the rl_kl sample, wait until it ends; returns the job and its launcher's output,
    after checking that it Succeeded and the program ran to its end."""
    kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
    name = yaml.safe_load(SAMPLE.read_text())["metadata"]["name"]
    job = wait_for_phase(kubectl, namespace, name, ("Succeeded", "Failed"), timeout=420)
    log = launcher_log(kubectl, state_dir, namespace, name)
    assert job["status"]["phase"] == "Succeeded", log[-4000:]
    assert "rl_kl: done" in log
    return job, log


def sample_job_succeeded_once(kubectl, namespace: str, name: str, state_dir: Path) -> dict:
    """Wait until the running sample job ends; check that it Succeeded in one attempt with no
    restart and its program ran to its end; returns the job."""
    job = wait_for_phase(kubectl, namespace, name, ("Succeeded", "Failed"), timeout=420)
    log = launcher_log(kubectl, state_dir, namespace, name)
    assert job["status"]["phase"] == "Succeeded", log[-4000:]
    assert "rl_kl: done" in log
    assert job["status"].get("restartCount", 0) == 0, job["status"]
    assert len(job["status"].get("attempts", [])) == 1, job["status"]
    return job


def refused_requests(audit_log: Path, start: int, user: str) -> list[str]:
    """Requests by ``user`` that the API server answered 403, from byte ``start`` of its
    audit log."""
    refused = []
    with open(audit_log, "rb") as log:
        log.seek(start)
        for line in log:
            event = json.loads(line)
            if (event.get("user", {}).get("username") == user
                    and event.get("responseStatus", {}).get("code") == 403):
                ref = event.get("objectRef", {})
                refused.append(f"{event['verb']} {ref.get('resource')} {ref.get('name')}")
    return refused


@pytest.mark.parametrize("mode", ["namespaced", "cluster"])
def test_sample_job_succeeds_under_the_charts_service_account(
        kubectl, helm_env, chart_namespace, local_cluster, tmp_path, mode):
    """In both RBAC modes (a Role per watched namespace; one ClusterRole), with the API
    server's OwnerReferencesPermissionEnforcement admission plugin on (field case C24): every
    child carries ``blockOwnerDeletion``, which needs ``update`` on ``monarchjobs/finalizers``.
    In cluster mode the operator still watches only this test's namespace (the shared test
    operator has the others), under the ClusterRole's grants."""
    account = f"{RELEASE}-monarch-operator"
    scope = (("--set", f"watchNamespaces={{{chart_namespace}}}") if mode == "namespaced"
             else ())
    helm("install", RELEASE, str(CHART), "-n", chart_namespace, *scope, env=helm_env)
    kind = "Role" if mode == "namespaced" else "ClusterRole"
    assert kubectl("get", kind.lower(), f"{RELEASE}-monarch-operator", "-n", chart_namespace,
                   "-o", "name", check=False).strip(), f"no {kind} in {mode} mode"
    # The chart's Deployment stays, at zero replicas: this test runs the operator itself.
    kubectl("scale", "deployment", account, "-n", chart_namespace, "--replicas=0")
    config = token_kubeconfig(kubectl, chart_namespace, account, tmp_path / "kubeconfig")
    whoami = json.loads(kubectl("auth", "whoami", "-o", "json", f"--kubeconfig={config}"))
    user = f"system:serviceaccount:{chart_namespace}:{account}"
    assert whoami["status"]["userInfo"]["username"] == user
    audit_start = local_cluster.audit_log.stat().st_size
    operator = start_operator(tmp_path, {"KUBECONFIG": str(config)},
                              namespaces=(chart_namespace,))
    try:
        job, _ = run_sample_job(kubectl, chart_namespace, local_cluster.state_dir)
        assert job["status"]["launcher"]["exitCode"] == 0
    finally:
        stop_process(operator)
        helm("uninstall", RELEASE, "-n", chart_namespace, env=helm_env, check=False)
    children = [child for child in kubectl.json(
        "pods,secrets,services,configmaps", "-n", chart_namespace)["items"]
        if any(ref["kind"] == "MonarchJob" for ref in child["metadata"].get(
            "ownerReferences", []))]
    assert children and all(ref.get("blockOwnerDeletion") for child in children
                            for ref in child["metadata"]["ownerReferences"]), children
    operator_log = (tmp_path / "logs" / "operator.log").read_text()
    assert "Forbidden" not in operator_log and " 403" not in operator_log, operator_log[-3000:]
    assert refused_requests(local_cluster.audit_log, audit_start, user) == []


def test_sample_job_succeeds_with_the_operator_as_the_charts_pod(
        kubectl, helm_env, chart_namespace, local_cluster):
    """The chart's Deployment runs the operator as pods from the operator image on the real
    nodes (their kubelets mount the ServiceAccount token; the ``kubernetes`` Service leads to
    the API server): two replicas by default, one holding the release's Lease. `helm test` finds
    both healthy (the standby too). The rl_kl job is applied, and once it runs the leading pod
    is force-deleted (field case C32): the standby takes the Lease and the job still reaches
    Succeeded with one attempt and no restart. The namespace enforces the Pod Security
    "restricted" level, so the operator, `helm test` and job pods all pass it."""
    account = FULLNAME
    user = f"system:serviceaccount:{chart_namespace}:{account}"
    kubectl("label", "namespace", chart_namespace,
            *(f"pod-security.kubernetes.io/{mode}=restricted"
              for mode in ("enforce", "warn", "audit")))
    audit_start = local_cluster.audit_log.stat().st_size
    installed = helm("install", RELEASE, str(CHART), "-n", chart_namespace, "--wait",
                     "--timeout=120s", "--set", f"watchNamespaces={{{chart_namespace}}}",
                     env=helm_env, check=False)
    try:
        assert installed.returncode == 0, (installed.stderr, operator_pod_report(
            kubectl, local_cluster, chart_namespace))
        pods = kubectl.json("pods", "-n", chart_namespace, "-l",
                            f"app.kubernetes.io/instance={RELEASE}")["items"]
        assert len(pods) == 2, [pod["metadata"]["name"] for pod in pods]
        for pod in pods:
            assert pod["spec"]["serviceAccountName"] == account
            assert pod["status"]["phase"] == "Running", pod["status"]
        names = {pod["metadata"]["name"] for pod in pods}
        leader = wait_for_holder(kubectl, chart_namespace, names, timeout=60)
        # Without --logs: helm v3.22 deletes a hook-succeeded test pod before reading its logs
        # (helm/helm#9098). The test pod succeeds only if every operator pod answers healthz.
        tested = helm("test", RELEASE, "-n", chart_namespace, env=helm_env)
        assert "Phase:          Succeeded" in tested.stdout, tested.stdout
        kubectl("apply", "-n", chart_namespace, "-f", str(SAMPLE))
        name = yaml.safe_load(SAMPLE.read_text())["metadata"]["name"]
        wait_for_phase(kubectl, chart_namespace, name, ("Running", "Succeeded", "Failed"),
                       timeout=300)
        killed = time.monotonic()
        kubectl("delete", "pod", leader, "-n", chart_namespace, "--grace-period=0", "--force")
        successor = wait_for_holder(kubectl, chart_namespace, names - {leader}, timeout=60)
        print(f"leader {leader} force-deleted; {successor} leads after "
              f"{time.monotonic() - killed:.1f}s")
        sample_job_succeeded_once(kubectl, chart_namespace, name, local_cluster.state_dir)
        # The children were made by the pods' ServiceAccount, and nothing was refused to it.
        assert refused_requests(local_cluster.audit_log, audit_start, user) == []
        assert creators(local_cluster.audit_log, audit_start, chart_namespace, "statefulsets") \
            == {user}
    finally:
        helm("uninstall", RELEASE, "-n", chart_namespace, "--wait", env=helm_env, check=False)


def test_sample_job_runs_on_across_helm_upgrade(kubectl, helm_env, chart_namespace,
                                                local_cluster, tmp_path):
    """Field case C33 on the real nodes: the rl_kl job runs while the release is upgraded to
    a newer chart (version 0.1.1, new worker defaults: the operator pods roll, one by one, and
    the Lease moves to a new pod). The same operator image (the nodes hold one; the kwok test
    changes the tag too). No worker pod is deleted or restarted, the job's StatefulSet keeps its
    template, and the job Succeeds with one attempt and no restart."""
    installed = helm("install", RELEASE, str(CHART), "-n", chart_namespace, "--wait",
                     "--timeout=120s", "--set", f"watchNamespaces={{{chart_namespace}}}",
                     env=helm_env, check=False)
    try:
        assert installed.returncode == 0, (installed.stderr, operator_pod_report(
            kubectl, local_cluster, chart_namespace))
        old = {pod["metadata"]["name"] for pod in kubectl.json(
            "pods", "-n", chart_namespace, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]}
        wait_for_holder(kubectl, chart_namespace, old, timeout=60)
        kubectl("apply", "-n", chart_namespace, "-f", str(SAMPLE))
        name = yaml.safe_load(SAMPLE.read_text())["metadata"]["name"]
        wait_for_phase(kubectl, chart_namespace, name, ("Running",), timeout=300)
        before = worker_pods(kubectl, chart_namespace, name)
        template = kubectl.json("statefulset", f"{name}-worker", "-n", chart_namespace)[
            "spec"]["template"]
        started = time.monotonic()
        helm("upgrade", RELEASE, str(newer_chart(tmp_path)), "-n", chart_namespace, "--wait",
             "--timeout=180s", "--set", f"watchNamespaces={{{chart_namespace}}}",
             "--set", "image.tag=0.1.0", env=helm_env)
        new = {pod["metadata"]["name"] for pod in kubectl.json(
            "pods", "-n", chart_namespace, "-l", f"app.kubernetes.io/instance={RELEASE}")[
            "items"] if not pod["metadata"].get("deletionTimestamp")}
        successor = wait_for_holder(kubectl, chart_namespace, new - old, timeout=60)
        print(f"helm upgrade --wait and hand-over to {successor}: "
              f"{time.monotonic() - started:.1f}s")
        # Right after the hand-over, while the job still runs (it takes about 40 s on these
        # nodes): the same worker pods, not restarted, and the StatefulSet's template as it was.
        if kubectl.json("monarchjob", name, "-n", chart_namespace)["status"]["phase"] \
                == "Running":
            assert worker_pods(kubectl, chart_namespace, name) == before
            assert kubectl.json("statefulset", f"{name}-worker", "-n", chart_namespace)[
                "spec"]["template"] == template
            print("checked the running job's pods after the upgrade")
        deployment = kubectl.json("deployment", FULLNAME, "-n", chart_namespace)
        env = {item["name"]: item.get("value") for item in
               deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert NEW_ENV[0] in env["MONARCH_OPERATOR_WORKER_ENV"]
        assert NEW_LABEL[0] in env["MONARCH_OPERATOR_WORKER_LABELS"]
        job = sample_job_succeeded_once(kubectl, chart_namespace, name, local_cluster.state_dir)
        # The attempt's workers, as its status names them, are those from before the upgrade.
        assert sorted((w["name"], w["uid"]) for w in job["status"]["attemptWorkers"]) == [
            (pod, uid) for pod, (uid, _) in sorted(before.items())]
    finally:
        helm("uninstall", RELEASE, "-n", chart_namespace, "--wait", env=helm_env, check=False)


def worker_pods(kubectl, namespace: str, job: str) -> dict[str, tuple[str, int]]:
    """``{pod: (uid, restarts)}`` of the job's worker pods."""
    pods = kubectl.json("pods", "-n", namespace, "-l",
                        f"monarch-operator.dev/job={job},monarch-operator.dev/role=worker")
    return {pod["metadata"]["name"]: (pod["metadata"]["uid"], sum(
        c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", [])))
        for pod in pods["items"]}


def wait_for_holder(kubectl, namespace: str, pods: set[str], timeout: float) -> str:
    """The pod of ``pods`` that holds the release's Lease (named as the release's objects,
    :data:`FULLNAME`; ``holderIdentity`` is ``<pod name>_<suffix>``, docs/ha.md), polled every
    0.5 s. Raises TimeoutError naming the holder last seen."""
    deadline = time.monotonic() + timeout
    holder = None
    while time.monotonic() < deadline:
        try:
            lease = kubectl.json("lease", FULLNAME, "-n", namespace)
        except RuntimeError:  # not created yet
            lease = {}
        holder = (lease.get("spec") or {}).get("holderIdentity") or ""
        for pod in pods:
            if holder.startswith(f"{pod}_"):
                return pod
        time.sleep(0.5)
    raise TimeoutError(f"no pod of {sorted(pods)} holds Lease {FULLNAME} within {timeout:g}s; "
                       f"holder {holder!r}")


def operator_pod_report(kubectl, local_cluster, namespace: str) -> str:
    """The operator pods' status and output, for a failure message."""
    report = []
    for pod in kubectl.json("pods", "-n", namespace, "-l",
                            f"app.kubernetes.io/instance={RELEASE}")["items"]:
        name = pod["metadata"]["name"]
        report.append(f"{name}: {json.dumps(pod.get('status'))[:3000]}")
        path = pod_log_path(local_cluster.state_dir, namespace, name)
        output = (path.read_text(errors="replace") if path is not None
                  else kubectl("logs", "-n", namespace, name, check=False))
        report.append(output[-3000:])
    return "\n".join(report)


def creators(audit_log: Path, start: int, namespace: str, resource: str) -> set[str]:
    """Users that created ``resource`` objects in ``namespace`` (audit log from ``start``)."""
    users = set()
    with open(audit_log, "rb") as log:
        log.seek(start)
        for line in log:
            event = json.loads(line)
            ref = event.get("objectRef", {})
            if (event.get("verb") == "create" and ref.get("namespace") == namespace
                    and ref.get("resource") == resource and not ref.get("subresource")):
                users.add(event.get("user", {}).get("username"))
    return users
