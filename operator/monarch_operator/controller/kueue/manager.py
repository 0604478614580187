"""MultiKueue on the manager cluster: a job with ``spec.managedBy: kueue.x-k8s.io/multikueue``
is run by a worker cluster; here the operator makes its Workload and nothing else.

Kueue never makes a Workload for an external framework, so the operator makes it as for any
job under Kueue (:func:`.admission._desired`); MultiKueue copies it and then the job to a worker
cluster once one admits it (``pkg/controller/admissionchecks/multikueue/workload.go`` of Kueue
v0.19.2). No pod, StatefulSet, Secret or ConfigMap is made here, and the job's status is never
written: MultiKueue replaces it wholesale with the worker copy's
(``externalframeworks/adapter.go``, ``copyStatusFromRemote``). What the operator still does:

- an evicted Workload's quota is given back at once (nothing runs here to stop first), as
  Kueue's job integrations do after stopping the job; MultiKueue then deletes the worker's
  copy;
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

from typing import Any

from kubernetes.client.rest import ApiException

from monarch_operator import constants, names
from monarch_operator.controller.k8s import errors, writes
from monarch_operator.controller.kueue import admission, client
from monarch_operator.controller.kueue import workload as wl
from monarch_operator.controller.spec.settings import Settings
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
    if verdict.state == wl.STATE_EVICTED:  # nothing runs here: give the quota back now
        if client.write_workload_status(workload, wl.released_status(workload, state.now_text)):
            state.events.append(Event("Normal", REASON_QUOTA_RELEASED, (
                f"evicted by Kueue ({verdict.reason}: {verdict.message}); quota given back, "
                "MultiKueue deletes the worker cluster's copy")))
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
