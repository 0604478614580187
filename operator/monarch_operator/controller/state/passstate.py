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

    def wake_in(self, seconds: float | None) -> None:
        """Ask for a pass ``seconds`` from now (the earliest asked for wins); None: nothing."""
        if seconds is not None:
            self.wake_after = seconds if self.wake_after is None else min(self.wake_after,
                                                                           seconds)

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
