"""Pure: pods of a job that cannot end by themselves, and when the operator stops waiting.

A deleted pod stays (Terminating) until its kubelet has stopped its containers and confirmed it,
then until every finalizer is removed. A pod on a lost node (NotReady, its kubelet silent) or
held by a finalizer nobody removes therefore stays for ever, and so would the next attempt that
waits for it: the StatefulSet recreates a worker only once its namesake is gone, and the next
launcher waits for the earlier one to end. Kubernetes leaves this to an operator or a person:
``kubectl delete pod --force --grace-period=0`` ("Force Delete StatefulSet Pods", kubernetes.io
docs), or the ``node.kubernetes.io/out-of-service`` taint of non-graceful node shutdown.

The operator waits the pod's own grace period (the API server sets ``deletionTimestamp`` to
the deletion time plus ``deletionGracePeriodSeconds``) and :data:`FORCE_DELETE_AFTER_SECONDS`
more, then force-deletes it (grace period 0: the object goes at once unless finalizers hold it)
and goes on without it. No I/O and no clock here: times come in as arguments.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from monarch_operator.controller.spec.settings import Settings

# How long past the end of its grace period a deleted pod may still exist before it is
# force-deleted: a live kubelet kills the containers at the end of the grace period and reports
# within seconds, so a pod still there this much later has nobody to end it.
FORCE_DELETE_AFTER_SECONDS = float(Settings.force_delete_after_seconds)  # the default


def deletion_deadline(pod: dict[str, Any]) -> dt.datetime | None:
    """When the pod's grace period ends (its ``deletionTimestamp``), None if not being deleted.

    The timestamp is RFC 3339 as the API server writes it (``...Z``) or as the Python client
    serializes it (``...+00:00``); a value without a zone is taken as UTC.

    Raises:
        ValueError: the timestamp is not ISO 8601.
    """
    text = (pod.get("metadata") or {}).get("deletionTimestamp")
    if not text:
        return None
    when = dt.datetime.fromisoformat(str(text))
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def is_force_deleted(pod: dict[str, Any]) -> bool:
    """Whether the pod was deleted with grace period 0 (``--force``): if it still exists, only
    its finalizers hold it, and nothing the operator can send would end it sooner."""
    metadata = pod.get("metadata") or {}
    return bool(metadata.get("deletionTimestamp")) and metadata.get(
        "deletionGracePeriodSeconds") == 0


def is_overdue(pod: dict[str, Any], now: dt.datetime,
               after: float = FORCE_DELETE_AFTER_SECONDS) -> bool:
    """Whether the pod is being deleted, not yet force-deleted, and still exists ``after``
    seconds (:data:`FORCE_DELETE_AFTER_SECONDS` unless the operator's settings say otherwise)
    after its grace period ended: nothing will end it, so it is to be force-deleted."""
    deadline = deletion_deadline(pod)
    return (deadline is not None and not is_force_deleted(pod)
            and (now - deadline).total_seconds() >= after)


def is_awaited(pod: dict[str, Any], now: dt.datetime,
               after: float = FORCE_DELETE_AFTER_SECONDS) -> bool:
    """Whether the pod is being deleted and still within its grace period plus ``after``
    seconds: worth waiting for (its kubelet may still end it)."""
    return (deletion_deadline(pod) is not None and not is_force_deleted(pod)
            and not is_overdue(pod, now, after))


def seconds_until_overdue(pods: list[dict[str, Any]], now: dt.datetime,
                          after: float = FORCE_DELETE_AFTER_SECONDS) -> float | None:
    """Seconds from ``now`` until the first of ``pods`` that is being deleted (and not yet
    force-deleted) becomes overdue (``after`` seconds past its grace period), 0 when one
    already is; None when there is none."""
    waits = [(deadline - now).total_seconds() + after
             for pod in pods if not is_force_deleted(pod)
             and (deadline := deletion_deadline(pod)) is not None]
    return max(min(waits), 0.0) if waits else None


def describe_stuck(pod: dict[str, Any], now: dt.datetime, node_ready: bool | None) -> str:
    """Why an overdue pod is still there, in a few words for an Event, e.g.
    ``demo-launcher-x7k2p on node kwok-gpu-2 (NotReady), 16s past its grace period``
    or ``... (finalizers: example.com/hold)``.

    ``node_ready``: whether its node is Ready, None when unknown (no node, or not readable).
    """
    metadata = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    words = [str(metadata.get("name"))]
    if node:
        words.append(f"on node {node}" + (" (NotReady)" if node_ready is False else ""))
    finalizers = metadata.get("finalizers") or []
    if finalizers:
        words.append(f"(finalizers: {', '.join(finalizers)})")
    deadline = deletion_deadline(pod)
    if deadline is not None:
        words[-1] += f", {int((now - deadline).total_seconds())}s past its grace period"
    return " ".join(words)
