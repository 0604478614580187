"""The operator woken by watches, not polling: no writes while nothing changes (C5), restarts
converge (C6), deletion never blocked (C14). Against the real local control plane."""

from __future__ import annotations

import base64
import json
import time

import pytest

from tests.cluster.helpers import get_json, job_manifest, job_status, wait_phase, wait_until
from tests.conftest import WATCH_RENEW_SECONDS

pytestmark = pytest.mark.cluster

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
OPERATOR_AGENTS = ("monarch-operator/", "kopf/")
# Each child kind of a job with the selector that picks it: the launcher is a pod of its own.
CHILD_KINDS = {"secrets": "", "services": "", "statefulsets": "", "configmaps": "",
               "launcher pods": "pods,monarch-operator.dev/role=launcher"}
LONG_LAUNCHER = {"command": ["sh", "-c", "sleep 600"]}
# C5's window: three renewals of every watch stream (a write on re-watch would show).
QUIET_WINDOW_SECONDS = 3 * WATCH_RENEW_SECONDS
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def audit_events(cluster, start: int = 0) -> list[dict]:
    """Audit events written after byte ``start`` of the API server's audit log."""
    with open(cluster.audit_log, "rb") as log:
        log.seek(start)
        return [json.loads(line) for line in log.read().splitlines() if line.strip()]


def operator_writes(events: list[dict], namespace: str) -> list[str]:
    """Write requests by the operator (its client or kopf) to objects in ``namespace``, and by
    anyone to a MonarchJob there, as ``verb resource/name (agent)``."""
    found = []
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("verb") not in WRITE_VERBS or ref.get("namespace") != namespace:
            continue
        by_operator = str(event.get("userAgent", "")).startswith(OPERATOR_AGENTS)
        if by_operator or ref.get("resource") == "monarchjobs":
            found.append(f"{event['verb']} {ref.get('resource')}/{ref.get('subresource', '')}"
                         f"{ref.get('name')} ({event.get('userAgent')})")
    return found


def phase(kubectl, namespace: str, name: str) -> str | None:
    job = get_json(kubectl, "monarchjob", name, "-n", namespace)
    return (job or {}).get("status", {}).get("phase")


def children(kubectl, namespace: str, name: str) -> dict[str, list[dict]]:
    """Every child kind of the job (by its job label), as lists of objects."""
    found = {}
    for key, query in CHILD_KINDS.items():
        kind, _, extra = (query or key).partition(",")
        selector = ",".join(filter(None, [f"monarch-operator.dev/job={name}", extra]))
        found[key] = kubectl.json(kind, "-n", namespace, "-l", selector)["items"]
    return found


def test_running_job_gets_no_writes_while_nothing_changes(kubectl, namespace, local_cluster):
    """C5: a Running job, three watch renewals of the API server's audit log (30 s with the
    tests' 10 s renewal; every stream re-watched three times): no write by the operator."""
    start = local_cluster.audit_log.stat().st_size
    kubectl("apply", "-n", namespace, "-f", "-",
            stdin=job_manifest("quiet", launcher=LONG_LAUNCHER))
    wait_until(lambda: phase(kubectl, namespace, "quiet") == "Running", 90, "job Running")
    wait_until(lambda: (pod := get_json(kubectl, "pod", "quiet-launcher", "-n", namespace))
               and pod["status"].get("phase") == "Running", 60, "launcher pod Running")
    before = operator_writes(audit_events(local_cluster, start), namespace)
    # The audit log does record the operator: creating the job's children is in it.
    assert any(line.startswith("create statefulsets/quiet-worker") for line in before), before
    assert any("monarchjobs/status" in line for line in before), before
    window_start = local_cluster.audit_log.stat().st_size
    time.sleep(QUIET_WINDOW_SECONDS)
    writes = operator_writes(audit_events(local_cluster, window_start), namespace)
    assert writes == [], (f"writes to a Running job in {QUIET_WINDOW_SECONDS} s while nothing "
                          f"changed: {writes}")
    job = get_json(kubectl, "monarchjob", "quiet", "-n", namespace)
    assert job["status"]["phase"] == "Running"
    assert job["status"]["observedGeneration"] == job["metadata"]["generation"]
    assert not job["metadata"].get("finalizers"), "no finalizer of ours on the job"
    annotations = job["metadata"].get("annotations") or {}
    assert not [key for key in annotations if key.startswith(("kopf", "monarch-operator"))]


@pytest.mark.parametrize("crash_after", ["Secret", "RoleBinding", "ConfigMap"])
def test_operator_killed_between_child_creations_converges(kubectl, namespace, operator_process,
                                                           crash_after):
    """C6: SIGKILL right after creating one child; after a restart, one of each child, all
    owned by the job, and the same SSH key bytes."""
    operator_process.start(MONARCH_OPERATOR_CRASH_AFTER_CREATE=crash_after)
    kubectl("apply", "-n", namespace, "-f", "-",
            stdin=job_manifest("crashy", launcher=LONG_LAUNCHER))
    assert operator_process.wait_exit(timeout=120) == -9, "the operator killed itself"
    key_before = get_json(kubectl, "secret", "crashy-ssh", "-n", namespace)["data"]
    operator_process.start()
    wait_until(lambda: phase(kubectl, namespace, "crashy") == "Running", 90, "job Running")
    job = get_json(kubectl, "monarchjob", "crashy", "-n", namespace)
    found = children(kubectl, namespace, "crashy")
    assert sorted(item["metadata"]["name"] for item in found["configmaps"]) == [
        "crashy-hostfile", "crashy-progress"], found["configmaps"]
    for kind, items in found.items():
        assert len(items) == 1 or kind == "configmaps", \
            f"{kind}: {[i['metadata']['name'] for i in items]}"
        for item in items:
            (ref,) = item["metadata"]["ownerReferences"]
            assert ref["uid"] == job["metadata"]["uid"] and ref["controller"] is True
    assert found["secrets"][0]["data"] == key_before, "the key was never regenerated"
    assert base64.b64decode(key_before["id_ed25519"]).startswith(b"-----BEGIN OPENSSH")


def test_foreign_secret_is_never_adopted_and_no_retry_storm(kubectl, namespace):
    """C6: a Secret named <job>-ssh that the job does not own is left alone; the job says why
    once (status and one Warning), and goes on when the Secret is gone."""
    kubectl("create", "secret", "generic", "alien-ssh", "-n", namespace,
            "--from-literal=id_ed25519=not-ours")
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest("alien"))

    def blocked():
        job = get_json(kubectl, "monarchjob", "alien", "-n", namespace)
        for condition in (job or {}).get("status", {}).get("conditions", []):
            if condition["reason"] == "ChildNotOwned":
                return condition
        return None

    condition = wait_until(blocked, 30, "ChildNotOwned in status")
    assert f"Secret {namespace}/alien-ssh" in condition["message"], condition["message"]
    time.sleep(10)  # the operator retries meanwhile: no new event, no write, no adoption
    events = kubectl.json("events", "-n", namespace,
                          "--field-selector", "reason=ChildNotOwned")["items"]
    assert sum(event.get("count") or 1 for event in events) == 1, events
    secret = get_json(kubectl, "secret", "alien-ssh", "-n", namespace)
    assert not secret["metadata"].get("ownerReferences")
    assert base64.b64decode(secret["data"]["id_ed25519"]) == b"not-ours"
    assert get_json(kubectl, "statefulset", "alien-worker", "-n", namespace) is None
    kubectl("delete", "secret", "alien-ssh", "-n", namespace)
    wait_until(lambda: (s := get_json(kubectl, "secret", "alien-ssh", "-n", namespace))
               and s["metadata"].get("ownerReferences"), 90, "the job's own Secret")


def test_no_launcher_runs_on_a_hostfile_an_earlier_job_of_the_name_still_holds(kubectl,
                                                                              namespace):
    """A job deleted and applied again at once: the earlier job's hostfile ConfigMap, not yet
    garbage-collected, holds the name. A kubelet mounts a ConfigMap by name, so a launcher
    created beside it ran on the earlier job's hosts and addresses (a clean-clone CI run,
    tests/e2e/test_same_name_again.py: attempt 1 timed out on an address no pod had any more).
    No launcher exists until the hostfile is the job's own; then the job runs in attempt 1."""
    kubectl("apply", "-n", namespace, "-f", "-",
            stdin=job_manifest("earlier", suspend=True))
    earlier = get_json(kubectl, "monarchjob", "earlier", "-n", namespace)
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "again-hostfile", "labels": {
            "monarch-operator.dev/job": "again",
            "app.kubernetes.io/managed-by": "monarch-operator"},
            "ownerReferences": [{"apiVersion": "monarch-operator.dev/v1alpha1",
                                 "kind": "MonarchJob", "name": "earlier",
                                 "uid": earlier["metadata"]["uid"], "controller": True}]},
        "data": {"hostfile": "nowhere.invalid slots=1\n"}}))
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest("again"))

    def blocked():
        for condition in job_status(kubectl, namespace, "again").get("conditions", []):
            if condition["reason"] == "ChildNotOwned":
                return condition
        return None

    condition = wait_until(blocked, 60, "ChildNotOwned in status")
    assert f"ConfigMap {namespace}/again-hostfile" in condition["message"], condition
    time.sleep(3)  # passes retry meanwhile
    assert get_json(kubectl, "pod", "again-launcher", "-n", namespace) is None
    kubectl("delete", "configmap", "again-hostfile", "-n", namespace)
    status = wait_phase(kubectl, namespace, "again", "Succeeded", 120)
    assert [record["class"] for record in status["attempts"]] == ["Succeeded"], status


def test_deleting_a_starting_job_is_never_blocked(kubectl, namespace, operator_process):
    """C14: no finalizer of ours; a Starting job deleted (also with the operator down) goes,
    its children are garbage-collected, and nothing comes back on restart."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
        "starting", workers={"replicas": 2, "gpusPerWorker": 9},
        meshes={"trainer": {"hosts": 1}, "ref": {"hosts": 1}, "colocate": True}))
    wait_until(lambda: phase(kubectl, namespace, "starting") == "Starting", 30, "Starting")
    job = get_json(kubectl, "monarchjob", "starting", "-n", namespace)
    assert not job["metadata"].get("finalizers")
    operator_process.stop()
    kubectl("delete", "monarchjob", "starting", "-n", namespace, "--wait=true", "--timeout=30s")
    wait_until(lambda: not any(children(kubectl, namespace, "starting").values()), 60,
               "children garbage-collected without the operator")
    operator_process.start()
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest("probe"))
    wait_until(lambda: phase(kubectl, namespace, "probe"), 60, "the restarted operator at work")
    assert not any(children(kubectl, namespace, "starting").values()), "nothing recreated"


def test_finalizer_left_by_an_older_operator_is_removed(kubectl, namespace):
    """C14: jobs handled by the timer-based operator carry kopf's finalizer; it is dropped."""
    manifest = json.loads(json.dumps(__import__("yaml").safe_load(job_manifest("legacy"))))
    manifest["metadata"]["finalizers"] = [KOPF_FINALIZER]
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    wait_until(lambda: not get_json(kubectl, "monarchjob", "legacy", "-n", namespace)
               ["metadata"].get("finalizers"), 30, "kopf's finalizer removed")
    kubectl("delete", "monarchjob", "legacy", "-n", namespace, "--wait=true", "--timeout=30s")


def test_deleting_a_namespace_with_a_running_job_completes(kubectl, operator):
    """C14: the namespace, the Running job and its children all go."""
    name = f"t-ns-{int(time.time() * 1000) % 10**8}"
    kubectl("create", "namespace", name)
    try:
        kubectl("apply", "-n", name, "-f", "-", stdin=job_manifest("busy", launcher=LONG_LAUNCHER))
        wait_until(lambda: phase(kubectl, name, "busy") == "Running", 90, "job Running")
        kubectl("delete", "namespace", name, "--wait=true", "--timeout=90s")
        assert get_json(kubectl, "namespace", name) is None
    finally:
        kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
