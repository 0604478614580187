"""The stop guard (launcher/stopguard.py, issue 32 item 1): a stop signal decides the exit status
whatever the program under the launcher does with it.

The process tests start a real guard around a small child (no hosts, no Monarch): the child
takes SIGTERM away from us in each way a user's program can, and the guard must still end
``128 + 15`` with a line naming the signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monarch_operator.launcher import stopguard, stopsignal

OPERATOR_DIR = str(Path(stopguard.__file__).resolve().parents[2])

# Each child prints "ready" once it has taken SIGTERM, then waits to be stopped.
CHILDREN = {
    "handler_exits_0": "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))",
    "ignored_then_exit_0": "signal.signal(signal.SIGTERM, signal.SIG_IGN)",
    "thread_os_exit_0": (
        "signal.signal(signal.SIGTERM, lambda *a: threading.Thread("
        "target=os._exit, args=(0,)).start())"),
    "asyncio_handler": "USE_ASYNCIO = True",
}

CHILD_TEMPLATE = """\
import asyncio, os, signal, sys, threading, time
from monarch_operator.launcher import stopguard
stopguard.guard("monarch-launch")
USE_ASYNCIO = False
{takes_sigterm}
if USE_ASYNCIO:
    async def main():
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await stop.wait()
    asyncio.run(main())
    sys.exit(0)
print("ready", flush=True)
deadline = time.monotonic() + {wait}
while time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(0)
"""


def _start(takes_sigterm: str, wait: float = 30.0, env: dict[str, str] | None = None
           ) -> subprocess.Popen[str]:
    code = CHILD_TEMPLATE.format(takes_sigterm=takes_sigterm, wait=wait)
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("MONARCH_")}
    environment.update({"PYTHONPATH": OPERATOR_DIR, **(env or {})})
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=environment)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.mark.parametrize("way", sorted(CHILDREN))
def test_a_program_that_takes_sigterm_away_still_ends_143(way: str, tmp_path: Path) -> None:
    wait = 3.0 if way == "ignored_then_exit_0" else 30.0
    log = tmp_path / "termination-log"
    process = _start(CHILDREN[way], wait, {"MONARCH_TERMINATION_LOG": str(log)})
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=20)

    assert process.returncode == 143, err
    assert "monarch-launch: failed: terminated by signal 15 (SIGTERM)" in err
    assert "before the launcher's teardown" in err  # no final line of the launcher's
    assert log.read_text().startswith("terminated by signal 15 (SIGTERM)")


def test_without_a_stop_the_child_status_is_the_guard_status() -> None:
    process = _start("", wait=0.2)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "failed" not in err


def test_the_guard_reaps_the_child_killed_by_a_signal_as_128_plus_it() -> None:
    process = _start("signal.signal(signal.SIGTERM, signal.SIG_DFL)")
    children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True,
                              text=True).stdout.split()
    assert len(children) == 1, children
    os.kill(int(children[0]), signal.SIGKILL)  # the launcher itself dies, no stop asked
    process.communicate(timeout=20)
    assert process.returncode == 137


def test_a_launcher_that_aborts_after_its_final_line_ends_with_that_line_s_status() -> None:
    # The launcher proper reports 1 and then dies of SIGABRT at its exit (CI 2026-12-07).
    process = _start("print('ready', flush=True); stopguard.note_final(1); os.abort()")
    _, err = process.communicate(timeout=20)
    assert process.returncode == 1, err
    assert ("monarch-launch: warning: the launcher was killed by signal 6 (SIGABRT) after its "
            "final line; the run's exit status 1 stands") in err
    assert "failed" not in err


def test_killing_the_guard_stops_the_launcher() -> None:
    process = _start("")
    child = int(subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True,
                               text=True).stdout.split()[0])
    process.kill()
    process.communicate(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the launcher outlived its guard"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_stopguard_can_be_turned_off() -> None:
    process = _start("", wait=0.2, env={"MONARCH_STOPGUARD": "0"})
    children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True,
                              text=True).stdout.split()
    process.communicate(timeout=20)
    assert children == []


def _status(code: int = 0, killed_by: int | None = None) -> int:
    """A wait status as os.waitpid gives it."""
    return killed_by if killed_by is not None else code << 8


@pytest.mark.parametrize(
    ("status", "first_signal", "stop", "final", "expected"),
    [
        (_status(0), None, None, 0, (0, None)),
        (_status(3), None, None, 3, (3, None)),
        (_status(143), 15, None, 143, (143, None)),  # the launcher said it itself
        (_status(130), 2, None, 130, (130, None)),
    ],
)
def test_decide_keeps_what_the_launcher_said(status, first_signal, stop, final, expected):
    assert stopguard.decide(status, first_signal, stop, final) == expected


@pytest.mark.parametrize("number", [signal.SIGKILL, signal.SIGSEGV])
def test_decide_a_launcher_killed_without_a_word_gets_the_guards_line(number: int) -> None:
    # The OOM killer's SIGKILL for the launcher proper: no final line, no stop received.
    code, reason = stopguard.decide(_status(killed_by=number), None, None, None)
    assert code == 128 + number
    assert reason is not None
    assert reason.startswith(f"the launcher was killed by signal {number} ({number.name})")
    assert ("OOM killer" in reason) == (number == signal.SIGKILL)


@pytest.mark.parametrize(("number", "final"), [(signal.SIGABRT, 1), (signal.SIGSEGV, 0),
                                               (signal.SIGABRT, 3)])
def test_decide_a_launcher_killed_after_its_final_line_keeps_that_status(number, final) -> None:
    # CI 2026-12-07: a daemon thread aborted the interpreter's exit ("FATAL: exception not
    # rethrown") after the final line had reported 1; the job recorded 134.
    assert stopguard.decide(_status(killed_by=number), None, None, final) == (final, None)


def test_decide_a_stop_wins_over_exit_0() -> None:
    code, reason = stopguard.decide(_status(0), 15, None, None)
    assert code == 143
    assert reason is not None and reason.startswith("terminated by signal 15 (SIGTERM); ")
    assert "exited 0" in reason


def test_decide_a_stall_the_launcher_noted_wins_over_exit_0() -> None:
    stall = "ProgressStalled: no progress report for 65s (runPolicy.progressDeadlineSeconds=60)"
    code, reason = stopguard.decide(_status(0), None, stall, 0)
    assert code == 143
    assert reason is not None and reason.startswith(stall)


def test_parse_notes() -> None:
    notes = "stop ProgressStalled: x\nstop later\nfinal 0\nfinal 143\n"
    assert stopguard.parse_notes(notes) == ("ProgressStalled: x", 143)
    assert stopguard.parse_notes("") == (None, None)


def test_stop_signals_match_the_launchers() -> None:
    assert stopguard.STOP_SIGNALS == stopsignal.STOP_SIGNALS
