"""A launcher stopped from outside never reports success: the first stop signal decides the exit.

An exit status is a claim about what happened (issue 20, item 1). When SIGTERM, SIGINT or SIGHUP
reaches ``monarch-launch`` or ``monarch-torchrun``, the run was stopped, whatever the user's
program then does: a rank script that traps SIGTERM and exits 0, a controller that catches
KeyboardInterrupt and returns, a signal that arrives during teardown (when the handlers only
record it). So the launcher's signal handlers :func:`record` the first such signal, and
:class:`launcher.report.Reporter` turns the final result into exit ``128 + signal`` with the
line ``terminated by signal N (SIGNAME)`` (:func:`final_result`), as a shell reports a process
killed by that signal.

The state is per process, like signal handlers; :func:`reset` is for tests.
"""

from __future__ import annotations

import signal

from monarch_operator.launcher import stopguard

# What a stop signal turns the exit status into (shell convention; launcher.exitcodes).
SIGNAL_BASE = 128
# The signals that mean "stop the run" (a terminal's Ctrl-C, its closing, kill/pod deletion).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_received: int | None = None
_stall: str | None = None  # launcher/progress.py: the run stalled, and the launcher stopped it


def record(signal_number: int) -> None:
    """Remember ``signal_number`` if it is the first stop signal of this process."""
    global _received
    if _received is None:
        _received = signal_number


def received() -> int | None:
    """The first stop signal this process got, or None. Under a guard
    (:mod:`.stopguard`) also a signal the guard got that no handler of ours saw (the user's
    program took the signal)."""
    return _received if _received is not None else stopguard.signal_received()


def record_stall(message: str) -> None:
    """The launcher stops the run itself because it stalled (``ProgressStalled: ...``, see
    :mod:`.progress`): the final result says that, not the signal it sends itself."""
    global _stall
    _stall = message
    stopguard.note_stop(message)


def stall_recorded() -> bool:
    """Whether the launcher stopped the run itself as stalled (:func:`record_stall`)."""
    return _stall is not None


def reset() -> None:
    """Forget the recorded signal and stall (tests run several launches in one process)."""
    global _received, _stall
    _received, _stall = None, None


def describe(signal_number: int) -> str:
    """``terminated by signal 15 (SIGTERM)``."""
    try:
        name = signal.Signals(signal_number).name
    except ValueError:
        return f"terminated by signal {signal_number}"
    return f"terminated by signal {signal_number} ({name})"


def final_result(exit_code: int, reason: str | None) -> tuple[int, str | None]:
    """Return the ``(exit status, reason)`` to report, given the run's own.

    Args:
        exit_code: what the run would exit with.
        reason: its failure reason, or None.

    Returns:
        Unchanged when no stop signal was recorded; else ``128 + signal`` and a reason that
        starts with :func:`describe` (followed by the run's own reason, if it had one).
    """
    first = received()
    if _stall is not None:
        return SIGNAL_BASE + (first or signal.SIGTERM), _stall
    if first is None:
        return exit_code, reason
    stopped = describe(first)
    if reason and not reason.startswith(stopped):
        return SIGNAL_BASE + first, f"{stopped}; {reason}"
    return SIGNAL_BASE + first, stopped
