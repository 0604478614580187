"""Checkpoint before a stop (issue 21 item 4): a program that asks for it gets a grace period
between the launcher's SIGTERM and its stop, and names where it saved its state.

When a MonarchJob is suspended or evicted by Kueue while it runs, and its
``runPolicy.checkpointGracePeriodSeconds`` is above 0, the operator deletes the launcher pod
with that grace period and keeps the workers until the launcher has ended (or the period has
passed). The launcher pod gets ``MONARCH_STOP_GRACE_SECONDS``; the kubelet's SIGTERM is the
request to stop.

A program opts in with :func:`on_stop` (``monarch_operator.job.on_stop``): then the first SIGTERM does not stop
it at once. :func:`stop_requested` turns True, the callbacks run (in a thread of their own),
and the program has until :func:`deadline` (the grace period less :data:`TEARDOWN_RESERVE_S`
for the teardown, then SIGTERM again, to the main thread) to save its state, call
:func:`checkpoint_saved` with where, and return;
whatever it does, the exit status stays ``128 + 15`` (:mod:`.stopsignal`). At the deadline the
stop happens as it does without opting in. Without opting in, or with no grace period, SIGTERM
stops the program at once, as it always did.

:func:`checkpoint_saved` writes the location into the termination message (``[checkpoint:
LOCATION]``, :mod:`.termination`), where the operator reads it: it goes into the attempt's
record and ``status.lastCheckpoint``, and the next attempt's launcher gets it as
``MONARCH_CHECKPOINT`` (:func:`resume_checkpoint`).

State is per process, like signal handlers; :func:`reset` is for tests.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable

from monarch_operator import constants
from monarch_operator.launcher import progress, termination

# Set by the operator on the launcher pod: runPolicy.checkpointGracePeriodSeconds; and on a
# later attempt's launcher pod, the last checkpoint a launcher named.
ENV_STOP_GRACE = constants.ENV_STOP_GRACE
ENV_CHECKPOINT = constants.ENV_CHECKPOINT
# Seconds of the grace period kept for the teardown (stopping ranks, ending ssh sessions)
# before the kubelet's SIGKILL: at most this, at most a quarter of the period.
TEARDOWN_RESERVE_S = 10.0
# How a checkpoint location may look: one token, no ']' (it ends the marker), at most this long.
MAX_LOCATION_CHARS = 1024
_LOCATION = re.compile(r"[^\s\]]+")
_MARKER = re.compile(r"\[checkpoint: (?P<location>[^\s\]]+)\]\s*$")

_lock = threading.Lock()
_opted_in = False
_callbacks: list[Callable[[], None]] = []
_requested = threading.Event()
_deadline: float | None = None  # monotonic time at which the stop happens after all
_expired = False
_finished = False  # the program is done: no stop left to deliver


def grace_seconds() -> float:
    """The grace period the operator gave (``MONARCH_STOP_GRACE_SECONDS``), 0 when unset or
    not a number (then SIGTERM stops at once)."""
    try:
        return max(0.0, float(os.environ.get(ENV_STOP_GRACE, "0") or 0))
    except ValueError:
        return 0.0


def on_stop(callback: Callable[[], None] | None = None) -> None:
    """Opt in: the next SIGTERM requests a stop instead of stopping at once (when a grace
    period is set), and ``callback`` (if any) is called then, in a thread of its own, once.

    A plain program (no launcher) gets a SIGTERM handler that does this; under
    ``monarch-launch`` the launcher's own handler asks :func:`defer` first.
    """
    global _opted_in
    with _lock:
        _opted_in = True
        if callback is not None:
            _callbacks.append(callback)
        requested = _requested.is_set()
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _plain_handler)
    if requested and callback is not None:  # asked after the request came: call it now
        threading.Thread(target=callback, name="on-stop", daemon=True).start()


def stop_requested() -> bool:
    """Whether a stop was requested (SIGTERM with a grace period, after :func:`on_stop`)."""
    return _requested.is_set()


def wait_for_stop(timeout: float | None = None) -> bool:
    """Block until a stop is requested or ``timeout`` seconds passed; returns
    :func:`stop_requested`."""
    return _requested.wait(timeout)


def deadline() -> float | None:
    """Seconds left until the requested stop happens anyway, None when none was requested."""
    with _lock:
        return None if _deadline is None else max(0.0, _deadline - time.monotonic())


def checkpoint_saved(location: str) -> None:
    """Say where the program saved its state (a path or URL, one token): it reaches the
    operator through the termination message, and the next attempt as ``MONARCH_CHECKPOINT``.
    The last call wins; it may come at any time, not only after a stop request.

    Raises:
        ValueError: ``location`` is empty, longer than :data:`MAX_LOCATION_CHARS`, or has
            whitespace or ``]``.
    """
    if not isinstance(location, str) or not _LOCATION.fullmatch(location) \
            or len(location) > MAX_LOCATION_CHARS:
        raise ValueError(f"checkpoint location {location!r}: one token of 1-"
                         f"{MAX_LOCATION_CHARS} characters without whitespace or ']'")
    termination.set_checkpoint(location)
    termination.write_termination_message("")  # the marker alone until the final line
    progress.note_checkpoint(location)  # and status.progress.checkpoint while it runs


def saved_location() -> str | None:
    """The last location given to :func:`checkpoint_saved`, or None."""
    return termination.checkpoint_location()


def marker() -> str:
    """`` [checkpoint: LOCATION]`` for the termination message, "" when none was saved."""
    return termination.checkpoint_marker()


def parse_marker(message: str) -> str | None:
    """The location of a termination message's marker (what the operator reads), or None."""
    found = _MARKER.search(message or "")
    return found["location"] if found else None


def resume_checkpoint() -> str | None:
    """Where an earlier attempt of this job saved its state (``MONARCH_CHECKPOINT``), or None:
    resume from it."""
    return os.environ.get(ENV_CHECKPOINT) or None


def defer(signal_number: int) -> bool:
    """Called by a SIGTERM handler: True when this SIGTERM only requests a stop (the program
    opted in, a grace period is set, and its deadline has not passed); False when it must stop
    now. The first deferred SIGTERM starts the callbacks and a timer that delivers SIGTERM to
    the main thread again at the deadline."""
    global _deadline, _expired
    if signal_number != signal.SIGTERM:
        return False
    with _lock:
        if _expired or not _opted_in:
            return False
        if _requested.is_set():
            return True  # a second SIGTERM within the period changes nothing
        grace = grace_seconds()
        if grace <= 0:
            return False
        wait = max(0.0, grace - min(TEARDOWN_RESERVE_S, grace / 4))
        _deadline = time.monotonic() + wait
        _requested.set()
        callbacks = list(_callbacks)
    for callback in callbacks:
        threading.Thread(target=callback, name="on-stop", daemon=True).start()
    threading.Thread(target=_expire, args=(wait,), name="stop-deadline", daemon=True).start()
    return True


def _expire(wait: float) -> None:
    global _expired
    time.sleep(wait)
    with _lock:
        _expired = True
        if _finished:
            return
    # A real signal to the main thread: it also ends a blocking wait there (EINTR).
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)


def finish() -> None:
    """The program returned (the launcher's teardown starts): a deadline still pending
    delivers nothing any more."""
    global _finished
    with _lock:
        _finished = True


def _plain_handler(signum: int, frame: object) -> None:
    """SIGTERM of a program run without the launcher's handlers: request, then default."""
    if defer(signum):
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def reset() -> None:
    """Forget everything (tests run several programs in one process)."""
    global _opted_in, _deadline, _expired, _finished
    with _lock:
        _opted_in, _deadline, _expired, _finished = False, None, False, False
        _callbacks.clear()
        _requested.clear()
    termination.set_checkpoint(None)
