"""Infrastructure failures the operator gets past on its own, on the real local control plane:
a worker container restarted in place (field case C8), a worker's node lost mid-run (its pod
recreated elsewhere, with and without budget), the running launcher's own node lost mid-run,
and a launcher pod of a failed attempt stuck on a lost node (force-deleted once its grace
period is long over, so the next attempt runs).

Nodes go down with ``LocalCluster.node_lost`` (kwok stops heartbeating them: NotReady after
about 20 s). Placement is pinned with node affinity so that the lost node holds exactly what a
test means to lose. Launchers are shell commands that hang in attempt 1 and succeed after.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from monarch_operator import constants
from monarch_operator.localcluster import nodestate
from tests.cluster.helpers import (
    PodWatch,
    apply_manifest,
    condition,
    get_json,
    job_manifest,
    job_pods,
    job_status,
    pod_condition,
    running_attempt,
    wait_phase,
    wait_until,
)

pytestmark = pytest.mark.cluster

# Runs until stopped in attempt 1, succeeds at once afterwards.
HANG_FIRST = ('if [ "$MONARCH_ATTEMPT" = 1 ]; then exec sleep 600; fi; '
              'echo "attempt $MONARCH_ATTEMPT"')
LAUNCHER_NODE = "kwok-gpu-0"
# Short grace periods: a pod on a lost node is force-deleted this + FORCE_DELETE_AFTER_SECONDS
# after its deletion, which keeps the tests short (the default is 30 s).
GRACE = {"terminationGracePeriodSeconds": 5}
# Long enough for a node to be noticed lost (~20 s), its pod's grace period, the force
# deletion and a new pod becoming Ready, on a loaded machine.
LOSS_TIMEOUT = 240


def on_nodes(operator: str, nodes: list[str]) -> dict:
    """A pod template ``spec`` with required node affinity on the node names (matchFields)."""
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": operator, "values": nodes}]}]}}}, **GRACE}


def prefer_node(node: str) -> dict:
    """A pod template ``spec`` preferring (not requiring) node ``node``: the scheduler puts the
    pod there while it is healthy and elsewhere once it is tainted."""
    return {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}}]}}, **GRACE}


def events(kubectl, namespace: str, name: str, reason: str) -> list[str]:
    """Messages of the job's Events with ``reason``."""
    listed = json.loads(kubectl("get", "events", "-n", namespace, "-o", "json",
                                "--field-selector", f"involvedObject.name={name},reason={reason}"))
    return [event.get("message", "") for event in listed["items"]]


def pod_node(kubectl, namespace: str, name: str) -> str:
    return get_json(kubectl, "pod", name, "-n", namespace)["spec"]["nodeName"]


def test_a_worker_container_restarted_in_place_is_an_infrastructure_failure(kubectl, namespace):
    """C8 in place: sshd (the worker container's main process) dies and the kubelet restarts
    the container; the pod stays (same uid), the attempt ends as WorkerRestarted on the
    infrastructure budget, and the next attempt runs on the same pods."""
    with PodWatch(kubectl, namespace, "inplace") as watch:
        apply_manifest(kubectl, namespace, job_manifest(
            "inplace", launcher={"command": ["sh", "-c", HANG_FIRST]}))
        running_attempt(kubectl, namespace, "inplace", 1)
        # sshd's pid file is in the entrypoint's state directory (the pod's runtime emptyDir).
        kubectl("exec", "inplace-worker-1", "-n", namespace, "--", "sh", "-c",
                f'kill "$(cat {constants.SSHD_STATE_DIR}/sshd.pid)"')
        status = wait_phase(kubectl, namespace, "inplace", "Succeeded", timeout=LOSS_TIMEOUT)

    first, second = status["attempts"]
    assert (first["class"], first["reason"]) == ("Infrastructure", "WorkerRestarted"), first
    assert first["lostWorkers"] == ["inplace-worker-1"]
    assert "inplace-worker-1 (container " in first["message"], first["message"]
    assert second["class"] == "Succeeded"
    assert status["failureCounts"] == {"infrastructure": 1}, "backoffLimit 0 was not spent"
    assert watch.pods_seen() == {"inplace-worker-0": 1, "inplace-worker-1": 1}, "pods kept"
    pod = get_json(kubectl, "pod", "inplace-worker-1", "-n", namespace)
    assert pod is None or pod["status"]["containerStatuses"][0]["restartCount"] >= 1


def test_a_workers_node_lost_mid_run_restarts_on_a_new_pod(kubectl, namespace, local_cluster):
    """The node of a worker goes silent mid-run: once the node is NotReady the attempt ends
    (Infrastructure, the application budget untouched), the operator deletes the lost pod and,
    since its node never confirms, force-deletes it after its grace period; the StatefulSet
    recreates it on a healthy node and the next attempt succeeds, all while the node is down."""
    watch = PodWatch(kubectl, namespace, "nodeloss")
    apply_manifest(kubectl, namespace, job_manifest(
        "nodeloss", launcher={"command": ["sh", "-c", HANG_FIRST],
                              "template": {"spec": on_nodes("In", [LAUNCHER_NODE])}},
        workers={"replicas": 2, "gpusPerWorker": 1,
                 "template": {"spec": on_nodes("NotIn", [LAUNCHER_NODE])}}))
    running_attempt(kubectl, namespace, "nodeloss", 1)
    lost_node = pod_node(kubectl, namespace, "nodeloss-worker-1")

    with watch, local_cluster.node_lost(lost_node, nodestate.CRASH):
        status = wait_phase(kubectl, namespace, "nodeloss", "Succeeded", timeout=LOSS_TIMEOUT)

    first, second = status["attempts"]
    assert (first["class"], first["reason"]) == ("Infrastructure", "WorkerEvicted"), first
    # The scheduler may have put both workers on the lost node: then whichever is seen not
    # Ready first ends the attempt, and the gate replaces the other (still one restart).
    assert any(f"{worker} (node {lost_node} NotReady)" in first["message"]
               for worker in first["lostWorkers"]), first
    assert second["class"] == "Succeeded"
    assert "nodeloss-worker-1" in second["forceDeletedPods"], second
    assert status["failureCounts"] == {"infrastructure": 1}, "backoffLimit 0 was not spent"
    # Recreated (a second pod of that name), on the one node neither lost nor excluded.
    assert watch.pods_seen()["nodeloss-worker-1"] == 2, watch.uids
    assert watch.nodes["nodeloss-worker-1"] - {lost_node} == {"kwok-gpu-1", "kwok-gpu-2"} - {
        lost_node}, watch.nodes
    forced = events(kubectl, namespace, "nodeloss", "PodForceDeleted")
    assert any(f"nodeloss-worker-1 on node {lost_node} (NotReady)" in message
               for message in forced), forced


def test_a_workers_node_lost_without_budget_fails_naming_it_and_every_pod_goes(
        kubectl, namespace, local_cluster):
    apply_manifest(kubectl, namespace, job_manifest(
        "nodenobudget", runPolicy={"infrastructureBackoffLimit": 0, "backoffLimit": 5},
        launcher={"command": ["sh", "-c", HANG_FIRST],
                  "template": {"spec": on_nodes("In", [LAUNCHER_NODE])}},
        workers={"replicas": 2, "gpusPerWorker": 1,
                 "template": {"spec": on_nodes("NotIn", [LAUNCHER_NODE])}}))
    running_attempt(kubectl, namespace, "nodenobudget", 1)
    lost_node = pod_node(kubectl, namespace, "nodenobudget-worker-0")

    with local_cluster.node_lost(lost_node, nodestate.CRASH):
        status = wait_phase(kubectl, namespace, "nodenobudget", "Failed", timeout=LOSS_TIMEOUT)
        # The pod on the lost node can only go by force deletion: the job lets go of it too.
        wait_until(lambda: not job_pods(kubectl, namespace, "nodenobudget"), LOSS_TIMEOUT,
                   "every pod of the failed job gone while its node is down")

    failed = condition(status, "Failed")
    assert failed["reason"] == "WorkerEvicted"
    assert f"nodenobudget-worker-0 (node {lost_node} NotReady)" in failed["message"], failed
    assert "infrastructureBackoffLimit" in failed["message"], failed["message"]
    assert status["attempts"][-1]["class"] == "Infrastructure"
    assert status.get("restartCount") == 0 and status.get("failureCounts", {}) == {}
    forced = events(kubectl, namespace, "nodenobudget", "PodForceDeleted")
    assert any("nodenobudget-worker-0" in message for message in forced), forced


def test_the_running_launchers_node_lost_ends_the_attempt_and_the_next_runs_elsewhere(
        kubectl, namespace, local_cluster):
    """The node of the running launcher crashes (its workers are elsewhere): once the node is
    NotReady and the node controller marks the launcher pod not Ready, the attempt ends as
    Infrastructure / LauncherLost naming the node, not 300 s later at the taint eviction. Its
    Job is deleted, its pod (Terminating for ever on the silent node) is force-deleted after
    its grace period, and attempt 2's launcher runs on another node and succeeds, all while
    the node is down."""
    apply_manifest(kubectl, namespace, job_manifest(
        "launcherloss", runPolicy={"infrastructureBackoffLimit": 1},
        launcher={"command": ["sh", "-c", HANG_FIRST],
                  "template": {"spec": prefer_node(LAUNCHER_NODE)}},
        workers={"replicas": 2, "gpusPerWorker": 1,
                 "template": {"spec": on_nodes("NotIn", [LAUNCHER_NODE])}}))
    running_attempt(kubectl, namespace, "launcherloss", 1)
    # Ready first: the node controller then marks it not Ready when the node is lost.
    [old_launcher] = wait_until(lambda: [
        pod for pod in job_pods(kubectl, namespace, "launcherloss")
        if pod["metadata"]["labels"]["monarch-operator.dev/role"] == "launcher"
        and pod_condition(pod) == "True"], 60, "attempt 1's launcher pod Ready")
    name, node = old_launcher["metadata"]["name"], old_launcher["spec"].get("nodeName")
    if node != LAUNCHER_NODE:
        pytest.fail(f"the scheduler put attempt 1's launcher {name} on {node}, not on the "
                    f"preferred {LAUNCHER_NODE}: this test cannot lose it with that node")

    lost_at = dt.datetime.now(dt.UTC)
    with local_cluster.node_lost(LAUNCHER_NODE, nodestate.CRASH):
        status = wait_phase(kubectl, namespace, "launcherloss", "Succeeded",
                            timeout=LOSS_TIMEOUT)
        gone = get_json(kubectl, "pod", name, "-n", namespace) is None

    first, second = status["attempts"]
    assert (first["class"], first["reason"]) == ("Infrastructure", "LauncherLost"), first
    assert first["message"] == (f"launcher pod {name} lost with its node {LAUNCHER_NODE} "
                                "(NotReady)"), first
    assert second["class"] == "Succeeded", second
    second_node = pod_node(kubectl, namespace, next(
        pod["metadata"]["name"] for pod in job_pods(kubectl, namespace, "launcherloss")
        if pod["metadata"]["labels"].get("monarch-operator.dev/attempt") == "2"))
    assert second_node != LAUNCHER_NODE, second_node
    forced = [*first.get("forceDeletedPods", []), *second.get("forceDeletedPods", [])]
    assert name in forced and gone, (forced, gone)
    assert any(f"{name} on node {LAUNCHER_NODE} (NotReady)" in message for message in
               events(kubectl, namespace, "launcherloss", "PodForceDeleted"))
    assert status["failureCounts"] == {"infrastructure": 1}, status.get("failureCounts")
    launched = dt.datetime.fromisoformat(second["launchTime"].replace("Z", "+00:00"))
    print(f"node {LAUNCHER_NODE} lost -> attempt 2's launcher started: "
          f"{(launched - lost_at).total_seconds():.0f}s")


def test_an_earlier_launcher_stuck_on_a_lost_node_does_not_block_the_next_attempt(
        kubectl, namespace, local_cluster):
    """The launcher's node is partitioned (its processes keep running, unseen): the attempt
    ends (the launcher lost with its node) and its launcher Job is deleted, but the launcher
    pod stays Terminating for as long as its node is away. The next attempt waits for it through its
    grace period, then force-deletes it (Warning PodForceDeleted, recorded in the attempt)
    and starts its own launcher, while the node is still down."""
    apply_manifest(kubectl, namespace, job_manifest(
        "stuck", launcher={"command": ["sh", "-c", HANG_FIRST],
                           "template": {"spec": on_nodes("In", ["kwok-gpu-2"])}},
        workers={"replicas": 2, "gpusPerWorker": 1,
                 "template": {"spec": on_nodes("NotIn", ["kwok-gpu-2"])}}))
    running_attempt(kubectl, namespace, "stuck", 1)
    [old_launcher] = [pod["metadata"]["name"] for pod in job_pods(kubectl, namespace, "stuck")
                      if pod["metadata"]["labels"]["monarch-operator.dev/role"] == "launcher"]

    with local_cluster.node_lost("kwok-gpu-2", nodestate.PARTITION):
        launched = wait_until(
            lambda: (status := job_status(kubectl, namespace, "stuck")).get("attempt") == 2
            and status["attempts"][-1].get("launchTime") and status, LOSS_TIMEOUT,
            "attempt 2's launcher started while the earlier one's node is down")
        assert get_json(kubectl, "pod", old_launcher, "-n", namespace) is None
        assert get_json(kubectl, "pod", "stuck-launcher-2", "-n", namespace) is not None
    # Attempt 2's launcher is pinned to the node too: it runs once the node is back.
    status = wait_phase(kubectl, namespace, "stuck", "Succeeded", timeout=LOSS_TIMEOUT)

    first, second = launched["attempts"]
    assert (first["class"], first["reason"]) == ("Infrastructure", "LauncherLost"), first
    assert second["forceDeletedPods"] == [old_launcher], second
    forced = events(kubectl, namespace, "stuck", "PodForceDeleted")
    assert any(f"{old_launcher} on node kwok-gpu-2 (NotReady)" in message
               for message in forced), forced
    assert [a["class"] for a in status["attempts"]] == ["Infrastructure", "Succeeded"]


def test_an_earlier_launcher_held_by_a_finalizer_does_not_block_the_next_attempt(kubectl,
                                                                                  namespace):
    """A finalizer nobody removes keeps the earlier attempt's launcher pod in the API after its
    Job is deleted. Its containers stop on a live node (phase final), or else it is
    force-deleted once overdue; either way the next attempt runs while the pod is still held."""
    apply_manifest(kubectl, namespace, job_manifest(
        "fin", launcher={"command": ["sh", "-c", HANG_FIRST], "template": {"spec": GRACE}}))
    running_attempt(kubectl, namespace, "fin", 1)
    [old_launcher] = [pod["metadata"]["name"] for pod in job_pods(kubectl, namespace, "fin")
                      if pod["metadata"]["labels"]["monarch-operator.dev/role"] == "launcher"]
    kubectl("patch", "pod", old_launcher, "-n", namespace, "--type=merge",
            "-p", '{"metadata": {"finalizers": ["example.com/hold"]}}')
    try:
        kubectl("delete", "pod", "fin-worker-1", "-n", namespace, "--wait=false")
        status = wait_phase(kubectl, namespace, "fin", "Succeeded", timeout=LOSS_TIMEOUT)
        held = get_json(kubectl, "pod", old_launcher, "-n", namespace)
    finally:
        kubectl("patch", "pod", old_launcher, "-n", namespace, "--type=json",
                "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]', check=False)

    assert held is not None and held["metadata"]["deletionTimestamp"], "still held"
    assert [a["class"] for a in status["attempts"]] == ["Infrastructure", "Succeeded"]
