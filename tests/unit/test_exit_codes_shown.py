"""The EXIT column and the attempts' exit codes (issue 32 item 5): ``status.launcher`` is the
launcher of the attempt that ended last, never an earlier one's, and shows no exit code when it
reported none; an attempt whose launcher still ran when its end was recorded gets the
launcher's exit code and output once it ended."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml

from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state import timestamps
from tests.unit.test_launch_pass import job_body, running_status
from tests.unit.test_verdicts import api, run_policy_pass, running_launcher, worker  # noqa: F401

CRD = Path(__file__).resolve().parents[2] / "crds" / "monarchjobs.monarch-operator.dev.yaml"


def test_a_launcher_lost_without_an_exit_code_shows_none_not_an_earlier_one(api):  # noqa: F811
    settings = Settings.from_env()
    status = running_status(settings)
    # An earlier attempt's launcher, stopped from outside, had exited 0 (not believed).
    status["launcher"] = {"exitCode": 0, "reason": "stopped"}
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    lost = running_launcher(settings, launched)
    lost["status"] = {"phase": "Failed"}  # its pod failed, no container ever ended
    body = {**job_body(status), "spec": {**job_body()["spec"],
                                         "runPolicy": {"infrastructureBackoffLimit": 0}}}
    after = run_policy_pass(settings, body, [worker(0), worker(1), lost],
                            launched + dt.timedelta(seconds=8))
    record = after["attempts"][-1]
    assert (record["reason"], record.get("exitCode")) == (st.REASON_LAUNCHER_LOST, None)
    assert st.is_true(after, st.FAILED)
    # EXIT (.status.launcher.exitCode) empty: None removes status.launcher (a merge patch).
    assert after.get("launcher") is None, after.get("launcher")


def test_a_launcher_stopped_after_its_attempt_ended_gives_its_exit_code_then(api):  # noqa: F811
    """Worker 1 lost mid-run: the attempt ends (Infrastructure) while its launcher still runs,
    and the launcher is stopped. Once it ended, the record has its exit code and output tail
    (its end time stays the attempt's: the loss ended it), and EXIT shows it."""
    settings = Settings.from_env()
    status = running_status(settings)
    launched = timestamps.parse(status["attempts"][-1]["launchTime"])
    assert launched is not None
    body = {**job_body(status), "spec": {**job_body()["spec"],
                                         "runPolicy": {"infrastructureBackoffLimit": 0}}}
    gone = worker(1, uid="replacement")
    ended_at = launched + dt.timedelta(seconds=5)
    first = run_policy_pass(settings, body, [worker(0), gone, running_launcher(settings, launched)],
                            ended_at)
    record = first["attempts"][0]
    assert (record["reason"], record.get("exitCode")) == (st.REASON_WORKER_EVICTED, None)
    assert first.get("launcher") is None
    stopped = running_launcher(settings, launched, exit_code=143, ended=7)
    stopped["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = (
        "monarch-launch: terminated by signal 15 (SIGTERM)")
    after = run_policy_pass(settings, {**body, "status": first}, [worker(0), gone, stopped],
                            launched + dt.timedelta(seconds=9))
    record = after["attempts"][0]
    assert record["exitCode"] == 143, record
    assert record["outputTail"] == ["monarch-launch: terminated by signal 15 (SIGTERM)"]
    assert record["endTime"] == st.format_time(ended_at)
    assert after["launcher"]["exitCode"] == 143


def test_the_exit_column_says_whose_exit_code_it_is():
    crd = yaml.safe_load(CRD.read_text())
    columns = {column["name"]: column for column in
               crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Exit"]["jsonPath"] == ".status.launcher.exitCode"
    assert "empty when it reported none" in columns["Exit"]["description"]
