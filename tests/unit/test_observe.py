"""Observed children: why a worker pod is not Ready, in the words Kubernetes used
(startup-timeout messages), and how the launcher ended (its termination message)."""

from __future__ import annotations

from typing import Any

import pytest

from monarch_operator.controller.state.observe import (
    LauncherOutcome,
    create_failure,
    is_invalid_object_message,
    launcher_failure_message,
    launcher_outcome,
    launcher_reason,
    unrecoverable_problem,
    why_not_ready,
)

UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available:\n 3 Insufficient nvidia.com/gpu.",
}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (None, "not created"),
        (
            {"status": {"phase": "Pending", "conditions": [UNSCHEDULABLE]}},
            "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        ),
        (
            {
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [
                        {
                            "state": {
                                "waiting": {
                                    "reason": "ImagePullBackOff",
                                    "message": "no such image",
                                }
                            }
                        }
                    ],
                }
            },
            "ImagePullBackOff: no such image",
        ),
        (
            {
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}],
                }
            },
            "ContainerCreating",
        ),
        ({"status": {"phase": "Running"}}, "sshd not accepting connections yet (readiness probe)"),
        ({"status": {"phase": "Failed"}}, "Failed"),
        (
            {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {}},
            "being deleted",
        ),
    ],
    ids=["missing", "unschedulable", "image", "creating", "probe", "failed", "deleting"],
)
def test_why_not_ready(pod: dict[str, Any] | None, expected: str) -> None:
    assert why_not_ready(pod) == expected


def init_pod(prep: dict[str, Any], main_state: dict[str, Any] | None = None,
             phase: str = "Pending") -> dict[str, Any]:
    done = {"name": "fetch", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    return {"status": {
        "phase": phase,
        "initContainerStatuses": [done, {"name": "prep", **prep}],
        "containerStatuses": [{"name": "worker", "state": main_state
                               or {"waiting": {"reason": "PodInitializing"}}}]}}


EXITED_1 = {"terminated": {"exitCode": 1, "reason": "Error"}}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (
            init_pod({"state": {"waiting": {"reason": "CrashLoopBackOff",
                                            "message": "back-off 10s restarting failed ..."}},
                      "lastState": EXITED_1, "restartCount": 2}),
            "Init:CrashLoopBackOff: init container prep exited 1",
        ),
        (
            init_pod({"state": {"terminated": {"exitCode": 3, "reason": "Error",
                                               "message": "no data\n"}}}, phase="Failed"),
            "Init:Error: init container prep exited 3: no data",
        ),
        (init_pod({"state": {"running": {}}}), "Init:1/2: init container prep running"),
        (
            init_pod({"state": {"waiting": {"reason": "CreateContainerConfigError",
                                            "message": 'secret "s" not found'}}}),
            'Init:CreateContainerConfigError: secret "s" not found',
        ),
        (
            {"status": {"phase": "Running", "containerStatuses": [{
                "name": "worker", "lastState": EXITED_1,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}}]}},
            "CrashLoopBackOff: container worker exited 1",
        ),
        (
            {"status": {"phase": "Failed", "reason": "NodeAgentError",
                        "message": "local node agent: OSError: boom"}},
            "NodeAgentError: local node agent: OSError: boom",
        ),
    ],
    ids=["init-crash-loop", "init-failed", "init-running", "init-config", "crash-loop",
         "agent-error"],
)
def test_why_not_ready_names_failing_init_and_restarting_containers(
    pod: dict[str, Any], expected: str
) -> None:
    """Field case C13: the startup-timeout message names the init container that fails."""
    assert why_not_ready(pod) == expected


def launcher_pod(*containers: tuple[str, dict[str, Any]], phase: str = "Failed",
                 **status: str) -> dict[str, Any]:
    return {"status": {"phase": phase, **status, "containerStatuses": [
        {"name": name, "state": {"terminated": terminated}} for name, terminated in containers]}}


@pytest.mark.parametrize(
    ("pod", "exit_code", "message"),
    [
        (launcher_pod(("launcher", {"exitCode": 3, "reason": "Error",
                                    "message": "trainer rank 1 failed: boom\n"})),
         3, "trainer rank 1 failed: boom"),
        (launcher_pod(("launcher", {"exitCode": 1, "reason": "Error"})), 1, "Error"),
        (launcher_pod(("launcher", {"exitCode": 1, "reason": "Error", "message": " \n"})),
         1, "Error"),
        (launcher_pod(("sidecar", {"exitCode": 0, "reason": "Completed", "message": "bye"}),
                      ("launcher", {"exitCode": 4, "message": "Monarch worker lost"})),
         4, "Monarch worker lost"),
        (launcher_pod(("launcher", {"exitCode": 3, "reason": "Error",
                                    "message": "about to fail\nstep 2: loss is NaN\n\n"})),
         3, "step 2: loss is NaN"),
        (launcher_pod(reason="Evicted", message="The node was low on resource: memory."),
         None, "Evicted: The node was low on resource: memory."),
        (launcher_pod(), None, "pod failed"),
        # The kubelet lost the container with its node: 137 is no exit of the program.
        (launcher_pod(("launcher", {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                    "message": "The container could not be located when the "
                                               "pod was terminated"})),
         None, "ContainerStatusUnknown: The container could not be located when the pod was "
               "terminated"),
    ],
    ids=["termination-message", "reason-only", "blank-message", "sidecar-ignored", "log-tail",
         "evicted", "no-reason", "container-lost-with-its-node"],
)
def test_failed_launcher_outcome_prefers_the_termination_message(pod, exit_code, message):
    outcome = launcher_outcome(pod)
    assert outcome == LauncherOutcome(finished=True, succeeded=False, exit_code=exit_code,
                                      message=message)


@pytest.mark.parametrize("phase", ["Pending", "Running", "Unknown", None])
def test_a_launcher_pod_not_ended_is_not_finished(phase):
    # The launcher container ended, a sidecar still runs: the pod (as a Job would) is not done.
    pod = launcher_pod(("launcher", {"exitCode": 0, "reason": "Completed"}), phase=phase)
    assert launcher_outcome(pod) == LauncherOutcome(finished=False)


def test_no_launcher_pod_and_a_succeeded_one():
    assert launcher_outcome(None) == LauncherOutcome(finished=False)
    done = launcher_pod(("launcher", {"exitCode": 0, "reason": "Completed"}), phase="Succeeded")
    assert launcher_outcome(done) == LauncherOutcome(finished=True, succeeded=True, exit_code=0)


def test_failed_condition_message_carries_the_launchers_final_line():
    reason = ("trainer rank 1 (host demo-worker-0, local rank 1): raised ValueError: boom at "
              "step 2")
    pod = launcher_pod(("launcher", {"exitCode": 3, "reason": "Error", "message": reason}))
    outcome = launcher_outcome(pod)
    assert launcher_failure_message(outcome) == f"launcher exited with code 3: {reason}"
    assert launcher_reason(outcome) == reason


def test_long_launcher_reason_keeps_head_and_tail():
    message = "Traceback (most recent call last):\n" + "x" * 3000 + "\nValueError: boom"
    reason = launcher_reason(LauncherOutcome(finished=True, exit_code=1, message=message),
                             limit=100)
    assert len(reason) == 100
    assert reason.startswith("Traceback") and reason.endswith("ValueError: boom")


def waiting(name: str, reason: str, message: str = "",
            last_exit: int | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name,
                                 "state": {"waiting": {"reason": reason, "message": message}}}
    if last_exit is not None:
        container["lastState"] = {"terminated": {"exitCode": last_exit}}
    return container


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"containerStatuses": [waiting("worker", "InvalidImageName", "bad ref")]},
         "InvalidImageName: bad ref"),
        ({"initContainerStatuses": [waiting("prep", "CrashLoopBackOff", "back-off", 1)]},
         "Init:CrashLoopBackOff: init container prep exited 1"),
        ({"initContainerStatuses": [waiting("prep", "InvalidImageName", "bad")]},
         "Init:InvalidImageName: bad"),
        # Might heal: a pull that fails now, a main container restarting, a pod being scheduled.
        ({"containerStatuses": [waiting("worker", "ImagePullBackOff", "timeout")]}, None),
        ({"containerStatuses": [waiting("worker", "CrashLoopBackOff", "back-off", 1)]}, None),
        ({"conditions": [UNSCHEDULABLE]}, None),
        ({}, None),
    ],
)
def test_unrecoverable_problem(status: dict[str, Any], expected: str | None) -> None:
    assert unrecoverable_problem({"status": status}) == expected


def test_create_failure_is_the_newest_failed_create_event() -> None:
    events = [
        {"reason": "SuccessfulCreate", "message": "create Pod x-worker-0",
         "lastTimestamp": "2026-01-01T00:00:09Z"},
        {"reason": "FailedCreate", "message": "old\n failure",
         "lastTimestamp": "2026-01-01T00:00:01Z"},
        {"reason": "FailedCreate", "message": 'pods "x-worker-0" is forbidden: quota',
         "lastTimestamp": "2026-01-01T00:00:05Z"},
    ]
    assert create_failure(events) == 'pods "x-worker-0" is forbidden: quota'
    assert create_failure(events[:1]) is None
    assert create_failure(events[1:2]) == "old failure"


def test_only_invalid_objects_are_final() -> None:
    assert is_invalid_object_message(
        'Pod "x-worker-0" is invalid: spec.containers[0].image: Required value')
    assert not is_invalid_object_message(
        'pods "x-worker-0" is forbidden: error looking up service account t/x: not found')
