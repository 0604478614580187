"""One idempotent, level-based reconcile pass of a MonarchJob.

Reads like a checklist: suspended -> delete workers and launcher; else key Secret, Service,
StatefulSet, wait for Ready workers (or time out), hostfile, the current attempt's launcher,
its outcome or a lost worker -> the run policy restarts or fails the job; release GPUs when
finished; one status patch when it changed. Safe to run any number of times from any trigger
(a watch event on the job or a child, the operator starting, a deadline); it writes nothing
when nothing changed.

The checklist is here; its steps live by responsibility: :mod:`.gate` (children and Ready
workers), :mod:`.launching` (the attempt's launcher), :mod:`.endings` (how an attempt ends and
what the run policy does then), :mod:`.suspension` (``spec.suspend``), :mod:`.release` (pods
stuck terminating, cleanup of a finished job, READY); :mod:`.passstate` is what they share.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monarch_operator.controller.gate import gate
from monarch_operator.controller.judge import endings
from monarch_operator.controller.k8s import deletes, errors, writes
from monarch_operator.controller.kueue import admission as kueue
from monarch_operator.controller.kueue import manager as dispatch
from monarch_operator.controller.launch import checkpoints, launching, reported
from monarch_operator.controller.release import release, suspension
from monarch_operator.controller.spec import policy
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import attempts, deadlines
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Event, Pass

__all__ = ["Event", "Outcome", "reconcile"]

# When a job blocked by a foreign child looks again first (the delay then doubles, see
# passes.py); nothing of the foreign object is watched, so this is how the job goes on.
NOT_OWNED_RETRY_SECONDS = 5.0

# After an infrastructure restart the next attempt's gate is looked at again this soon (seconds):
# no watch event may come (a launcher pod deleted while the operator was stopped is long gone,
# the workers unchanged), and without this pass the job waited for its startup timeout's timer.
INFRASTRUCTURE_RECHECK_SECONDS = 1.0

# The spec field a refused child comes from, named in the Failed message.
_USER_FIELDS = {"StatefulSet": "spec.workers.template", "Pod": "spec.launcher"}


@dataclass
class Outcome:
    """What one pass did: events to post, the status it left, and when to look again.

    ``retry_after`` (seconds) is set when the pass could not finish its checklist (a child name
    taken by a foreign object) and should run again even if no watch event comes; ``wake_after``
    (seconds) when it waits for something no watch event will announce (a pod stuck
    terminating becomes due for force deletion).
    """

    events: list[Event]
    status: dict[str, Any]
    retry_after: float | None = None
    deleted: bool = False  # the pass deleted the job itself (ttlSecondsAfterFinished)
    wake_after: float | None = None
    status_written: bool = False
    # A progress-only status change held back (``progress_writes_after``): write it then.
    write_deferred_seconds: float | None = None


def reconcile(body: dict[str, Any], settings: Settings, now: dt.datetime,
              hold_progress: Callable[[], float] | None = None) -> Outcome:
    """Bring the job's children and status one step closer to the spec.

    Args:
        body: the MonarchJob object as a dict.
        now: current time (UTC); used for the startup timeout and condition timestamps.
        hold_progress: for a status change that is only progress
            (:func:`.status.only_progress_changed`: ready count, waiting message) of a job
            whose workers are starting, how many seconds it must wait
            (:meth:`.progress.ProgressWrites.hold_seconds`; ``Outcome.write_deferred_seconds``
            says when); None: written at once, as any other change is.

    Returns:
        The events to post, the status written (or kept), and whether to retry.

    Raises:
        InvalidSpecError: the spec is invalid (the caller marks the job Failed).
    """
    job = JobSpec.from_body(body)
    previous = dict(body.get("status") or {})
    if job.dispatched:
        return _dispatched(job, previous, settings, now)
    state = Pass(job=job, status=dict(previous), now=now,
                 force_delete_after=float(settings.force_delete_after_seconds), stored=previous)
    state.status.setdefault("startTime", state.now_text)
    retry_after = None
    if not st.is_finished(state.status) and state.status.get("attempt") is None:
        state.status = attempts.begin(state.status, 1, state.now_text)
    reported.harvest(state)
    checkpoints.harvest(state)  # before a next attempt's launcher is built with it
    endings.record_late_ends(state)  # a launcher stopped after its attempt's end ended since
    if not st.is_finished(state.status):
        _check_active_deadline(state)
    if not st.is_finished(state.status):  # noqa: SIM102 (the deadline may have ended it)
        try:
            queue = None if job.suspend else kueue.gate(state, settings)
            if job.suspend:
                suspension.suspend(state)
            elif queue is None or queue.admitted:  # Kueue: nothing runs until admitted
                suspension.resume(state)
                state.job = queue.job if queue else job
                _run_attempt(state, settings)
                if queue and not st.is_finished(state.status):
                    kueue.report(state, queue)
        except errors.NotOwnedError as error:
            # Never adopted, never overwritten (field case C6): say so once, look again later.
            state.condition(st.WORKERS_READY, False, st.REASON_CHILD_NOT_OWNED, str(error))
            retry_after = NOT_OWNED_RETRY_SECONDS
        except errors.RefusedError as error:
            # Resending the same object cannot succeed: the job ends naming the field (C12).
            field_path = _USER_FIELDS.get(error.kind, "spec")
            endings.fail(state, st.REASON_TEMPLATE_REFUSED, f"{field_path}: {error}")
        except errors.ForbiddenError as error:
            # Nor can it while the operator lacks a permission: fail now with the API server's
            # words rather than sit Starting for ever (C24).
            endings.fail(state, st.REASON_OPERATOR_FORBIDDEN,
                         f"{error} (grant the operator's ServiceAccount this permission: the "
                         f"chart's RBAC has it)")
    if st.is_finished(state.status):
        # Finished is final: nothing is created again, only let go of (cleanupPolicy, TTL).
        state.status.setdefault("completionTime", state.now_text)
        if _ttl_expired(state, previous):
            return Outcome(state.events, state.status, deleted=True)
        _release_once_stored(state, previous)
        kueue.finish(state, finished_written=st.is_finished(previous))
    reported.hide_eta_unless_running(state, previous)
    deferred = _write_status(state, previous, hold_progress)
    return Outcome(state.events, state.status, retry_after, wake_after=state.wake_after,
                   status_written=deferred is None and state.status != previous,
                   write_deferred_seconds=deferred)


def _dispatched(job: JobSpec, previous: dict[str, Any], settings: Settings,
                now: dt.datetime) -> Outcome:
    """A job that Kueue's MultiKueue runs on a worker cluster (:mod:`..kueue.manager`): its
    Workload, and the status only while nothing was dispatched; the rest of the status is the
    worker copy's, its TTL counted from the ``completionTime`` copied with it."""
    state = Pass(job=job, status=dict(previous), now=now)
    if st.is_finished(previous):
        if _ttl_expired(state, previous):
            return Outcome(state.events, previous, deleted=True)
        return Outcome(state.events, previous)
    if not dispatch.dispatch(state, settings):
        return Outcome(state.events, previous, wake_after=state.wake_after)
    deferred = _write_status(state, previous, None)
    return Outcome(state.events, state.status, wake_after=state.wake_after,
                   status_written=deferred is None and state.status != previous)


def _check_active_deadline(state: Pass) -> None:
    """``spec.activeDeadlineSeconds`` from ``status.startTime``: past it the job Failed
    (``DeadlineExceeded``) and :func:`.release.clean_up` releases every pod."""
    limit = state.job.active_deadline_seconds
    if limit is None:
        return
    started = deadlines.parse_time(state.status["startTime"])
    if (state.now - started).total_seconds() <= limit:
        return
    endings.fail(state, st.REASON_DEADLINE_EXCEEDED,
                 f"the job ran longer than spec.activeDeadlineSeconds ({limit}s); "
                 "workers and launcher deleted")


def _ttl_expired(state: Pass, previous: dict[str, Any]) -> bool:
    """``spec.ttlSecondsAfterFinished`` from ``status.completionTime``: past it, delete the
    MonarchJob (its children follow by garbage collection). Only once the finished status
    has been written, so that even a TTL of 0 shows how the job ended first."""
    ttl = state.job.ttl_seconds_after_finished
    if ttl is None or not st.is_finished(previous) or "completionTime" not in previous:
        return False
    finished = deadlines.parse_time(previous["completionTime"])
    if (state.now - finished).total_seconds() < ttl:
        return False
    job = state.job
    deletes.delete_monarchjob(job.namespace, job.name)
    state.events.append(Event("Normal", st.REASON_TTL_EXPIRED,
                              f"deleted {ttl}s after it finished (spec.ttlSecondsAfterFinished)"))
    return True


def _release_once_stored(state: Pass, previous: dict[str, Any]) -> None:
    """A finished job's children go (:func:`.release.clean_up`) only once the status read at
    the pass's start says finished: the pass that judged the ending writes it first, its
    Event says what goes, and a pass right after its write deletes. A leader that deleted
    the launcher and workers in the judging pass and was cut off before its status write
    left the next leader an attempt with no evidence: judged lost, an extra attempt (found
    by a 30-minute leader-fault soak). READY is ``0/N`` from the ending on all the same."""
    if st.is_finished(previous):
        release.clean_up(state)
        release.count_ready_workers(state)
        return
    releasing = release.announce_clean_up(state)
    state.after_status_write()
    release.count_ready_workers(state, releasing=releasing)


def _run_attempt(state: Pass, settings: Settings) -> None:
    """The gate, then the current attempt's launcher; once more at once when an application
    failure restarted on the same, still Ready workers (the fast path); a pass soon after an
    infrastructure restart (:data:`INFRASTRUCTURE_RECHECK_SECONDS`)."""
    for _ in range(2):
        attempt = state.status["attempt"]
        pods = gate.ensure_workers(state, settings)
        if st.is_finished(state.status):
            return
        restarted_class = launching.start_or_follow_launcher(state, settings, pods)
        if restarted_class == policy.INFRASTRUCTURE:
            state.wake_in(INFRASTRUCTURE_RECHECK_SECONDS)
        if restarted_class != policy.APPLICATION or state.status["attempt"] == attempt:
            return


def _write_status(state: Pass, previous: dict[str, Any],
                  hold_progress: Callable[[], float] | None) -> float | None:
    """One status patch when the status changed; returns the seconds a progress-only change
    was held back for (None when written, or when nothing changed)."""
    posted = {event.reason for event in state.events}
    if st.REASON_LAUNCHER_STARTED in posted:  # its message says every worker is ready
        posted.add(st.REASON_ALL_WORKERS_READY)
    for transition in st.condition_transitions(previous, state.status):
        if transition.reason not in posted:  # every transition gets an Event, once
            state.events.append(Event(transition.type, transition.reason, transition.message))
            posted.add(transition.reason)
    state.status["phase"] = st.summarize_phase(state.status)
    state.status["message"] = st.summarize_message(state.status)
    state.status["observedGeneration"] = state.job.generation
    if state.status == previous:
        return None
    # Held back only while workers start (where each pod event changes the count or the
    # waiting message); a running, suspended or finished job shows its pods as they are now.
    if (hold_progress is not None
            and state.status["phase"] in (st.PHASE_STARTING, st.PHASE_RESTARTING)
            and st.only_progress_changed(previous, state.status)):
        held = hold_progress()
        if held > 0:
            return held
    writes.patch_job_status(state.job.namespace, state.job.name, state.status)
    return None
