"""Waiting on a Monarch call without going deaf to signals.

A Monarch future's ``get`` blocks in Rust and does not let Python run its signal handlers until
it returns. The launcher learns of a lost worker (:mod:`.workerloss`: its ssh client exited) and
of a stop (SIGTERM, SIGINT, SIGHUP: :mod:`.lifecycle`) by a signal to the main thread, whose
handler raises there; during one long ``get`` that exception waited for the call to end: a
worker killed mid-step was reported about a minute later (when Monarch's supervision failed the
call), not within a second. :func:`get` waits in slices of :data:`SLICE_S`, so that a handler
runs between two of them.
"""

from __future__ import annotations

import time
from typing import Any

# The longest a signal handler waits while the main thread waits on a call, seconds.
SLICE_S = 0.2


def get(future: Any, timeout: float | None = None) -> Any:
    """``future.get(timeout=timeout)``, waited for in slices of :data:`SLICE_S` seconds.

    Args:
        future: a Monarch ``Future`` (what an endpoint's ``call``, ``call_one`` ... returns);
            Monarch allows ``get`` again after a ``get`` that timed out.
        timeout: seconds to wait in all; None waits as long as the call takes.

    Returns:
        The call's value.

    Raises:
        TimeoutError: the call did not end within ``timeout`` seconds.
        Whatever the call raised, and whatever a signal handler raises while it waits
        (``Terminated``, ``WorkerLost``).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        try:
            return future.get(timeout=SLICE_S if left is None else max(0.0, min(SLICE_S, left)))
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise
