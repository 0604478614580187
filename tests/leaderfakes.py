"""Fakes of the leader election's clock and Lease API for the unit tests (tests/unit/
test_leader_election.py, test_leader_process.py): one Lease in memory with conditional
replaces, a log of its writes, and a partition mode in which every call hangs until its
timeout and fails."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from monarch_operator.controller.leader.lease import LeaseConflict, LeaseRecord, micro_time


class FakeClock:
    """Seconds that move only when advanced (``advance`` is an elector's ``wait``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> bool:
        self.now += seconds
        return False  # not asked to stop


@dataclass
class FakeServer:
    """One Lease in a fake API server: conditional replaces, a log of the writes."""

    clock: FakeClock | RealClock
    record: LeaseRecord | None = None
    version: int = 0
    writes: list[tuple[float, str, str | None]] = field(default_factory=list)
    down: bool = False  # every call fails, after its timeout (a partition)
    timeouts: list[float] = field(default_factory=list)

    def _call(self, timeout: float) -> None:
        self.timeouts.append(timeout)
        if self.down:
            self.clock.advance(timeout)  # the request hangs until its timeout
            raise TimeoutError("read timed out")

    def _write(self, holder: str | None, duration: float, transitions: int,
               acquire_time: str | None) -> LeaseRecord:
        self.version += 1
        self.record = LeaseRecord(holder, duration, transitions, str(self.version),
                                  acquire_time or micro_time(), micro_time())
        self.writes.append((self.clock.now, "write", holder))
        return self.record


@dataclass
class FakeLeaseApi:
    server: FakeServer

    def read(self, timeout: float) -> LeaseRecord | None:
        self.server._call(timeout)
        return self.server.record

    def create(self, holder: str, duration: float, timeout: float) -> LeaseRecord:
        self.server._call(timeout)
        if self.server.record is not None:
            raise LeaseConflict("exists")
        return self.server._write(holder, duration, 0, None)

    def replace(self, previous: LeaseRecord, holder: str | None, duration: float,
                transitions: int, acquired: bool, timeout: float) -> LeaseRecord:
        self.server._call(timeout)
        current = self.server.record
        if current is None or current.resource_version != previous.resource_version:
            raise LeaseConflict(f"changed since {previous.resource_version}")
        return self.server._write(holder, duration, transitions,
                                  None if acquired else current.acquire_time)


class RealClock:
    """The real clock, for tests of the whole process (real threads, short timings)."""

    def __call__(self) -> float:
        return time.monotonic()

    @property
    def now(self) -> float:
        return time.monotonic()

    def advance(self, seconds: float) -> bool:
        time.sleep(seconds)
        return False


class ScheduledClock(FakeClock):
    """A :class:`FakeClock` that runs callbacks at their times as it is advanced (another
    replica's renewals, a release), in time order."""

    def __init__(self) -> None:
        super().__init__()
        self.due: list[tuple[float, int, Callable[[], None]]] = []

    def at(self, moment: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.due, (moment, len(self.due), action))

    def advance(self, seconds: float) -> bool:
        end = self.now + max(0.0, seconds)
        while self.due and self.due[0][0] <= end:
            moment, _, action = heapq.heappop(self.due)
            self.now = max(self.now, moment)
            action()
        self.now = end
        return False

    def next_due(self) -> float | None:
        return self.due[0][0] if self.due else None


@dataclass
class FakeWatchingLeaseApi(FakeLeaseApi):
    """A :class:`FakeLeaseApi` with ``watch_change`` over a :class:`ScheduledClock`: the clock
    runs to the first scheduled action that changes the Lease, within the timeout."""

    watches: list[float] = field(default_factory=list)

    def watch_change(self, resource_version: str, timeout: float) -> LeaseRecord | None:
        clock = self.server.clock
        assert isinstance(clock, ScheduledClock)
        self.watches.append(timeout)
        end = clock.now + timeout
        while (moment := clock.next_due()) is not None and moment <= end:
            clock.advance(moment - clock.now)
            record = self.server.record
            if record is not None and record.resource_version != resource_version:
                return record
        clock.advance(end - clock.now)
        return None
