"""Where the job's program saved its state, as its launchers named it (issue 21 item 4).

A program calls ``monarch_operator.job.checkpoint_saved(LOCATION)`` (typically when asked to
stop before a suspend or an eviction, see :func:`.release.stop_launcher_first`); the launcher
ends its termination message with ``[checkpoint: LOCATION]``
(``launcher/stoprequest.py``; a unit test keeps the two patterns equal). Each pass reads the
job's ended launcher pods from its view (no request): the newest attempt's location becomes
``status.lastCheckpoint`` (location, attempt, and when: the time the program named it, as
its launcher reported it in its progress report, else when that launcher ended, never when the
operator noticed) and that attempt's ``checkpoint``; the next attempt's launcher gets it as
``MONARCH_CHECKPOINT``.

A launcher deleted for a suspend or an eviction may be gone from the view before a pass saw
its end: every launcher pod event that names a checkpoint is also remembered here
(:func:`remember`, from the pod watch, the DELETED event's last state included) until the job
goes (:func:`forget`), and a pass reads both.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from monarch_operator import constants
from monarch_operator.controller.builders.launcher import LAUNCHER_CONTAINER
from monarch_operator.controller.k8s import reads
from monarch_operator.controller.state import lastseen
from monarch_operator.controller.state.passstate import Event, Pass

MARKER = re.compile(r"\[checkpoint: (?P<location>[^\s\]]+)\]\s*$")
REASON_CHECKPOINT_SAVED = "CheckpointSaved"

# (namespace, job) -> the newest launcher pod that named a checkpoint, as last seen.
_seen: dict[tuple[str, str], dict[str, Any]] = {}
_seen_lock = threading.Lock()


def remember(namespace: str, job_name: str, pod: dict[str, Any]) -> None:
    """Keep ``pod`` (a launcher pod as an event delivered it) for the job's next pass if it
    names a checkpoint and is of the newest attempt seen so far."""
    attempt = lastseen.attempt_of(pod)
    if attempt is None or named_in(pod) is None:
        return
    with _seen_lock:
        known = _seen.get((namespace, job_name))
        if known is None or (lastseen.attempt_of(known) or 0) <= attempt:
            _seen[(namespace, job_name)] = pod


def forget(namespace: str, job_name: str) -> None:
    """The job is gone: drop what :func:`remember` kept for it."""
    with _seen_lock:
        _seen.pop((namespace, job_name), None)


def location(status: dict[str, Any]) -> str | None:
    """The last checkpoint's location (``status.lastCheckpoint.location``), or None."""
    return (status.get("lastCheckpoint") or {}).get("location") or None


def named_in(pod: dict[str, Any]) -> tuple[str, str | None] | None:
    """``(location, finishedAt)`` of the checkpoint named in the launcher container's
    termination message, or None (running, or no marker)."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        if container.get("name") != LAUNCHER_CONTAINER:
            continue
        terminated = (container.get("state") or {}).get("terminated") or {}
        found = MARKER.search(" ".join(str(terminated.get("message") or "").split()))
        if found:
            return found["location"], terminated.get("finishedAt")
    return None


def harvest(state: Pass) -> None:
    """Record the newest checkpoint the job's ended launcher pods named (see the module doc);
    an Event ``CheckpointSaved`` for each new one."""
    job = state.job
    pods = reads.list_pods(job.namespace, {constants.LABEL_JOB: job.name,
                                         constants.LABEL_ROLE: constants.ROLE_LAUNCHER})
    with _seen_lock:
        remembered = _seen.get((job.namespace, job.name))
    if remembered is not None:
        pods = [*pods, remembered]
    last = dict(state.status.get("lastCheckpoint") or {})
    numbered = [(attempt, pod) for pod in pods if (attempt := lastseen.attempt_of(pod)) is not None]
    for attempt, pod in sorted(numbered, key=lambda item: item[0]):
        named = named_in(pod)
        if named is None or attempt < int(last.get("attempt") or 0):
            continue
        where, when = named
        if (attempt, where) == (last.get("attempt"), last.get("location")):
            continue
        when = _saved_time(state.status, attempt, where) or when
        last = {"location": where, "attempt": attempt, **({"time": when} if when else {})}
        state.status["lastCheckpoint"] = last
        state.status["attempts"] = [
            {**record, "checkpoint": where} if record.get("number") == attempt else record
            for record in state.status.get("attempts") or []]
        state.events.append(Event("Normal", REASON_CHECKPOINT_SAVED,
                                  f"attempt {attempt} saved its state at {where}; the next "
                                  f"attempt gets it as {constants.ENV_CHECKPOINT}"))


def _saved_time(status: dict[str, Any], attempt: int, where: str) -> str | None:
    """When attempt ``attempt``'s program said it saved its state at ``where``, as its
    launcher reported it (``status.progress.checkpointTime``); None when its last report
    names another location (or none): then the launcher's end is the best time known."""
    progress = status.get("progress") or {}
    if progress.get("attempt") == attempt and progress.get("checkpoint") == where:
        return progress.get("checkpointTime") or None
    return None
