"""Why a pod of a job was stopped from outside, in words: one mapping from what Kubernetes (or
Kueue) observed to what the status says (issue 32 item 4). Pure: no I/O.

Kubernetes says why it stops a pod in three places, read in this order, the most specific
first (https://kubernetes.io/docs/concepts/workloads/pods/disruptions/#pod-disruption-conditions):

- the ``DisruptionTarget`` condition's reason: ``EvictionByEvictionAPI`` (the Eviction API:
  ``kubectl drain``, a cluster autoscaler's scale-down), ``PreemptionByScheduler`` (a pod of
  higher priority needed the node), ``DeletionByTaintManager`` (a ``NoExecute`` taint, e.g. the
  node not Ready or unreachable for the pod's ``tolerationSeconds``), ``DeletionByPodGC`` (its
  node is gone), ``TerminationByKubelet`` (node-pressure eviction, graceful node shutdown);
- the pod's ``status.reason`` as the kubelet writes it: ``Evicted`` (node pressure),
  ``Preempting`` (a critical pod), ``Shutdown``/``NodeShutdown``/``Terminated`` (graceful node
  shutdown), ``NodeLost``, ``OutOf<resource>`` (admission after a kubelet restart);
- a ``deletionTimestamp`` alone: someone deleted it (``kubectl delete``, a controller).

An API eviction of a pod on a cordoned node (``spec.unschedulable``: what ``kubectl drain``
does first) is a drain of that node. A deletion request comes with most of these, so it is the
cause only when nothing more specific tells.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Causes (kinds), each worded by _WORDS.
DELETED = "Deleted"  # a deletion request alone: kubectl delete, a controller
EVICTED_BY_API = "EvictedByAPI"  # the Eviction API, the node not cordoned (or not readable)
DRAINED = "NodeDrained"  # the Eviction API on a cordoned node: kubectl drain
EVICTED_BY_KUBELET = "EvictedByKubelet"  # node-pressure eviction (status reason Evicted)
PREEMPTED_BY_SCHEDULER = "PreemptedByScheduler"
PREEMPTED_BY_KUBELET = "PreemptedByKubelet"  # status reason Preempting: a critical pod
NODE_TAINTED = "DeletedByTaintManager"  # a NoExecute taint: node not Ready or unreachable
NODE_GONE = "DeletedByPodGC"  # its node object is gone
NODE_SHUTDOWN = "NodeShutdown"  # graceful node shutdown
STOPPED_BY_KUBELET = "StoppedByKubelet"  # TerminationByKubelet, or another kubelet reason
NODE_LOST = "NodeLost"  # status reason NodeLost
NODE_NOT_READY = "NodeNotReady"  # the operator found its node not Ready
NODE_WAS_NOT_READY = "NodeWasNotReady"  # ... at some moment since the launcher's end
# Kueue evicted the job's Workload (its Evicted condition's reason, Kueue v0.19).
PREEMPTED_BY_KUEUE = "PreemptedByKueue"  # Preempted (the detail says why: priority, cohort)
KUEUE_PODS_READY_TIMEOUT = "KueuePodsReadyTimeout"  # PodsReadyTimeout: waitForPodsReady
KUEUE_DEACTIVATED = "KueueDeactivated"  # InactiveWorkload, Deactivated...: spec.active false
KUEUE_QUEUE_STOPPED = "KueueQueueStopped"  # ClusterQueueStopped, LocalQueueStopped
KUEUE_ADMISSION_CHECK = "KueueAdmissionCheck"  # AdmissionCheck: a check asked to retry
KUEUE_NODE_FAILURES = "KueueNodeFailures"  # NodeFailures: a node of its TAS assignment
EVICTED_BY_KUEUE = "EvictedByKueue"  # any other reason (named in the detail)

_WORDS = {
    DELETED: "deleted",
    EVICTED_BY_API: "evicted through the Eviction API",
    DRAINED: "evicted by a drain of {its_node}",
    EVICTED_BY_KUBELET: "evicted by the kubelet{of_node}",
    PREEMPTED_BY_SCHEDULER: "preempted by the scheduler for a pod of higher priority",
    PREEMPTED_BY_KUBELET: "preempted by the kubelet{of_node} for a critical pod",
    NODE_TAINTED: "deleted by the taint manager: {its_node} not Ready or unreachable",
    NODE_GONE: "deleted by the pod garbage collector: {its_node} gone",
    NODE_SHUTDOWN: "stopped by a shutdown of {its_node}",
    STOPPED_BY_KUBELET: "stopped by the kubelet{of_node}",
    NODE_LOST: "lost with {its_node}",
    NODE_NOT_READY: "{its_node} NotReady",
    NODE_WAS_NOT_READY: "{its_node} was NotReady",
    PREEMPTED_BY_KUEUE: "preempted by Kueue",
    KUEUE_PODS_READY_TIMEOUT: ("evicted by Kueue: its pods were not all ready within "
                               "waitForPodsReady.timeout"),
    KUEUE_DEACTIVATED: "evicted by Kueue: its Workload was deactivated",
    KUEUE_QUEUE_STOPPED: "evicted by Kueue: its queue was stopped",
    KUEUE_ADMISSION_CHECK: "evicted by Kueue: an admission check asked for it",
    KUEUE_NODE_FAILURES: "evicted by Kueue: a node of its topology assignment failed",
    EVICTED_BY_KUEUE: "evicted by Kueue",
}

_DISRUPTION_REASONS = {
    "EvictionByEvictionAPI": EVICTED_BY_API,
    "PreemptionByScheduler": PREEMPTED_BY_SCHEDULER,
    "DeletionByTaintManager": NODE_TAINTED,
    "DeletionByPodGC": NODE_GONE,
    "TerminationByKubelet": STOPPED_BY_KUBELET,
}
_STATUS_REASONS = {
    "Evicted": EVICTED_BY_KUBELET,
    "Preempting": PREEMPTED_BY_KUBELET,
    "Shutdown": NODE_SHUTDOWN,
    "NodeShutdown": NODE_SHUTDOWN,
    "Terminated": NODE_SHUTDOWN,
    "NodeLost": NODE_LOST,
}
_KUEUE_REASONS = {
    "Preempted": PREEMPTED_BY_KUEUE,
    "PodsReadyTimeout": KUEUE_PODS_READY_TIMEOUT,
    "InactiveWorkload": KUEUE_DEACTIVATED,
    "Deactivated": KUEUE_DEACTIVATED,
    "DeactivatedDueToRequeuingLimitExceeded": KUEUE_DEACTIVATED,
    "ClusterQueueStopped": KUEUE_QUEUE_STOPPED,
    "LocalQueueStopped": KUEUE_QUEUE_STOPPED,
    "AdmissionCheck": KUEUE_ADMISSION_CHECK,
    "NodeFailures": KUEUE_NODE_FAILURES,
}
DETAIL_CHARS = 160  # the words of Kubernetes or Kueue kept after ours
# "(UID: 7c5a..., JobUID: 1f1c...)" and the like in Kueue's messages: ids nobody reads.
_UIDS = re.compile(r"\s*\((?:Job)?UID: [^)]*\)|\s*\b(?:Job)?UID: [0-9a-fA-F-]{8,}")


@dataclass(frozen=True)
class Cause:
    """One observed cause: its kind (above), the node it happened on ("" when unknown) and
    the words of whoever caused it (the kubelet's message, Kueue's), kept after ours."""

    kind: str
    node: str = ""
    detail: str = ""

    @property
    def headline(self) -> str:
        """Our words alone, e.g. ``evicted by a drain of node kwok-gpu-1``, ``deleted``."""
        return _WORDS[self.kind].format(its_node=f"node {self.node}" if self.node else "its node",
                                        of_node=f" of node {self.node}" if self.node else "")

    def words(self) -> str:
        """The headline, then the words of whoever caused it, e.g. ``evicted by the kubelet
        of node n1: The node was low on resource: memory.``"""
        return f"{self.headline}: {self.detail}" if self.detail else self.headline


def of_pod(pod: dict[str, Any], cordoned: frozenset[str] = frozenset()) -> Cause | None:
    """How ``pod`` was stopped from outside (see the module doc), or None when nothing says it
    was.

    Args:
        cordoned: nodes known to be cordoned (``spec.unschedulable``): an API eviction of a
            pod on one of them is a drain.
    """
    status = pod.get("status") or {}
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            kind = _DISRUPTION_REASONS.get(str(condition.get("reason") or ""),
                                           STOPPED_BY_KUBELET)
            if kind == EVICTED_BY_API and node in cordoned:
                kind = DRAINED
            # The kubelet's own message says more than its condition's (which resource).
            detail = _detail(status.get("message")) if kind == STOPPED_BY_KUBELET else ""
            return Cause(kind, node, detail)
    reason = str(status.get("reason") or "")
    if reason in _STATUS_REASONS or reason.startswith("OutOf"):
        return Cause(_STATUS_REASONS.get(reason, STOPPED_BY_KUBELET), node,
                     _detail(status.get("message")) or (reason if reason.startswith("OutOf")
                                                        else ""))
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return Cause(DELETED)
    return None


def api_evicted_nodes(pods: list[dict[str, Any]]) -> set[str]:
    """The nodes of those of ``pods`` evicted through the Eviction API: only for them does it
    matter whether their node is cordoned (a drain), so nodes are read only then."""
    return {str(pod["spec"]["nodeName"]) for pod in pods
            if (pod.get("spec") or {}).get("nodeName") and any(
                condition.get("type") == "DisruptionTarget" and condition.get("status") == "True"
                and condition.get("reason") == "EvictionByEvictionAPI"
                for condition in (pod.get("status") or {}).get("conditions") or [])}


def of_kueue(reason: str, message: str = "") -> Cause:
    """Kueue's eviction of the job's Workload (its ``Evicted`` condition's ``reason`` and
    ``message``): what it means, then Kueue's own message without the UIDs it names (an
    unknown reason is named there)."""
    kind = _KUEUE_REASONS.get(reason, EVICTED_BY_KUEUE)
    detail = _detail(without_uids(message))
    if kind == EVICTED_BY_KUEUE and reason:
        detail = f"{reason}: {detail}" if detail else reason
    return Cause(kind, detail=detail)


def without_uids(text: str) -> str:
    """Kueue's ``text`` without the UIDs it names (``(UID: ..., JobUID: ...)``): nobody reads
    them, and they fill the 200 characters of MESSAGE. A requeued Workload's pending message
    still names the preemption that evicted it, UIDs included."""
    return _UIDS.sub("", text or "")


def kueue_reason(attempt_reason: str) -> str:
    """Kueue's eviction reason in an evicted attempt's reason (``EvictedPreempted`` ->
    ``Preempted``)."""
    return attempt_reason.removeprefix("Evicted")


def _detail(text: Any) -> str:
    """``text`` on one line, at most :data:`DETAIL_CHARS` characters."""
    line = " ".join(str(text or "").split())
    return line if len(line) <= DETAIL_CHARS else line[:DETAIL_CHARS - 3] + "..."
