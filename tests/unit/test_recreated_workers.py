"""Field case C20 without a cluster: a pre-flight failure on workers the operator had just
created or recreated (their names not resolving yet, or resolving to the old address) is an
infrastructure failure, never an Application one, in a later attempt and in the first (a job
applied again under the name of one just deleted); any other pre-flight failure is judged by
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
        message, NAME, {"startTime": START}, pods()) == [f"{NAME}-worker-1 ({reason})"]


@pytest.mark.parametrize(("message", "created"), [
    # A worker kept from the attempt before (created before this attempt started).
    (line(f"{NAME}-worker-0.{NAME}-worker.{NAMESPACE}.svc.cluster.local: SSHUnreachable: x"),
     "2026-12-01T12:00:04Z"),
    # Another reason: the program's environment, not a name that lags behind.
    (line(f"{FQDN}: PythonNotFound: python3: not found"), "2026-12-01T12:00:04Z"),
    # One of two failing hosts is not recreated: the exit code decides.
    (line(f"{FQDN}: DNSNotResolvable: x",
          f"{NAME}-worker-0.{NAME}-worker.{NAMESPACE}.svc.cluster.local: SSHUnreachable: y"),
     "2026-12-01T12:00:04Z"),
    # Created before this attempt began.
    (line(f"{FQDN}: DNSNotResolvable: x"), "2026-12-01T11:59:59Z"),
    # Not a pre-flight line, or one naming fewer hosts than it says.
    ("trainer rank 1 (host h, local rank 0): raised ValueError: SSHUnreachable",
     "2026-12-01T12:00:04Z"),
    (line(f"{FQDN}: DNSNotResolvable: x", total=2).replace("on 1 of", "on 2 of"),
     "2026-12-01T12:00:04Z"),
])
def test_other_preflight_failures_are_left_to_the_exit_code(message, created):
    assert recreated.recreated_workers_unreachable(
        message, NAME, {"startTime": START}, pods(created)) == []


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


def running(status: dict[str, Any]) -> dict[str, Any]:
    """``status`` with both workers recorded for the attempt (worker 1 a new pod) and Ready."""
    status["attemptWorkers"] = [{"name": f"{NAME}-worker-0", "uid": "w0", "restartCount": 0},
                                {"name": f"{NAME}-worker-1", "uid": "w1-new",
                                 "restartCount": 0}]
    return st.set_condition(status, st.WORKERS_READY, True, "AllWorkersReady", "", 1, START)


def failed_preflight(settings: Settings, message: str, finished: str) -> dict[str, Any]:
    """The attempt's launcher pod, Failed with exit code 1 and ``message`` at ``finished``."""
    failed = launcher_pod(settings)
    failed["status"] = {"phase": "Failed", "containerStatuses": [{
        "name": "launcher", "state": {"terminated": {
            "exitCode": 1, "finishedAt": finished, "message": message}}}]}
    return failed


def with_budgets(status: dict[str, Any]) -> dict[str, Any]:
    """The job with ``status``: no application restart, two infrastructure ones."""
    return {**job_body(status), "spec": {**job_body()["spec"], "runPolicy": {
        "backoffLimit": 0, "infrastructureBackoffLimit": 2}}}


def test_c20_attempt_after_an_infrastructure_restart_is_not_an_application_failure(api):
    """Attempt 2 (after worker 1 was lost) fails its pre-flight on the recreated worker 1:
    Infrastructure, the application budget (backoffLimit 0) untouched, attempt 3 starts."""
    settings = Settings.from_env()
    status = attempts.begin({}, 1, "2026-12-01T11:59:00Z")
    status = attempts.update_current(status, launchTime="2026-12-01T11:59:05Z",
                                     endTime=START, **{"class": "Infrastructure"},
                                     lostWorkers=[f"{NAME}-worker-1"])
    status = attempts.begin({**status, "failureCounts": {"infrastructure": 1}}, 2, START)
    status = running(attempts.update_current(status, launchTime="2026-12-01T12:00:10Z",
                                             launcherPod=f"{NAME}-launcher-2"))
    failed = failed_preflight(settings, line(f"{FQDN} (10.244.1.9): DNSNotResolvable: no address"),
                              "2026-12-01T12:00:41Z")
    failed["metadata"].update(name=f"{NAME}-launcher-2", labels={
        **failed["metadata"]["labels"], "monarch-operator.dev/attempt": "2"})
    after = run_policy_pass(settings, with_budgets(status), [*pods(), failed],
                            dt.datetime(2026, 12, 1, 12, 0, 50, tzinfo=dt.UTC))

    second = after["attempts"][1]
    assert (second["class"], second["reason"]) == ("Infrastructure", "WorkerUnreachable"), second
    assert second["message"].startswith(
        f"pre-flight could not reach recreated worker {NAME}-worker-1 (DNSNotResolvable): "
        "launcher exited with code 1: pre-flight failed"), second["message"]
    assert after["failureCounts"] == {"infrastructure": 2}
    assert after["attempt"] == 3 and not st.is_true(after, st.FAILED)


def test_the_first_attempt_of_a_job_applied_again_under_its_name_is_not_an_application_failure(
        api):
    """A job deleted and applied again at once: attempt 1's pre-flight finds worker 1's name
    still giving the deleted job's pod from the resolver's cache (DNSStale; seen on the real
    nodes, 2026-12-06). The program never ran: Infrastructure, never the application budget
    (backoffLimit 0 made it Failed), and attempt 2 starts."""
    settings = Settings.from_env()
    status = attempts.begin({}, 1, START)
    status = running(attempts.update_current(status, launchTime="2026-12-01T12:00:10Z",
                                             launcherPod=f"{NAME}-launcher"))
    failed = failed_preflight(settings, line(
        f"{FQDN} (10.244.2.3): DNSStale: resolves to 10.244.2.3, not to 10.244.2.5, the "
        "address the host has now"), "2026-12-01T12:00:16Z")
    workers = pods("2026-12-01T12:00:01Z")
    workers[0]["metadata"]["creationTimestamp"] = "2026-12-01T12:00:01Z"
    after = run_policy_pass(settings, with_budgets(status), [*workers, failed],
                            dt.datetime(2026, 12, 1, 12, 0, 20, tzinfo=dt.UTC))

    first = after["attempts"][0]
    assert (first["class"], first["reason"]) == ("Infrastructure", "WorkerUnreachable"), first
    assert first["message"].startswith(
        f"pre-flight could not reach new worker {NAME}-worker-1 (DNSStale): "), first["message"]
    assert after["failureCounts"] == {"infrastructure": 1}, "the application count stays 0"
    assert after["attempt"] == 2 and not st.is_true(after, st.FAILED)
