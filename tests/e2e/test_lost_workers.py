"""Worker and node loss on the real nodes, with the real launcher in the next attempt.

The first attempt's launcher sleeps; the second runs the built-in Monarch job, whose pre-flight
and ``SSHJob`` reach every worker by its name through cluster DNS (CoreDNS with ``cache 30``)
and over ssh. So a recreated worker whose name still resolves to its old address, or not yet at
all, would fail the second attempt; it must not (field case C20). The lost node is a real
node: every process of it is killed (kubelet, containerd, the pods), and the node-lifecycle
controller marks it NotReady.
"""

from __future__ import annotations

import time

import pytest
import yaml

from monarch_operator.localcluster import nodestate
from monarch_operator.localcluster.demo import SAMPLE, launcher_log
from tests.cluster.helpers import PodWatch, get_json, running_attempt, wait_phase, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

# The built-in job in attempt 2 and after; attempt 1 waits to be interrupted.
SLEEP_FIRST = ('if [ "$MONARCH_ATTEMPT" = 1 ]; then exec sleep 600; fi; '
               'exec monarch-launch --steps 1')
LOSS_TIMEOUT = 420
GRACE = {"terminationGracePeriodSeconds": 5}


def small_job(name: str, **run_policy: int) -> str:
    """The sample's image and meshes on 2 one-GPU workers (both fit on one real node)."""
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = name
    body["spec"]["workers"] = {"replicas": 2, "gpusPerWorker": 1, "template": {"spec": GRACE}}
    body["spec"]["meshes"] = {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}
    body["spec"]["launcher"] = {"command": ["sh", "-c", SLEEP_FIRST]}
    body["spec"]["runPolicy"] = run_policy
    return yaml.safe_dump(body)


def resolver_pod(kubectl, namespace: str, name: str, fqdn: str) -> None:
    """A pod that asks cluster DNS for ``fqdn`` every 0.5 s (so CoreDNS's cache always holds
    the latest answer: the old address, then the negative one), printing what it got."""
    kubectl("run", name, "-n", namespace, "--image=ghcr.io/monarch-operator/worker:0.1.0",
            "--restart=Never", "--command", "--", "sh", "-c",
            f'while :; do echo "$(date +%s.%N) $(getent hosts {fqdn} | cut -d" " -f1)"; '
            f"sleep 0.5; done")
    wait_until(lambda: (get_json(kubectl, "pod", name, "-n", namespace) or {}).get(
        "status", {}).get("phase") == "Running", 120, f"{name} Running")


def test_a_force_deleted_worker_is_reached_at_its_new_address_in_the_next_attempt(
        kubectl, namespace, local_cluster):
    """C20: worker-1 is force-deleted while attempt 1 runs; the StatefulSet recreates it with
    a new address while a pod keeps CoreDNS's cache warm with the old one. Attempt 2 starts,
    reaches every worker and Succeeds; the application budget (0) is never spent."""
    fqdn = f"c20-worker-1.c20-worker.{namespace}.svc.cluster.local"
    with PodWatch(kubectl, namespace, "c20") as watch:
        kubectl("apply", "-n", namespace, "-f", "-", stdin=small_job(
            "c20", backoffLimit=0, infrastructureBackoffLimit=2))
        running_attempt(kubectl, namespace, "c20", 1)
        old_ip = get_json(kubectl, "pod", "c20-worker-1", "-n", namespace)["status"]["podIP"]
        resolver_pod(kubectl, namespace, "resolver", fqdn)
        kubectl("delete", "pod", "c20-worker-1", "-n", namespace, "--grace-period=0",
                "--force")
        status = wait_phase(kubectl, namespace, "c20", "Succeeded", timeout=LOSS_TIMEOUT)
    log = launcher_log(kubectl, local_cluster.state_dir, namespace, "c20")
    answers = kubectl("logs", "resolver", "-n", namespace, check=False)
    first, second = status["attempts"][0], status["attempts"][-1]
    assert first["class"] == "Infrastructure" and first["lostWorkers"] == ["c20-worker-1"], first
    assert second["class"] == "Succeeded", (second, log[-3000:])
    assert "application" not in status.get("failureCounts", {}), status["failureCounts"]
    # Two pods of worker-1 ran: the force-deleted one and its replacement. (A pod object the
    # StatefulSet made and that vanished before its binding is no pod the job ran on.)
    assert watch.pods_bound()["c20-worker-1"] == 2, (watch.uids, watch.bound)
    assert watch.pods_bound()["c20-worker-0"] == 1, (watch.uids, watch.bound)
    new_ip = get_json(kubectl, "pod", "c20-worker-1", "-n", namespace)
    # The resolver saw the old address: the cache really was warm with it.
    assert f" {old_ip}" in answers, answers[-2000:]
    assert new_ip is None or new_ip["status"]["podIP"] != old_ip
    assert "monarch-launch: succeeded" in log, log[-3000:]


def test_a_real_nodes_loss_mid_run_restarts_on_the_other_node(kubectl, namespace,
                                                              local_cluster):
    """Every process of the node of worker-1 is killed mid-run (kubelet, containerd, its
    pods); once the node is NotReady the attempt ends Infrastructure, the lost pods are
    force-deleted after their grace period, the StatefulSet recreates them on the other node,
    and attempt 2 (the real launcher over ssh) Succeeds there while the node is still down."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=small_job(
        "nodeloss", backoffLimit=0, infrastructureBackoffLimit=2))
    running_attempt(kubectl, namespace, "nodeloss", 1)
    lost_node = get_json(kubectl, "pod", "nodeloss-worker-1", "-n",
                         namespace)["spec"]["nodeName"]
    started = time.monotonic()
    with local_cluster.node_lost(lost_node, nodestate.CRASH):
        status = wait_phase(kubectl, namespace, "nodeloss", "Succeeded", timeout=LOSS_TIMEOUT)
        recovered = time.monotonic() - started
        nodes = {pod["spec"]["nodeName"] for pod in get_json(
            kubectl, "pods", "-n", namespace, "-l",
            "monarch-operator.dev/job=nodeloss")["items"]}
    first, second = status["attempts"][0], status["attempts"][-1]
    assert (first["class"], first["reason"]) == ("Infrastructure", "WorkerEvicted"), first
    assert any(f"(node {lost_node} NotReady)" in first["message"]
               for _ in first["lostWorkers"]), first
    assert second["class"] == "Succeeded", second
    assert "application" not in status.get("failureCounts", {}), status["failureCounts"]
    assert lost_node not in nodes, nodes
    print(f"node {lost_node} lost: Succeeded on the other node {recovered:.0f} s later")

