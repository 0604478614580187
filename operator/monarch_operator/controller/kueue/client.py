"""The Kueue part of the one layer that talks to the API (:mod:`..k8s`): the job's Workload,
ResourceFlavors, WorkloadPriorityClasses and LocalQueues, through the same API client.

Workloads are not in the watches' cache (their events only wake the job, see :mod:`.watch`):
a pass of a queued job reads its Workload once.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.rest import ApiException

from monarch_operator import constants
from monarch_operator.controller.k8s import client as k8s_client
from monarch_operator.controller.k8s import errors, writes
from monarch_operator.controller.kueue import workload as wl


def _get(namespace: str | None, plural: str, name: str) -> dict[str, Any] | None:
    try:
        found = k8s_client.call("get", wl.API_VERSION, plural, namespace, name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return dict(found)


def read_workload(namespace: str, name: str) -> dict[str, Any] | None:
    """The Workload, or None when it does not exist."""
    return _get(namespace, "workloads", name)


def create_workload(desired: dict[str, Any], owner_uid: str) -> dict[str, Any]:
    """Create ``desired``; an existing one of that name (409) is read instead.

    Raises:
        errors.NotOwnedError: it exists but another owner controls it.
        errors.RefusedError: the API server (or Kueue's webhook) refused it (400/422).
        kubernetes.client.rest.ApiException: any other API error.
    """
    metadata = desired["metadata"]
    try:
        created = k8s_client.call("create", wl.API_VERSION, "workloads", metadata["namespace"],
                                  body=desired)
    except ApiException as error:
        if error.status in (400, 422):
            raise errors.RefusedError(wl.KIND, metadata["name"],
                                   errors.api_error_message(error)) from error
        if error.status != 409:
            raise
        found = read_workload(metadata["namespace"], metadata["name"])
        if found is None:
            raise
        created = found
    writes.check_owner(dict(created), owner_uid)
    return dict(created)


def delete_workload(workload: dict[str, Any]) -> None:
    """Delete ``workload`` as read (a precondition on its uid: never a newer one of that
    name); already gone (404) or replaced (409) is fine."""
    metadata = workload["metadata"]
    try:
        k8s_client.call("delete", wl.API_VERSION, "workloads", metadata["namespace"],
                        metadata["name"], body={"preconditions": {"uid": metadata.get("uid")},
                                                "propagationPolicy": "Background"})
    except ApiException as error:
        if error.status not in (404, 409):
            raise


def write_workload_status(workload: dict[str, Any], status: dict[str, Any]) -> bool:
    """Replace the Workload's status (PUT, with its ``resourceVersion``: a status Kueue
    changed meanwhile is not overwritten). Returns False on such a conflict (409) or when it
    is gone (404): the next pass reads it again."""
    body = {**workload, "status": status}
    metadata = workload["metadata"]
    try:
        k8s_client.call("update", wl.API_VERSION, "workloads", metadata["namespace"],
                        metadata["name"], subresource="status", body=body)
    except ApiException as error:
        if error.status in (404, 409):
            return False
        raise
    return True


def flavor_specs(names: set[str]) -> dict[str, dict[str, Any]]:
    """``spec`` of each named ResourceFlavor (cluster-scoped); missing ones are left out."""
    specs = {}
    for name in sorted(names):
        flavor = _get(None, "resourceflavors", name)
        if flavor is not None:
            specs[name] = dict(flavor.get("spec") or {})
    return specs


def priority_value(name: str) -> int | None:
    """``value`` of WorkloadPriorityClass ``name``, None when there is no such class."""
    found = _get(None, "workloadpriorityclasses", name)
    return None if found is None else int(found.get("value") or 0)


def local_queue_exists(namespace: str, name: str) -> bool:
    """Whether LocalQueue ``namespace/name`` exists (False too when Kueue is not installed)."""
    try:
        return _get(namespace, "localqueues", name) is not None
    except ApiException as error:
        if error.status == 403:
            return False
        raise


def label_job_queue(namespace: str, name: str, queue: str) -> None:
    """Put ``kueue.x-k8s.io/queue-name: <queue>`` on the MonarchJob itself (merge patch of its
    labels). Kueue's pod webhook leaves a pod alone only when an ancestor is a managed job
    *with* a queue name (``FindAncestorJobManagedByKueue``); a job queued in the default
    LocalQueue without the label would have its pods defaulted into that queue one by one."""
    k8s_client.call("patch", constants.API_VERSION, constants.PLURAL, namespace, name,
                    body={"metadata": {"labels": {wl.LABEL_QUEUE_NAME: queue}}})


def annotate_job(namespace: str, name: str, annotations: dict[str, str | None]) -> None:
    """Merge ``annotations`` into the MonarchJob's own (None removes one): the manager's
    operator writes the job's metadata, never its status, which MultiKueue owns."""
    k8s_client.call("patch", constants.API_VERSION, constants.PLURAL, namespace, name,
                    body={"metadata": {"annotations": annotations}})


def adopt_workload(workload: dict[str, Any], owner: dict[str, Any],
                   owner_uid: str) -> dict[str, Any]:
    """Make the job ``owner`` (its controller owner reference, :func:`..builders.common.
    owner_reference`) the controller of ``workload`` and label it ``kueue.x-k8s.io/job-uid``,
    as Kueue's jobframework does with a prebuilt Workload (``EnsurePrebuiltWorkloadOwnership``);
    nothing is written when it is ours already. Returns the Workload as it is now.

    Raises:
        errors.NotOwnedError: another object controls it.
        kubernetes.client.rest.ApiException: the update failed (409: changed meanwhile; the
            next pass tries again).
    """
    metadata = workload["metadata"]
    references = list(metadata.get("ownerReferences") or [])
    controller = next((ref for ref in references if ref.get("controller")), None)
    if controller is not None:
        writes.check_owner(workload, owner_uid)
        if (metadata.get("labels") or {}).get(wl.LABEL_JOB_UID) == owner_uid:
            return workload
    body = {**workload, "metadata": {
        **metadata, "ownerReferences": references if controller else [*references, owner],
        "labels": {**(metadata.get("labels") or {}), wl.LABEL_JOB_UID: owner_uid}}}
    return dict(k8s_client.call("update", wl.API_VERSION, "workloads", metadata["namespace"],
                                metadata["name"], body=body))


def set_workload_active(workload: dict[str, Any], active: bool,
                        annotations: dict[str, str | None]) -> None:
    """Set the Workload's ``spec.active`` (False: Kueue evicts it and gives its quota back;
    True: it queues again) and merge ``annotations`` (None removes one)."""
    metadata = workload["metadata"]
    k8s_client.call("patch", wl.API_VERSION, "workloads", metadata["namespace"],
                    metadata["name"], body={"metadata": {"annotations": annotations},
                                            "spec": {"active": active}})
