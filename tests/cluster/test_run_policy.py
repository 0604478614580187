"""The run policy on the real local control plane: application restarts that keep the worker
pods, infrastructure restarts after a lost worker (field case C8) on their own budget, budgets
running out, exit-code rules, and suspend/resume (field case C10).

Launchers here are shell commands that read ``MONARCH_ATTEMPT`` (1, 2, ...) to behave
differently per attempt; real Monarch programs restart the same way (tests/e2e).
"""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster.helpers import (
    PodWatch,
    condition,
    get_json,
    job_manifest,
    job_pods,
    job_status,
    running_attempt,
    wait_phase,
    wait_until,
)
from tests.cluster.helpers import apply_manifest as apply

pytestmark = pytest.mark.cluster

# Fails on the first attempt (exit 3, naming it on stderr), succeeds from the second on.
FAIL_FIRST = ('echo "attempt $MONARCH_ATTEMPT"; if [ "$MONARCH_ATTEMPT" = 1 ]; then '
              'echo "trainer rank 1 (host w-1, local rank 0): raised ValueError: boom" >&2; '
              'exit 3; fi; echo done')
# Runs until stopped on the first attempt, succeeds at once afterwards.
HANG_FIRST = 'if [ "$MONARCH_ATTEMPT" = 1 ]; then exec sleep 600; fi; echo "attempt $MONARCH_ATTEMPT"'


def test_application_failure_restarts_on_the_same_worker_pods(kubectl, namespace):
    with PodWatch(kubectl, namespace, "app") as watch:
        apply(kubectl, namespace, job_manifest(
            "app", launcher={"command": ["sh", "-c", FAIL_FIRST]}, runPolicy={"backoffLimit": 2}))
        status = wait_phase(kubectl, namespace, "app", "Succeeded")

    # Same worker pods for both attempts: one uid per worker ever announced.
    assert watch.pods_seen() == {"app-worker-0": 1, "app-worker-1": 1}
    first, second = status["attempts"]
    assert first["number"] == 1 and first["class"] == "Application"
    assert first["exitCode"] == 3 and first["reason"] == "LauncherFailed"
    assert (first["role"], first["rank"], first["host"]) == ("trainer", 1, "w-1"), first
    assert first["outputTail"][-1].endswith("raised ValueError: boom"), first["outputTail"]
    assert first["launcherPod"] == "app-launcher" and "endTime" in first
    assert second["number"] == 2 and second["class"] == "Succeeded"
    assert second["launcherPod"] == "app-launcher-2"
    assert status["restartCount"] == 1 and status["attempt"] == 2
    assert status["failureCounts"] == {"application": 1}
    header, row = kubectl("get", "monarchjobs", "app", "-n", namespace).strip().splitlines()
    # The progress columns are there, empty: the launcher reported nothing.
    assert header.split() == ["NAME", "STATUS", "READY", "RESTARTS", "STEP", "PROGRESS", "ETA",
                              "AGE"]
    # READY counts the workers Ready now: 2/2 until the finished job's workers are released.
    assert row.split()[1:4:2] == ["Succeeded", "1"] and row.split()[2] in ("2/2", "1/2", "0/2")
    # The first attempt's pod is gone: one launcher at a time.
    assert get_json(kubectl, "pod", "app-launcher", "-n", namespace) is None


def test_worker_deleted_mid_run_restarts_as_infrastructure(kubectl, namespace):
    """C8 with budget: the lost worker's pod is recreated, the application budget untouched."""
    apply(kubectl, namespace, job_manifest("infra", launcher={"command": ["sh", "-c", HANG_FIRST]}))
    running = running_attempt(kubectl, namespace, "infra", 1)
    before = {entry["name"]: entry["uid"] for entry in running["attemptWorkers"]}

    kubectl("delete", "pod", "infra-worker-1", "-n", namespace, "--wait=false")
    status = wait_phase(kubectl, namespace, "infra", "Succeeded")

    first, second = status["attempts"]
    assert first["class"] == "Infrastructure" and first["reason"] == "WorkerEvicted", first
    assert first["lostWorkers"] == ["infra-worker-1"]
    assert "infra-worker-1 (deleted" in first["message"], first["message"]
    assert second["class"] == "Succeeded"
    assert status["failureCounts"] == {"infrastructure": 1}, "backoffLimit 0 was not spent"
    assert status["restartCount"] == 1
    assert before["infra-worker-1"] != before["infra-worker-0"]


def test_worker_lost_without_budget_fails_naming_it_and_every_pod_goes(kubectl, namespace):
    apply(kubectl, namespace, job_manifest(
        "nobudget", launcher={"command": ["sh", "-c", HANG_FIRST]},
        runPolicy={"infrastructureBackoffLimit": 0, "backoffLimit": 5}))
    running_attempt(kubectl, namespace, "nobudget", 1)

    kubectl("delete", "pod", "nobudget-worker-0", "-n", namespace, "--wait=false")
    status = wait_phase(kubectl, namespace, "nobudget", "Failed")

    failed = condition(status, "Failed")
    assert failed["reason"] == "WorkerEvicted"
    assert "nobudget-worker-0 (deleted" in failed["message"], failed["message"]
    assert "infrastructureBackoffLimit" in failed["message"], failed["message"]
    assert status["attempts"][-1]["class"] == "Infrastructure"
    assert status.get("restartCount") == 0
    wait_until(lambda: not job_pods(kubectl, namespace, "nobudget"), 60, "every pod gone")
    assert get_json(kubectl, "pod", "nobudget-launcher", "-n", namespace) is None


def test_application_budget_exhausted_fails_with_the_last_exit_code(kubectl, namespace):
    apply(kubectl, namespace, job_manifest(
        "spent", launcher={"command": ["sh", "-c", "exit $((6 + MONARCH_ATTEMPT))"]},
        runPolicy={"backoffLimit": 1}))
    status = wait_phase(kubectl, namespace, "spent", "Failed")

    assert [(a["class"], a["exitCode"]) for a in status["attempts"]] == [
        ("Application", 7), ("Application", 8)]
    assert status["launcher"]["exitCode"] == 8
    failed = condition(status, "Failed")
    assert failed["reason"] == "LauncherFailed"
    assert "code 8" in failed["message"] and "backoffLimit" in failed["message"], failed
    assert status["failureCounts"] == {"application": 1} and status["restartCount"] == 1


def test_repeated_failures_restart_with_a_back_off(kubectl, namespace):
    # A launcher that fails at once: the first restart is immediate, the second waits 10 s
    # (no restart loop flooding the API server), and its launcher starts only after that.
    apply(kubectl, namespace, job_manifest(
        "loop", launcher={"command": ["sh", "-c", "exit 1"]}, runPolicy={"backoffLimit": 2}))
    status = wait_phase(kubectl, namespace, "loop", "Failed", timeout=180)

    first, second, third = status["attempts"]
    assert "notBefore" not in first and "notBefore" not in second
    assert third["notBefore"] and third["launchTime"] >= third["notBefore"], third
    assert status["restartCount"] == 2


def test_fail_job_rule_ends_the_job_at_once(kubectl, namespace):
    apply(kubectl, namespace, job_manifest(
        "fatal", launcher={"command": ["sh", "-c", "exit 42"]},
        runPolicy={"backoffLimit": 3, "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"values": [42]}}]}}))
    status = wait_phase(kubectl, namespace, "fatal", "Failed")

    assert [a["class"] for a in status["attempts"]] == ["Fatal"]
    failed = condition(status, "Failed")
    assert failed["reason"] == "FatalExitCode"
    assert "rules[0] (FailJob)" in failed["message"], failed["message"]


def test_invalid_run_policy_refused_at_admission(kubectl, namespace):
    for policy, fragment in [
        ({"backoffLimit": -1}, "spec.runPolicy.backoffLimit"),
        ({"podFailurePolicy": {"rules": [{"action": "FailJob",
                                          "onExitCodes": {"values": [0, 1]}}]}},
         "must not contain 0 with operator In"),
        ({"podFailurePolicy": {"rules": [{"action": "Count",
                                          "onExitCodes": {"values": [3, 3]}}]}},
         "Duplicate value: 3"),
        ({"podFailurePolicy": {"rules": [{"action": "Restart",
                                          "onExitCodes": {"values": [1]}}]}},
         "spec.runPolicy.podFailurePolicy.rules[0].action"),
    ]:
        result = subprocess.run(["kubectl", "apply", "-n", namespace, "-f", "-"],
                                input=job_manifest("badpolicy", runPolicy=policy),
                                capture_output=True, text=True, env=kubectl.env)
        assert result.returncode != 0 and fragment in result.stderr, result.stderr


def test_c10a_created_suspended_then_resumed(kubectl, namespace):
    manifest = job_manifest("susp", suspend=True, launcher={"command": ["sh", "-c", "true"]})
    apply(kubectl, namespace, manifest)
    status = wait_phase(kubectl, namespace, "susp", "Suspended")
    assert condition(status, "Suspended")["reason"] == "JobSuspended"
    # Nothing was deleted, so nothing says so.
    assert condition(status, "Suspended")["message"] == (
        "spec.suspend is true: nothing started; workers start when it is false"), status
    assert get_json(kubectl, "statefulset", "susp-worker", "-n", namespace) is None
    assert not job_pods(kubectl, namespace, "susp")
    assert get_json(kubectl, "configmap", "susp-hostfile", "-n", namespace) is None

    kubectl("patch", "monarchjob", "susp", "-n", namespace, "--type=merge",
            "-p", '{"spec": {"suspend": false}}')
    status = wait_phase(kubectl, namespace, "susp", "Succeeded")
    assert condition(status, "Suspended")["status"] == "False"
    assert [a["class"] for a in status["attempts"]] == ["Succeeded"]


def test_c10b_suspend_running_job_change_launcher_image_resume(kubectl, namespace):
    body = job_manifest("c10b", launcher={"command": ["sh", "-c", HANG_FIRST]})
    # A label of the user's own (a Kueue queue label would put the job under Kueue instead).
    body = body.replace("metadata:\n  name: c10b\n", "metadata:\n  name: c10b\n  labels:\n"
                        "    example.com/team: team-q\n  annotations:\n"
                        "    example.com/owner: alice\n")
    watch = PodWatch(kubectl, namespace, "c10b")
    apply(kubectl, namespace, body)
    running_attempt(kubectl, namespace, "c10b", 1)
    for pod in job_pods(kubectl, namespace, "c10b"):
        assert pod["metadata"]["labels"]["example.com/team"] == "team-q"
        assert pod["metadata"]["annotations"]["example.com/owner"] == "alice"
    old_hostfile = get_json(kubectl, "configmap", "c10b-hostfile", "-n", namespace)

    kubectl("patch", "monarchjob", "c10b", "-n", namespace, "--type=merge",
            "-p", '{"spec": {"suspend": true}}')
    wait_until(lambda: job_status(kubectl, namespace, "c10b").get("phase") == "Suspended"
               and not job_pods(kubectl, namespace, "c10b"), 60, "suspended with no pods")
    assert get_json(kubectl, "configmap", "c10b-hostfile", "-n", namespace) is None
    assert get_json(kubectl, "pod", "c10b-launcher", "-n", namespace) is None
    assert job_status(kubectl, namespace, "c10b")["readyWorkers"] == "0/2"
    kubectl("patch", "monarchjob", "c10b", "-n", namespace, "--type=merge", "-p",
            '{"spec": {"suspend": false, "launcher": {"image": "example.com/launcher:v2"}}}')
    with watch:
        status = wait_phase(kubectl, namespace, "c10b", "Succeeded")

    # New worker pods after the resume: two uids per worker, the launcher only on the new ones.
    assert watch.pods_seen() == {"c10b-worker-0": 2, "c10b-worker-1": 2}
    first, second = status["attempts"]
    assert first["class"] == "Suspended" and second["class"] == "Succeeded"
    assert status.get("failureCounts", {}) == {}, "a suspension spends no budget"
    launcher = get_json(kubectl, "pod", "c10b-launcher-2", "-n", namespace)
    (container,) = launcher["spec"]["containers"]
    assert container["image"] == "example.com/launcher:v2"
    hostfile = get_json(kubectl, "configmap", "c10b-hostfile", "-n", namespace)
    assert hostfile["metadata"]["uid"] != old_hostfile["metadata"]["uid"], "rebuilt"
    assert second["launchTime"] >= condition(status, "Suspended")["lastTransitionTime"]
