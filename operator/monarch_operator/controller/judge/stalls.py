"""Hang detection and the progress budget rule (issue 22 item 2).

**Stalled.** With ``runPolicy.progressDeadlineSeconds``, an attempt whose program reported
progress and then none for that long has stalled. Its launcher notices first
(``launcher/progress.py``): it prints its threads' stacks, stops the ranks and ends with
``ProgressStalled: ...; threads: A | B``, which :func:`stall_in` finds; the attempt ends as
Infrastructure with reason ``ProgressStalled`` (a hang's usual causes in a long run are a dead
peer, a wedged collective or a stuck generator: the run's code, not the hosts, is rarely to
blame for the first one, and infrastructureBackoffLimit bounds a program that hangs every
time), its stacks in its record. A launcher that cannot stop itself (its own process stuck, or
a launcher command without our launcher) is stopped by the operator once the last report is
older than the deadline plus the report interval plus :data:`BACKSTOP_MARGIN_SECONDS`
(:func:`overdue_seconds`), with the same verdict and no stacks. None of the peers (Kubeflow
Trainer, the MPI Operator, KubeRay) has either.

**Progress spends no budget** (``runPolicy.progressResetsBackoff``): an application failure of
an attempt that reported a higher step than every earlier attempt (:func:`made_progress`)
restarts without spending ``backoffLimit``; a crash loop that never gets past its step stops
as before.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from monarch_operator.controller.state import deadlines

# launcher/progress.py STALL_REASON and its ": " (a unit test keeps them equal).
STALL_MARKER = "ProgressStalled: "
STACKS_MARKER = "; threads: "
MAX_STACKS = 20
# How long past deadline + report interval the operator lets a stalled launcher stop itself.
BACKSTOP_MARGIN_SECONDS = 60.0


def stall_in(message: str | None) -> tuple[str, list[str]] | None:
    """``(what, stacks)`` when a launcher's final message says it stopped a stalled run
    (``ProgressStalled: no progress report for 65s (...); threads: A | B``), else None.
    ``what`` is the message up to its threads, ``stacks`` one line per thread (at most
    :data:`MAX_STACKS`)."""
    if not message or STALL_MARKER not in message:
        return None
    stall = message[message.index(STALL_MARKER):]
    what, _, threads = stall.partition(STACKS_MARKER)
    stacks = [line.strip() for line in threads.split(" | ") if line.strip()]
    return what.strip(), stacks[:MAX_STACKS]


def reported_idle_seconds(status: dict[str, Any], now: dt.datetime) -> float | None:
    """Seconds since the current attempt's program last reported (``status.progress``), None
    when this attempt has not reported."""
    progress = status.get("progress") or {}
    if progress.get("attempt") != status.get("attempt") or not progress.get("lastUpdatedTime"):
        return None
    try:
        last = deadlines.parse_time(str(progress["lastUpdatedTime"]))
    except ValueError:
        return None
    return max(0.0, (now - last).total_seconds())


def overdue_seconds(status: dict[str, Any], now: dt.datetime, deadline: int | None,
                    interval: int) -> float | None:
    """For a running attempt: seconds left before the operator stops it as stalled (<= 0:
    now); None when it cannot stall (no deadline, or no report of this attempt yet). The
    launcher's own stop comes at ``deadline``; the operator waits ``interval`` more (a report
    may be that late in status) and :data:`BACKSTOP_MARGIN_SECONDS`."""
    idle = reported_idle_seconds(status, now)
    if deadline is None or idle is None:
        return None
    return deadline + interval + BACKSTOP_MARGIN_SECONDS - idle


def made_progress(status: dict[str, Any]) -> bool:
    """Whether the current attempt reported a step above every earlier attempt's last step
    (and above 0): progress since the previous failure."""
    attempt = status.get("attempt")
    records = status.get("attempts") or []
    current = next((record for record in records if record.get("number") == attempt), {})
    step = current.get("lastStep")
    if not isinstance(step, int):
        return False
    earlier = [record.get("lastStep") for record in records
               if record.get("number") != attempt and isinstance(record.get("lastStep"), int)]
    return step > max(earlier, default=0)


def attach_stacks(status: dict[str, Any], attempt: int, stacks: list[str]) -> dict[str, Any]:
    """``status`` with attempt ``attempt``'s record holding ``stacks``."""
    if not stacks:
        return status
    return {**status, "attempts": [
        {**record, "stacks": stacks} if record.get("number") == attempt else record
        for record in status.get("attempts") or []]}
