"""Per-job series on the operator's ``/metrics``, for live jobs only (issue 22 item 3).

After each pass the job's status is summed up (:func:`sample`); a finished (Succeeded or
Failed) or deleted job leaves every series at once, so the number of series follows the jobs
running or waiting now, never the history. At most :data:`MAX_JOBS` jobs are shown (the
ones seen first; a warning names the limit once); labels are ``namespace`` and ``job``, plus
``phase`` or ``class`` where the series says so:

- ``monarch_operator_job_phase{namespace,job,phase}``: 1 for the job's phase (``STATUS``).
- ``monarch_operator_job_attempt``: the attempt in progress (1 for the first).
- ``monarch_operator_job_restarts``: restarts so far (``RESTARTS``).
- ``monarch_operator_job_attempts_ended{class}``: ended attempts by failure class
  (``Application``, ``Infrastructure``, ``Startup``, ``Evicted``, ``Suspended`` ...).
- ``monarch_operator_job_queued_seconds``: seconds spent queued by Kueue, the wait in progress
  included.
- ``monarch_operator_job_startup_seconds``: the attempt in progress, from its start (or its
  admission) to its launcher's start; while it has not started, the time so far.
- ``monarch_operator_job_workers`` and ``monarch_operator_job_ready_workers``: worker pods
  wanted and Ready (``READY``).
- ``monarch_operator_job_step`` and ``monarch_operator_job_total_steps``: the program's last
  reported step and total (``status.progress``), once it reported.
- ``monarch_operator_job_seconds_since_report``: seconds since that report (a run whose value
  keeps growing is stalling; ``runPolicy.progressDeadlineSeconds`` acts on it).

Gauges, in base units (Prometheus "Metric and label naming").
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from monarch_operator.controller.state import attempts, deadlines
from monarch_operator.controller.state import status as st

logger = logging.getLogger("monarch_operator")

PREFIX = "monarch_operator_job"
# The most jobs shown at once (bounded cardinality: ~10 series a job).
MAX_JOBS = 2000
FINISHED = (st.PHASE_SUCCEEDED, st.PHASE_FAILED)


@dataclass(frozen=True)
class JobSample:
    """What the series say of one live job; times as the status gives them (``None``:
    unknown or not applicable)."""

    phase: str
    attempt: int
    restarts: int
    ended: dict[str, int] = field(default_factory=dict)
    queued_seconds: float = 0.0
    queued_since: dt.datetime | None = None
    started: dt.datetime | None = None
    launched: dt.datetime | None = None
    workers: int = 0
    ready_workers: int = 0
    step: int | None = None
    total_steps: int | None = None
    reported: dt.datetime | None = None


def _time(text: Any) -> dt.datetime | None:
    try:
        return deadlines.parse_time(str(text)) if text else None
    except ValueError:
        return None


def sample(status: dict[str, Any] | None) -> JobSample | None:
    """The job's :class:`JobSample` from its ``status``, or None when the job is finished
    (or has no phase yet): its series go."""
    status = status or {}
    phase = status.get("phase")
    if not phase or phase in FINISHED:
        return None
    ready, _, wanted = str(status.get("readyWorkers") or "0/0").partition("/")
    queue = status.get("queue") or {}
    record = attempts.current(status) or {}
    ended = Tally(str(item["class"]) for item in status.get("attempts") or []
                  if item.get("class"))
    progress = status.get("progress") or {}
    return JobSample(
        phase=str(phase), attempt=int(status.get("attempt") or 1),
        restarts=int(status.get("restartCount") or 0), ended=dict(ended),
        queued_seconds=float(queue.get("queuedSeconds") or 0),
        queued_since=_time(queue.get("queuedSince")),
        started=None if phase == st.PHASE_QUEUED else _time(record.get("startTime")),
        launched=_time(record.get("launchTime")),
        workers=int(wanted) if wanted.isdigit() else 0,
        ready_workers=int(ready) if ready.isdigit() else 0,
        step=_int(progress.get("step")), total_steps=_int(progress.get("totalSteps")),
        reported=_time(progress.get("lastUpdatedTime")))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class JobSeries(Collector):
    """The live jobs' samples, collected as the families in the module docstring
    (thread-safe: passes record from their threads, the HTTP server collects from its own)."""

    def __init__(self, clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 max_jobs: int = MAX_JOBS) -> None:
        self._clock = clock
        self._max_jobs = max_jobs
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], JobSample] = {}
        self._warned = False

    def observe(self, job: tuple[str, str], status: dict[str, Any] | None) -> None:
        """Record ``(namespace, name)``'s status after a pass (a finished job is forgotten)."""
        found = sample(status)
        with self._lock:
            if found is None:
                self._jobs.pop(job, None)
                return
            if job not in self._jobs and len(self._jobs) >= self._max_jobs:
                if not self._warned:
                    logger.warning("per-job metrics: %d jobs shown, the limit; more are left "
                                   "out until some finish", self._max_jobs)
                    self._warned = True
                return
            self._jobs[job] = found

    def forget(self, job: tuple[str, str]) -> None:
        """The job is gone: its series go."""
        with self._lock:
            self._jobs.pop(job, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        with self._lock:
            jobs = sorted(self._jobs.items())
        keys = ["namespace", "job"]
        phase = GaugeMetricFamily(f"{PREFIX}_phase", "1 for the job's phase (STATUS).",
                                  labels=[*keys, "phase"])
        ended = GaugeMetricFamily(f"{PREFIX}_attempts_ended",
                                  "The job's ended attempts by failure class.",
                                  labels=[*keys, "class"])
        plain = {name: GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=keys) for name, text in (
            ("attempt", "The job's attempt in progress (1: the first)."),
            ("restarts", "The job's restarts so far (RESTARTS)."),
            ("queued_seconds", "Seconds the job spent queued by Kueue, the wait in progress "
                               "included."),
            ("startup_seconds", "The attempt in progress: seconds from its start (or "
                                "admission) to its launcher's start, or so far."),
            ("workers", "Worker pods the job wants."),
            ("ready_workers", "Worker pods of the job that are Ready."),
            ("step", "The program's last reported step (status.progress)."),
            ("total_steps", "The steps the program said it will do."),
            ("seconds_since_report", "Seconds since the program's last progress report."))}
        for (namespace, name), job in jobs:
            labels = [namespace, name]
            phase.add_metric([*labels, job.phase], 1)
            for failure_class, count in sorted(job.ended.items()):
                ended.add_metric([*labels, failure_class], count)
            plain["attempt"].add_metric(labels, job.attempt)
            plain["restarts"].add_metric(labels, job.restarts)
            waiting = (now - job.queued_since).total_seconds() if job.queued_since else 0.0
            plain["queued_seconds"].add_metric(labels, job.queued_seconds + max(0.0, waiting))
            if job.started is not None:
                until = job.launched or now
                plain["startup_seconds"].add_metric(
                    labels, max(0.0, (until - job.started).total_seconds()))
            plain["workers"].add_metric(labels, job.workers)
            plain["ready_workers"].add_metric(labels, job.ready_workers)
            if job.step is not None:
                plain["step"].add_metric(labels, job.step)
            if job.total_steps is not None:
                plain["total_steps"].add_metric(labels, job.total_steps)
            if job.reported is not None:
                plain["seconds_since_report"].add_metric(
                    labels, max(0.0, (now - job.reported).total_seconds()))
        yield phase
        yield ended
        yield from plain.values()


JOBS = JobSeries()
REGISTRY.register(JOBS)
