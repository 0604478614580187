"""The elector: one replica at a time leads, on a ``coordination.k8s.io/v1`` Lease.

The algorithm is client-go's (``tools/leaderelection``), with the changes that make it a
fence rather than a hint (docs/ha.md has the reasons and the timing arithmetic):

- time is read from a clock that never jumps (``CLOCK_BOOTTIME``: monotonic, and it keeps
  counting through a suspended machine); the Lease's timestamps are for people only;
- a candidate takes the Lease over when its holder is empty (released) or when the Lease has
  not changed for ``lease_duration`` seconds *as this candidate observed it*;
- the leader's deadline is the start of its last successful renewal plus ``renew_deadline``.
  :meth:`Elector.may_write` is false from that moment on, for good, and :meth:`Elector.lead`
  returns the reason; the standby cannot take over before that start plus ``lease_duration``;
- every request is bounded by the time left to the deadline (at most half the renew deadline);
- each write is a replace conditional on the resourceVersion read (409: someone else wrote);
- on a clean stop the leader releases the Lease (empty holder), so that a standby takes over
  at its next try instead of after ``lease_duration`` (client-go's ``ReleaseOnCancel``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from monarch_operator.controller.leader.lease import LeaseApi, LeaseConflict, LeaseRecord
from monarch_operator.controller.leader.settings import ElectionSettings

logger = logging.getLogger("monarch_operator.leader")

Clock = Callable[[], float]
# Waits up to the given seconds; returns True when the elector was asked to stop meanwhile.
Wait = Callable[[float], bool]
# The shortest wait a standby spends watching the Lease (the API server ends a watch after
# whole seconds); a shorter one is slept.
WATCH_MIN_S = 1.0


def boottime() -> float:
    """Seconds on ``CLOCK_BOOTTIME`` (Linux), else ``time.monotonic()``."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


class Elector:
    """Acquires, renews and releases one Lease for this replica; thread-safe to query.

    ``api``: the Lease calls; ``clock``: seconds that only move forward; ``on_transition``:
    called with ``(holder or None, reason)`` once per change of the Lease's holder this replica
    sees, its own acquisition, release and loss included (metrics); each is logged too.
    :meth:`acquire`, :meth:`lead` and :meth:`release` run in one thread at a time;
    :meth:`may_write` and the properties may be asked from any.
    """

    def __init__(self, api: LeaseApi, settings: ElectionSettings, clock: Clock = boottime,
                 on_transition: Callable[[str | None, str], None] | None = None,
                 wait: Wait | None = None) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.on_transition = on_transition or (lambda holder, reason: None)
        self._wait_for = wait  # tests: a fake clock's wait
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # when this replica last saw the Lease change (clock)
        self._record: LeaseRecord | None = None  # what this replica last wrote, as leader
        self._deadline: float | None = None  # leader only: last renewal's start + RD
        self._lost = False
        self._reported: str | None = None  # the holder last reported to on_transition
        self._stopped = threading.Event()

    # -- queries -------------------------------------------------------------------------------
    @property
    def identity(self) -> str:
        return self.settings.identity

    @property
    def holder(self) -> str | None:
        """The holder this replica last saw on the Lease (``None``: none, or not read yet)."""
        return self._observed.holder if self._observed else None

    @property
    def leading(self) -> bool:
        """True while this replica leads and its renew deadline has not passed."""
        return self.may_write()

    def may_write(self) -> bool:
        """True while this replica leads and its renew deadline has not passed; false for good
        once it has passed or leadership was given up."""
        deadline = self._deadline
        return deadline is not None and not self._lost and self.clock() < deadline

    def seconds_left(self) -> float:
        """Seconds to the renew deadline (0 when not leading)."""
        deadline = self._deadline
        if deadline is None or self._lost:
            return 0.0
        return max(0.0, deadline - self.clock())

    # -- one try ---------------------------------------------------------------------------------
    def _observe(self, record: LeaseRecord | None, now: float) -> None:
        previous = self._observed
        if record is None or (previous is not None
                              and record.resource_version == previous.resource_version):
            return
        self._observed, self._observed_at = record, now
        if record.holder != self.identity:
            self._report(record.holder, "seen on the Lease" if record.holder
                         else "the Lease was released")

    def _report(self, holder: str | None, why: str) -> None:
        if holder == self._reported:
            return
        self._reported = holder
        logger.info("leader election: Lease %s/%s now held by %s (%s)", self.settings.namespace,
                    self.settings.name, holder or "nobody", why)
        self.on_transition(holder, why)

    def try_acquire_or_renew(self, timeout: float | None = None) -> bool:
        """One try: read the Lease, and take it (free or expired) or renew it (ours).

        ``timeout`` (seconds) bounds the whole try (default: the settings' request timeout).
        Returns True when this replica holds the Lease after the try, with a new deadline of
        this try's start plus the renew deadline. Raises :class:`LeaseConflict` when another
        replica wrote first, and the API client's errors (timeouts, refusals).
        """
        start = self.clock()
        budget = self.settings.request_timeout if timeout is None else timeout
        end = start + budget
        record = self.api.read(timeout=budget)
        now = self.clock()
        if record is None:
            written = self.api.create(self.identity, self.settings.lease_duration,
                                      timeout=max(0.001, end - now))
            self._won(written, start, "created the Lease")
            return True
        self._observe(record, now)
        # Ours only if this process won it: a Lease left by an earlier process with the same
        # identity (a fixed --leader-elect-identity) is waited out like anyone else's.
        mine = record.holder == self.identity and self._deadline is not None
        expired = now >= self._observed_at + record.duration
        if record.holder and not mine and not expired:
            return False
        transitions = record.transitions + (0 if mine else 1)
        written = self.api.replace(record, self.identity, self.settings.lease_duration,
                                   transitions, acquired=not mine, timeout=max(0.001, end - now))
        if mine:
            self._renewed(written, start)
        else:
            why = (f"{record.holder} did not renew it for {now - self._observed_at:.1f}s"
                   if record.holder else "it had no holder (released)")
            self._won(written, start, why)
        return True

    def _won(self, written: LeaseRecord, start: float, why: str) -> None:
        previous = self._observed.holder if self._observed else None
        self._observed, self._observed_at, self._record = written, self.clock(), written
        self._deadline = start + self.settings.renew_deadline
        logger.info("leader election: %s acquired Lease %s/%s (%s; previous holder %s)",
                    self.identity, self.settings.namespace, self.settings.name, why,
                    previous or "none")
        self._report(self.identity, why)

    def _renewed(self, written: LeaseRecord, start: float) -> None:
        self._observed, self._observed_at, self._record = written, self.clock(), written
        deadline = self._deadline
        # A renewal that ends after the deadline extends nothing: the leader has stopped.
        if not self._lost and deadline is not None and self.clock() < deadline:
            self._deadline = start + self.settings.renew_deadline

    # -- loops -----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask :meth:`acquire` or :meth:`lead` to return at their next wait."""
        self._stopped.set()

    def stop_requested(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopped.is_set()

    def _wait(self, seconds: float) -> bool:
        if self._wait_for is not None:
            return self._wait_for(max(0.0, seconds)) or self._stopped.is_set()
        return self._stopped.wait(max(0.0, seconds))

    def acquire(self) -> bool:
        """Try every retry period until this replica holds the Lease (True) or :meth:`stop` was
        called (False). Errors of a try are logged and the next try follows.

        With an API that can watch the Lease (:class:`.lease.WatchingLeaseApi`), the wait
        between two tries follows its changes: a renewal is observed when it happens (not up
        to a retry period later, which the wait for the holder's expiry would add), a release
        is taken at once, and an expiry is tried at its moment rather than at the next tick.
        A leader killed without a word is then succeeded ``lease_duration`` after its last
        renewal, within a few hundredths of a second; before, up to two retry periods later.
        """
        while not self._stopped.is_set():
            start = self.clock()
            try:
                if self.try_acquire_or_renew():
                    return True
            except LeaseConflict as error:
                logger.info("leader election: another replica wrote the Lease first (%s)", error)
            except Exception as error:  # noqa: BLE001 (any API failure: try again)
                logger.warning("leader election: could not read or take the Lease: %r", error)
            if self._stand_by(start + self.settings.retry_period):
                return False
        return False

    def _stand_by(self, until: float) -> bool:
        """Wait until ``until`` (clock), or less: until the observed holder's time is up or
        the Lease is released, following its changes where the API can watch it. Returns True
        when asked to stop."""
        watch = getattr(self.api, "watch_change", None)
        while True:
            observed = self._observed
            if watch is None or observed is None or not observed.holder:
                return self._wait(until - self.clock())
            due = min(until, self._observed_at + observed.duration)
            left = due - self.clock()
            if left <= 0 or self._stopped.is_set():
                return self._stopped.is_set()
            if left < WATCH_MIN_S:  # a watch ends on whole seconds: sleep to the moment
                return self._wait(left)
            try:
                changed = watch(observed.resource_version, timeout=left)
            except Exception as error:  # noqa: BLE001 (the next try reads the Lease anyway)
                logger.debug("leader election: watching the Lease failed: %r", error)
                changed = None
            if self._stopped.is_set():
                return True
            if changed is None:  # no change in time, or none to be had: the next try reads
                return self._wait(due - self.clock())
            self._observe(changed, self.clock())
            if not changed.holder:
                return False  # released: take it now

    def lead(self) -> str | None:
        """Renew every retry period until :meth:`stop` (returns ``None``) or until leadership is
        lost: returns why (the renew deadline passed, or another replica holds the Lease).
        Once lost, :meth:`may_write` stays false for good."""
        next_try = self.clock() + self.settings.retry_period
        failures: list[str] = []
        while True:
            deadline = self._deadline
            assert deadline is not None, "lead() before acquire()"
            if self._wait(min(next_try, deadline) - self.clock()):
                return None
            now = self.clock()
            if now >= deadline:
                return self._lose(f"could not renew the Lease within the renew deadline "
                                  f"({self.settings.renew_deadline:g}s; "
                                  f"{'; '.join(failures[-3:]) or 'no try finished'})")
            next_try = now + self.settings.retry_period
            try:
                if self.try_acquire_or_renew(timeout=min(self.settings.request_timeout,
                                                         deadline - now)):
                    failures.clear()
                    continue
                return self._lose(f"the Lease is held by {self.holder}")
            except LeaseConflict as error:
                return self._lose(f"another replica wrote the Lease ({error})")
            except Exception as error:  # noqa: BLE001 (try again until the deadline)
                failures.append(repr(error))
                logger.warning("leader election: renewing the Lease failed (%.1fs left to the "
                               "renew deadline): %r", max(0.0, deadline - self.clock()), error)

    def _lose(self, why: str) -> str:
        self._lost = True
        logger.error("leader election lost by %s: %s", self.identity, why)
        self._report(None if self.holder == self.identity else self.holder, why)
        return why

    def release(self) -> bool:
        """Give the Lease up (empty holder, 1 s duration) when this replica still leads, so
        that a standby takes it at its next try. Call only once the guarded work has stopped.
        Returns True when released; False (logged) when not leading or the write failed."""
        record = self._record
        if record is None or not self.may_write():
            return False
        timeout = min(self.settings.request_timeout, self.seconds_left())
        self._lost = True  # from here on nothing may write, whatever the answer
        try:
            self.api.replace(record, None, 1, record.transitions, acquired=True,
                             timeout=max(0.001, timeout))
        except Exception as error:  # noqa: BLE001 (the Lease then expires on its own)
            logger.warning("leader election: could not release the Lease: %r", error)
            return False
        self._report(None, f"released by {self.identity}")
        return True
