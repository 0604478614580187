"""MonarchJobs dispatched by Kueue's MultiKueue (issue 37, field case C37) on two local control
planes: the session's cluster with simulated nodes is the worker (Kueue, the operator running
jobs), a second one without nodes the manager (Kueue with MultiKueue, the operator making
Workloads only). The manager reaches the worker's API server through a TCP proxy, so that a
test can take the worker away. Both control planes are shared by the module; each test has its
own namespace on both, with a ClusterQueue of its own on each.

The worker-side tests at the top need no manager: they play MultiKueue's part by hand (a
prebuilt Workload, then the job's copy naming it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from monarch_operator import constants
from monarch_operator.controller.kueue import workload as wl
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.localcluster import multikueue, multikueue_pair
from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl, stop_process
from monarch_operator.localcluster.kueue import KueueProcess
from tests.cluster.helpers import (
    CHECKPOINTING_PROGRAM,
    apply_manifest,
    condition,
    get_json,
    job_manifest,
    job_pods,
    job_status,
    wait_phase,
    wait_ready_for_a_stop,
    wait_until,
)
from tests.cluster.tcpproxy import TcpProxy
from tests.cluster.test_kueue import (
    KUEUE,
    QUEUE_LABEL,
    cluster_queue,
    kueue_objects,
    priority_classes,
)
from tests.conftest import OPERATOR_NAMESPACES, operator_env

pytestmark = pytest.mark.cluster

MANAGED_BY = "kueue.x-k8s.io/multikueue"
PREBUILT = "kueue.x-k8s.io/prebuilt-workload-name"
# Short for the lost-worker test (Kueue's default: 15 minutes).
WORKER_LOST_TIMEOUT_SECONDS = 20
STEPS = 30
REPORTING_PROGRAM = f"""
import time
from monarch_operator.job import report
for step in range(1, {STEPS} + 1):
    time.sleep(0.4)
    report(step, total_steps={STEPS})
"""


@dataclass
class Manager:
    cluster: LocalCluster
    kubectl: Kubectl
    proxy: TcpProxy


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory, local_cluster: LocalCluster,
            kubectl: Kubectl, kueue: KueueProcess) -> Iterator[Manager]:
    """The manager control plane (no nodes) with Kueue (MultiKueue, MonarchJob as external
    framework) and our operator, connected to the worker (the session's cluster, ``kueue``
    running there) through a proxy."""
    cluster = LocalCluster(tmp_path_factory.mktemp("mk-manager"), nodes=0, node_agent=False,
                           stop_with_owner=True)
    proxy = TcpProxy(int(local_cluster.record()["ports"]["apiserver"]))
    side = None
    try:
        cluster.up(progress=lambda message: print(f"[manager] {message}", flush=True))
        manager_kubectl = Kubectl(cluster.env())
        side = multikueue_pair.start_side(
            cluster, manager_kubectl, lambda message: print(f"[manager] {message}", flush=True),
            multikueue_section=multikueue.manager_section(WORKER_LOST_TIMEOUT_SECONDS, 10),
            feature_gates=multikueue.MANAGER_FEATURE_GATES, operator_env=operator_env(cluster),
            namespaces=OPERATOR_NAMESPACES, stop_with_owner=True)
        multikueue.connect(manager_kubectl, kubectl, f"https://127.0.0.1:{proxy.port}",
                           local_cluster.state_dir / "pki" / "ca.crt")
        multikueue_pair.wait_worker_active(manager_kubectl, "worker", 60)
        yield Manager(cluster, manager_kubectl, proxy)
    finally:
        if side is not None and side.operator is not None:
            stop_process(side.operator)
        if side is not None and side.kueue is not None:
            side.kueue.down()
        proxy.close()
        cluster.down(quiet=True)
        kubectl("delete", "clusterrolebinding,clusterrole", multikueue.CLUSTER_ROLE,
                "--ignore-not-found", check=False)


def queue_objects(namespace: str, admission_check: str | None) -> list[dict[str, Any]]:
    """ResourceFlavor, ClusterQueue (4 GPUs; with the MultiKueue check on the manager) for
    ``namespace`` only, LocalQueue ``user-queue``."""
    flavor, queue = f"flavor-{namespace}", cluster_queue(f"cq-{namespace}",
                                                         f"flavor-{namespace}", namespace, 4)
    if admission_check:
        queue["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": admission_check}]}
    return [{"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": flavor}}, queue,
            {"apiVersion": KUEUE, "kind": "LocalQueue",
             "metadata": {"name": "user-queue", "namespace": namespace},
             "spec": {"clusterQueue": f"cq-{namespace}"}}]


@pytest.fixture
def worker_queue(kueue: KueueProcess, kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """The test's namespace on the worker with its queue; yields the namespace."""
    kueue_objects(kubectl, *queue_objects(namespace, None))
    try:
        yield namespace
    finally:
        kubectl("delete", "monarchjobs", "--all", "-n", namespace, "--wait=true",
                "--timeout=60s", check=False)
        kubectl("delete", "clusterqueue", f"cq-{namespace}", "--wait=false", check=False)
        kubectl("delete", "resourceflavor", f"flavor-{namespace}", "--wait=false", check=False)


@pytest.fixture
def pair(manager: Manager, worker_queue: str) -> Iterator[str]:
    """The same namespace and queue on the manager (with the MultiKueue check)."""
    namespace = worker_queue
    manager.kubectl("create", "namespace", namespace)
    kueue_objects(manager.kubectl, *queue_objects(namespace, multikueue.ADMISSION_CHECK))
    try:
        yield namespace
    finally:
        manager.kubectl("delete", "monarchjobs", "--all", "-n", namespace, "--wait=true",
                        "--timeout=60s", check=False)
        manager.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        manager.kubectl("delete", "clusterqueue", f"cq-{namespace}", "--wait=false", check=False)


def dispatched_job(name: str, **spec: Any) -> str:
    body = yaml.safe_load(job_manifest(name, **spec))
    body["metadata"]["labels"] = {QUEUE_LABEL: "user-queue"}
    body["spec"]["managedBy"] = MANAGED_BY
    return yaml.safe_dump(body)


def workloads(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    return list(get_json(kubectl, "workloads.kueue.x-k8s.io", "-n", namespace)["items"])


def wl_condition(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (workload.get("status") or {}).get("conditions") or []
                 if c["type"] == kind), {})


def awaiting_dispatch(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    """The job's status once it is Queued for MultiKueue again (a status the worker had,
    Queued for another reason, may be copied for a moment first)."""
    status = job_status(kubectl, namespace, name)
    queued = next((c for c in status.get("conditions") or [] if c["type"] == "Queued"), {})
    return status if (status.get("phase") == "Queued"
                      and queued.get("reason") == "AwaitingDispatch") else None


def worker_copy(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    return get_json(kubectl, "monarchjob", name, "-n", namespace)


def test_managed_by_is_fixed_at_creation(kubectl, namespace):
    own = yaml.safe_load(job_manifest("own", suspend=True))
    own["spec"]["managedBy"] = "monarch-operator.dev/monarch-operator"
    apply_manifest(kubectl, namespace, yaml.safe_dump(own))
    apply_manifest(kubectl, namespace, job_manifest("plain", suspend=True))

    def refused(name: str, patch_type: str, patch: Any) -> str:
        with pytest.raises(RuntimeError) as error:  # kubectl exits non-zero: refused
            kubectl("patch", "monarchjob", name, "-n", namespace, f"--type={patch_type}",
                    "-p", json.dumps(patch))
        return str(error.value)

    assert "spec.managedBy cannot change" in refused(
        "own", "merge", {"spec": {"managedBy": MANAGED_BY}})
    assert "cannot be added or removed" in refused(
        "own", "json", [{"op": "remove", "path": "/spec/managedBy"}])
    assert "cannot be added or removed" in refused(
        "plain", "merge", {"spec": {"managedBy": "monarch-operator.dev/monarch-operator"}})
    other = yaml.safe_load(job_manifest("other"))
    other["spec"]["managedBy"] = "example.com/other"
    with pytest.raises(RuntimeError, match="Unsupported value"):
        apply_manifest(kubectl, namespace, yaml.safe_dump(other))


# -- the worker's side, MultiKueue played by hand ------------------------------------------------

def prebuilt_workload(name: str, namespace: str, body: dict[str, Any],
                      extra_workers: int = 0) -> dict[str, Any]:
    """The Workload MultiKueue would copy to the worker for job ``body``: built as the
    manager's operator builds it, without owner and job uid (``cloneForCreate``)."""
    spec = JobSpec.from_body({**body, "metadata": {**body["metadata"], "namespace": namespace,
                                                   "uid": str(uuid.uuid4())}})
    workload = wl.build_workload(spec, Settings(), "user-queue")
    workload["metadata"] = {"name": name, "namespace": namespace,
                            "labels": {key: value for key, value in
                                       workload["metadata"]["labels"].items()
                                       if key != wl.LABEL_JOB_UID}}
    workload["spec"]["podSets"][0]["count"] += extra_workers
    return workload


def test_a_copy_waits_for_its_prebuilt_workload_then_adopts_it_and_runs(kubectl, worker_queue):
    namespace = worker_queue
    body = yaml.safe_load(job_manifest("copy", launcher={"command": ["true"]}))
    body["metadata"]["labels"] = {QUEUE_LABEL: "user-queue"}
    body["metadata"]["annotations"] = {PREBUILT: "copy-from-manager"}
    apply_manifest(kubectl, namespace, yaml.safe_dump(body))
    queued = wait_phase(kubectl, namespace, "copy", "Queued", timeout=60)
    assert condition(queued, "Queued")["reason"] == "Queued", queued
    assert "AwaitingWorkload" in queued["message"] and "copy-from-manager" in queued["message"]
    assert not workloads(kubectl, namespace) and not job_pods(kubectl, namespace, "copy")

    kueue_objects(kubectl, prebuilt_workload("copy-from-manager", namespace, body))
    done = wait_phase(kubectl, namespace, "copy", "Succeeded", timeout=120)
    job_uid = get_json(kubectl, "monarchjob", "copy", "-n", namespace)["metadata"]["uid"]
    [workload] = workloads(kubectl, namespace)  # adopted, never a second one
    assert workload["metadata"]["name"] == "copy-from-manager"
    assert [(ref["uid"], ref.get("controller")) for ref in
            workload["metadata"]["ownerReferences"]] == [(job_uid, True)]
    assert workload["metadata"]["labels"][wl.LABEL_JOB_UID] == job_uid
    finished = wait_until(lambda: wl_condition(workloads(kubectl, namespace)[0], "Finished")
                          or None, 30, "the Workload Finished")
    assert finished["reason"] == "Succeeded", finished
    # Finished only after the copy's own Succeeded was written (MultiKueue copies it then).
    assert done["phase"] == "Succeeded"
    wait_until(lambda: job_status(kubectl, namespace, "copy")["queue"].get("finished"), 30,
               "status.queue.finished")


def test_a_prebuilt_workload_out_of_sync_is_finished_and_nothing_runs(kubectl, worker_queue):
    namespace = worker_queue
    body = yaml.safe_load(job_manifest("drift", launcher={"command": ["true"]}))
    body["metadata"]["labels"] = {QUEUE_LABEL: "user-queue"}
    body["metadata"]["annotations"] = {PREBUILT: "drift-from-manager"}
    kueue_objects(kubectl, prebuilt_workload("drift-from-manager", namespace, body,
                                             extra_workers=1))
    apply_manifest(kubectl, namespace, yaml.safe_dump(body))
    finished = wait_until(lambda: wl_condition(workloads(kubectl, namespace)[0], "Finished")
                          or None, 60, "the out-of-sync Workload Finished")
    assert finished["reason"] == "OutOfSync", finished
    assert "workers x3" in finished["message"] and "workers x2" in finished["message"], finished
    # The pass that finished the Workload writes the job's status last: wait for it.
    queued = wait_phase(kubectl, namespace, "drift", "Queued", timeout=30)
    assert condition(queued, "Queued")["status"] == "True", queued
    assert not job_pods(kubectl, namespace, "drift")


# -- both clusters ------------------------------------------------------------------------------

def test_c37_dispatched_job_runs_on_the_worker_and_its_status_reaches_the_manager(
        kubectl, manager, pair):
    namespace, mk = pair, manager.kubectl
    apply_manifest(mk, namespace, dispatched_job(
        "demo", progress={"reportIntervalSeconds": 1},
        launcher={"command": ["python3", "-c", REPORTING_PROGRAM]}))
    [manager_workload] = wait_until(lambda: workloads(mk, namespace) or None, 30,
                                    "the manager's Workload")
    running = wait_until(lambda: (status := job_status(mk, namespace, "demo")).get(
        "phase") == "Running" and 0 < status.get("progress", {}).get("step", 0) < STEPS
        and status, 120, "Running with progress on the manager")
    assert running["readyWorkers"] == "2/2" and running["progress"]["totalSteps"] == STEPS, running
    table = mk("get", "monarchjobs", "demo", "-n", namespace)
    assert "Running" in table and "2/2" in table, table
    copy = worker_copy(kubectl, namespace, "demo")
    assert copy["metadata"]["annotations"][PREBUILT] == manager_workload["metadata"]["name"]
    assert "managedBy" not in copy["spec"]  # MultiKueue removes it: the worker runs the copy
    [worker_workload] = workloads(kubectl, namespace)
    assert worker_workload["metadata"]["ownerReferences"][0]["uid"] == copy["metadata"]["uid"]
    # The manager's operator made nothing but the Workload.
    assert not get_json(mk, "pods,statefulsets,configmaps,secrets", "-n", namespace,
                        "-l", "monarch-operator.dev/job=demo")["items"]

    done = wait_phase(mk, namespace, "demo", "Succeeded", timeout=120)
    assert done["progress"]["step"] == STEPS and done["progress"]["percent"] == "100%", done
    # MultiKueue copies the worker's status first and finishes the manager's Workload after.
    finished = wait_until(lambda: wl_condition(workloads(mk, namespace)[0], "Finished") or None,
                          30, "the manager's Workload Finished")
    assert finished["reason"] == "Succeeded", finished
    wait_until(lambda: worker_copy(kubectl, namespace, "demo") is None, 60,
               "the worker's copy deleted by MultiKueue")


def test_a_job_of_two_worker_groups_dispatches_whole_and_deleting_it_deletes_the_copy(
        kubectl, manager, pair):
    namespace, mk = pair, manager.kubectl
    body = yaml.safe_load(dispatched_job(
        "gone", launcher={"command": ["sh", "-c", "exec sleep 300"]},
        workerGroups=[{"name": "train", "replicas": 1, "gpusPerWorker": 2},
                      {"name": "gen", "replicas": 1, "gpusPerWorker": 1}],
        roles=[{"name": "trainer", "group": "train"}, {"name": "ref", "group": "gen"}]))
    del body["spec"]["workers"]
    apply_manifest(mk, namespace, yaml.safe_dump(body))
    running = wait_phase(kubectl, namespace, "gone", "Running", timeout=120)
    assert running["readyWorkers"] == "2/2", running
    [manager_workload] = workloads(mk, namespace)  # one Workload, a pod set per group
    assert [(p["name"], p["count"]) for p in manager_workload["spec"]["podSets"]] == [
        ("train", 1), ("gen", 1), ("launcher", 1)]
    assert len(workloads(kubectl, namespace)) == 1
    mk("delete", "monarchjob", "gone", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_until(lambda: worker_copy(kubectl, namespace, "gone") is None, 90,
               "the worker's copy deleted")
    wait_until(lambda: not job_pods(kubectl, namespace, "gone"), 60, "its pods gone")


def test_a_failing_job_shows_its_reason_and_exit_code_on_the_manager_then_its_ttl(
        kubectl, manager, pair):
    namespace, mk = pair, manager.kubectl
    apply_manifest(mk, namespace, dispatched_job(
        "boom", launcher={"command": ["sh", "-c", "echo boom; exit 3"]},
        runPolicy={"backoffLimit": 0}, ttlSecondsAfterFinished=10))
    failed = wait_phase(mk, namespace, "boom", "Failed", timeout=120)
    assert condition(failed, "Failed")["reason"] == "LauncherFailed", failed
    assert failed["attempts"][-1]["exitCode"] == 3 and "code 3" in failed["message"], failed
    # MultiKueue copies the status first, then finishes the manager's Workload.
    wait_until(lambda: wl_condition(workloads(mk, namespace)[0], "Finished").get(
        "reason") == "Failed", 30, "the manager's Workload Finished (Failed)")
    # The TTL counts from the completionTime the status brought from the worker.
    wait_until(lambda: get_json(mk, "monarchjob", "boom", "-n", namespace) is None, 60,
               "the manager's job deleted by its TTL")


def test_suspend_on_the_manager_gives_the_quota_back_and_resume_runs_it_again(
        kubectl, manager, pair):
    namespace, mk = pair, manager.kubectl
    apply_manifest(mk, namespace, dispatched_job(
        "pause", launcher={"command": ["sh", "-c", "exec sleep 12"]}))
    first = wait_phase(kubectl, namespace, "pause", "Running", timeout=120)
    first_uid = worker_copy(kubectl, namespace, "pause")["metadata"]["uid"]
    mk("patch", "monarchjob", "pause", "-n", namespace, "--type=merge",
       "-p", json.dumps({"spec": {"suspend": True}}))
    queued = wait_until(lambda: awaiting_dispatch(mk, namespace, "pause"), 60,
                        "Queued (AwaitingDispatch) on the manager")
    assert queued["message"].startswith("suspended; "), queued
    [workload] = workloads(mk, namespace)
    assert wl_condition(workload, "QuotaReserved").get("status") != "True", workload
    wait_until(lambda: worker_copy(kubectl, namespace, "pause") is None, 60,
               "the worker's copy deleted")
    assert first["attempt"] == 1

    mk("patch", "monarchjob", "pause", "-n", namespace, "--type=merge",
       "-p", json.dumps({"spec": {"suspend": False}}))
    wait_phase(mk, namespace, "pause", "Succeeded", timeout=150)
    second = worker_copy(kubectl, namespace, "pause")
    assert second is None or second["metadata"]["uid"] != first_uid


def test_c37_preempted_on_the_manager_the_program_checkpoints_and_the_next_dispatch_resumes(
        kubectl, manager, pair):
    """Issue 37 item 5: a dispatched job with a checkpoint grace period, preempted on the
    manager, keeps its quota there while MultiKueue has the worker's Kueue evict the copy; the
    worker's operator asks the launcher to stop first, the program saves and names its
    checkpoint, and only once the copied status shows that does the manager give the quota
    back (MultiKueue then deletes the copy). The next dispatch's launcher starts from it."""
    namespace, mk = pair, manager.kubectl
    with priority_classes(kubectl, namespace), priority_classes(mk, namespace):
        low = yaml.safe_load(dispatched_job(
            "low", workers={"replicas": 2, "gpusPerWorker": 2},
            runPolicy={"checkpointGracePeriodSeconds": 30},
            launcher={"command": ["python3", "-c",
                                  CHECKPOINTING_PROGRAM.replace("ckpt-demo", "mk-low")]}))
        low["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = f"low-{namespace}"
        apply_manifest(mk, namespace, yaml.safe_dump(low))
        wait_phase(kubectl, namespace, "low", "Running", timeout=120)
        first_uid = worker_copy(kubectl, namespace, "low")["metadata"]["uid"]
        wait_ready_for_a_stop(kubectl, namespace, "low-launcher")
        high = yaml.safe_load(dispatched_job(
            "high", workers={"replicas": 2, "gpusPerWorker": 1},
            launcher={"command": ["sh", "-c", "exit 0"]}))
        high["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = f"high-{namespace}"
        apply_manifest(mk, namespace, yaml.safe_dump(high))

        def launcher_terminating() -> dict[str, Any] | None:
            pod = get_json(kubectl, "pod", "low-launcher", "-n", namespace)
            return pod if pod and pod["metadata"].get("deletionTimestamp") else None

        launcher = wait_until(launcher_terminating, 60, "the worker's launcher asked to stop")
        assert launcher["metadata"]["deletionGracePeriodSeconds"] == 30, launcher["metadata"]
        # While it saves, the copy is the same and the manager still holds the quota.
        assert worker_copy(kubectl, namespace, "low")["metadata"]["uid"] == first_uid
        held = next(w for w in workloads(mk, namespace) if w["metadata"]["name"].startswith(
            "low-"))
        assert wl_condition(held, "Evicted").get("status") == "True", held["status"]
        assert wl_condition(held, "QuotaReserved").get("status") == "True", held["status"]

        queued = wait_until(lambda: awaiting_dispatch(mk, namespace, "low"), 90,
                            "low Queued (AwaitingDispatch) on the manager")
        ended = [record for record in queued["attempts"] if record.get("class")]
        assert ended[-1]["class"] == "Evicted", queued["attempts"]
        where = ended[-1]["checkpoint"]
        assert where.startswith("/ckpt/mk-low/step-"), ended
        assert queued["lastCheckpoint"]["location"] == where, queued
        job = get_json(mk, "monarchjob", "low", "-n", namespace)
        assert job["metadata"]["annotations"][constants.ANNOTATION_RESUME_CHECKPOINT] == where
        released = [event["message"] for event in get_json(
            mk, "events", "-n", namespace, "--field-selector", "involvedObject.name=low")["items"]
            if event.get("reason") == "QuotaReleased"]
        assert any(f"once the worker cluster's copy had stopped; checkpoint {where} kept"
                   in message for message in released), released

        wait_phase(mk, namespace, "high", "Succeeded", timeout=150)
        done = wait_phase(mk, namespace, "low", "Succeeded", timeout=150)
        # A new copy, attempt 1 there, its launcher given the checkpoint the first one saved.
        assert [record["number"] for record in done["attempts"]] == [1], done["attempts"]
        assert done["attempts"][0]["resumedFrom"] == where, done["attempts"]


def test_c37_a_lost_worker_turns_the_manager_job_back_to_awaiting_dispatch(
        kubectl, manager, pair):
    # Last in the module: the worker stays unreachable for the manager afterwards.
    namespace, mk = pair, manager.kubectl
    apply_manifest(mk, namespace, dispatched_job(
        "lost", launcher={"command": ["sh", "-c", "exec sleep 300"]}))
    wait_phase(mk, namespace, "lost", "Running", timeout=120)
    manager.proxy.close()  # the worker's API server unreachable for the manager
    queued = wait_until(lambda: awaiting_dispatch(mk, namespace, "lost"),
                        WORKER_LOST_TIMEOUT_SECONDS + 90,
                        "the manager's job Queued (AwaitingDispatch) after workerLostTimeout")
    assert "MultiKueue" in queued["message"], queued
