"""Every warning and failure tells what was seen (issue 32): launcher.session.causes, and the
places that use it. Pure; ssh's and Monarch's wording as seen on real runs (OpenSSH 9,
torchmonarch 0.7.0)."""

from __future__ import annotations

import pytest

from monarch_operator.hostfile import Host
from monarch_operator.launcher.hosts.placement import plan_placement
from monarch_operator.launcher.programs.roles import describe_failure
from monarch_operator.launcher.programs.spmd import SpmdRunError, describe_exit
from monarch_operator.launcher.programs.spmd_actor import RankOutcome
from monarch_operator.launcher.session.causes import (
    command_failure,
    monarch_loss,
    not_reached,
    quote,
    session_end,
)
from monarch_operator.launcher.session.fanout import CommandResult
from monarch_operator.launcher.session.lifecycle import WorkerLost
from monarch_operator.launcher.session.straggler_scan import command_words
from monarch_operator.launcher.session.stragglers import ScanReport, Survivor, survivor_lines

# A Monarch supervision error for a trainer proc whose host went silent (wording of
# hyperactor_mesh in torchmonarch 0.7.0; the proc and actor ids as Monarch prints them).
UNRESPONSIVE = (
    "SupervisionError: Endpoint call trainer.step() failed, The actor <root>.<monarch_operator."
    "launcher.programs.workload.Trainer trainer{'hosts': 1/2, 'gpus': 0/1}> and all its "
    "descendants have failed: Supervision event: the process tcp:127.0.0.3:26600,service "
    "owned by actor <root>.<monarch_operator.launcher.programs.workload.Trainer trainer> became "
    "unresponsive and is assumed dead, check the log on the host for details"
)
STALLED = (
    "delivery progress to monitored actor tcp:192.0.2.7:26600,trainer[1] from "
    "tcp:192.0.2.2:40111,client[0] stalled for 30s"
)
UNDELIVERED = "failed to deliver message within timeout 60s"
EXITED_3 = "the process this actor was running on exited with non-zero code 3"


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
        (CommandResult(255, "", "ssh: connect to host 192.0.2.7 port 22: No route to host\n"),
         "ssh: connect to host 192.0.2.7 port 22: No route to host"),
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
    ("code", "lines", "words"),
    [
        (255, ["[spmd/127.0.0.3/1] started", "Timeout, server 127.0.0.3 not responding."],
         "127.0.0.3 stopped answering: no reply to 3 ssh keepalives sent 1s apart (3s of "
         "silence)"),
        (255, ["Connection to 127.0.0.3 closed by remote host."],
         "the ssh connection to 127.0.0.3 was cut (Connection to 127.0.0.3 closed by remote "
         "host.)"),
        (255, ["[spmd/127.0.0.3/1] started"],
         "the ssh session to 127.0.0.3 ended (ssh exit status 255, no reason given)"),
        (3, ["boom"], "the Monarch worker on 127.0.0.3 exited with status 3"),
        (137, [], "the Monarch worker on 127.0.0.3 was killed by signal SIGKILL (9)"),
        (-15, [], "the ssh client for 127.0.0.3 was killed by signal SIGTERM (15)"),
    ],
    ids=["keepalives-unanswered", "closed-by-remote", "cut-silently", "exit-3", "killed",
         "ssh-killed"],
)
def test_a_session_that_ended_mid_run_is_said_in_words(
    code: int, lines: list[str], words: str
) -> None:
    assert session_end("127.0.0.3", code, lines, 1, 3) == words


def test_a_lost_worker_is_reported_with_what_was_seen_never_a_made_up_exit_code() -> None:
    reason = session_end("b", 255, ["Timeout, server b not responding."], 15, 4)

    lost = WorkerLost({"b": 255}, {"b": reason})

    assert str(lost) == (
        "Monarch worker lost mid-run: b stopped answering: no reply to 4 ssh keepalives sent "
        "15s apart (60s of silence)"
    )
    assert str(WorkerLost({"c": 0})) == (
        "Monarch worker lost mid-run: its ssh session ended with status 0"
    )


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (UNRESPONSIVE, "host b stopped answering: Monarch found its process unresponsive and "
                       "assumed it dead"),
        (STALLED, "host b stopped answering: messages to it made no progress for 30s"),
        (UNDELIVERED, "host b stopped answering: a message to it was not delivered in time"),
        (EXITED_3, None),
        ("Actor call info.boom failed. ValueError: deliberate", None),
    ],
    ids=["unresponsive", "stalled", "undelivered", "exited", "raised"],
)
def test_monarchs_words_for_a_silent_host_map_to_one_sentence(
    message: str, words: str | None
) -> None:
    assert monarch_loss(message, "b") == words


def test_a_role_rank_on_a_silent_host_says_its_host_stopped_answering() -> None:
    plan = plan_placement([Host("a", 1), Host("b", 1), Host("c", 1)], 2, 1)

    assert describe_failure(plan, " ".join(UNRESPONSIVE.split())) == (
        "trainer rank 1 (host b, local rank 0): host b stopped answering: Monarch found its "
        "process unresponsive and assumed it dead"
    )


def test_an_spmd_rank_on_a_lost_host_is_never_said_to_have_exited_with_code_1() -> None:
    lost = RankOutcome(1, "b", 0, 1, 0.0, error="Monarch worker lost mid-run: ...",
                       lost="b stopped answering: no reply to 4 ssh keepalives sent 15s apart "
                            "(60s of silence)")
    exited = RankOutcome(0, "a", 0, 3, 0.0)

    assert describe_exit(lost) == (
        "was lost: b stopped answering: no reply to 4 ssh keepalives sent 15s apart (60s of "
        "silence)"
    )
    assert describe_exit(exited) == "exited with code 3"
    error = SpmdRunError([lost], world_size=2)
    assert "exited with code" not in str(error) and error.exit_code == 1


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
