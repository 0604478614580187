"""Checkpoint before a stop, the program's side (launcher/stoprequest.py, issue 21 item 4): a
real SIGTERM to a real process, with and without opting in, with and without a grace period."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from monarch_operator.launcher import stoprequest, termination

# A program that opts in (or not), says "ready", then saves a checkpoint once asked to stop.
PROGRAM = textwrap.dedent("""
    import sys, time
    from monarch_operator.job import (checkpoint_saved, on_stop, resume_checkpoint,
                                      stop_requested)
    opt_in, ignore = sys.argv[1] == "1", sys.argv[2] == "1"
    if opt_in:
        on_stop(lambda: print("callback", flush=True))
    print("ready", resume_checkpoint(), flush=True)
    for step in range(600):
        time.sleep(0.05)
        if stop_requested() and not ignore:
            checkpoint_saved(f"/ckpt/step-{step}")
            print("saved", flush=True)
            sys.exit(0)
""")


def run(tmp_path: Path, opt_in: bool, grace: str, ignore: bool = False,
        checkpoint: str = "") -> tuple[int, str, str, float]:
    """(exit status, output, termination message, seconds from SIGTERM to exit)."""
    log = tmp_path / "termination-log"
    env = {**os.environ, stoprequest.ENV_STOP_GRACE: grace,
           termination.ENV_TERMINATION_LOG: str(log), stoprequest.ENV_CHECKPOINT: checkpoint}
    process = subprocess.Popen([sys.executable, "-c", PROGRAM, str(int(opt_in)),
                                str(int(ignore))], env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    first = process.stdout.readline()
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    took = time.monotonic() - sent
    return (process.returncode, first + output, log.read_text() if log.exists() else "", took)


def test_an_opted_in_program_saves_its_checkpoint_and_names_it(tmp_path):
    code, output, message, _ = run(tmp_path, opt_in=True, grace="30", checkpoint="/ckpt/old")
    assert output.startswith("ready /ckpt/old"), output
    assert "callback" in output and "saved" in output, output
    assert code == 0  # a plain program's own exit; under monarch-launch it is 143 (below)
    assert stoprequest.parse_marker(message) is not None, message
    assert message.strip().startswith("[checkpoint: /ckpt/step-"), message


def test_without_opting_in_or_without_a_grace_period_sigterm_stops_at_once(tmp_path):
    for opt_in, grace in ((False, "30"), (True, "0"), (True, "")):
        code, output, message, took = run(tmp_path, opt_in=opt_in, grace=grace)
        assert code == -signal.SIGTERM, (opt_in, grace, output)
        assert "saved" not in output and message == "", (opt_in, grace)
        assert took < 5, took


def test_a_program_that_ignores_the_request_is_stopped_when_the_period_ends(tmp_path):
    # Grace 4 s: the stop comes at 4 - min(10, 4/4) = 3 s, leaving 1 s for the teardown.
    code, output, _, took = run(tmp_path, opt_in=True, grace="4", ignore=True)
    assert code == -signal.SIGTERM and "callback" in output, output
    assert 2.5 < took < 10, took


@pytest.mark.parametrize("location", ["", "two words", "a]b", "x" * 1025, "line\nbreak"])
def test_a_location_must_be_one_token(location):
    with pytest.raises(ValueError, match="one token of 1-1024 characters"):
        stoprequest.checkpoint_saved(location)


def test_the_marker_survives_a_long_final_line(tmp_path, monkeypatch):
    log = tmp_path / "log"
    monkeypatch.setenv(termination.ENV_TERMINATION_LOG, str(log))
    stoprequest.reset()
    try:
        stoprequest.checkpoint_saved("s3://bucket/run-7/step-120")
        termination.write_termination_message("terminated by signal 15 (SIGTERM) " + "x" * 5000)
        text = log.read_text()
        assert len(text.encode()) <= termination.MAX_MESSAGE_BYTES
        assert stoprequest.parse_marker(text) == "s3://bucket/run-7/step-120", text[-80:]
    finally:
        stoprequest.reset()


LAUNCHER_PROGRAM = textwrap.dedent("""
    import sys, time
    from monarch_operator.launcher import stopsignal
    from monarch_operator.launcher.session.lifecycle import (Terminated,
                                                              install_termination_handlers)
    from monarch_operator.job import on_stop, stop_requested
    install_termination_handlers()
    on_stop()
    print("ready", flush=True)
    started = None
    try:
        while True:
            time.sleep(0.05)
            if stop_requested() and started is None:
                started = time.monotonic()
                print("requested", flush=True)
    except Terminated as stopped:
        print(f"terminated after {time.monotonic() - started:.1f}s", flush=True)
        sys.exit(stopped.exit_code)
""")


def test_under_the_launchers_handlers_the_stop_comes_as_terminated_at_the_deadline(tmp_path):
    env = {**os.environ, stoprequest.ENV_STOP_GRACE: "4"}
    process = subprocess.Popen([sys.executable, "-c", LAUNCHER_PROGRAM], env=env,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 143, output
    lines = output.split()
    assert lines[0] == "requested" and lines[1] == "terminated", output
    assert 2.5 < float(lines[-1].rstrip("s")) < 6, output
