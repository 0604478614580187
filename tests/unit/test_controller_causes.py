"""Words from what happened (issue 32 item 4): one mapping (controller/state/causes.py) from what
Kubernetes or Kueue observed to what the status says, so that an eviction, a drain or a
preemption of a pod is worded as what it was, never "deleted" because a deletion request came
with it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from monarch_operator.controller.judge import verdicts
from monarch_operator.controller.k8s import nodes
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import causes, timestamps
from monarch_operator.controller.state import status as st
from tests.unit.test_launch_pass import NAME, job_body, running_status
from tests.unit.test_verdicts import api, run_policy_pass, running_launcher, worker  # noqa: F401

T0 = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> str:
    return st.format_time(T0 + dt.timedelta(seconds=seconds))


def pod(node: str = "node-9", reason: str | None = None, message: str | None = None,
        disruption: str | None = None, asked: float | None = None) -> dict[str, Any]:
    """A pod on ``node``: with a kubelet ``reason``, a ``DisruptionTarget`` condition (at 3 s)
    and/or a deletion asked for at ``asked`` seconds (grace period 30 s)."""
    body: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"nodeName": node},
                            "status": {"phase": "Running", "conditions": []}}
    if reason:
        body["status"].update(reason=reason, message=message)
    elif message:
        body["status"]["message"] = message
    if disruption:
        body["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                             "reason": disruption, "lastTransitionTime": at(3)})
    if asked is not None:
        body["metadata"].update(deletionTimestamp=at(asked + 30), deletionGracePeriodSeconds=30)
    return body


@pytest.mark.parametrize(("observed", "cordoned", "words"), [
    (pod(asked=2), False, "deleted"),
    # kubectl drain / an autoscaler: the Eviction API, which also asks for the deletion (here
    # a second before the condition's time): evicted, not "deleted".
    (pod(disruption="EvictionByEvictionAPI", asked=2), False, "evicted through the Eviction API"),
    (pod(disruption="EvictionByEvictionAPI", asked=2), True, "evicted by a drain of node node-9"),
    (pod(reason="Evicted", message="The node was low on resource: memory."), False,
     "evicted by the kubelet of node node-9: The node was low on resource: memory."),
    (pod(disruption="TerminationByKubelet", asked=2,
         message="Pod was terminated in response to imminent node shutdown."), False,
     "stopped by the kubelet of node node-9: Pod was terminated in response to imminent node "
     "shutdown."),
    (pod(disruption="PreemptionByScheduler", asked=2), False,
     "preempted by the scheduler for a pod of higher priority"),
    (pod(disruption="DeletionByTaintManager", asked=2), False,
     "deleted by the taint manager: node node-9 not Ready or unreachable"),
    (pod(disruption="DeletionByPodGC", asked=2), False,
     "deleted by the pod garbage collector: node node-9 gone"),
    (pod(reason="Shutdown", message="Node is shutting, evicting pods"), False,
     "stopped by a shutdown of node node-9: Node is shutting, evicting pods"),
    (pod(reason="Preempting", message="Preempted in order to admit critical pod"), False,
     "preempted by the kubelet of node node-9 for a critical pod: Preempted in order to admit "
     "critical pod"),
])
def test_each_cause_is_worded_as_what_it_was(observed, cordoned, words):
    found = causes.of_pod(observed, frozenset({"node-9"}) if cordoned else frozenset())
    assert found is not None and found.words() == words
    # The launcher's verdict words it the same, at the earliest moment that tells.
    stop = verdicts.launcher_stop(observed, frozenset({"node-9"}) if cordoned else frozenset())
    assert stop is not None and stop[0] == words


def test_a_pod_nobody_stopped_has_no_cause():
    assert causes.of_pod(pod()) is None
    assert verdicts.launcher_stop(pod()) is None
    assert causes.api_evicted_nodes([pod(disruption="EvictionByEvictionAPI"), pod("node-1"),
                                     pod("node-2", disruption="PreemptionByScheduler")]) == \
        {"node-9"}


@pytest.mark.parametrize("cordoned", [True, False])
def test_a_launcher_evicted_by_a_drain_is_worded_so_not_deleted(api, monkeypatch,  # noqa: F811
                                                                 cordoned):
    """kubectl drain of the launcher's node: its pod gets DisruptionTarget
    (EvictionByEvictionAPI) and a deletion request; the program exits 143 on SIGTERM. The
    attempt is LauncherLost as before, in words that say what happened."""
    read: list[str] = []
    monkeypatch.setattr(nodes, "node_cordoned", lambda node: read.append(node) or cordoned)
    settings = Settings.from_env()
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    launcher = running_launcher(settings, launched, exit_code=143, ended=4)
    launcher["metadata"].update(
        deletionTimestamp=st.format_time(launched + dt.timedelta(seconds=32)),
        deletionGracePeriodSeconds=30)
    launcher["status"]["conditions"] = [{
        "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
        "lastTransitionTime": st.format_time(launched + dt.timedelta(seconds=3))}]
    body = {**job_body(status), "spec": {**job_body()["spec"],
                                         "runPolicy": {"infrastructureBackoffLimit": 0}}}
    after = run_policy_pass(settings, body, [worker(0), worker(1), launcher],
                            launched + dt.timedelta(seconds=8))
    record = after["attempts"][0]
    assert (record["class"], record["reason"]) == ("Infrastructure", st.REASON_LAUNCHER_LOST)
    how = "evicted by a drain of node node-9" if cordoned else "evicted through the Eviction API"
    assert record["message"] == f"launcher pod {NAME}-launcher {how} while it ran (it exited 143)"
    assert read == ["node-9"], "only the evicted pod's node is read"


def test_a_worker_evicted_by_its_kubelet_is_worded_so(api):  # noqa: F811
    settings = Settings.from_env()
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    evicted = worker(1, phase="Failed", reason="Evicted",
                     message="The node was low on resource: ephemeral-storage.")
    body = {**job_body(status), "spec": {**job_body()["spec"],
                                         "runPolicy": {"infrastructureBackoffLimit": 0}}}
    after = run_policy_pass(settings, body, [worker(0), evicted, running_launcher(
        settings, launched)], launched + dt.timedelta(seconds=8))
    record = after["attempts"][0]
    assert record["reason"] == st.REASON_WORKER_EVICTED
    assert record["message"].startswith(
        f"worker {NAME}-worker-1 (evicted by the kubelet of node node-1: The node was low on "
        "resource: ephemeral-storage.) lost mid-run"), record


@pytest.mark.parametrize(("reason", "message", "words"), [
    ("Preempted", "Preempted to accommodate a workload (UID: 527a9fa8-fb86-4116-b295-"
     "4f4dd72e478f, JobUID: 1f1c675a-711f-4a13-a3bd-da3d50e6f893) due to reclamation within "
     "the cohort", "preempted by Kueue: Preempted to accommodate a workload due to reclamation "
     "within the cohort"),
    ("PodsReadyTimeout", "Exceeded the PodsReady timeout team-a/demo-w",
     "evicted by Kueue: its pods were not all ready within waitForPodsReady.timeout: Exceeded "
     "the PodsReady timeout team-a/demo-w"),
    ("InactiveWorkload", "", "evicted by Kueue: its Workload was deactivated"),
    ("SomethingNew", "why", "evicted by Kueue: SomethingNew: why"),
])
def test_kueue_evictions_are_worded_first_and_its_uids_left_out(reason, message, words):
    assert causes.of_kueue(reason, message).words() == words
    assert causes.kueue_reason(f"Evicted{reason}") == reason
