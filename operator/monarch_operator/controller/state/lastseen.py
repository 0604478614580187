"""The last state of each job's newest launcher pod as the pod watch delivered it.

A launcher pod can end and be gone before a pass of its job runs: it exited 0 and a node
loss, an operator restart's clean-up or a ``kubectl delete`` removed it seconds later. The
pass then finds no pod for an attempt that has a ``launchTime``, and without its last state it
cannot tell a launcher that ended by itself from one deleted while it ran (found by the chaos
soak: an attempt whose launcher exited 0 judged ``LauncherLost``). Every launcher pod event,
the DELETED event's last state included, is kept here (:func:`remember`, from
``handlers.on_child_event``) until the job goes (:func:`forget`); :func:`launcher` gives the
pass the newest attempt's. Only the newest attempt's pod is kept per job: the memory is one pod
per live job.
"""

from __future__ import annotations

import threading
from typing import Any

from monarch_operator import constants
from monarch_operator.controller.state.ownership import controller_uid, owned_by_another_job

_seen: dict[tuple[str, str], dict[str, Any]] = {}
_lock = threading.Lock()


def attempt_of(pod: dict[str, Any]) -> int | None:
    """The attempt number of a launcher pod (its attempt label), or None without one."""
    try:
        return int(pod["metadata"].get("labels", {})[constants.LABEL_ATTEMPT])
    except (KeyError, ValueError, TypeError):
        return None


def remember(namespace: str, job_name: str, pod: dict[str, Any]) -> None:
    """Keep ``pod`` (a launcher pod as a watch event delivered it) as its job's newest
    launcher's last state, unless a newer attempt's pod of the same job was already seen (an
    earlier job of the same name, its attempt 3 say, never holds back the new job's 1)."""
    attempt = attempt_of(pod)
    if attempt is None:
        return
    with _lock:
        known = _seen.get((namespace, job_name))
        if (known is None or (attempt_of(known) or 0) <= attempt
                or controller_uid(known) != controller_uid(pod)):
            _seen[(namespace, job_name)] = pod


def launcher(namespace: str, job_name: str, attempt: int, job_uid: str) -> dict[str, Any] | None:
    """The last state seen of attempt ``attempt``'s launcher pod of job ``job_uid``, or None
    when the watch delivered none since this operator started (or a newer attempt's came
    since, or it is the pod of an earlier job of the same name: its events come on after that
    job's deletion)."""
    with _lock:
        known = _seen.get((namespace, job_name))
    if known is None or attempt_of(known) != attempt or owned_by_another_job(known, job_uid):
        return None
    return known


def forget(namespace: str, job_name: str) -> None:
    """The job is gone: drop what :func:`remember` kept for it."""
    with _lock:
        _seen.pop((namespace, job_name), None)
