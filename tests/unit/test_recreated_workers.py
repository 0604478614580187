"""Field case C20 without a cluster: a pre-flight failure on workers the operator had just
recreated (their names not resolving yet, or resolving to the old address) is an
infrastructure failure, never an Application one; any other pre-flight failure is judged by
the exit code as before."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from monarch_operator.controller.judge import recreated
from monarch_operator.controller.k8s import deletes, nodes, reads, writes
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import attempts
from monarch_operator.controller.state import status as st
from monarch_operator.launcher.session import preflight, ssh, versions
from tests.unit.test_launch_pass import NAME, NAMESPACE, job_body, launcher_pod
from tests.unit.test_verdicts import run_policy_pass, worker

START = "2026-12-01T12:00:00Z"
FQDN = f"{NAME}-worker-1.{NAME}-worker.{NAMESPACE}.svc.cluster.local"


def line(*failures: str, total: int = 2) -> str:
    return (f"pre-flight failed on {len(failures)} of {total} hosts after 30.5s: "
            + "; ".join(failures))


def pods(created_1: str = "2026-12-01T12:00:04Z") -> list[dict[str, Any]]:
    kept, fresh = worker(0), worker(1, uid="w1-new")
    kept["metadata"]["creationTimestamp"] = "2026-12-01T11:50:00Z"
    fresh["metadata"]["creationTimestamp"] = created_1
    return [kept, fresh]


def test_the_reason_lists_match_the_launchers():
    launcher_reasons = {value for name, value in vars(preflight).items()
                        if name.isupper() and isinstance(value, str) and value[:1].isupper()
                        and " " not in value and name not in ("RETRYABLE",)}
    launcher_reasons |= {ssh.HOST_KEY_UNKNOWN, ssh.HOST_KEY_CHANGED, versions.VERSION_SKEW}
    assert recreated.PREFLIGHT_REASONS == launcher_reasons
    assert recreated.RECREATED_WORKER_REASONS <= recreated.PREFLIGHT_REASONS


@pytest.mark.parametrize("reason", sorted(recreated.RECREATED_WORKER_REASONS))
def test_a_recreated_worker_that_cannot_be_reached_yet_is_named(reason):
    message = line(f"{FQDN} (10.244.1.9): {reason}: name or service not known; still 1; x: y")
    assert recreated.recreated_workers_unreachable(
        message, NAME, 2, {"startTime": START}, pods()) == [f"{NAME}-worker-1 ({reason})"]


@pytest.mark.parametrize(("message", "attempt", "created"), [
    # A worker kept from the attempt before (created before this attempt started).
    (line(f"{NAME}-worker-0.{NAME}-worker.{NAMESPACE}.svc.cluster.local: SSHUnreachable: x"),
     2, "2026-12-01T12:00:04Z"),
    # Another reason: the program's environment, not a name that lags behind.
    (line(f"{FQDN}: PythonNotFound: python3: not found"), 2, "2026-12-01T12:00:04Z"),
    # One of two failing hosts is not recreated: the exit code decides.
    (line(f"{FQDN}: DNSNotResolvable: x",
          f"{NAME}-worker-0.{NAME}-worker.{NAMESPACE}.svc.cluster.local: SSHUnreachable: y"),
     2, "2026-12-01T12:00:04Z"),
    # The first attempt: nothing was recreated.
    (line(f"{FQDN}: DNSNotResolvable: x"), 1, "2026-12-01T12:00:04Z"),
    # Created before this attempt began.
    (line(f"{FQDN}: DNSNotResolvable: x"), 2, "2026-12-01T11:59:59Z"),
    # Not a pre-flight line, or one naming fewer hosts than it says.
    ("trainer rank 1 (host h, local rank 0): raised ValueError: SSHUnreachable", 2,
     "2026-12-01T12:00:04Z"),
    (line(f"{FQDN}: DNSNotResolvable: x", total=2).replace("on 1 of", "on 2 of"), 2,
     "2026-12-01T12:00:04Z"),
])
def test_other_preflight_failures_are_left_to_the_exit_code(message, attempt, created):
    assert recreated.recreated_workers_unreachable(
        message, NAME, attempt, {"startTime": START}, pods(created)) == []


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writes, "_post", lambda desired, dry_run=False: desired)
    monkeypatch.setattr(writes, "patch_job_status", lambda namespace, name, status: status)
    monkeypatch.setattr(nodes, "node_not_ready_since", lambda node: None)
    monkeypatch.setattr(nodes, "node_heartbeats", lambda: None)  # unknown: judged at once
    monkeypatch.setattr(nodes, "node_readiness", lambda: None)
    monkeypatch.setattr(deletes, "stop_pod", lambda pod: True)
    monkeypatch.setattr(deletes, "delete_if_present", lambda *args: True)
    monkeypatch.setattr(reads, "pod_log_tail", lambda *args: "")


def test_c20_attempt_after_an_infrastructure_restart_is_not_an_application_failure(api):
    """Attempt 2 (after worker 1 was lost) fails its pre-flight on the recreated worker 1:
    Infrastructure, the application budget (backoffLimit 0) untouched, attempt 3 starts."""
    settings = Settings.from_env()
    status = attempts.begin({}, 1, "2026-12-01T11:59:00Z")
    status = attempts.update_current(status, launchTime="2026-12-01T11:59:05Z",
                                     endTime=START, **{"class": "Infrastructure"},
                                     lostWorkers=[f"{NAME}-worker-1"])
    status = attempts.begin({**status, "failureCounts": {"infrastructure": 1}}, 2, START)
    status = attempts.update_current(status, launchTime="2026-12-01T12:00:10Z",
                                     launcherPod=f"{NAME}-launcher-2")
    status["attemptWorkers"] = [{"name": f"{NAME}-worker-0", "uid": "w0", "restartCount": 0},
                                {"name": f"{NAME}-worker-1", "uid": "w1-new",
                                 "restartCount": 0}]
    status = st.set_condition(status, st.WORKERS_READY, True, "AllWorkersReady", "", 1, START)
    failed = launcher_pod(settings)
    failed["metadata"].update(name=f"{NAME}-launcher-2", labels={
        **failed["metadata"]["labels"], "monarch-operator.dev/attempt": "2"})
    failed["status"] = {"phase": "Failed", "containerStatuses": [{
        "name": "launcher", "state": {"terminated": {
            "exitCode": 1, "finishedAt": "2026-12-01T12:00:41Z",
            "message": line(f"{FQDN} (10.244.1.9): DNSNotResolvable: no address")}}}]}
    body = {**job_body(status), "spec": {**job_body()["spec"], "runPolicy": {
        "backoffLimit": 0, "infrastructureBackoffLimit": 2}}}
    after = run_policy_pass(settings, body, [*pods(), failed],
                            dt.datetime(2026, 12, 1, 12, 0, 50, tzinfo=dt.UTC))

    second = after["attempts"][1]
    assert (second["class"], second["reason"]) == ("Infrastructure", "WorkerUnreachable"), second
    assert second["message"].startswith(
        f"pre-flight could not reach recreated worker {NAME}-worker-1 (DNSNotResolvable): "
        "launcher exited with code 1: pre-flight failed"), second["message"]
    assert after["failureCounts"] == {"infrastructure": 2}
    assert after["attempt"] == 3 and not st.is_true(after, st.FAILED)
