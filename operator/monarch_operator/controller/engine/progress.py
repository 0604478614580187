"""When a status change that is only progress may be written (ready count, waiting message).

Transitions (a condition's status or reason, the phase) are written at once. Progress is not
worth one API write per pod event: a job's progress is written at most once per
:data:`INTERVAL_SECONDS` after its last status write, and while jobs start, progress writes of
all jobs together are spaced :data:`STARTING_SPACING_SECONDS` apart (each job reserves its
turn, in the order it asked). 200 jobs starting at once then cost about one progress write each
instead of one per 10 s of their start-up, and one job alone still shows its workers becoming
Ready within 10 s. The same idea as client-go's rate-limited work queue, applied to status
writes only (client-go's default client limit is 5 writes per second for a whole controller).
"""

from __future__ import annotations

import datetime as dt
import threading

JobKey = tuple[str, str]  # (namespace, name)

# A job's progress is written at most once per this many seconds after its last status write.
INTERVAL_SECONDS = 10.0
# Operator-wide, progress writes of starting jobs are at least this far apart (2 per second).
STARTING_SPACING_SECONDS = 0.5


class ProgressWrites:
    """Per job, when its last status write was; operator-wide, the next free turn for a
    starting job's progress write. Thread-safe (passes run in threads)."""

    def __init__(self, interval: float = INTERVAL_SECONDS,
                 spacing: float = STARTING_SPACING_SECONDS) -> None:
        self._interval = dt.timedelta(seconds=interval)
        self._spacing = dt.timedelta(seconds=spacing)
        self._lock = threading.Lock()
        self._after: dict[JobKey, dt.datetime] = {}  # a job's own interval ends then
        self._turns: dict[JobKey, dt.datetime] = {}  # a starting job's reserved turn
        self._next_free: dt.datetime | None = None

    def hold_seconds(self, key: JobKey, now: dt.datetime) -> float:
        """Seconds the progress-only change of starting job ``key`` must wait (0: write it
        now): until its own interval ends, then until its turn among all starting jobs; a job
        that waits for its turn keeps it until it writes (:meth:`written`)."""
        with self._lock:
            own = self._after.get(key)
            if own is not None and now < own:
                return (own - now).total_seconds()
            turn = self._turns.get(key)
            if turn is None:
                turn = now if self._next_free is None else max(now, self._next_free)
                self._next_free = turn + self._spacing
                self._turns[key] = turn
            return max((turn - now).total_seconds(), 0.0)

    def written(self, key: JobKey, now: dt.datetime) -> None:
        """The job's status was written at ``now`` (any change): its interval starts again and
        a turn it held is given up."""
        with self._lock:
            self._after[key] = now + self._interval
            self._turns.pop(key, None)

    def forget(self, key: JobKey) -> None:
        """The job is gone."""
        with self._lock:
            self._after.pop(key, None)
            self._turns.pop(key, None)
