"""Node loss on the local control plane (``LocalCluster.node_down``/``node_up``,
``monarch-localcluster node down|up``): the node's kubelet goes silent, the node-lifecycle
controller marks the node ``Ready=Unknown``, taints it unreachable and its pods not Ready; a pod
deleted meanwhile stays Terminating until the node is back (or it is force-deleted); after
``node up`` the node is Ready again and the deletion completes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from monarch_operator.localcluster import nodestate
from monarch_operator.localcluster.cli import pod_log_path
from tests.cluster.helpers import pod_condition, read_pod, start_pod, wait_until

pytestmark = pytest.mark.cluster

LOST_NODE = "kwok-gpu-2"
OTHER_NODE = "kwok-gpu-0"
# Prints its pid ("$$$$": "$$" after the kubelet's $(VAR) expansion), then a line per 0.2 s.
TICKER = 'echo "pid $$$$"; while :; do echo tick; sleep 0.2; done'


def start_ticker(core, namespace: str, name: str, node: str) -> dict:
    """A pod on ``node`` that runs ``TICKER``; returned once it is Ready."""
    return start_pod(core, namespace, name, TICKER, ready=True, nodeName=node,
                     terminationGracePeriodSeconds=5)


def main_pid(local_cluster, namespace: str, name: str) -> int:
    path = pod_log_path(local_cluster.state_dir, namespace, name, "main")
    assert path is not None
    first = wait_until(lambda: path.read_text().split("\n", 1)[0], 10, "the pid line")
    return int(first.split()[1])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def ticks(local_cluster, namespace: str, name: str) -> int:
    path = pod_log_path(local_cluster.state_dir, namespace, name, "main")
    assert path is not None
    return path.read_text().count("tick")


def test_crashed_node_goes_unknown_and_its_deleted_pod_stays_terminating(core, namespace,
                                                                         local_cluster):
    start_ticker(core, namespace, "on-lost-node", LOST_NODE)
    start_ticker(core, namespace, "on-other-node", OTHER_NODE)
    pid = main_pid(local_cluster, namespace, "on-lost-node")
    with local_cluster.node_lost(LOST_NODE, nodestate.CRASH):
        node = core.api_client.sanitize_for_serialization(core.read_node(LOST_NODE))
        ready = nodestate.condition(node)
        assert (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown"), ready
        assert not alive(pid), "a crashed node's processes are gone"
        wait_until(lambda: {t.key for t in core.read_node(LOST_NODE).spec.taints or []}
                   >= {"node.kubernetes.io/unreachable"}, 30, "the unreachable taint")
        wait_until(lambda: pod_condition(read_pod(core, namespace, "on-lost-node")) == "False",
                   30, "the lost node's pod not Ready")
        # Deleting both: the pod on the healthy node goes, the other stays Terminating.
        core.delete_namespaced_pod("on-lost-node", namespace)
        core.delete_namespaced_pod("on-other-node", namespace)
        wait_until(lambda: read_pod(core, namespace, "on-other-node") is None, 60,
                   "the pod on the healthy node deleted")
        stuck = read_pod(core, namespace, "on-lost-node")
        assert stuck is not None and stuck["metadata"]["deletionTimestamp"]
        assert pod_condition(stuck) == "False"
    # node_lost waited for Ready=True without taints; the deletion completes now.
    wait_until(lambda: read_pod(core, namespace, "on-lost-node") is None, 60,
               "the lost node's pod deleted after node up")


def test_partitioned_node_keeps_pods_running_until_it_is_back(core, namespace, local_cluster):
    """A force-deleted pod of a partitioned node keeps running there (nobody can tell its
    kubelet); once the node is back, the kubelet stops it."""
    start_ticker(core, namespace, "partitioned", LOST_NODE)
    pid = main_pid(local_cluster, namespace, "partitioned")
    with local_cluster.node_lost(LOST_NODE, nodestate.PARTITION):
        wait_until(lambda: pod_condition(read_pod(core, namespace, "partitioned")) == "False",
                   30, "the partitioned node's pod not Ready")
        core.delete_namespaced_pod("partitioned", namespace, grace_period_seconds=0)
        assert read_pod(core, namespace, "partitioned") is None
        before = ticks(local_cluster, namespace, "partitioned")
        wait_until(lambda: ticks(local_cluster, namespace, "partitioned") > before + 3, 30,
                   "the force-deleted pod still running on the partitioned node")
        assert alive(pid)
    wait_until(lambda: not alive(pid), 60, "the pod's process stopped after node up")
    agent_log = (local_cluster.state_dir / "logs" / "agent.log").read_text()
    assert f"terminating {namespace}/partitioned (gone from the API)" in agent_log


def test_node_down_and_up_from_the_command_line(core, local_cluster):
    """``monarch-localcluster node down|up``: a missing node is an error naming it; down
    labels the node (kwok lets go of it), up brings it back Ready (waiting by default)."""
    env = {**os.environ, "MONARCH_LOCALCLUSTER_DIR": str(local_cluster.state_dir)}
    command = [sys.executable, "-m", "monarch_operator.localcluster.cli", "node"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], env=env, capture_output=True, text=True,
                              check=False, timeout=120)

    bad = cli("down", "no-such-node", "--no-wait")
    assert bad.returncode == 1 and 'nodes "no-such-node" not found' in bad.stderr, bad.stderr
    try:
        down = cli("down", LOST_NODE, "--partition", "--no-wait")
        assert down.returncode == 0, down.stderr
        labels = core.read_node(LOST_NODE).metadata.labels
        assert labels[nodestate.LABEL_NODE_DOWN] == nodestate.PARTITION
    finally:
        up = cli("up", LOST_NODE)
    assert up.returncode == 0, up.stderr
    assert up.stdout.splitlines()[-1] == f"node {LOST_NODE}: Ready=True"
    assert nodestate.LABEL_NODE_DOWN not in core.read_node(LOST_NODE).metadata.labels


def test_a_heartbeat_keeps_the_ready_conditions_transition_time(core):
    """As a kubelet's node status update does: the operator tells a node that came back from
    one that was Ready all along by when its Ready condition last changed (chaos soak: with
    every heartbeat moving it, healthy nodes looked just back)."""
    def ready() -> dict:
        return nodestate.condition(core.api_client.sanitize_for_serialization(
            core.read_node(OTHER_NODE)))

    before = ready()

    def after_a_heartbeat() -> dict | None:
        now = ready()
        return now if now["lastHeartbeatTime"] != before["lastHeartbeatTime"] else None

    after = wait_until(after_a_heartbeat, 70, f"a heartbeat of {OTHER_NODE}")
    assert after["status"] == "True", after
    assert after["lastTransitionTime"] == before["lastTransitionTime"], (before, after)
