"""The kubelet's rules as the node agent applies them: init containers in order, restart
policies, crash-loop back-off, pod phase, conditions and container statuses."""

from __future__ import annotations

import pytest

from monarch_operator.localcluster import podstatus
from monarch_operator.localcluster.podstatus import Backoff, PodRecord

T0 = 1_800_000_000.0


def pod(policy: str = "Always", init: tuple[str, ...] = (), containers: tuple[str, ...] = ("main",),
        conditions: list | None = None) -> dict:
    return {"metadata": {"name": "demo-worker-0", "namespace": "team-a", "uid": "u1"},
            "spec": {"restartPolicy": policy,
                     "initContainers": [{"name": n, "image": "busybox"} for n in init],
                     "containers": [{"name": n, "image": "worker"} for n in containers]},
            "status": {"conditions": conditions or []}}


def run(record: PodRecord, name: str, code: int, now: float, init: bool = False) -> None:
    """Start the container at ``now`` and let it exit with ``code`` one second later."""
    container = record.container(name, init)
    assert container in record.due(now), f"{name} should be due at {now}"
    container.started(now)
    container.exited(code, "Completed" if code == 0 else "Error", "", now + 1,
                     record.restart_policy, record.ref)


@pytest.mark.parametrize(("policy", "code", "init", "expected"), [
    ("Always", 0, False, True), ("Always", 1, False, True),
    ("OnFailure", 0, False, False), ("OnFailure", 2, False, True),
    ("Never", 0, False, False), ("Never", 1, False, False),
    ("Always", 0, True, False), ("Always", 1, True, True),
    ("OnFailure", 1, True, True), ("Never", 1, True, False),
])
def test_restarts_after_follows_restart_policy(policy, code, init, expected):
    assert podstatus.restarts_after(policy, code, init) is expected


def test_backoff_is_immediate_then_doubles_to_the_cap_and_resets_after_twice_the_cap():
    backoff = Backoff(base=10, cap=300)
    delays, now = [], T0
    for _ in range(8):
        delay = backoff.delay(now)
        delays.append(delay)
        backoff.restarted(now, now + delay)
        now += delay + 1  # runs one second, exits again
    assert delays == [0, 10, 20, 40, 80, 160, 300, 300]
    assert backoff.delay(now + 601) == 0, "forgotten after 2 x cap without a restart"


def test_go_duration_matches_kubelet_messages():
    assert [podstatus.go_duration(s) for s in (10, 80, 300, 0.5, 1.5)] == [
        "10s", "1m20s", "5m0s", "500ms", "1.5s"]


def test_init_containers_run_in_order_then_the_containers():
    record = PodRecord.from_pod(pod(init=("a", "b"), containers=("main", "side")))
    assert [c.name for c in record.due(T0)] == ["a"]
    assert record.phase() == "Pending"
    record.container("a", True).started(T0)
    assert record.due(T0) == [], "nothing else starts while an init container runs"
    record.container("a", True).exited(0, "Completed", "", T0 + 1, "Always", record.ref)
    assert [c.name for c in record.due(T0 + 1)] == ["b"]
    run(record, "b", 0, T0 + 1, init=True)
    assert [c.name for c in record.due(T0 + 2)] == ["main", "side"]
    status = record.api_status(T0 + 2)
    assert status["phase"] == "Pending"
    assert [s["state"]["terminated"]["reason"] for s in status["initContainerStatuses"]] == [
        "Completed", "Completed"]
    initialized = next(c for c in status["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "True"


def test_failed_init_container_with_restart_policy_never_fails_the_pod():
    record = PodRecord.from_pod(pod(policy="Never", init=("prep",)))
    run(record, "prep", 1, T0, init=True)
    status = record.api_status(T0 + 1)
    assert status["phase"] == "Failed"
    (prep,) = status["initContainerStatuses"]
    assert prep["state"]["terminated"]["exitCode"] == 1
    assert prep["state"]["terminated"]["reason"] == "Error"
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert record.due(T0 + 100) == [], "the containers never start"
    initialized = next(c for c in status["conditions"] if c["type"] == "Initialized")
    assert initialized == {"type": "Initialized", "status": "False",
                           "reason": "ContainersNotInitialized",
                           "message": "containers with incomplete status: [prep]",
                           "lastTransitionTime": podstatus.timestamp(T0 + 1)}


@pytest.mark.parametrize("policy", ["Always", "OnFailure"])
def test_failing_init_container_crash_loops_and_blocks_the_containers(policy):
    record = PodRecord.from_pod(pod(policy=policy, init=("prep",)), backoff_base=10)
    run(record, "prep", 1, T0, init=True)  # first restart: at once
    run(record, "prep", 1, T0 + 1, init=True)  # then 10 s of back-off
    status = record.api_status(T0 + 3)
    assert status["phase"] == "Pending"
    (prep,) = status["initContainerStatuses"]
    assert prep["restartCount"] == 1
    assert prep["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert prep["state"]["waiting"]["message"] == (
        "back-off 10s restarting failed container=prep pod=demo-worker-0_team-a(u1)")
    assert prep["lastState"]["terminated"]["exitCode"] == 1
    assert record.due(T0 + 11) == []
    assert [c.name for c in record.due(T0 + 12)] == ["prep"]
    record.container("prep", True).started(T0 + 12)
    assert record.api_status(T0 + 12)["initContainerStatuses"][0]["restartCount"] == 2


def test_always_restarts_a_container_that_exits_with_growing_back_off():
    record = PodRecord.from_pod(pod(policy="Always"), backoff_base=1)
    starts, now = [], T0
    while len(starts) < 5:
        due = record.due(now)
        if due:
            starts.append(now - T0)
            due[0].started(now)
            due[0].exited(1, "Error", "boom", now + 0.5, "Always", record.ref)
            now += 0.5
        else:
            now += 0.25
    assert starts == [0, 0.5, 2.0, 4.5, 9.0]  # back-off 0, 1, 2, 4 after each 0.5 s run
    (main,) = record.api_status(now)["containerStatuses"]
    assert main["restartCount"] == 4
    assert main["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert main["lastState"]["terminated"]["message"] == "boom"
    assert record.phase() == "Running", "a restarting container keeps the pod Running"


def test_on_failure_stops_after_success_and_keeps_the_failure_as_last_state():
    record = PodRecord.from_pod(pod(policy="OnFailure"))
    run(record, "main", 3, T0)
    run(record, "main", 0, T0 + 1)
    status = record.api_status(T0 + 2)
    assert status["phase"] == "Succeeded"
    (main,) = status["containerStatuses"]
    assert main["restartCount"] == 1
    assert main["state"]["terminated"]["reason"] == "Completed"
    assert main["lastState"]["terminated"]["exitCode"] == 3
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "PodCompleted"


@pytest.mark.parametrize(("codes", "phase"), [((0, 0), "Succeeded"), ((0, 2), "Failed")])
def test_never_phase_from_every_container(codes, phase):
    record = PodRecord.from_pod(pod(policy="Never", containers=("a", "b")))
    record.container("a", False).started(T0)
    record.container("b", False).started(T0)
    record.container("a", False).exited(codes[0], "", "", T0 + 1, "Never", record.ref)
    assert record.phase() == "Running", "b still runs"
    record.container("b", False).exited(codes[1], "", "", T0 + 2, "Never", record.ref)
    assert record.phase() == phase
    assert record.due(T0 + 100) == []


def test_ready_conditions_keep_their_transition_time_until_they_flip():
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "x"}
    record = PodRecord.from_pod(pod(policy="Always", conditions=[scheduled]))
    record.container("main", False).started(T0)
    record.container("main", False).ready = True
    first = {c["type"]: c for c in record.api_status(T0)["conditions"]}
    later = {c["type"]: c for c in record.api_status(T0 + 50)["conditions"]}
    assert first == later and first["PodScheduled"] == scheduled
    assert first["Ready"]["status"] == "True" and first["ContainersReady"]["status"] == "True"
    record.container("main", False).ready = False
    unready = {c["type"]: c for c in record.api_status(T0 + 60)["conditions"]}
    assert unready["Ready"]["lastTransitionTime"] == podstatus.timestamp(T0 + 60)
    assert unready["Ready"]["message"] == "containers with unready status: [main]"


def test_config_error_waits_and_is_retried():
    record = PodRecord.from_pod(pod(policy="Never"))
    container = record.container("main", False)
    container.config_failed("CreateContainerConfigError", 'secret "s" not found', T0)
    assert record.phase() == "Pending"
    assert record.due(T0 + 1) == []
    assert record.due(T0 + podstatus.CONFIG_RETRY_SECONDS) == [container]
    assert record.api_status(T0)["containerStatuses"][0]["state"] == {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "s" not found'}}


def test_agent_error_fails_the_pod_with_a_readable_reason():
    record = PodRecord.from_pod(pod())
    record.agent_error = "local node agent: OSError: boom"
    status = record.api_status(T0)
    assert (status["phase"], status["reason"], status["message"]) == (
        "Failed", "NodeAgentError", "local node agent: OSError: boom")
    assert record.due(T0) == []
