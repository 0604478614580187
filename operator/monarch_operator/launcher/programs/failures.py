"""Why a launch stopped, reported once with its exit status (:func:`report_failure`).

Shared by the programs (the built-in example, a user's program) and ``monarch-torchrun``: it knows
every failure a job can end with, from a rank's own (:class:`launcher.programs.job.RankFailure`)
down to the session's (pre-flight, a stop signal, a lost or failed worker).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from monarch_operator import hwerrors
from monarch_operator.launcher import exitcodes, stopsignal
from monarch_operator.launcher.programs.job import RankFailure
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session.lifecycle import (
    FaultRecorder,
    Terminated,
    WorkerLost,
    one_line,
)
from monarch_operator.launcher.session.preflight import PreflightError
from monarch_operator.launcher.session.workerloss import WorkerStartFailed

# How long a failed launch waits for a fault report that names the exit status, seconds.
FAULT_SETTLE_S = 3.0


def report_failure(
    error: BaseException,
    recorder: FaultRecorder,
    reporter: Reporter,
    describe: Callable[[str], str | None] | None = None,
) -> int:
    """Report why a launch stopped and return its exit status (rules in :mod:`launcher.exitcodes`).

    Args:
        error: a :class:`~launcher.programs.job.RankFailure` (its own status and reason), a
            :class:`~launcher.session.preflight.PreflightError` (each host's reason is
            reported), :class:`~launcher.session.lifecycle.Terminated`, KeyboardInterrupt, or
            any other Exception (its code is read from Monarch's fault reports and the error
            text).
        recorder: the faults Monarch reported during the launch.
        reporter: where the result goes.
        describe: turns a Monarch failure text into a readable reason (role, host, rank), or
            returns None to keep the raw text.

    Returns:
        The exit status (:mod:`launcher.exitcodes`), after the result was reported.
    """
    if isinstance(error, RankFailure):
        if error.traceback and not reporter.quiet:
            reporter.warning(f"remote traceback of {error.summary}:\n{error.traceback.rstrip()}")
        found = hardware_line(recorder, error.host, [error.what, error.traceback, error.detail])
        return reporter.result(
            error.exit_code,
            error.summary + (f" {hwerrors.marker(error.host, found)}" if found else ""),
            role=error.role,
            rank=error.rank,
            host=error.host,
            local_rank=error.local_rank,
            **hardware_fields(error.host, error.rank, found),
        )
    if isinstance(error, PreflightError):
        hosts = [
            {"host": c.host, "address": c.address, "reason": c.reason, "detail": c.detail}
            for c in error.failures
        ]
        return reporter.result(exitcodes.FAILURE, str(error), hosts=hosts)
    if isinstance(error, Terminated):
        return reporter.result(error.exit_code, str(error))
    if isinstance(error, WorkerLost):
        return reporter.result(exitcodes.FAILURE, str(error), lost_hosts=error.hosts)
    if isinstance(error, WorkerStartFailed):
        exits = [
            {"host": host, "ssh_exit": code, "output_tail": tail}
            for host, (code, tail) in error.exits.items()
        ]
        return reporter.result(exitcodes.FAILURE, str(error), failed_hosts=exits)
    if isinstance(error, KeyboardInterrupt):
        stopsignal.record(signal.SIGINT)
        return reporter.result(exitcodes.SIGNAL_BASE + signal.SIGINT, "interrupted")
    reason = one_line(f"{type(error).__name__}: {error}")
    readable = describe(" ".join(str(error).split())) if describe is not None else None
    if readable:
        reason = f"{readable} [{one_line(reason, 300)}]"
    code = exitcodes.exit_code_for_failure([*recorder.reports, str(error)])
    # Under CPU pressure Monarch's supervision can first report a dead proc without its exit
    # status ("... The process likely crashed"); the report naming the code follows. Give it a
    # moment before settling for the generic failure status.
    deadline = time.monotonic() + FAULT_SETTLE_S
    while code == exitcodes.FAILURE and "Supervision" in type(error).__name__:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
        code = exitcodes.exit_code_for_failure([*recorder.reports, str(error)])
    return reporter.result(code, reason)


def hardware_line(
    recorder: FaultRecorder, host: str, texts: Sequence[str]
) -> hwerrors.HardwareLine | None:
    """The first line that means a hardware fault (``recorder.hardware_patterns``) in a failed
    rank's own ``texts`` (how it failed, its traceback, Monarch's words), else in the last
    lines its ``host``'s worker printed (``recorder.output_of``); None when there is none.

    Args:
        recorder: the launch's recorder (its patterns and the workers' output tails).
        host: the failed rank's host name, as the launcher was given it.
        texts: the failure's own words, several lines each.
    """
    found = hwerrors.find(texts, recorder.hardware_patterns)
    if found is None and recorder.output_of is not None:
        try:
            found = hwerrors.find(recorder.output_of(host), recorder.hardware_patterns)
        except Exception:  # noqa: BLE001 - its output cannot be read: judged by the rest
            found = None
    return found


def hardware_fields(host: str, rank: int, found: hwerrors.HardwareLine | None) -> dict[str, Any]:
    """The result's fields for a rank failure found to be a hardware fault (``{}`` when not):
    ``failure_class`` Infrastructure, ``failure_reason`` :data:`~monarch_operator.hwerrors.REASON`
    and ``hardware`` (host, rank, pattern, line)."""
    if found is None:
        return {}
    return {
        "failure_class": "Infrastructure",
        "failure_reason": hwerrors.REASON,
        "hardware": {"host": host, "rank": rank, "pattern": found.pattern, "line": found.line},
    }
