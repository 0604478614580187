"""When a job's reconcile pass runs: on a wake-up from a watch event, or at the job's deadline.

The operator does not poll. A watch event on the job or on one of its children (pods, the
launcher Job, the worker StatefulSet) wakes the job; the pass itself says when the job next
needs looking at even if nothing happens (its startup timeout, ``activeDeadlineSeconds``,
``ttlSecondsAfterFinished``), and only then does a timer fire. An idle job therefore costs one
sleeping timer at most, and no API calls at all (field case C5).

Per job, one pass runs at a time: wake-ups that arrive during a pass are coalesced into one more
pass after it, so a burst of pod events costs one or two passes, never one each. Same idea as
the work queue of client-go's controllers (a key is never processed by two workers at once, and
re-adding a key while it is processed marks it dirty): kubernetes/client-go ``util/workqueue``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

JobKey = tuple[str, str]  # (namespace, name)
# A pass: returns the seconds until the job's next deadline, or None when it has none.
PassFunction = Callable[[JobKey], Awaitable[float | None]]


class Wakeups:
    """Runs ``run_pass`` for a job when woken, one pass at a time per job, and at its deadline.

    Must be used from one asyncio event loop (kopf's); ``wake`` is not thread-safe.
    """

    def __init__(self, run_pass: PassFunction) -> None:
        self._run_pass = run_pass
        self._running: dict[JobKey, asyncio.Task[None]] = {}
        self._again: set[JobKey] = set()
        self._timers: dict[JobKey, asyncio.TimerHandle] = {}

    def wake(self, key: JobKey) -> None:
        """Run a pass for ``key`` now, or once more right after the one that is running."""
        if key in self._running:
            self._again.add(key)
            return
        task = asyncio.get_running_loop().create_task(self._passes(key), name=f"pass {key}")
        self._running[key] = task

    def forget(self, key: JobKey) -> None:
        """The job is gone: drop its timer (a pass that runs finds it gone and stops)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._again.discard(key)

    def pending_timers(self) -> dict[JobKey, float]:
        """Loop time of each job's next timed wake-up (for tests and debugging)."""
        return {key: timer.when() for key, timer in self._timers.items()}

    def is_idle(self) -> bool:
        """Whether no pass runs or is queued."""
        return not self._running and not self._again

    async def _passes(self, key: JobKey) -> None:
        try:
            while True:
                self._again.discard(key)
                try:
                    delay = await self._run_pass(key)
                except Exception:  # the pass logs its own errors; never lose the loop
                    logger.exception("reconcile pass of %s/%s failed", *key)
                    delay = None
                self._set_timer(key, delay)
                if key not in self._again:
                    return
        finally:
            self._running.pop(key, None)

    def _set_timer(self, key: JobKey, delay: float | None) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if delay is not None:
            self._timers[key] = asyncio.get_running_loop().call_later(
                max(delay, 0.0), self.wake, key
            )
