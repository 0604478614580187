"""What one reconcile pass carries from step to step: the job, its status as the pass leaves
it, the time, the Events to post and when to look again; shared by the pass's steps
(:mod:`.gate`, :mod:`.launching`, :mod:`.endings`, :mod:`.suspension`, :mod:`.release`)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import status as st

# A step held back until the pass's status write is stored asks for a pass this soon after
# (seconds): our own status write wakes nobody (``cache.JobCache.is_own_write``), and without
# it the step waited for the next watch event on the job or a child.
AFTER_STATUS_WRITE_SECONDS = 0.0


@dataclass
class Event:
    """A Kubernetes Event to post on the job (the handler posts it)."""

    type: str  # "Normal" or "Warning"
    reason: str
    message: str


@dataclass
class Pass:
    """State carried through one reconcile pass."""

    job: JobSpec
    status: dict[str, Any]
    now: dt.datetime
    events: list[Event] = field(default_factory=list)
    wake_after: float | None = None  # seconds until a pass is needed (reconcile.Outcome)
    # Settings.force_delete_after_seconds, for the pass's look at pods stuck terminating.
    force_delete_after: float = float(Settings.force_delete_after_seconds)
    # The status as the API server had stored it when the pass began (the job as read). What
    # removes the evidence of a verdict waits until the verdict is stored: a leader cut off
    # between its deletes and its status write left the next one nothing to judge by.
    stored: dict[str, Any] = field(default_factory=dict)

    def wake_in(self, seconds: float | None) -> None:
        """Ask for a pass ``seconds`` from now (the earliest asked for wins); None: nothing."""
        if seconds is not None:
            self.wake_after = seconds if self.wake_after is None else min(self.wake_after,
                                                                           seconds)

    def after_status_write(self) -> None:
        """Ask for a pass right after this one's status write (a step waits for it)."""
        self.wake_in(AFTER_STATUS_WRITE_SECONDS)

    @property
    def now_text(self) -> str:
        """``now`` as the status writes times (RFC 3339, whole seconds, ``Z``)."""
        return st.format_time(self.now)

    def condition(self, condition_type: str, is_set: bool, reason: str, message: str) -> None:
        """Set a condition of the status (:func:`.status.set_condition`) at ``now``."""
        self.status = st.set_condition(
            self.status, condition_type, is_set, reason, message,
            self.job.generation, self.now_text,
        )


def short(items: list[str], limit: int = 5) -> str:
    """The first ``limit`` items joined by commas, and how many more there are."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
