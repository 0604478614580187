"""The run mark every process of a launch inherits (launcher.session.stragglers): built from the
launcher pod's MONARCH_JOB_UID and MONARCH_ATTEMPT, refused with the variable named, read back
from the scan's report and turned into lines naming host, pid and command."""

from __future__ import annotations

import pytest

from monarch_operator.controller.builders.launcher import launcher_env
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.launcher.session.stragglers import (
    MARK_ENV,
    RunMark,
    RunMarkError,
    ScanReport,
    Survivor,
    mark_env,
    parse_report,
    preflight_prefix,
    run_mark,
    survivor_lines,
)


@pytest.mark.parametrize(
    ("case", "environ", "expected"),
    [
        ("standalone", {}, RunMark("-", 0, "r1")),
        ("standalone, attempt ignored", {"MONARCH_ATTEMPT": "4"}, RunMark("-", 0, "r1")),
        ("a job's attempt", {"MONARCH_JOB_UID": "5f0c-11ee", "MONARCH_ATTEMPT": "3"},
         RunMark("5f0c-11ee", 3, "r1")),
        ("a job without attempt", {"MONARCH_JOB_UID": "u"}, RunMark("u", 1, "r1")),
    ],
)
def test_run_mark_from_the_launcher_environment(case, environ, expected):
    mark = run_mark("r1", environ)
    assert mark == expected, case
    assert RunMark.parse(mark.value) == mark
    assert mark_env(mark) == {MARK_ENV: mark.value}


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"MONARCH_JOB_UID": "a/b"}, "MONARCH_JOB_UID='a/b': must be a job uid"),
        ({"MONARCH_JOB_UID": "u", "MONARCH_ATTEMPT": "0"}, "MONARCH_ATTEMPT='0': must be 1"),
        ({"MONARCH_JOB_UID": "u", "MONARCH_ATTEMPT": "x"}, "MONARCH_ATTEMPT='x': must be 1"),
    ],
)
def test_a_malformed_job_uid_or_attempt_is_refused_naming_the_variable(environ, named):
    with pytest.raises(RunMarkError, match=named.replace("(", r"\(")):
        run_mark("r1", environ)


@pytest.mark.parametrize("value", ["", "-", "-/0", "u/x/r", "/1/r", "u/1/"])
def test_a_value_that_is_no_mark_reads_as_none(value):
    assert RunMark.parse(value) is None


def test_the_operator_gives_the_launcher_pod_the_jobs_uid_next_to_its_attempt():
    job = JobSpec.from_body({
        "metadata": {"name": "demo", "namespace": "team-a", "uid": "6d1e-42", "generation": 1},
        "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 1},
                 "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}},
    })
    env = {item["name"]: item.get("value") for item in launcher_env(job, attempt=2)}
    assert run_mark("r", env) == RunMark("6d1e-42", 2, "r")


def test_the_report_line_becomes_lines_naming_host_pid_command_and_outcome():
    stdout = (
        "noise\n"
        'monarch-stragglers {"found": [{"pid": 41, "command": "sleep 1000", "mark": "u/1/a", '
        '"stopped": "SIGKILL"}, {"pid": 42, "command": "python loader.py", "mark": "-/0/b", '
        '"stopped": null}], "left": [42], "scanned": 300, "scan_ms": 2.5}\n'
        '{"reason": null}\n'
    )
    report = parse_report(stdout)
    assert report == ScanReport(
        (Survivor(41, "sleep 1000", RunMark("u", 1, "a"), "SIGKILL"),
         Survivor(42, "python loader.py", RunMark("-", 0, "b"), None)),
        (42,), 300, 2.5,
    )
    assert survivor_lines("node-1", report) == [
        "process of an earlier run on node-1, pid 41 (attempt 1 of this job): sleep 1000: "
        "stopped (SIGKILL)",
        "process of an earlier run on node-1, pid 42 (run b): python loader.py: left running "
        "(--no-clean-stale)",
    ]
    assert survivor_lines("node-1", None) == []
    assert parse_report('{"reason": null}\n') is None
    assert parse_report("monarch-stragglers {broken\n") is None


def test_the_preflight_runs_the_scan_first_and_only_with_a_mark():
    assert preflight_prefix("python3", None, True) == ""
    prefix = preflight_prefix("python3", RunMark("-", 0, "abc"), False)
    assert prefix.startswith("python3 -I -S -c ")
    assert prefix.endswith(f" {MARK_ENV} earlier -/0/abc 0 3 </dev/null; ")
