"""When a job's reconcile pass runs: on a wake-up from a watch event, or at the job's deadline.

The operator does not poll. A watch event on the job or on one of its children (its pods,
the launcher among them, and the worker StatefulSet) wakes the job; the pass itself says when
the job next needs looking at even if nothing happens (its startup timeout,
``activeDeadlineSeconds``, ``ttlSecondsAfterFinished``), and only then does a timer fire. An
idle job therefore costs one sleeping timer at most, and no API calls at all (field case C5).

Per job, one pass runs at a time: wake-ups that arrive during a pass are coalesced into one more
pass after it, so a burst of pod events costs one or two passes, never one each. Same idea as
the work queue of client-go's controllers (a key is never processed by two workers at once, and
re-adding a key while it is processed marks it dirty): kubernetes/client-go ``util/workqueue``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from monarch_operator.controller.engine import metrics

logger = logging.getLogger(__name__)

JobKey = tuple[str, str]  # (namespace, name)
# A pass: returns the seconds until the job's next deadline, or None when it has none.
PassFunction = Callable[[JobKey], Awaitable[float | None]]


class Wakeups:
    """Runs ``run_pass`` for a job when woken, one pass at a time per job, and at its deadline.

    At most ``concurrency`` passes run at once (``None``: no limit); the others wait for a slot,
    and a wake-up that comes while a job waits is served by the pass it waits for: the pass
    reads the job only when it gets its slot (client-go runs a controller's queue with a fixed
    number of workers for the same reason). Jobs for which ``urgent`` says True when they are
    woken (the operator: every worker Ready, GPUs held) get a slot before the others; each
    group is served in the order woken.

    Must be used from one asyncio event loop (kopf's); ``wake`` is not thread-safe.
    """

    def __init__(self, run_pass: PassFunction, concurrency: int | None = None,
                 urgent: Callable[[JobKey], bool] | None = None) -> None:
        self._run_pass = run_pass
        self._free = concurrency  # slots free now; None: no limit
        self._urgent = urgent or (lambda key: False)
        # Jobs waiting for a slot, urgent ones first; a slot is handed over by resolving the
        # job's future.
        self._waiting: tuple[dict[JobKey, asyncio.Future[None]], ...] = ({}, {})
        self._running: dict[JobKey, asyncio.Task[None]] = {}
        self._again: set[JobKey] = set()
        self._timers: dict[JobKey, asyncio.TimerHandle] = {}
        self._woken_at: dict[JobKey, float] = {}  # the first wake-up not yet served

    def wake(self, key: JobKey) -> None:
        """Run a pass for ``key`` now, or once more right after the one that is running."""
        self._woken_at.setdefault(key, asyncio.get_running_loop().time())
        if key in self._running:
            self._again.add(key)
            urgent, normal = self._waiting
            if key in normal and self._urgent(key):  # e.g. its last worker just became Ready
                urgent[key] = normal.pop(key)
            return
        task = asyncio.get_running_loop().create_task(self._passes(key), name=f"pass {key}")
        self._running[key] = task

    def forget(self, key: JobKey) -> None:
        """The job is gone: drop its timer (a pass that runs finds it gone and stops)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._again.discard(key)
        self._woken_at.pop(key, None)

    def pending_timers(self) -> dict[JobKey, float]:
        """Loop time of each job's next timed wake-up (for tests and debugging)."""
        return {key: timer.when() for key, timer in self._timers.items()}

    def is_idle(self) -> bool:
        """Whether no pass runs or is queued."""
        return not self._running and not self._again

    async def _passes(self, key: JobKey) -> None:
        try:
            while True:
                await self._take_slot(key)
                try:
                    self._again.discard(key)  # what woke the job so far, this pass sees
                    woken_at = self._woken_at.pop(key, None)
                    if woken_at is not None:
                        metrics.RECONCILE_WAIT.labels(str(self._urgent(key)).lower()).observe(
                            asyncio.get_running_loop().time() - woken_at)
                    delay = await self._run_pass(key)
                except Exception:  # the pass logs its own errors; never lose the loop
                    logger.exception("reconcile pass of %s/%s failed", *key)
                    delay = None
                finally:
                    self._give_slot()
                self._set_timer(key, delay)
                if key not in self._again:
                    return
        finally:
            self._running.pop(key, None)

    async def _take_slot(self, key: JobKey) -> None:
        """Return once this job may run a pass (a slot is taken for it)."""
        if self._free is None:
            return
        if self._free > 0 and not any(self._waiting):
            self._free -= 1
            return
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[0 if self._urgent(key) else 1][key] = handed
        try:
            await handed
        except asyncio.CancelledError:
            for waiting in self._waiting:
                waiting.pop(key, None)
            if handed.done() and not handed.cancelled():
                self._give_slot()  # handed over just as it was cancelled: pass it on
            raise

    def _give_slot(self) -> None:
        """The pass ended: hand its slot to the first urgent job waiting, else the first other
        one, else keep it free."""
        if self._free is None:
            return
        for waiting in self._waiting:
            while waiting:
                key = next(iter(waiting))
                handed = waiting.pop(key)
                if not handed.done():
                    handed.set_result(None)
                    return
        self._free += 1

    def _set_timer(self, key: JobKey, delay: float | None) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if delay is not None:
            self._timers[key] = asyncio.get_running_loop().call_later(
                max(delay, 0.0), self.wake, key
            )
