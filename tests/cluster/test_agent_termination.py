"""The node agent ends deleted pods as a kubelet does: the preStop exec hook, SIGTERM to the
main process, SIGKILL once the grace period (``deletionGracePeriodSeconds``, else
``terminationGracePeriodSeconds``) is over; the pod stays Terminating until then, and its final
status (exit codes) is written before the object goes. Order of events, never wall-clock bounds."""

from __future__ import annotations

import re

import kubernetes
import pytest

from monarch_operator.localcluster import agent
from monarch_operator.localcluster.cli import pod_log_path
from tests.cluster.helpers import read_pod, start_pod, wait_until

pytestmark = pytest.mark.cluster

# Prints "started", then loops; the TERM trap is the test's.
LOOP = 'echo started; sleep 1000 & wait $!; while :; do sleep 0.2; done'


def events_until_gone(core, namespace: str, name: str, resource_version: str,
                      timeout: int = 90) -> list[tuple[str, dict]]:
    """Watch events of the pod from ``resource_version`` until it is deleted: (type, pod)."""
    events = []
    watch = kubernetes.watch.Watch()
    for event in watch.stream(core.list_namespaced_pod, namespace,
                              field_selector=f"metadata.name={name}",
                              resource_version=resource_version, timeout_seconds=timeout):
        events.append((event["type"], event["raw_object"]))
        if event["type"] == "DELETED":
            watch.stop()
    assert events and events[-1][0] == "DELETED", f"pod {name} not deleted: {events[-1:]}"
    return events


def main_state(pod: dict) -> dict:
    (status,) = pod["status"]["containerStatuses"]
    return status["state"]


def agent_lines(local_cluster, namespace: str, name: str) -> list[str]:
    text = (local_cluster.state_dir / "logs" / "agent.log").read_text(errors="replace")
    return [line for line in text.splitlines() if f"{namespace}/{name}" in line]


def container_log(local_cluster, namespace: str, name: str) -> str:
    path = pod_log_path(local_cluster.state_dir, namespace, name, "main")
    assert path is not None, f"no log for {namespace}/{name}"
    return path.read_text(errors="replace")


def test_sigterm_after_prestop_hook_trap_output_in_log(core, namespace, local_cluster):
    """The preStop hook runs in the container first, then the main process gets SIGTERM and its
    trap runs (its output in the container's log); the pod is Terminating with the container
    still running meanwhile, and goes with its final status (exit 0, Completed)."""
    trap = ("trap 'echo got SIGTERM after: $(cat /work/events); exit 0' TERM; " + LOOP)
    pod = start_pod(core, namespace, "trapper", trap,
                    volumes=[{"name": "work", "emptyDir": {}}],
                    container={"volumeMounts": [{"name": "work", "mountPath": "/work"}],
                               "lifecycle": {"preStop": {"exec": {"command": [
                                   "sh", "-c", "echo prestop-in-$(hostname) >> /work/events"]}}}})
    core.delete_namespaced_pod("trapper", namespace)  # default grace period: 30 s
    events = events_until_gone(core, namespace, "trapper", pod["metadata"]["resourceVersion"])
    terminating = [p for kind, p in events if kind == "MODIFIED"
                   and p["metadata"].get("deletionTimestamp")]
    assert terminating and terminating[0]["metadata"]["deletionGracePeriodSeconds"] == 30
    assert "running" in main_state(terminating[0]), "Terminating while the container runs"
    final = events[-1][1]
    terminated = main_state(final)["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed"), final["status"]
    assert final["status"]["phase"] == "Succeeded"
    log = container_log(local_cluster, namespace, "trapper")
    assert log.splitlines() == ["started", "got SIGTERM after: prestop-in-trapper"], log
    lines = agent_lines(local_cluster, namespace, "trapper")
    assert any("grace period 30s" in line for line in lines), lines
    assert not any("grace period over" in line for line in lines), lines


def test_ignored_sigterm_is_sigkilled_after_the_grace_period(core, namespace, local_cluster):
    """``kubectl delete --grace-period=2`` (deletionGracePeriodSeconds) wins over the spec's 30 s:
    the container that ignores SIGTERM gets it, then SIGKILL: exit code 137."""
    pod = start_pod(core, namespace, "stubborn", "trap 'echo ignoring SIGTERM' TERM; " + LOOP,
                    terminationGracePeriodSeconds=30)
    core.delete_namespaced_pod("stubborn", namespace, grace_period_seconds=2)
    events = events_until_gone(core, namespace, "stubborn", pod["metadata"]["resourceVersion"])
    terminated = main_state(events[-1][1])["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "Error"), terminated
    assert events[-1][1]["status"]["phase"] == "Failed"
    assert "ignoring SIGTERM" in container_log(local_cluster, namespace, "stubborn")
    lines = agent_lines(local_cluster, namespace, "stubborn")
    steps = [next((i for i, line in enumerate(lines) if step in line), -1)
             for step in ("grace period 2s", "SIGTERM to the main process",
                          "grace period over: SIGKILL", "exited with 137")]
    assert -1 not in steps and steps == sorted(steps), lines


def test_force_deletion_still_stops_the_container(core, namespace, local_cluster):
    """``--force --grace-period=0``: the object goes at once; the node still stops the
    container, SIGTERM then SIGKILL after the runtime's minimum of 2 s."""
    start_pod(core, namespace, "forced", "trap 'echo ignoring SIGTERM' TERM; " + LOOP)
    core.delete_namespaced_pod("forced", namespace, grace_period_seconds=0)
    with pytest.raises(kubernetes.client.ApiException) as gone:
        core.read_namespaced_pod("forced", namespace)
    assert gone.value.status == 404

    def stopped():
        lines = agent_lines(local_cluster, namespace, "forced")
        return lines if any("exited with" in line for line in lines) else None

    lines = wait_until(stopped, 60, "the forced pod's container stopped")
    # The agent's watch sees the pod marked for deletion (grace period 1 s) in the same request
    # that removes it, as a kubelet's does, or only its removal ("gone from the API").
    assert any(re.search(r"terminating \S+/forced \((deleted|gone from the API)\)", line)
               for line in lines), lines
    assert any("SIGKILL in 2.0s" in line for line in lines), "the runtime's minimum: 2 s"
    assert any(re.search(r"container main exited with 137\b", line) for line in lines), lines
    assert "ignoring SIGTERM" in container_log(local_cluster, namespace, "forced")


def test_a_stopped_pods_final_status_never_reaches_a_pod_recreated_under_its_name(
        core, namespace):
    """The agent reports a pod's status by annotating it by name: once the pod was deleted and
    another created under its name (a StatefulSet's worker), the old pod's final status and
    "stopped" mark must not land on the new one (a chaos soak saw a recreated worker held in
    ContainerCreating by them). The API server refuses the patch on the uid."""
    never_scheduled = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "twin"},
                       "spec": {"nodeSelector": {"no-such-node": "true"}, "containers": [
                           {"name": "main", "image": "img", "command": ["true"]}]}}
    old = core.create_namespaced_pod(namespace, never_scheduled).metadata.uid
    core.delete_namespaced_pod("twin", namespace, grace_period_seconds=0)
    wait_until(lambda: read_pod(core, namespace, "twin") is None, 30, "the first twin gone")
    new = core.create_namespaced_pod(namespace, never_scheduled).metadata.uid
    stopped = {agent.ANNOTATION_STOPPED: "true"}
    assert agent.annotate_pod(core, namespace, "twin", old, stopped) is False
    annotations = read_pod(core, namespace, "twin")["metadata"].get("annotations") or {}
    assert agent.ANNOTATION_STOPPED not in annotations, annotations
    assert agent.annotate_pod(core, namespace, "twin", new, stopped) is True
    annotations = read_pod(core, namespace, "twin")["metadata"]["annotations"]
    assert annotations[agent.ANNOTATION_STOPPED] == "true"
    assert agent.annotate_pod(core, namespace, "gone", new, stopped) is False
