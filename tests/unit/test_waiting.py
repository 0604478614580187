"""A wait on a Monarch call lets the main thread's signal handlers run (launcher/session/waiting.py).

The fake future stands for Monarch's: its ``get`` blocks with signals held back, as a wait in
Rust does (Python runs a handler only when the call returns). The handler raises, as the
launcher's WorkerLost and Terminated handlers do."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from monarch_operator.launcher.session import waiting


class Interrupted(BaseException):
    pass


class DeafFuture:
    """``get(timeout)`` blocks ``timeout`` seconds (``None``: ``never`` seconds, then returns
    ``"late"``) with SIGUSR2 held back; returns ``value`` once ``ready_after`` seconds passed."""

    def __init__(self, ready_after: float = 3600.0, never: float = 5.0) -> None:
        self.start = time.monotonic()
        self.ready_after = ready_after
        self.never = never
        self.timeouts: list[float | None] = []

    def get(self, timeout: float | None = None) -> str:
        self.timeouts.append(timeout)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
        try:
            left = self.ready_after - (time.monotonic() - self.start)
            if timeout is None:
                time.sleep(min(self.never, max(0.0, left)))
                return "value" if left <= self.never else "late"
            time.sleep(max(0.0, min(timeout, left)))
            if time.monotonic() - self.start >= self.ready_after:
                return "value"
            raise TimeoutError("not yet")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


@pytest.fixture
def raising_handler():
    def handler(_signum, _frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR2, handler)
    yield
    signal.signal(signal.SIGUSR2, previous)


def signal_main_thread_after(seconds: float) -> threading.Thread:
    main = threading.main_thread().ident

    def send() -> None:
        time.sleep(seconds)
        signal.pthread_kill(main, signal.SIGUSR2)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_signal_during_an_endless_wait_is_handled_within_a_slice(raising_handler):
    """The lost worker's signal comes 0.3 s into a wait with no timeout: the handler's exception
    ends the wait within a slice, not when the call ends (5 s here, a minute in the field)."""
    future = DeafFuture()
    signal_main_thread_after(0.3)
    started = time.monotonic()
    with pytest.raises(Interrupted):
        waiting.get(future, None)
    assert time.monotonic() - started < 0.3 + 2 * waiting.SLICE_S + 1.0
    assert future.timeouts and all(t is not None and t <= waiting.SLICE_S
                                   for t in future.timeouts), future.timeouts


def test_the_value_comes_back_and_a_timeout_is_kept():
    assert waiting.get(DeafFuture(ready_after=0.5), None) == "value"
    assert waiting.get(DeafFuture(ready_after=0.5), 3.0) == "value"
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        waiting.get(DeafFuture(), 0.7)
    assert 0.7 <= time.monotonic() - started < 0.7 + waiting.SLICE_S + 1.0
