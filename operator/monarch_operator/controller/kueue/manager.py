"""MultiKueue on the manager cluster: a job with ``spec.managedBy: kueue.x-k8s.io/multikueue``
is run by a worker cluster; here the operator makes its Workload and nothing else.

Kueue never makes a Workload for an external framework, so the operator makes it as for any
job under Kueue (:func:`.admission._desired`); MultiKueue copies it and then the job to a worker
cluster once one admits it (``pkg/controller/admissionchecks/multikueue/workload.go`` of Kueue
v0.19.2). No pod, StatefulSet, Secret or ConfigMap is made here, and the job's status is never
written: MultiKueue replaces it wholesale with the worker copy's
(``externalframeworks/adapter.go``, ``copyStatusFromRemote``). What the operator still does:

- an evicted Workload's quota is given back, as Kueue's job integrations do after stopping
  the job; MultiKueue then deletes the worker's copy. Nothing runs here, so that is at once,
  except for a dispatched job with ``runPolicy.checkpointGracePeriodSeconds`` above 0: while
  the quota stays reserved MultiKueue marks the worker's Workload for deactivation ("Evicted
  on manager") instead of deleting the copy, the worker's Kueue evicts it and the worker's
  operator stops the launcher first, giving the program its grace period to save its state.
  The quota goes back once the status MultiKueue copies shows that attempt ended
  (:func:`copy_stopped`), or :data:`STOP_MARGIN_SECONDS` past the grace period (a worker that
  does not answer). Not for a deactivated Workload (``spec.suspend``): MultiKueue deletes a
  copy whose Workload spec differs at once. The last checkpoint the copied status names is
  kept on the job (``monarch-operator.dev/resume-checkpoint``) whenever the quota goes back,
  and MultiKueue copies it to the next dispatch;
- ``spec.suspend: true`` deactivates the Workload (``spec.active: false``: evicted, quota
  given back, the worker's copy deleted), and ``false`` activates it again, only when the
  operator deactivated it;
- one narrow write of the status: while the Workload is not admitted (no quota, or quota
  but the MultiKueue admission check not Ready), MultiKueue copies nothing (without quota it
  deletes the worker's objects; with quota it has no admitted worker copy to copy from), so
  the status would go on showing whatever it copied last (Running, after a lost worker:
  Kueue reserves the quota again at once while no worker can take the job); then the job
  says ``Queued``, reason :data:`REASON_AWAITING_DISPATCH`, with Kueue's words;
- problems (no queue label, a refused Workload) are Warning Events, not status.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kubernetes.client.rest import ApiException

from monarch_operator import constants, names
from monarch_operator.controller.k8s import errors, writes
from monarch_operator.controller.kueue import admission, client
from monarch_operator.controller.kueue import workload as wl
from monarch_operator.controller.spec.policy import EVICTED
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import deadlines
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Event, Pass

# Queued reason while the manager's Workload is not admitted (nothing dispatched).
REASON_AWAITING_DISPATCH = "AwaitingDispatch"
# Warning reasons.
REASON_NO_QUEUE = "NoLocalQueue"
REASON_WORKLOAD_PROBLEM = "WorkloadNotCreated"
# Event reasons of what the operator did to the Workload.
REASON_QUOTA_RELEASED = "QuotaReleased"
REASON_DEACTIVATED = "WorkloadDeactivated"
REASON_ACTIVATED = "WorkloadActivated"
# On the Workload: the operator set spec.active false for spec.suspend (and only then sets it
# true again; Kueue deactivates Workloads itself too, e.g. after backoffLimitCount).
ANNOTATION_DEACTIVATED = f"{constants.GROUP}/deactivated-for-suspend"
# How long past a dispatched job's checkpoint grace period the quota stays reserved for the
# worker's copy to show it stopped: the worker's Kueue and operator reacting to the
# deactivation, the launcher's pod ending and MultiKueue copying the status (seconds).
STOP_MARGIN_SECONDS = 30.0


def dispatch(state: Pass, settings: Settings) -> bool:
    """One pass of a job MultiKueue runs elsewhere: its Workload made, suspended or not as the
    spec says, an eviction's quota given back. Returns whether the pass may write the job's
    status (the Workload is not admitted: :data:`REASON_AWAITING_DISPATCH` is set in
    ``state.status``); problems are Warning Events in ``state.events``."""
    job = state.job
    queue = admission.queue_of(state, settings) if job.queue_name or settings.kueue else None
    if queue is None:
        state.events.append(Event("Warning", REASON_NO_QUEUE, (
            f"spec.managedBy {constants.MANAGED_BY_MULTIKUEUE} needs a LocalQueue: label the "
            f"job {wl.LABEL_QUEUE_NAME}=<queue> (nothing is dispatched until then)")))
        return False
    if job.queue_name != queue:
        client.label_job_queue(job.namespace, job.name, queue)
    workload = _ensure_workload(state, settings, queue)
    if workload is None:
        return False
    _follow_suspend(state, workload)
    verdict = wl.admission(workload)
    if verdict.state == wl.STATE_EVICTED:
        _release(state, workload, verdict)
        return False  # the Workload's next event brings the pass that says Queued
    if verdict.state in (wl.STATE_FINISHED, wl.STATE_ADMITTED):
        return False  # MultiKueue's to copy (its admission check is Ready once dispatched)
    words = f"{verdict.reason}: {verdict.message}" if verdict.message else verdict.reason
    message = (f"{'suspended; ' if job.suspend else ''}waiting in LocalQueue {queue} for "
               f"MultiKueue to admit the job and dispatch it to a worker cluster ({words})")
    state.condition(st.QUEUED, True, REASON_AWAITING_DISPATCH, message)
    if st.get_condition(state.status, st.RUNNING) is not None:
        state.condition(st.RUNNING, False, REASON_AWAITING_DISPATCH, "not running anywhere")
    return True


def _release(state: Pass, workload: dict[str, Any], verdict: wl.Admission) -> None:
    """Give an evicted Workload's quota back, unless the worker's copy is still being given
    its checkpoint grace period (:func:`hold_seconds`: a pass comes back by its deadline)."""
    hold, after = hold_seconds(state.job.run_policy.checkpoint_grace_seconds, workload,
                               state.status, state.now)
    if hold is not None:
        state.wake_in(hold)
        return
    # This copy's checkpoint, or one saved on a schedule (launch.checkpoints.location's read;
    # launch is a layer above this one).
    where = (state.status.get("lastCheckpoint") or {}).get("location") or None
    if where and where != state.job.resume_checkpoint:
        client.annotate_job(state.job.namespace, state.job.name,
                            {constants.ANNOTATION_RESUME_CHECKPOINT: where})
    if not client.write_workload_status(workload, wl.released_status(workload, state.now_text)):
        return
    kept = f"; checkpoint {where} kept for the next dispatch" if where else ""
    state.events.append(Event("Normal", REASON_QUOTA_RELEASED, (
        f"evicted by Kueue ({verdict.reason}: {verdict.message}); quota given back {after}"
        f"{kept}; MultiKueue deletes the worker cluster's copy")))


def _active(workload: dict[str, Any]) -> bool:
    """Whether the Workload is active (``spec.active`` not false)."""
    return (workload.get("spec") or {}).get("active") is not False


# How Kueue words an admission check it reset as it evicted the Workload
# (pkg/workload/evict/evict.go, resetChecksOnEviction, v0.19.2); it clears status.clusterName
# at the same time, so this is what is left saying that a worker had admitted the copy.
_RESET_AFTER_READY = "Previously: Ready"


def was_dispatched(workload: dict[str, Any]) -> bool:
    """Whether the evicted Workload had been dispatched: its MultiKueue admission check was
    ``Ready`` (a worker admitted the copy) when Kueue evicted it, or still is."""
    return any(check.get("state") == "Ready"
               or str(check.get("message") or "").endswith(_RESET_AFTER_READY)
               for check in (workload.get("status") or {}).get("admissionChecks") or [])


def launcher_running(status: dict[str, Any]) -> bool:
    """Whether the status MultiKueue last copied shows the copy's launcher running (its
    current attempt launched, not ended). The copy may be further on than this: MultiKueue
    copies the status when the worker's Workload changes, not each time the copy's does."""
    attempts = status.get("attempts") or []
    current = attempts[-1] if attempts else {}
    return (current.get("number") == status.get("attempt") and bool(current.get("launchTime"))
            and not current.get("endTime"))


def evicted_at(workload: dict[str, Any]) -> dt.datetime | None:
    """When Kueue evicted the Workload (its ``Evicted`` condition's lastTransitionTime, UTC),
    or None when it has no such time."""
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("type") == wl.EVICTED and condition.get("status") == "True":
            try:
                return deadlines.parse_time(str(condition.get("lastTransitionTime")))
            except ValueError:
                return None
    return None


def copy_stopped(status: dict[str, Any], since: dt.datetime | None) -> bool:
    """Whether the worker copy's status (as MultiKueue copied it here) shows its running
    attempt ended by an eviction at or after ``since``, its launcher's end read: the worker's
    operator ends the attempt (class ``Evicted``, ``endTime``) once its launcher is gone,
    having had its grace period, and records the launcher's ``exitCode`` and the checkpoint
    it named from the pod's last state (one read, possibly a pass later; a copy is seen
    between the two). An earlier eviction of the same copy ends before ``since``."""
    ended = [record for record in status.get("attempts") or [] if record.get("class")]
    if not ended or ended[-1].get("class") != EVICTED or not ended[-1].get("endTime"):
        return False
    if ended[-1].get("exitCode") is None and not ended[-1].get("checkpoint"):
        return False
    if since is None:
        return True
    try:
        return deadlines.parse_time(str(ended[-1]["endTime"])) >= since
    except ValueError:
        return False


def hold_seconds(grace_seconds: int, workload: dict[str, Any], status: dict[str, Any],
                 now: dt.datetime) -> tuple[float | None, str]:
    """How many more seconds an evicted Workload's quota stays reserved (None: give it back
    now), and, when None, the words for the Event saying why it goes back now.

    Args:
        grace_seconds: the job's ``runPolicy.checkpointGracePeriodSeconds``.
        workload: the manager's Workload (Evicted=True, quota still reserved).
        status: the job's status, as MultiKueue copied it from the worker's copy.
        now: the current time (aware UTC).

    Returns:
        None when nothing needs the quota kept: the copy shows its attempt ended
        (:func:`copy_stopped`), no grace period, the Workload deactivated, never dispatched
        (:func:`was_dispatched`, :func:`launcher_running`), or the grace period plus
        :data:`STOP_MARGIN_SECONDS` from the eviction is over; else the seconds left of that.
        The words: "once the worker cluster's copy had stopped", "at once (...)" or "after
        waiting in vain ..."; empty while it holds.
    """
    since = evicted_at(workload)
    if copy_stopped(status, since):
        return None, "once the worker cluster's copy had stopped"
    if grace_seconds <= 0 or since is None:
        return None, "at once (no runPolicy.checkpointGracePeriodSeconds to give)"
    # Deactivated (spec.suspend, or by Kueue): the copy's Workload spec no longer matches this
    # one's, and MultiKueue deletes such a copy at once (isRemoteSpecOutOfSync in
    # multikueue/workload.go): there is no grace period to keep the quota for.
    if not _active(workload):
        return None, "at once (deactivated: MultiKueue deletes the worker cluster's copy at once)"
    if not (was_dispatched(workload) or launcher_running(status)):
        return None, "at once (not dispatched: nothing runs on a worker cluster)"
    left = grace_seconds + STOP_MARGIN_SECONDS - (now - since).total_seconds()
    if left > 0:
        return left, ""
    return None, (f"after waiting in vain for the worker cluster's copy to show it stopped "
                  f"(runPolicy.checkpointGracePeriodSeconds + {STOP_MARGIN_SECONDS:.0f} s)")


def _ensure_workload(state: Pass, settings: Settings, queue: str) -> dict[str, Any] | None:
    """The job's Workload, made when missing; None (and a Warning Event) when it cannot be."""
    job = state.job
    name = names.workload(job.name, job.uid)
    try:
        workload = client.read_workload(job.namespace, name)
        if workload is None:
            workload = client.create_workload(admission._desired(state, settings, queue),
                                              job.uid)
        else:
            writes.check_owner(workload, job.uid)
        return workload
    except (errors.NotOwnedError, errors.RefusedError, errors.ForbiddenError) as error:
        state.events.append(Event("Warning", REASON_WORKLOAD_PROBLEM, f"Workload {name}: {error}"))
    except ApiException as error:
        if error.status != 404:
            raise
        state.events.append(Event("Warning", admission.REASON_KUEUE_NOT_INSTALLED, (
            f"the API server serves no {wl.API_VERSION} Workloads (is Kueue installed?); "
            "nothing is dispatched until it does")))
        state.wake_in(admission.NOT_SERVED_RETRY_SECONDS)
    return None


def _follow_suspend(state: Pass, workload: dict[str, Any]) -> None:
    """``spec.suspend`` true: deactivate the Workload (Kueue evicts it, MultiKueue deletes the
    worker's copy); false again: activate it, if the operator was the one that deactivated it."""
    active = (workload.get("spec") or {}).get("active") is not False
    ours = ANNOTATION_DEACTIVATED in ((workload["metadata"].get("annotations")) or {})
    if state.job.suspend and active:
        client.set_workload_active(workload, False, {ANNOTATION_DEACTIVATED: "true"})
        state.events.append(Event("Normal", REASON_DEACTIVATED, (
            "spec.suspend: Workload deactivated; Kueue evicts it and MultiKueue deletes the "
            "worker cluster's copy")))
    elif not state.job.suspend and not active and ours:
        client.set_workload_active(workload, True, {ANNOTATION_DEACTIVATED: None})
        state.events.append(Event("Normal", REASON_ACTIVATED,
                                  "resumed: Workload active again, queued for admission"))
