"""Every warning tells what was seen (issue 32): launcher.session.causes, and the places that
use it. Pure; ssh's wording as seen on real runs (OpenSSH 9)."""

from __future__ import annotations

import pytest

from monarch_operator.launcher.session.causes import (
    command_failure,
    not_reached,
    quote,
)
from monarch_operator.launcher.session.fanout import CommandResult
from monarch_operator.launcher.session.straggler_scan import command_words
from monarch_operator.launcher.session.stragglers import ScanReport, Survivor, survivor_lines


@pytest.mark.parametrize(
    ("result", "words"),
    [
        (CommandResult(None, "", ""), "no answer within 15s"),
        (CommandResult(255, "", "kex_exchange_identification: Connection closed by remote host\n",
                       7),
         "refused at login 7 times (kex_exchange_identification: Connection closed by remote "
         "host)"),
        (CommandResult(255, "", "Exceeded MaxStartups\r\n"), "refused at login (Exceeded "
                                                            "MaxStartups)"),
        (CommandResult(255, "", "ssh: connect to host 10.0.0.7 port 22: No route to host\n"),
         "ssh: connect to host 10.0.0.7 port 22: No route to host"),
        (CommandResult(255, "", ""), "ssh failed (exit status 255) and said nothing"),
        (CommandResult(127, "", "sh: 1: /opt/venv/bin/python3: not found\n"),
         "command not found, exit status 127 (sh: 1: /opt/venv/bin/python3: not found)"),
        (CommandResult(1, "", "Traceback (most recent call last):\n  File \"<string>\", line "
                              "9\nPermissionError: [Errno 1] Operation not permitted\n"),
         "exit status 1 (PermissionError: [Errno 1] Operation not permitted)"),
        (CommandResult(-9, "", ""), "the ssh client was killed by signal SIGKILL (9)"),
        (CommandResult(0, "", ""), "exit status 0 but no report"),
    ],
    ids=["timeout", "refused-7", "maxstartups", "no-route", "silent-255", "not-found",
         "traceback", "ssh-killed", "no-report"],
)
def test_a_failed_command_is_said_in_words(result: CommandResult, words: str) -> None:
    said = command_failure(result, 15.0)

    assert said == words
    assert "None" not in said


def test_a_quote_is_one_line_and_bounded() -> None:
    assert quote("first\n\n  last  \n") == "last"
    assert quote("") == ""
    assert len(quote("x" * 1000)) == 200


def test_the_summary_names_each_host_once_or_is_absent() -> None:
    assert not_reached("sweep", {}, 64) is None
    assert not_reached("sweep", {"h1": "no answer within 15s", "h2": "exit status 2"}, 64,
                       "then this") == (
        "sweep: 2 of 64 hosts not reached: h1 (no answer within 15s), h2 (exit status 2); "
        "then this"
    )


@pytest.mark.parametrize(
    ("survivor", "left", "stopping", "outcome"),
    [
        (Survivor(41, "sleep 1000", None, "SIGTERM"), (), True, "stopped (SIGTERM)"),
        (Survivor(41, "sleep 1000", None, None), (), True,
         "ended by itself before it was signalled"),
        (Survivor(41, "sleep 1000", None, "SIGKILL"), (41,), True, "still running after SIGKILL"),
        (Survivor(41, "sleep 1000", None, None), (41,), True,
         "still running: it could not be signalled"),
        (Survivor(41, "sleep 1000", None, None), (41,), False, "left running (--no-clean-stale)"),
    ],
    ids=["terminated", "ended-alone", "outlived-kill", "not-signalled", "report-only"],
)
def test_what_became_of_a_process_is_never_none(
    survivor: Survivor, left: tuple[int, ...], stopping: bool, outcome: str
) -> None:
    lines = survivor_lines("node-1", ScanReport((survivor,), left), stopping=stopping)

    assert lines == [f"process of an earlier run on node-1, pid 41 (unknown run): sleep 1000: "
                     f"{outcome}"]


def test_a_python_program_on_a_command_line_is_named_not_printed() -> None:
    guard = "\nimport os, signal, sys\nos.write(2, b'monarch-session-guard: up\\n')\n" * 20
    worker = "from monarch.actor import run_worker_loop_forever\nrun_worker_loop_forever()"
    helper = "import json, os\n" + "x = 1\n" * 11

    assert command_words(["python3", "-c", guard, "5", "python3", "-c", worker]) == (
        "python3 -c <session guard program> 5 python3 -c <Monarch worker program>"
    )
    assert command_words(["/opt/venv/bin/python", "-I", "-c", helper, "arg"]) == (
        "/opt/venv/bin/python -I -c <program of 12 lines> arg"
    )
    assert command_words(["sh", "-c", "exec sleep 1000"]) == "sh -c exec sleep 1000"
    assert len(command_words(["sleep", "9" * 500])) == 200
