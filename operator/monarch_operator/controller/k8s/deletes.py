"""Deletes: background propagation, 404 is done; by uid precondition for a job's children, and a
pod (always by uid) with its grace period, another one, or at once (``--force``).
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.rest import ApiException

from monarch_operator import constants
from monarch_operator.controller.k8s import client, reads


def delete(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete with background propagation; returns False if it was already gone (404)."""
    view = client._view(api_version, kind)
    try:
        client.call("delete", api_version, client.plural(api_version, kind), namespace, name,
                    body={"propagationPolicy": "Background"})
        deleted = True
    except ApiException as error:
        if error.status != 404:
            raise
        deleted = False
    if view is not None:
        view.deleted((api_version, kind), name)
    return deleted


def delete_exact(api_version: str, kind: str, namespace: str, name: str, uid: str) -> bool:
    """Delete object ``uid``, a child of a job (background propagation), never a namesake that
    replaced it: the uid is a precondition of the DELETE (``DeleteOptions.preconditions``).
    Returns False when it was gone already (404) or is another object now (409).

    Raises:
        ValueError: ``kind`` is not one the operator creates.
        kubernetes.client.rest.ApiException: any other API error.
    """
    if (api_version, kind) not in client._KINDS:
        raise ValueError(f"{api_version} {kind} is not a kind of child of a job")
    try:
        client.call("delete", api_version, client.plural(api_version, kind), namespace, name,
                    body={"propagationPolicy": "Background", "preconditions": {"uid": uid}})
    except ApiException as error:
        if error.status in (404, 409):
            return False
        raise
    return True


def delete_if_present(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete the object as read (by its uid, :func:`delete_exact`) unless absent or already
    being deleted: a pass on a finished job sends no request (a DELETE answered 404 is still a
    write in the audit log, field case C5), and a pass whose view is a moment behind never
    deletes a namesake created since (the next attempt's hostfile, say).

    Returns:
        Whether the object read was deleted by this call.
    """
    observed = reads.read(api_version, kind, namespace, name)
    if observed is None or observed.get("metadata", {}).get("deletionTimestamp"):
        return False
    deleted = delete_exact(api_version, kind, namespace, name, observed["metadata"]["uid"])
    view = client._view(api_version, kind)
    if view is not None:
        view.deleted((api_version, kind), name)
    return deleted


def delete_pod(namespace: str, name: str, uid: str, force: bool = False,
               grace_seconds: int | None = None) -> bool:
    """Delete pod ``uid`` (as read: the uid is a precondition of the DELETE, so a namesake its
    StatefulSet created meanwhile is never hit) with its own grace period, ``grace_seconds``
    instead (seconds between the kubelet's SIGTERM and SIGKILL), or with ``force`` at once
    (grace period 0, as ``kubectl delete pod --force --grace-period=0``: the object goes
    without waiting for its kubelet; only finalizers still hold it).

    Two passes working from views a moment apart both found one stuck worker pod and both
    force-deleted it by name: the second DELETE removed the replacement the StatefulSet had
    created 80 ms before (a clean-clone CI run, test_lost_workers).

    Returns:
        False when it was gone already (404) or the name is another pod's now (409).
    """
    body: dict[str, Any] = {"preconditions": {"uid": uid}}
    grace = 0 if force else grace_seconds
    if grace is not None:
        body["gracePeriodSeconds"] = grace
    try:
        client.call("delete", "v1", "pods", namespace, name, body=body)
    except ApiException as error:
        if error.status in (404, 409):
            return False
        raise
    return True


def stop_pod(pod: dict[str, Any] | None, grace_seconds: int | None = None) -> bool:
    """Delete ``pod`` (as read, by its uid) with its own grace period (or ``grace_seconds``)
    unless it is absent or already being deleted: a pass that finds it so sends nothing. The
    pod stays in the pass's view: it runs until its grace period ends, and whoever waits for it
    must still see it.

    Returns:
        Whether a delete was sent and the pod existed.
    """
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return False
    metadata = pod["metadata"]
    return delete_pod(metadata["namespace"], metadata["name"], metadata["uid"],
                      grace_seconds=grace_seconds)


def delete_monarchjob(namespace: str, name: str) -> bool:
    """Delete the MonarchJob (children follow by garbage collection); False if already gone."""
    try:
        client.call("delete", constants.API_VERSION, constants.PLURAL, namespace, name,
                    body={"propagationPolicy": "Background"})
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True
