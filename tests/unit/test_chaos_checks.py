"""The chaos soak's judgements (``monarch_operator.testing.chaos``), on hand-made statuses:
each invariant passes on a truthful status and catches the lie it is there for, so that a
soak with 0 violations means something."""

from __future__ import annotations

import random

import pytest

from monarch_operator.testing.chaos import checks, plan, procs
from monarch_operator.testing.chaos.plan import Verdict
from monarch_operator.testing.chaos.procs import JobProcess
from monarch_operator.testing.chaos.soak import Track


def attempt(number: int, cls: str | None = None, **fields: object) -> dict:
    record = {"number": number, "startTime": "2026-01-01T00:00:00Z",
              "launchTime": "2026-01-01T00:00:10Z", **fields}
    if cls:
        record.update({"class": cls, "endTime": "2026-01-01T00:01:00Z"})
    return record


def failed_status(records: list[dict], counts: dict, reason: str, code: int | None) -> dict:
    return {"phase": "Failed", "attempt": records[-1]["number"], "attempts": records,
            "failureCounts": counts, "restartCount": sum(counts.values()),
            "completionTime": "2026-01-01T00:02:00Z", "launcher": {"exitCode": code},
            "conditions": [{"type": "Failed", "status": "True", "reason": reason}]}


def test_a_deleted_launcher_judged_application_is_a_violation():
    accepted = {Verdict(plan.INFRASTRUCTURE, None, frozenset({"LauncherLost"}))}
    seen = attempt(1, "Application", exitCode=143, reason="LauncherFailed", message="143")
    assert checks.verdict_problems(seen, accepted) == [
        ("Infrastructure (LauncherLost)", "Application exit 143 (LauncherFailed): 143")]
    lost = attempt(1, "Infrastructure", reason="LauncherLost")
    assert checks.verdict_problems(lost, accepted) == []


def test_a_node_lost_under_a_deleted_launchers_job_accepts_either_faults_verdict():
    # CI, seed 1: a node lost under the job's worker, then its launcher deleted; the
    # operator judged the worker's loss (WorkerRestarted), which is as true as LauncherLost.
    track = Track(plan.make_plan("c005", "rank_straggler_lost", random.Random(1)), 0.0)
    track.strict[1] = Verdict(plan.INFRASTRUCTURE, None, frozenset({"LauncherLost"}))
    worker_lost = attempt(1, "Infrastructure", reason="WorkerRestarted")
    assert checks.verdict_problems(worker_lost, track.accepted(1)) != []
    track.widen(1, Verdict(plan.INFRASTRUCTURE))  # what a node lost under its pods widens
    assert checks.verdict_problems(worker_lost, track.accepted(1)) == []
    # Still never Application, and the next attempt keeps its own natural verdict.
    failed = attempt(1, "Application", exitCode=143, reason="LauncherFailed")
    assert checks.verdict_problems(failed, track.accepted(1)) != []
    assert track.accepted(2) == track.plan.natural(2)


def test_natural_verdicts_follow_exit_code_rules():
    rng = random.Random(0)
    fatal = plan.make_plan("f", "fatal", rng)
    assert fatal.natural(1) == {Verdict(plan.FATAL, 42)}
    ignore = plan.make_plan("i", "ignore", rng)
    assert ignore.natural(1) == {Verdict(plan.INFRASTRUCTURE, 134)}
    assert ignore.natural(2) == {Verdict(plan.SUCCEEDED, 0)}
    hang = plan.make_plan("h", plan.WORKER_DELETED, rng)
    assert hang.natural(1) == set(), "a hang ends only by its fault"


@pytest.mark.parametrize("scenario", sorted(plan.SCENARIOS))
def test_every_scenario_makes_a_valid_launcher_script(scenario):
    job = plan.make_plan(f"j-{scenario}", scenario, random.Random(3))
    body = job.manifest("/venv/bin/monarch-torchrun", "/venv/bin/python", "/repo/operator")
    script = body["spec"]["launcher"]["command"][2]
    assert script.count(";;") == len(job.actions) + 1
    assert ("monarch-torchrun" in script) == job.torchrun


def test_budgets_exact_catch_a_spent_budget_not_counted():
    records = [attempt(1, "Infrastructure", reason="WorkerEvicted"),
               attempt(2, "Application", exitCode=3, reason="LauncherFailed")]
    truthful = failed_status(records, {"infrastructure": 1}, "LauncherFailed", 3)
    assert checks.budget_problems(truthful, backoff_limit=0, infra_limit=3) == []
    assert checks.final_problems(truthful) == []
    uncounted = failed_status(records, {}, "LauncherFailed", 3)
    assert checks.budget_problems(uncounted, 0, 3)[0][0].startswith("failureCounts {'applic")
    early = failed_status(records, {"infrastructure": 1}, "LauncherFailed", 3)
    assert "restarts are left" in checks.budget_problems(early, 1, 3)[0][0]


def test_budgets_exact_leave_out_a_failure_that_spent_nothing():
    """runPolicy.progressResetsBackoff: a failure after a new highest step restarts the job
    (restartCount) without spending backoffLimit (failureCounts)."""
    records = [attempt(1, "Application", exitCode=1, reason="LauncherFailed", lastStep=5,
                       budgetSpent=False),
               attempt(2, "Application", exitCode=1, reason="LauncherFailed", lastStep=5)]
    truthful = {**failed_status(records, {}, "LauncherFailed", 1), "restartCount": 1}
    assert checks.budget_problems(truthful, backoff_limit=0, infra_limit=3) == []
    counted = {**failed_status(records, {"application": 1}, "LauncherFailed", 1),
               "restartCount": 1}
    assert checks.budget_problems(counted, 0, 3)[0][0] == (
        "failureCounts {'application': 0, 'infrastructure': 0} (from the attempts' classes)")


def test_final_state_must_tell_the_last_attempt():
    records = [attempt(1, "Application", exitCode=3, reason="LauncherFailed")]
    status = failed_status(records, {}, "LauncherFailed", 3)
    status["phase"] = "Succeeded"
    assert checks.final_problems(status)[0][0] == "Succeeded: the last attempt Succeeded, exit 0"
    wrong_reason = failed_status(records, {}, "WorkerEvicted", 3)
    assert "reason LauncherFailed" in checks.final_problems(wrong_reason)[0][0]


def test_phantom_attempts_and_launches_while_suspended():
    phantom = {"phase": "Running", "attempt": 2,
               "attempts": [{"number": 1, "class": "Suspended", "endTime": "x"},
                            {"number": 2}]}
    assert "no launchTime (phantom)" in checks.record_problems(phantom)[0][1]
    status = {"attempts": [attempt(1, launchTime="2026-01-01T00:00:30Z")]}
    start = checks.epoch("2026-01-01T00:00:20Z")
    assert start is not None
    assert checks.suspended_span_problems(status, [(start, start + 20)])
    assert not checks.suspended_span_problems(status, [(start - 60, start - 30)])


def test_two_live_launchers_and_survivors():
    pods = [{"metadata": {"name": f"j-launcher{s}"}, "spec": {"nodeName": node},
             "status": {"phase": phase}}
            for s, node, phase in (("", "kwok-gpu-0", "Running"), ("-2", "kwok-gpu-1", "Pending"),
                                   ("-3", "kwok-gpu-2", "Failed"))]
    assert checks.live_launcher_problems(pods, set()) == [
        ("one launcher pod not ended", "2: j-launcher, j-launcher-2")]
    assert checks.live_launcher_problems(pods, {"kwok-gpu-0"}) == []
    old = JobProcess(10, "uid", 1, False, "sleep 1000")
    new = JobProcess(11, "uid", 2, False, "python worker")
    survivors, _ = checks.process_problems([old, new])
    assert "pid 10 (worker, attempt 1): sleep 1000" in survivors[0][1]
    assert checks.process_problems([new]) == ([], [])
    _, launchers = checks.process_problems([JobProcess(5, "uid", 1, True, "sh"),
                                            JobProcess(6, "uid", 2, True, "sh")])
    assert launchers


def test_ledger_counts_checks_and_keeps_each_violation_once():
    ledger = checks.Ledger()
    for _ in range(3):
        ledger.judge(checks.BUDGETS, "j", None, [("a", "b")], 1.0)
    ledger.judge(checks.BUDGETS, "k", None, [], 2.0)
    assert ledger.checks[checks.BUDGETS] == 4 and len(ledger.violations) == 1


def test_the_process_scan_tells_launcher_and_worker_processes_apart(tmp_path):
    def fake(pid: int, environ: dict[str, str], state: str = "S", command: str = "sleep") -> None:
        folder = tmp_path / str(pid)
        folder.mkdir()
        (folder / "environ").write_bytes(b"\0".join(f"{k}={v}".encode()
                                                    for k, v in environ.items()) + b"\0")
        (folder / "stat").write_text(f"{pid} ({command}) {state} 1 2 3")
        (folder / "cmdline").write_bytes(command.encode() + b"\0" + b"1000\0")

    fake(10, {"MONARCH_RUN_MARK": "uid-a/2/run1", "PATH": "/bin"})
    fake(11, {"MONARCH_JOB_UID": "uid-a", "MONARCH_ATTEMPT": "3"}, command="sh")
    fake(12, {"MONARCH_RUN_MARK": "uid-b/1/run2"})  # another job
    fake(13, {"MONARCH_RUN_MARK": "uid-a/1/run0"}, state="Z")  # a zombie has ended
    fake(14, {"HOME": "/root"})
    (tmp_path / "self").mkdir()

    found = procs.scan({"uid-a"}, proc=str(tmp_path))
    assert found == [JobProcess(10, "uid-a", 2, False, "sleep 1000"),
                     JobProcess(11, "uid-a", 3, True, "sh 1000")]
