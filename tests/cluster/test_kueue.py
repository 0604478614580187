"""MonarchJobs under a real Kueue (v0.19, built from the Go module proxy, ``kueue`` fixture):
one job is one Workload and one gang (field case C23), queued truthfully, admitted as a whole,
preempted without spending its restart budget, placed by its flavor's node labels; a namespace
with a default LocalQueue does not split a job; the Workload goes with its job.

Each test has its own ClusterQueue (``nvidia.com/gpu`` quota) selecting only its namespace.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.cluster.helpers import (
    CHECKPOINTING_PROGRAM,
    LABEL_JOB,
    PodWatch,
    condition,
    get_json,
    job_manifest,
    job_status,
    running_attempt,
    wait_phase,
    wait_ready_for_a_stop,
    wait_until,
)
from tests.cluster.helpers import apply_manifest as apply

pytestmark = pytest.mark.cluster

KUEUE = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GPU = "nvidia.com/gpu"


def kueue_objects(kubectl: Any, *objects: dict[str, Any]) -> None:
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                  "items": list(objects)}))


@pytest.fixture
def queue(kueue: Any, kubectl: Any, namespace: str) -> Iterator[dict[str, str]]:
    """ResourceFlavor, ClusterQueue (4 GPUs, lower priority preempted) for this namespace
    only, LocalQueue ``user-queue``; yields their names (the test may change the flavor)."""
    names = {"flavor": f"flavor-{namespace}", "cluster_queue": f"cq-{namespace}",
             "local_queue": "user-queue"}
    kueue_objects(kubectl, {
        "apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": names["flavor"]}},
        cluster_queue(names["cluster_queue"], names["flavor"], namespace, gpus=4), {
        "apiVersion": KUEUE, "kind": "LocalQueue",
        "metadata": {"name": names["local_queue"], "namespace": namespace},
        "spec": {"clusterQueue": names["cluster_queue"]}})
    try:
        yield names
    finally:
        kubectl("delete", "monarchjobs", "--all", "-n", namespace, "--wait=true",
                "--timeout=60s", check=False)
        kubectl("delete", "localqueues", "--all", "-n", namespace, check=False)
        kubectl("delete", "clusterqueue", names["cluster_queue"], "--wait=false", check=False)
        kubectl("delete", "resourceflavor", names["flavor"], "--wait=false", check=False)


def cluster_queue(name: str, flavor: str, namespace: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "preemption": {"withinClusterQueue": "LowerPriority"},
        "resourceGroups": [{"coveredResources": [GPU], "flavors": [{
            "name": flavor, "resources": [{"name": GPU, "nominalQuota": gpus}]}]}]}}


def queued_job(name: str, queue_name: str = "user-queue", labels: dict[str, str] | None = None,
               **spec: Any) -> str:
    """A job of 2 workers x 2 GPUs in ``queue_name`` (None: no queue label)."""
    body = yaml.safe_load(job_manifest(name, **{
        "workers": {"replicas": 2, "gpusPerWorker": 2},
        "launcher": {"command": ["sh", "-c", "exec sleep 300"]}, **spec}))
    body["metadata"]["labels"] = {**({QUEUE_LABEL: queue_name} if queue_name else {}),
                                  **(labels or {})}
    return yaml.safe_dump(body)


def workloads(kubectl: Any, namespace: str) -> list[dict[str, Any]]:
    return list(get_json(kubectl, "workloads.kueue.x-k8s.io", "-n", namespace)["items"])


def job_workload(kubectl: Any, namespace: str, job: str) -> dict[str, Any]:
    """The one Workload the job owns."""
    owned = [w for w in workloads(kubectl, namespace)
             if any(ref["kind"] == "MonarchJob" and ref["name"] == job
                    for ref in w["metadata"].get("ownerReferences") or [])]
    assert len(owned) == 1, [w["metadata"]["name"] for w in workloads(kubectl, namespace)]
    return owned[0]


def wl_condition(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (workload.get("status") or {}).get("conditions") or []
                 if c["type"] == kind), {})


# The queued job's startup timeout: the schema's minimum, so that waiting past it is short.
QUEUED_STARTUP_TIMEOUT = 10


def test_c23_second_job_queued_whole_until_the_first_finishes(kubectl, namespace, queue):
    apply(kubectl, namespace, queued_job("a"))
    running_attempt(kubectl, namespace, "a", 1)
    started = time.monotonic()
    with PodWatch(kubectl, namespace, "demo") as watch:
        apply(kubectl, namespace, queued_job("demo", startupTimeoutSeconds=QUEUED_STARTUP_TIMEOUT))
        status = wait_phase(kubectl, namespace, "demo", "Queued", timeout=60)
        queued_after = time.monotonic() - started
        # Longer than its startup timeout: queue time is not startup time.
        time.sleep(QUEUED_STARTUP_TIMEOUT + 5)
        status = job_status(kubectl, namespace, "demo")
        assert status["phase"] == "Queued", status
        assert "user-queue" in status["message"] and "insufficient" in status["message"], status
        assert not get_json(kubectl, "pods", "-n", namespace, "-l", f"{LABEL_JOB}=demo")["items"]
        assert watch.pods_seen() == {}  # never one of two
        # One Workload per job, none per pod: 2 workers (one pod set) and the launcher.
        assert sorted(w["metadata"]["name"] for w in workloads(kubectl, namespace)) == sorted(
            [job_workload(kubectl, namespace, "a")["metadata"]["name"],
             job_workload(kubectl, namespace, "demo")["metadata"]["name"]])
        pod_sets = job_workload(kubectl, namespace, "demo")["spec"]["podSets"]
        assert [(p["name"], p["count"]) for p in pod_sets] == [("workers", 2), ("launcher", 1)]
        worker_limits = pod_sets[0]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert worker_limits[GPU] == "2"
        kubectl("delete", "monarchjob", "a", "-n", namespace, "--wait=true")
        freed = time.monotonic()
        status = running_attempt(kubectl, namespace, "demo", 1)
        admitted_in = time.monotonic() - freed
    assert watch.pods_seen() == {"demo-worker-0": 1, "demo-worker-1": 1}
    assert status["queue"]["name"] == "user-queue"
    assert status["queue"]["queuedSeconds"] >= QUEUED_STARTUP_TIMEOUT + 5
    assert status["queue"]["admissions"] == 1 and status["restartCount"] == 0
    assert not any(a.get("reason") == "StartupTimeout" for a in status["attempts"])
    # The launcher needed no admission of its own: no pod carries Kueue's gate or label.
    for pod in get_json(kubectl, "pods", "-n", namespace, "-l", f"{LABEL_JOB}=demo")["items"]:
        assert QUEUE_LABEL not in pod["metadata"].get("labels", {}), pod["metadata"]
        assert not pod["spec"].get("schedulingGates"), pod["spec"]
    workload = job_workload(kubectl, namespace, "demo")
    wait_until(lambda: wl_condition(job_workload(kubectl, namespace, "demo"),
                                    "PodsReady").get("status") == "True", 30, "PodsReady")
    assert wl_condition(workload, "Admitted")["status"] == "True"
    # C23: a recreated worker runs within 30 s and attempt 2 runs.
    kubectl("delete", "pod", "demo-worker-1", "-n", namespace, "--wait=false")
    status = running_attempt(kubectl, namespace, "demo", 2)
    assert status["attempts"][0]["class"] == "Infrastructure"
    print(f"\n[kueue] demo Queued {queued_after:.1f}s after A ran; launcher running "
          f"{admitted_in:.1f}s after A was deleted")


@contextlib.contextmanager
def priority_classes(kubectl: Any, namespace: str) -> Iterator[None]:
    """WorkloadPriorityClasses ``low-<namespace>`` (10) and ``high-<namespace>`` (1000) for
    the block."""
    kueue_objects(kubectl, *({"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
                              "metadata": {"name": f"{level}-{namespace}"}, "value": value}
                             for level, value in (("low", 10), ("high", 1000))))
    try:
        yield
    finally:
        kubectl("delete", "workloadpriorityclass", f"low-{namespace}", f"high-{namespace}",
                check=False)


def test_higher_priority_preempts_without_spending_the_budget(kubectl, namespace, queue):
    with priority_classes(kubectl, namespace):
        apply(kubectl, namespace, queued_job(
            "low", labels={"kueue.x-k8s.io/priority-class": f"low-{namespace}"},
            runPolicy={"backoffLimit": 0, "infrastructureBackoffLimit": 0},
            launcher={"command": ["sh", "-c",
                                  'if [ "$MONARCH_ATTEMPT" = 1 ]; then exec sleep 300; fi; '
                                  "exec sleep 3"]}))
        running_attempt(kubectl, namespace, "low", 1)
        apply(kubectl, namespace, queued_job(
            "high", labels={"kueue.x-k8s.io/priority-class": f"high-{namespace}"}))
        evicted = wait_until(lambda: (s := job_status(kubectl, namespace, "low")).get(
            "phase") == "Queued" and s, 60, "low evicted and queued")
        running_attempt(kubectl, namespace, "high", 1)
        first = evicted["attempts"][0]
        assert first["class"] == "Evicted" and first["reason"] == "EvictedPreempted", first
        assert evicted["restartCount"] == 1 and not evicted.get("failureCounts"), evicted
        # The cause in words first (issue 32): whether still stopping or requeued already.
        assert condition(evicted, "Queued")["message"].startswith(
            ("preempted by Kueue", "requeued after attempt 1 was preempted by Kueue")), evicted
        assert "UID:" not in condition(evicted, "Queued")["message"], evicted
        assert not get_json(kubectl, "pods", "-n", namespace, "-l", f"{LABEL_JOB}=low")["items"]
        requeued = wl_condition(job_workload(kubectl, namespace, "low"), "Requeued")
        assert requeued.get("status") == "True", requeued
        # Back when the quota is free again: attempt 2 runs and succeeds, budget 0 untouched.
        kubectl("delete", "monarchjob", "high", "-n", namespace, "--wait=true")
        status = wait_phase(kubectl, namespace, "low", "Succeeded", timeout=120)
        assert status["attempt"] == 2 and status["queue"]["admissions"] == 2, status
        finished = wl_condition(job_workload(kubectl, namespace, "low"), "Finished")
        assert finished.get("status") == "True" and finished["reason"] == "Succeeded"


def test_flavor_node_label_reaches_the_pods(kubectl, namespace, queue):
    label = "monarch-operator.dev/test-pool"
    node = "kwok-gpu-1"
    kubectl("label", "node", node, f"{label}={namespace}", "--overwrite")
    try:
        kueue_objects(kubectl, {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                                "metadata": {"name": queue["flavor"]},
                                "spec": {"nodeLabels": {label: namespace}}})
        apply(kubectl, namespace, queued_job("placed"))
        running_attempt(kubectl, namespace, "placed", 1)
        workers = get_json(kubectl, "pods", "-n", namespace, "-l",
                           f"{LABEL_JOB}=placed,monarch-operator.dev/role=worker")["items"]
        assert len(workers) == 2
        for pod in workers:
            assert pod["spec"]["nodeSelector"].get(label) == namespace, pod["spec"]
            assert pod["spec"]["nodeName"] == node
        # The launcher requests no GPU: Kueue assigns its pod set no flavor, so no selector.
        assignments = job_workload(kubectl, namespace, "placed")["status"]["admission"][
            "podSetAssignments"]
        assert {a["name"]: a.get("flavors") for a in assignments}["workers"] == {
            GPU: queue["flavor"]}
        # The job's own spec is unchanged: admission is applied, never written back.
        body = get_json(kubectl, "monarchjob", "placed", "-n", namespace)
        assert "nodeSelector" not in json.dumps(body["spec"])
    finally:
        kubectl("label", "node", node, f"{label}-")


def test_default_local_queue_never_splits_a_job_and_workload_goes_with_it(
        kubectl, namespace, queue):
    kueue_objects(kubectl, {"apiVersion": KUEUE, "kind": "LocalQueue",
                            "metadata": {"name": "default", "namespace": namespace},
                            "spec": {"clusterQueue": queue["cluster_queue"]}})
    created = time.monotonic()
    apply(kubectl, namespace, queued_job("plain", queue_name=None))
    status = running_attempt(kubectl, namespace, "plain", 1)
    running_in = time.monotonic() - created
    assert status["queue"]["name"] == "default"
    workload = job_workload(kubectl, namespace, "plain")
    assert len(workloads(kubectl, namespace)) == 1  # none for the StatefulSet or the pods
    statefulset = get_json(kubectl, "statefulset", "plain-worker", "-n", namespace)
    assert QUEUE_LABEL not in statefulset["metadata"].get("labels", {})
    for pod in get_json(kubectl, "pods", "-n", namespace, "-l", f"{LABEL_JOB}=plain")["items"]:
        assert QUEUE_LABEL not in pod["metadata"].get("labels", {}), pod["metadata"]
        assert not pod["spec"].get("schedulingGates"), pod["spec"]
    admitted = wl_condition(workload, "Admitted")["lastTransitionTime"]
    print(f"\n[kueue] job created -> Workload {workload['metadata']['creationTimestamp']} -> "
          f"Admitted {admitted}; launcher running after {running_in:.1f}s")
    kubectl("delete", "monarchjob", "plain", "-n", namespace, "--wait=true")
    wait_until(lambda: not workloads(kubectl, namespace), 60, "the Workload garbage-collected")


def test_wait_for_pods_ready_timeout_evicts_and_requeues(kubectl, namespace, queue):
    # Workers that can never be scheduled: PodsReady stays False past Kueue's timeout.
    apply(kubectl, namespace, queued_job("stuck", workers={
        "replicas": 2, "gpusPerWorker": 2,
        "template": {"spec": {"nodeSelector": {"monarch-operator.dev/no-such-pool": "x"}}}}))
    wait_until(lambda: job_status(kubectl, namespace, "stuck").get("phase") == "Starting", 60,
               "stuck admitted and starting")
    evicted = wait_until(lambda: (s := job_status(kubectl, namespace, "stuck")).get(
        "phase") == "Queued" and s.get("attempt") == 2 and s, 30 + 90, "PodsReady timeout")
    first = evicted["attempts"][0]
    assert first["class"] == "Evicted" and first["reason"] == "EvictedPodsReadyTimeout", first
    assert not evicted.get("failureCounts"), evicted
    assert "its pods were not all ready within waitForPodsReady.timeout" in condition(
        evicted, "Queued")["message"], evicted
    wait_until(lambda: not get_json(kubectl, "pods", "-n", namespace, "-l",
                                    f"{LABEL_JOB}=stuck")["items"], 30, "stuck's pods gone")
    # Quota given back (Kueue requeues it after its back-off, 60 s at first).
    wait_until(lambda: "admission" not in job_workload(kubectl, namespace, "stuck")["status"],
               30, "quota given back")


def test_a_preempted_job_checkpoints_first_and_resumes_from_it(kubectl, namespace, queue):
    """Issue 21 item 4: preempted with runPolicy.checkpointGracePeriodSeconds, the running job's
    launcher is asked to stop first and saves its state while its workers (and quota) stay;
    requeued without spending its budget; re-admitted, it resumes from that checkpoint."""
    with priority_classes(kubectl, namespace):
        apply(kubectl, namespace, queued_job(
            "low", labels={"kueue.x-k8s.io/priority-class": f"low-{namespace}"},
            runPolicy={"backoffLimit": 0, "checkpointGracePeriodSeconds": 30},
            launcher={"command": ["python3", "-c",
                                  CHECKPOINTING_PROGRAM.replace("ckpt-demo", "low")]}))
        running_attempt(kubectl, namespace, "low", 1)
        wait_ready_for_a_stop(kubectl, namespace, "low-launcher")
        apply(kubectl, namespace, queued_job(
            "high", labels={"kueue.x-k8s.io/priority-class": f"high-{namespace}"}))
        asked = wait_until(lambda: (pod := get_json(kubectl, "pod", "low-launcher", "-n",
                                                    namespace)) and pod["metadata"].get(
            "deletionTimestamp") and pod, 60, "the low launcher asked to stop")
        assert asked["metadata"]["deletionGracePeriodSeconds"] == 30
        workers = get_json(kubectl, "pods", "-n", namespace, "-l",
                           f"{LABEL_JOB}=low,monarch-operator.dev/role=worker")["items"]
        assert len(workers) == 2, "the workers stay while the launcher saves its state"
        saved = wait_until(lambda: (s := job_status(kubectl, namespace, "low")).get(
            "lastCheckpoint") and s, 60, "low's checkpoint recorded")
        where = saved["lastCheckpoint"]["location"]
        assert where.startswith("/ckpt/low/step-"), saved["lastCheckpoint"]
        first = saved["attempts"][0]
        assert (first["class"], first["checkpoint"]) == ("Evicted", where), first
        # The attempt ended when its launcher did, after the stop was asked for (issue 32),
        # with the launcher's exit code (this program's own: it returns once it saved) and
        # its output.
        ended = wait_until(lambda: (s := job_status(kubectl, namespace, "low"))["attempts"][0]
                           .get("exitCode") is not None and s["attempts"][0], 30,
                           "the evicted attempt's exit code")
        assert ended["exitCode"] == 0 and ended.get("outputTail"), ended
        stop_asked = (dt.datetime.fromisoformat(
            asked["metadata"]["deletionTimestamp"].replace("Z", "+00:00"))
            - dt.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert ended["endTime"] >= stop_asked, (ended, stop_asked)
        running_attempt(kubectl, namespace, "high", 1)
        kubectl("delete", "monarchjob", "high", "-n", namespace, "--wait=true")
        done = wait_phase(kubectl, namespace, "low", "Succeeded", timeout=120)
        assert done["attempt"] == 2 and not done.get("failureCounts"), done
        log = kubectl("logs", "low-launcher-2", "-n", namespace)
        assert f"resumed from {where}" in log, log


def test_a_spec_fixed_while_queued_is_what_kueue_admits(kubectl, namespace, queue):
    """2 workers x 4 GPUs can never fit the ClusterQueue's 4: the job waits, Kueue saying
    why. Suspended, lowered to 1 GPU per worker (the spec is editable only while suspended)
    and resumed, its Workload is replaced (Kueue's own integrations do the same with a
    Workload that no longer matches its job) and the job is admitted as it now is."""
    apply(kubectl, namespace, queued_job("big", workers={"replicas": 2, "gpusPerWorker": 4},
                                         launcher={"command": ["sh", "-c", "exit 0"]}))
    status = wait_until(lambda: (s := job_status(kubectl, namespace, "big")).get(
        "phase") == "Queued" and "insufficient" in s.get("message", "") and s, 60,
        "big Queued for quota")
    old = job_workload(kubectl, namespace, "big")["metadata"]["uid"]
    kubectl("patch", "monarchjob", "big", "-n", namespace, "--type=merge",
            "-p", '{"spec": {"suspend": true, "workers": {"gpusPerWorker": 1}}}')
    wait_phase(kubectl, namespace, "big", "Suspended", timeout=60)
    kubectl("patch", "monarchjob", "big", "-n", namespace, "--type=merge",
            "-p", '{"spec": {"suspend": false}}')
    done = wait_phase(kubectl, namespace, "big", "Succeeded", timeout=120)
    workload = job_workload(kubectl, namespace, "big")
    assert workload["metadata"]["uid"] != old
    limits = workload["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]
    assert limits["limits"][GPU] == "1"
    assert done["restartCount"] == 0 and done["queue"]["admissions"] == 1, done
    events = kubectl("get", "events", "-n", namespace, "--field-selector",
                     "involvedObject.name=big", "-o", "jsonpath={.items[*].reason}")
    assert "WorkloadReplaced" in events.split(), events
    assert status["queue"]["name"] == "user-queue"


def test_topology_aware_scheduling_puts_the_workers_in_the_domain_kueue_chose(
        kubectl, namespace, queue):
    """The flavor has a Topology (one level: the node); the workers' template asks for one
    node for all of them (``podset-required-topology``). Kueue assigns a node; the pods are
    created gated, Kueue's TAS ungater pins each to that node and removes the gate, and the
    job runs there."""
    hostname = "kubernetes.io/hostname"
    topology = f"topo-{namespace}"
    kueue_objects(kubectl, {"apiVersion": KUEUE, "kind": "Topology",
                            "metadata": {"name": topology},
                            "spec": {"levels": [{"nodeLabel": hostname}]}})
    try:
        # Every flavor has a topology: every pod set is placed by it, so the launcher needs a
        # covered resource to get a flavor (the Queued message says so otherwise).
        tas_queue = cluster_queue(queue["cluster_queue"], queue["flavor"], namespace, gpus=4)
        group = tas_queue["spec"]["resourceGroups"][0]
        group["coveredResources"] = ["cpu", GPU]
        group["flavors"][0]["resources"].insert(0, {"name": "cpu", "nominalQuota": "4"})
        kueue_objects(kubectl, {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                                "metadata": {"name": queue["flavor"]},
                                "spec": {"nodeLabels": {"type": "kwok"},
                                         "topologyName": topology}}, tas_queue)
        apply(kubectl, namespace, queued_job("tas", workers={
            "replicas": 2, "gpusPerWorker": 2, "template": {"metadata": {"annotations": {
                "kueue.x-k8s.io/podset-required-topology": hostname}}}},
            launcher={"command": ["sh", "-c", "exec sleep 300"], "template": {"spec": {
                "containers": [{"name": "launcher",
                                "resources": {"requests": {"cpu": "100m"}}}]}}}))
        try:
            running_attempt(kubectl, namespace, "tas", 1)
        except AssertionError as error:
            raise AssertionError(
                f"{error}; job {job_status(kubectl, namespace, 'tas')}; workload "
                f"{job_workload(kubectl, namespace, 'tas').get('status')}; pods "
                f"{kubectl('get', 'pods', '-n', namespace, '-o', 'yaml')[-3000:]}") from None
        workload = job_workload(kubectl, namespace, "tas")
        assert workload["spec"]["podSets"][0]["topologyRequest"] == {
            "required": hostname, "podIndexLabel": "apps.kubernetes.io/pod-index"}
        assignment = {a["name"]: a for a in workload["status"]["admission"][
            "podSetAssignments"]}["workers"]
        chosen = assignment["topologyAssignment"]
        workers = get_json(kubectl, "pods", "-n", namespace, "-l",
                           f"{LABEL_JOB}=tas,monarch-operator.dev/role=worker")["items"]
        nodes = {pod["spec"]["nodeName"] for pod in workers}
        assert len(workers) == 2 and len(nodes) == 1, (nodes, chosen)
        node = nodes.pop()
        assert node in json.dumps(chosen), chosen
        for pod in workers:
            assert pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "workers"
            assert pod["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == \
                workload["metadata"]["name"]
            assert pod["spec"]["nodeSelector"].get(hostname) == node, pod["spec"]
            assert not pod["spec"].get("schedulingGates"), pod["spec"]  # ungated by Kueue
    finally:
        kubectl("delete", "monarchjobs", "--all", "-n", namespace, "--wait=true",
                "--timeout=60s", check=False)
        kubectl("delete", "topology", topology, "--wait=false", check=False)


def _grouped_job(name: str, reward_selector: dict[str, str]) -> str:
    """Generator (2 x 2 GPUs) and trainer (1 x 2 GPUs) groups and a CPU-only reward group
    (1 cpu) with its own node selector; simulated pods (docs/roles.md)."""
    simulate = {"metadata": {"labels": {"localcluster.monarch-operator.dev/simulate": "ready"}}}
    body = yaml.safe_load(job_manifest(name, launcher={"command": ["sh", "-c", "exit 7"],
                                                       "template": simulate}))
    del body["spec"]["workers"], body["spec"]["meshes"]
    body["spec"]["workers"] = {"template": simulate}
    body["spec"]["workerGroups"] = [
        {"name": "generator", "replicas": 2, "gpusPerWorker": 2},
        {"name": "trainer", "replicas": 1, "gpusPerWorker": 2},
        {"name": "reward", "replicas": 1, "gpusPerWorker": 0, "template": {"spec": {
            "nodeSelector": reward_selector,
            "containers": [{"name": "worker", "resources": {"requests": {"cpu": "1"}}}]}}}]
    body["spec"]["roles"] = [{"name": "generator", "group": "generator"},
                             {"name": "trainer", "group": "trainer"},
                             {"name": "reward", "group": "reward"}]
    body["metadata"]["labels"] = {QUEUE_LABEL: "user-queue"}
    return yaml.safe_dump(body)


def test_c31_each_worker_group_keeps_its_own_flavor(kubectl, namespace, queue):
    pool, zone = "monarch-operator.dev/test-pool", "monarch-operator.dev/test-zone"
    gpu_node, cpu_node = "kwok-gpu-1", "kwok-gpu-2"
    cpu_flavor = f"cpu-{namespace}"
    kubectl("label", "node", gpu_node, f"{pool}=gpu-{namespace}", "--overwrite")
    kubectl("label", "node", cpu_node, f"{pool}=cpu-{namespace}", f"{zone}=z1", "--overwrite")
    try:
        kueue_objects(kubectl, {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                                "metadata": {"name": queue["flavor"]},
                                "spec": {"nodeLabels": {pool: f"gpu-{namespace}"}}},
                      {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                       "metadata": {"name": cpu_flavor},
                       "spec": {"nodeLabels": {pool: f"cpu-{namespace}"}}})
        two_flavors = cluster_queue(queue["cluster_queue"], queue["flavor"], namespace, gpus=8)
        two_flavors["spec"]["resourceGroups"].append({"coveredResources": ["cpu"], "flavors": [
            {"name": cpu_flavor, "resources": [{"name": "cpu", "nominalQuota": 4}]}]})
        kueue_objects(kubectl, two_flavors)
        apply(kubectl, namespace, _grouped_job("grouped", {zone: "z1"}))
        wait_until(lambda: job_status(kubectl, namespace, "grouped").get("readyWorkers")
                   == "4/4", 120, "grouped: 4/4 workers Ready")
        pod_sets = job_workload(kubectl, namespace, "grouped")["spec"]["podSets"]
        assert [(p["name"], p["count"]) for p in pod_sets] == [
            ("generator", 2), ("trainer", 1), ("reward", 1), ("launcher", 1)]
        workers = get_json(kubectl, "pods", "-n", namespace, "-l",
                           f"{LABEL_JOB}=grouped,monarch-operator.dev/role=worker")["items"]
        placed = {pod["metadata"]["name"]: (pod["spec"]["nodeSelector"], pod["spec"]["nodeName"])
                  for pod in workers}
        gpu_pool = {pool: f"gpu-{namespace}"}
        assert placed == {"grouped-generator-0": (gpu_pool, gpu_node),
                          "grouped-generator-1": (gpu_pool, gpu_node),
                          "grouped-trainer-0": (gpu_pool, gpu_node),
                          "grouped-reward-0": ({pool: f"cpu-{namespace}", zone: "z1"},
                                               cpu_node)}
        kubectl("delete", "monarchjob", "grouped", "-n", namespace, "--wait=true")
        # A group whose own selector contradicts its flavor runs nowhere: the job fails.
        apply(kubectl, namespace, _grouped_job("contradicts", {pool: "gpu-b"}))
        def settled() -> dict[str, Any] | None:
            status = job_status(kubectl, namespace, "contradicts")
            if status.get("phase") == "Failed" or (
                    status.get("phase") == "Queued" and "reward" in status.get("message", "")):
                return status
            return None
        status = wait_until(settled, 90, "contradicts: Failed, or Queued naming group reward")
        # Kueue finds no flavor for it and keeps it queued (had it admitted it, the operator
        # would fail the job with the same words); the message names group, key and values.
        message = condition(status, status["phase"])["message"]
        assert "'reward'" in message and f"{pool}=gpu-b" in message, message
        assert f"{pool}=cpu-{namespace}" in message, message
        assert not get_json(kubectl, "pods", "-n", namespace, "-l",
                            f"{LABEL_JOB}=contradicts")["items"]
    finally:
        kubectl("label", "node", gpu_node, f"{pool}-")
        kubectl("label", "node", cpu_node, f"{pool}-", f"{zone}-")
        kubectl("delete", "resourceflavor", cpu_flavor, "--wait=false", check=False)


def test_a_roles_job_waits_whole_and_is_admitted_whole(kubectl, namespace, queue):
    """Generator 2 x 2 GPUs, trainer 1 x 2 GPUs and a CPU-only reward worker: 6 GPUs, over the
    ClusterQueue's 4. Queued, no group gets a StatefulSet or a pod; its Workload has one pod
    set per group (its count and GPUs) and the launcher's. The quota raised to 6, Kueue admits
    it whole and every group gets its StatefulSet and its pods at once."""
    body = yaml.safe_load(_grouped_job("gang", {}))
    del body["spec"]["workerGroups"][2]["template"]  # no cpu request: the queue covers GPUs
    with PodWatch(kubectl, namespace, "gang") as watch:
        apply(kubectl, namespace, yaml.safe_dump(body))
        status = wait_until(lambda: (s := job_status(kubectl, namespace, "gang")).get(
            "phase") == "Queued" and "insufficient" in s.get("message", "") and s, 60,
            "gang Queued for quota")
        time.sleep(5)  # a pass or two later, still nothing of any group
        assert job_status(kubectl, namespace, "gang")["phase"] == "Queued"
        assert not get_json(kubectl, "statefulsets", "-n", namespace)["items"]
        assert not get_json(kubectl, "pods", "-n", namespace, "-l", f"{LABEL_JOB}=gang")["items"]
        assert watch.pods_seen() == {}
        pod_sets = job_workload(kubectl, namespace, "gang")["spec"]["podSets"]
        limits = {p["name"]: (p["count"], p["template"]["spec"]["containers"][0].get(
            "resources", {}).get("limits", {}).get(GPU)) for p in pod_sets}
        assert [p["name"] for p in pod_sets] == ["generator", "trainer", "reward", "launcher"]
        assert limits == {"generator": (2, "2"), "trainer": (1, "2"), "reward": (1, None),
                          "launcher": (1, None)}, limits

        kueue_objects(kubectl, cluster_queue(queue["cluster_queue"], queue["flavor"],
                                             namespace, gpus=6))
        wait_until(lambda: job_status(kubectl, namespace, "gang").get("readyWorkers")
                   == "4/4", 90, "gang admitted: 4/4 workers Ready")
        sets = {s["metadata"]["name"]: s["spec"]["replicas"]
                for s in get_json(kubectl, "statefulsets", "-n", namespace)["items"]}
        assert sets == {"gang-generator": 2, "gang-trainer": 1, "gang-reward": 1}, sets
        assert watch.pods_seen() == {"gang-generator-0": 1, "gang-generator-1": 1,
                                     "gang-trainer-0": 1, "gang-reward-0": 1}
    workload = job_workload(kubectl, namespace, "gang")
    assert wl_condition(workload, "Admitted")["status"] == "True"
    assigned = {a["name"]: a["count"] for a in workload["status"]["admission"][
        "podSetAssignments"]}
    assert assigned == {"generator": 2, "trainer": 1, "reward": 1, "launcher": 1}, assigned
    status = job_status(kubectl, namespace, "gang")
    assert status["queue"]["name"] == "user-queue" and status["queue"]["admissions"] == 1
