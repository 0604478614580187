"""Hang detection and the progress budget rule (issue 22 item 2): the launcher notices a
program that stopped reporting, dumps its threads and stops the run; the operator judges it
(or stops it itself when the launcher cannot); progress since the previous failure spends no
budget when asked, and a crash loop still stops."""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time
from typing import Any

import pytest

from monarch_operator import constants, names
from monarch_operator.controller.judge import stalls
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state import timestamps
from monarch_operator.launcher import progress, stopsignal
from tests.unit.test_launch_pass import job_body
from tests.unit.test_verdicts import (  # noqa: F401 - fixture
    NAME,
    api,
    run_policy_pass,
    running_launcher,
    running_status,
    worker,
)

T0 = dt.datetime(2026, 12, 2, 3, 0, tzinfo=dt.UTC)


def test_the_operator_reads_the_stall_the_launcher_writes():
    assert stalls.STALL_MARKER == progress.STALL_REASON + ": "
    message = progress.stall_message(65.2, 60, {"step": 120}, ["MainThread: wait (a.py:1)",
                                                              "w: run (b.py:2)"])
    assert stalls.stall_in(f"monarch-launch: failed: {message}") == (
        "ProgressStalled: no progress report for 65s (runPolicy.progressDeadlineSeconds=60; "
        "last step 120)", ["MainThread: wait (a.py:1)", "w: run (b.py:2)"])
    assert stalls.stall_in("launcher exited with code 1") is None


def test_a_program_that_stops_reporting_is_stalled_once_with_its_threads():
    stalled: list[tuple[float, dict]] = []
    done = threading.Event()

    def on_stall(idle: float, state: dict[str, Any]) -> None:
        stalled.append((idle, state))
        done.set()

    forwarder = progress.Forwarder(lambda text: None, interval=0, deadline=0.3,
                                   on_stall=on_stall)
    time.sleep(0.5)
    assert not stalled, "no report yet: nothing to judge"
    for step in range(3):
        forwarder.offer({"step": step})
        time.sleep(0.1)
    assert done.wait(3), "stalled 0.3 s after the last report"
    time.sleep(0.5)
    forwarder.close()
    assert len(stalled) == 1 and stalled[0][0] >= 0.3 and stalled[0][1]["step"] == 2
    stacks = progress.thread_stacks()
    assert any(line.startswith("MainThread: ") and "test_stalls.py" in line for line in stacks)


def test_a_stalled_launcher_ends_with_the_stall_not_the_signal():
    stopsignal.reset()
    try:
        stopsignal.record_stall("ProgressStalled: no progress report for 61s")
        stopsignal.record(signal.SIGTERM)  # the launcher's own SIGTERM stopped the run
        assert stopsignal.final_result(143, "terminated by signal 15 (SIGTERM)") == (
            143, "ProgressStalled: no progress report for 61s")
    finally:
        stopsignal.reset()


def stalled_status(settings: Settings, idle: float, deadline: int = 60) -> tuple[dict, dict]:
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    status["progress"] = {"attempt": 1, "step": 120, "lastUpdatedTime": st.format_time(
        launched + dt.timedelta(seconds=10))}
    body = {**job_body(status), "spec": {**job_body()["spec"], "runPolicy": {
        "progressDeadlineSeconds": deadline, "infrastructureBackoffLimit": 1}}}
    return body, {"now": launched + dt.timedelta(seconds=10 + idle), "launched": launched}


# 0: a `launcher.command` program that exits 0 when the launcher stops it (issue 32 item 2):
# the stall, not the exit code, says how the attempt ended.
@pytest.mark.parametrize("exit_code", [143, 0])
def test_the_launchers_stall_is_an_infrastructure_restart_with_its_stacks(
        api, exit_code):  # noqa: F811
    settings = Settings.from_env()
    body, at = stalled_status(settings, idle=70)
    pod = running_launcher(settings, at["launched"], exit_code=exit_code, ended=75)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = (
        "monarch-launch: failed: " + progress.stall_message(61, 60, {"step": 120},
                                                           ["MainThread: wait (x.py:9)"]))
    after = run_policy_pass(settings, body, [worker(0), worker(1), pod],
                            at["launched"] + dt.timedelta(seconds=90))
    record = after["attempts"][0]
    assert (record["class"], record["reason"]) == ("Infrastructure", "ProgressStalled"), record
    assert record["stacks"] == ["MainThread: wait (x.py:9)"]
    assert record["message"].startswith("ProgressStalled: no progress report for 61s")
    assert after["attempt"] == 2 and after["failureCounts"] == {"infrastructure": 1}


@pytest.mark.parametrize(("idle", "stopped"), [(60 + 10 + 59, False), (60 + 10 + 61, True)])
def test_the_operator_stops_a_stall_the_launcher_did_not(api, idle, stopped):  # noqa: F811
    settings = Settings.from_env()
    body, at = stalled_status(settings, idle=idle)
    pod = running_launcher(settings, at["launched"])
    after = run_policy_pass(settings, body, [worker(0), worker(1), pod], at["now"])
    record = after["attempts"][0]
    if not stopped:
        assert "class" not in record and after["attempt"] == 1
        return
    assert (record["class"], record["reason"]) == ("Infrastructure", "ProgressStalled")
    assert "stopped by the operator" in record["message"]
    # Stopped once the verdict is stored (the pass after the write), never before it: the
    # running launcher is what a next leader would judge again.
    assert api["deleted"] == [], "nothing the verdict rests on goes before it is stored"
    run_policy_pass(settings, {**body, "status": after}, [worker(0), worker(1), pod], at["now"])
    assert set(api["deleted"]) == {f"{NAME}-launcher"}, "the stalled launcher is stopped"


def test_an_attempt_that_never_reported_is_not_judged(api):  # noqa: F811
    settings = Settings.from_env()
    body, at = stalled_status(settings, idle=10_000)
    body["status"]["progress"]["attempt"] = 0  # an earlier attempt's report
    after = run_policy_pass(settings, body, [worker(0), worker(1),
                                             running_launcher(settings, at["launched"])],
                            at["now"])
    assert "class" not in after["attempts"][0]


def failing(settings: Settings, steps: list[int | None], resets: bool = True) -> dict:
    """A pass on the last of ``steps`` attempts (their lastStep) whose launcher exited 1; the
    earlier attempts spent the whole application budget (backoffLimit = their number)."""
    backoff_limit = len(steps) - 1
    status = running_status(settings)
    current = status["attempts"][-1]
    records = [{"number": index + 1, "class": "Application", **(
        {"lastStep": step} if step is not None else {})} for index, step in enumerate(steps[:-1])]
    current = {**current, "number": len(steps),
               **({"lastStep": steps[-1]} if steps[-1] is not None else {})}
    status.update(attempts=[*records, current], attempt=len(steps),
                  failureCounts={"application": len(steps) - 1} if len(steps) > 1 else {})
    launched = timestamps.parse(current["launchTime"])
    body = {**job_body(status), "spec": {**job_body()["spec"], "runPolicy": {
        "backoffLimit": backoff_limit, "progressResetsBackoff": resets}}}
    pod = running_launcher(settings, launched, exit_code=1, ended=5)
    pod["metadata"]["name"] = names.launcher_pod(NAME, len(steps))
    pod["metadata"]["labels"] = {**pod["metadata"]["labels"],
                                 constants.LABEL_ATTEMPT: str(len(steps))}
    return run_policy_pass(settings, body, [worker(0), worker(1), pod],
                           launched + dt.timedelta(seconds=30))


def test_a_failure_after_progress_spends_no_budget(api):  # noqa: F811
    settings = Settings.from_env()
    after = failing(settings, [100, 250])  # the budget is spent, and still a restart
    assert after["attempt"] == 3 and after["failureCounts"] == {"application": 1}
    assert after["attempts"][1]["budgetSpent"] is False
    assert not st.is_true(after, st.FAILED)


@pytest.mark.parametrize("steps", [[None], [0], [250, 250], [250, 120]])
def test_a_crash_loop_without_progress_still_spends_and_stops(api, steps):  # noqa: F811
    settings = Settings.from_env()
    after = failing(settings, steps)
    assert st.is_true(after, st.FAILED), after


def test_without_the_rule_progress_changes_nothing(api):  # noqa: F811
    settings = Settings.from_env()
    after = failing(settings, [100, 250], resets=False)
    assert st.is_true(after, st.FAILED)


def test_the_operator_reads_the_odd_rank_and_one_line_per_rank_from_the_launcher():
    """Issue 35: with every rank's stack the message names the odd one out before the
    threads, and the record's stacks are the per-rank lines."""
    ranks = ["rank 0 on w0: in all_reduce #42 at train.py:20 main",
             "rank 3 on w1: not in a collective (last all_reduce #41) at train.py:88 load_batch"]
    odd = "rank 3 on w1 is not in all_reduce #42 where 7 ranks wait: train.py:88 load_batch"
    message = progress.stall_message(65, 60, {"step": 120}, ranks, odd)
    assert stalls.stall_in(f"monarch-launch: failed: {message}") == (
        "ProgressStalled: no progress report for 65s (runPolicy.progressDeadlineSeconds=60; "
        f"last step 120); {odd}", ranks)


def test_standalone_the_deadline_alone_makes_a_forwarder_in_the_launcher_only(monkeypatch):
    monkeypatch.setattr(progress, "_forwarder", None)
    monkeypatch.setattr(progress, "_closed", False)
    monkeypatch.setattr(progress, "_in_launcher", False)
    monkeypatch.setattr(progress.atexit, "register", lambda function: None)
    environ = {constants.ENV_PROGRESS_DEADLINE: "30"}
    assert progress.install(environ) is None  # a rank's process: reports are printed
    progress.mark_launcher()
    assert progress.install({constants.ENV_PROGRESS_DEADLINE: "0"}) is None
    forwarder = progress.install(environ)
    try:
        assert forwarder is not None and forwarder._deadline == 30.0
        assert progress.install(environ) is forwarder
        assert progress.store_stacks("dump") is False  # no MonarchJob: the output only
    finally:
        assert forwarder is not None
        forwarder.close()
