"""Pure: when a job next needs a pass even if no watch event comes (its next deadline).

The operator has no periodic resync; a job is woken by watch events on itself and its
children, and by a timer set to the earliest deadline computed here (field case C5).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import attempts
from monarch_operator.controller.state import status as st

# Timestamps in status have whole seconds and the checks compare with ">": wake a little after.
DEADLINE_SLACK_SECONDS = 1.0
# A deadline further ahead than this (ten years) is never reached by a running operator. The
# schema allows spec.activeDeadlineSeconds and ttlSecondsAfterFinished up to 2^63-1 (int64,
# as the Kubernetes Job's activeDeadlineSeconds), far past what datetime can add (year 9999):
# such a deadline counts as none instead of failing every pass with OverflowError.
MAX_DEADLINE_SECONDS = 10 * 365 * 24 * 3600


def parse_time(text: str) -> dt.datetime:
    """An RFC 3339 ``...Z`` timestamp of the status as an aware UTC datetime.

    Raises:
        ValueError: not of the form ``YYYY-MM-DDTHH:MM:SSZ``.
    """
    return dt.datetime.strptime(text, st.TIME_FORMAT).replace(tzinfo=dt.UTC)


def seconds_until_next_deadline(job: JobSpec, status: dict[str, Any],
                                now: dt.datetime) -> float | None:
    """Seconds from ``now`` until the earliest deadline that is still ahead for the job.

    Deadlines: the startup timeout (``spec.startupTimeoutSeconds`` from the current attempt's
    ``startTime``, else ``status.startTime``, while its launcher has not started and the job is
    neither suspended nor queued), ``spec.activeDeadlineSeconds`` (from ``status.startTime``,
    until the job finished) and ``spec.ttlSecondsAfterFinished`` (from
    ``status.completionTime``, once it finished).

    Returns:
        ``None`` when no deadline applies (e.g. a running job without deadlines); ``0`` or more
        otherwise, including ``DEADLINE_SLACK_SECONDS`` past the deadline itself.
    """
    deadlines: list[dt.datetime | None] = []
    # Each attempt's gate has its own startup timeout (restarts, resume after suspend).
    record = attempts.current(status) or {}
    start_text = record.get("startTime") or status.get("startTime")
    if (not st.is_finished(status) and not st.is_true(status, st.SUSPENDED)
            and not st.is_true(status, st.QUEUED) and start_text):  # queue time is not startup
        started = parse_time(start_text)
        if not st.is_true(status, st.RUNNING):
            deadlines.append(_after(started, job.startup_timeout_seconds))
    job_start = status.get("startTime")
    if not st.is_finished(status) and job_start and job.active_deadline_seconds is not None:
        deadlines.append(_after(parse_time(job_start), job.active_deadline_seconds))
    completion_text = status.get("completionTime")
    if st.is_finished(status) and completion_text and job.ttl_seconds_after_finished is not None:
        deadlines.append(_after(parse_time(completion_text), job.ttl_seconds_after_finished))
    ahead = [deadline for deadline in deadlines if deadline is not None]
    if not ahead:
        return None
    remaining = (min(ahead) - now).total_seconds() + DEADLINE_SLACK_SECONDS
    return max(remaining, 0.0)


def _after(start: dt.datetime, seconds: int) -> dt.datetime | None:
    """``start`` plus ``seconds``, or None when that is beyond :data:`MAX_DEADLINE_SECONDS`."""
    if seconds > MAX_DEADLINE_SECONDS:
        return None
    return start + dt.timedelta(seconds=seconds)
