"""A change of a job's Workload (Kueue admitted or evicted it) wakes the job's pass.

Only Workloads carrying our job label are streamed (a server-side label selector set at
start-up, :func:`configure`); without Kueue's CRDs kopf watches nothing here.
"""

from __future__ import annotations

from typing import Any

import kopf

from monarch_operator import constants
from monarch_operator.controller.kueue import workload as wl

RESOURCE = (wl.GROUP, wl.API_VERSION.split("/")[1], "workloads")


def configure(settings: kopf.OperatorSettings, selector: str) -> None:
    """Stream only our Workloads (``selector``: the one the children's watches use)."""
    settings.watching.label_selectors[RESOURCE] = selector


def register(wake: Any) -> None:
    """Register the watch: ``wake((namespace, job name))`` on every event of our Workloads."""

    @kopf.on.event(*RESOURCE, labels={constants.LABEL_JOB: kopf.PRESENT})
    async def on_workload_event(namespace: str, labels: dict[str, str], **_: Any) -> None:
        """Kueue changed the job's Workload (admission, eviction, its conditions)."""
        wake((namespace, labels[constants.LABEL_JOB]))
