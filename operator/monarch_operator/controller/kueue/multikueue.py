"""MultiKueue on a worker cluster: the copy of a job that Kueue's MultiKueue made here runs
under the Workload MultiKueue made for it first, never under one of ours.

The copy carries the annotation ``kueue.x-k8s.io/prebuilt-workload-name`` (Kueue v0.19.2,
``jobframework.SetMultiKueueMeta``); the operator adopts that Workload (controller owner
reference and label ``kueue.x-k8s.io/job-uid``, as ``EnsurePrebuiltWorkloadOwnership`` in
``pkg/controller/jobframework/reconciler.go`` does), waits as Queued while it does not exist,
and finishes it ``OutOfSync`` when its pod sets are not the job's
(``ensurePrebuiltWorkloadInSync``): MultiKueue then re-dispatches the job instead of finishing
it on the manager. Admission, eviction and ``Finished`` then go as for any job under Kueue
(:mod:`.admission`), except that ``Finished`` waits until the job's own finished status is
written: MultiKueue copies the copy's status to the manager once, when it sees the Workload
finished, and then deletes the copy.

The manager's side is :mod:`.manager`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from monarch_operator.controller.builders.common import owner_reference
from monarch_operator.controller.kueue import client
from monarch_operator.controller.kueue import workload as wl
from monarch_operator.controller.state.passstate import Event, Pass

# Finished reason of a prebuilt Workload that does not match its job (Kueue's
# WorkloadFinishedReasonOutOfSync): MultiKueue resets its admission check for a new dispatch.
REASON_OUT_OF_SYNC = "OutOfSync"
# Queued reason of a copy whose Workload is not there (yet).
REASON_AWAITING_WORKLOAD = "AwaitingWorkload"
# How soon a pass of a finished copy looks again to finish its Workload once its own
# finished status is written (our own status write wakes no pass).
FINISH_RECHECK_SECONDS = 1.0


def pod_set_mismatch(workload: dict[str, Any], desired: dict[str, Any]) -> str | None:
    """How the prebuilt ``workload``'s pod sets differ from those the job asks for
    (``desired``, :func:`.workload.build_workload`): names and counts, in order; None when
    they match. Templates are not compared: the flavors' node labels are not in them yet,
    and MultiKueue copied the manager's Workload, built from the same spec."""
    def pod_sets(body: dict[str, Any]) -> list[tuple[str, int]]:
        return [(str(pod_set.get("name")), int(pod_set.get("count") or 0))
                for pod_set in (body.get("spec") or {}).get("podSets") or []]

    have, want = pod_sets(workload), pod_sets(desired)
    if have == want:
        return None
    return (f"Workload {workload['metadata']['name']} asks for pod sets "
            f"{_pod_sets_text(have)}, the job for {_pod_sets_text(want)}")


def _pod_sets_text(pod_sets: list[tuple[str, int]]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in pod_sets) or "none"


def out_of_sync_status(workload: dict[str, Any], message: str,
                       now: str) -> dict[str, Any] | None:
    """The Workload's status with ``Finished`` True, reason ``OutOfSync``; None when it is
    finished already."""
    status = wl.finished_status(workload, False, message, now)
    if status is None:
        return None
    status = copy.deepcopy(status)
    for condition in status["conditions"]:
        if condition["type"] == wl.FINISHED:
            condition["reason"] = REASON_OUT_OF_SYNC
    return status


def adopt(state: Pass, desired: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any] | None,
                                                                       str]:
    """The prebuilt Workload of a worker's copy, adopted; ``(None, why)`` while it is missing.

    ``desired`` builds the job's own Workload (only on adoption: for the pod set check).
    A Workload whose pod sets are not the job's is finished ``OutOfSync`` (a Warning Event)
    and returned as it is then (finished: the job does not run).

    Raises:
        errors.NotOwnedError: another object controls the Workload.
    """
    job = state.job
    name = str(job.prebuilt_workload)
    workload = client.read_workload(job.namespace, name)
    if workload is None:
        return None, (f"Workload {name} (annotation kueue.x-k8s.io/prebuilt-workload-name) "
                      "does not exist; MultiKueue makes it before the job's copy")
    if any(ref.get("controller") for ref in workload["metadata"].get("ownerReferences") or []):
        return client.adopt_workload(workload, owner_reference(job), job.uid), ""
    mismatch = pod_set_mismatch(workload, desired())
    if mismatch is not None:
        message = f"the prebuilt workload is out of sync with its job: {mismatch}"
        status = out_of_sync_status(workload, message, state.now_text)
        if status is not None and client.write_workload_status(workload, status):
            state.events.append(Event("Warning", REASON_OUT_OF_SYNC, message))
        return client.read_workload(job.namespace, name), ""
    try:
        return client.adopt_workload(workload, owner_reference(job), job.uid), ""
    except ApiException as error:
        if error.status != 409:
            raise
        state.wake_in(FINISH_RECHECK_SECONDS)  # changed meanwhile: the next pass adopts it
        return None, f"Workload {name} changed while it was adopted; looking again"


def may_finish(state: Pass, finished_written: bool) -> bool:
    """Whether a finished job may mark its Workload ``Finished`` now: always, unless it is a
    MultiKueue copy whose finished status is not written yet (then a pass comes back soon):
    the manager's copy would otherwise keep the last status MultiKueue copied (Running)."""
    if not state.job.prebuilt_workload or finished_written:
        return True
    state.wake_in(FINISH_RECHECK_SECONDS)
    return False


def may_release(state: Pass) -> bool:
    """Whether an evicted copy, its pods gone, may give its Workload's quota back now: always,
    unless it is a MultiKueue copy whose ended attempt (and checkpoint) is not written yet
    (then a pass comes back soon). The quota given back is the Workload change on which
    MultiKueue copies the copy's status to the manager, whose operator waits for that ended
    attempt before it gives its own quota back (:func:`.manager.hold_seconds`)."""
    if not state.job.prebuilt_workload:
        return True
    if all(state.status.get(key) == state.stored.get(key)
           for key in ("attempts", "lastCheckpoint")):
        return True
    state.wake_in(FINISH_RECHECK_SECONDS)
    return False
