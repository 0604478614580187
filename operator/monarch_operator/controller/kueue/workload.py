"""Pure: a MonarchJob's Kueue Workload, what Kueue's status on it means, and what admission
puts into the job's pods.

One MonarchJob is one Workload (``kueue.x-k8s.io/v1beta2``) and one gang: a pod set ``workers``
(the worker StatefulSet's pod template, ``count`` = workers; colocated roles live in the same
pods, so they share it), or with ``spec.workerGroups`` one pod set per group named as the
group, and a pod set ``launcher`` (count 1). Each template is the one the
operator creates, so Kueue counts exactly the requests (``nvidia.com/gpu`` included) that the
pods will make. The contract follows Kueue's own job integrations
(``pkg/controller/jobframework/reconciler.go`` of Kueue v0.19: the job runs only while its
Workload is admitted; on eviction it stops, and its controller then clears the quota
reservation and sets ``Requeued``; on completion it sets ``Finished``).

No I/O and no clock: times come in as RFC 3339 text.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from monarch_operator import names
from monarch_operator.controller.builders.common import job_labels, owner_reference
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.kueue import topology
from monarch_operator.controller.spec.groups import WorkerGroup
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec

GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"
KIND = "Workload"
# Labels a user puts on the MonarchJob (Kueue's names, pkg/controller/constants).
LABEL_QUEUE_NAME = f"{GROUP}/queue-name"
LABEL_PRIORITY_CLASS = f"{GROUP}/priority-class"
# On the Workload: the uid of the job it stands for (as jobframework labels its workloads).
LABEL_JOB_UID = f"{GROUP}/job-uid"
# On the Workload: a hash of what it asks Kueue for (queue, priority, pod sets), to tell that
# the job's spec changed while it was queued (:func:`outdated`).
ANNOTATION_SPEC_HASH = "monarch-operator.dev/workload-spec-hash"
# The LocalQueue Kueue's webhooks put on a job that has none (jobframework/defaults.go).
DEFAULT_LOCAL_QUEUE = "default"
# Pod set names (DNS labels, unique in the Workload).
PODSET_WORKERS = "workers"
PODSET_LAUNCHER = "launcher"

# Workload condition types and reasons (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
PODS_READY = "PodsReady"
REQUEUED = "Requeued"
REASON_PENDING = "Pending"
REASON_NO_RESERVATION = "NoReservation"
REASON_PREEMPTED = "Preempted"
REASON_NODE_FAILURES = "NodeFailures"
REASON_WAIT_FOR_START = "WaitForStart"
REASON_WAIT_FOR_RECOVERY = "WaitForRecovery"
REASON_STARTED = "Started"
REASON_RECOVERED = "Recovered"
REASON_SUCCEEDED = "Succeeded"
REASON_FAILED = "Failed"

# Where the Workload stands, as the job sees it.
STATE_PENDING = "Pending"  # no quota reserved, or admission checks not all Ready
STATE_ADMITTED = "Admitted"
STATE_EVICTED = "Evicted"  # Evicted=True: stop, then give the quota back
STATE_FINISHED = "Finished"


def build_workload(job: JobSpec, settings: Settings, queue: str,
                   priority: tuple[str, int] | None = None) -> dict[str, Any]:
    """The job's Workload: owned by the job (deleted with it), in LocalQueue ``queue``.

    Args:
        priority: ``(WorkloadPriorityClass name, its value)`` from the job's
            ``kueue.x-k8s.io/priority-class`` label; the Workload's CRD needs the value next
            to the reference, as Kueue's job integrations copy it.

    Returns the object to create (``kueue.x-k8s.io/v1beta2`` Workload).

    Raises:
        topology.TopologyRequestError: a template's topology annotation is malformed.
    """
    launcher = build_launcher_pod(job, settings, 1)
    launcher_template = {"metadata": {key: launcher["metadata"][key]
                                      for key in ("labels", "annotations")
                                      if launcher["metadata"].get(key)},
                         "spec": launcher["spec"]}
    workers = [_group_pod_set(job, settings, group) for group in job.groups]
    launcher_set: dict[str, Any] = {"name": PODSET_LAUNCHER, "count": 1,
                                    "template": launcher_template}
    launcher_topology = topology.topology_request(launcher_template, "spec.launcher.template")
    if launcher_topology is not None:
        launcher_set["topologyRequest"] = launcher_topology
    spec: dict[str, Any] = {"queueName": queue, "podSets": [*workers, launcher_set]}
    if priority is not None:
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass",
                                    "name": priority[0]}
        spec["priority"] = priority[1]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": names.workload(job.name, job.uid),
            "namespace": job.namespace,
            "labels": {**job_labels(job), LABEL_JOB_UID: job.uid},
            "annotations": {ANNOTATION_SPEC_HASH: _spec_hash(spec)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def pod_set_name(group: WorkerGroup) -> str:
    """The pod set of worker group ``group``: ``workers`` for the unnamed group of a job
    without ``spec.workerGroups``, else the group's name (never ``launcher``, a name groups
    may not take)."""
    return group.name if group.labelled else PODSET_WORKERS


def _group_pod_set(job: JobSpec, settings: Settings, group: WorkerGroup) -> dict[str, Any]:
    """Worker group ``group``'s pod set: its StatefulSet's pod template, count its replicas."""
    # Without the operator's default worker labels and env: they ask Kueue for nothing, and
    # with them an upgrade that changes them would change the spec hash and so replace a
    # queued job's Workload, which would lose its place in the queue (docs/install.md).
    plain = dataclasses.replace(settings, worker_labels=(), worker_env=())
    template = build_worker_statefulset(job, plain, group)["spec"]["template"]
    where = ("spec.workers.template" if not group.labelled
             else f"spec.workerGroups {group.name!r} template")
    return {"name": pod_set_name(group), "count": group.replicas, "template": template,
            "topologyRequest": topology.topology_request(template, where,
                                                         topology.POD_INDEX_LABEL)}


def _spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def outdated(workload: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Whether ``workload`` (as read) no longer asks for what ``desired`` (built from the job's
    spec now) does, while no quota is reserved for it: the job's spec changed while queued
    (more workers, other GPUs, another priority). Kueue must then see the new request, so
    the Workload is replaced, as Kueue's own job integrations do with a Workload that is no
    longer equivalent to its job (jobframework ``EquivalentToWorkload``). A Workload holding
    quota is never replaced (the job runs as admitted); one made before this hash existed
    is left as it is."""
    if _is_true(workload, QUOTA_RESERVED):
        return False
    known = ((workload.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
    wanted = desired["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
    return known is not None and known != wanted


@dataclass(frozen=True)
class PodSetUpdate:
    """What admission adds to one pod set's pods: the flavors' node labels and tolerations,
    and the admission checks' ``podSetUpdates``."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    scheduling_gates: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Admission:
    """The Workload's state for the job: ``state`` (``STATE_*``), Kueue's ``reason`` and
    ``message`` (why pending, why evicted), the ClusterQueue, and per pod set the flavor
    of each resource (``{podset: {resource: flavor}}``)."""

    state: str
    reason: str = ""
    message: str = ""
    cluster_queue: str = ""
    flavors: dict[str, dict[str, str]] = field(default_factory=dict)


def _condition(workload: dict[str, Any], condition_type: str) -> dict[str, Any] | None:
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("type") == condition_type:
            return dict(condition)
    return None


def _is_true(workload: dict[str, Any], condition_type: str) -> bool:
    return (_condition(workload, condition_type) or {}).get("status") == "True"


def admission(workload: dict[str, Any]) -> Admission:
    """Read Kueue's verdict from the Workload's status.

    Finished beats everything; Evicted=True while the quota is still reserved means "stop
    now" (Kueue waits for the job to stop before it gives the quota to anyone else); Admitted
    (quota reserved and every admission check Ready) means "run"; anything else is pending,
    with ``QuotaReserved``'s reason and message (e.g. ``couldn't assign flavors to pod set
    workers: insufficient unused quota for nvidia.com/gpu ...``).
    """
    status = workload.get("status") or {}
    if _is_true(workload, FINISHED):
        return Admission(STATE_FINISHED, **_words(_condition(workload, FINISHED)))
    evicted = _condition(workload, EVICTED)
    if evicted and evicted.get("status") == "True" and _is_true(workload, QUOTA_RESERVED):
        return Admission(STATE_EVICTED, **_words(evicted))
    assignment = status.get("admission") or {}
    if _is_true(workload, ADMITTED) and assignment:
        flavors = {str(item.get("name")): dict(item.get("flavors") or {})
                   for item in assignment.get("podSetAssignments") or []}
        return Admission(STATE_ADMITTED, cluster_queue=str(assignment.get("clusterQueue", "")),
                         flavors=flavors)
    reserved = _condition(workload, QUOTA_RESERVED)
    if reserved and reserved.get("status") == "True":  # admission checks still running
        checks = [f"{check.get('name')}: {check.get('state')}"
                  for check in status.get("admissionChecks") or []
                  if check.get("state") != "Ready"]
        return Admission(STATE_PENDING, reason="AdmissionChecks",
                         message="quota reserved; waiting for admission checks "
                         + (", ".join(checks) or "(none listed)"))
    words = _words(reserved) if reserved else {"reason": REASON_PENDING,
                                                "message": "not yet seen by Kueue"}
    return Admission(STATE_PENDING, **words)


def _words(condition: dict[str, Any] | None) -> dict[str, str]:
    condition = condition or {}
    return {"reason": str(condition.get("reason") or ""),
            "message": " ".join(str(condition.get("message") or "").split())}


def pod_set_updates(workload: dict[str, Any],
                    flavor_specs: dict[str, dict[str, Any]]) -> dict[str, PodSetUpdate]:
    """Per pod set, what admission puts into its pods: for each flavor assigned to it, that
    ResourceFlavor's ``spec.nodeLabels`` (node selector) and ``spec.tolerations``; then each
    admission check's ``podSetUpdates`` entry for it (labels, annotations, nodeSelector,
    tolerations), as Kueue's jobframework does when it starts a job (``podset.Merge``); and
    the pod set label, the Workload annotation and, with a topology assignment, the TAS
    scheduling gate (:func:`.topology.admitted_metadata`).

    Args:
        flavor_specs: ResourceFlavor name -> its ``spec`` (missing flavors add nothing).
    """
    status = workload.get("status") or {}
    pod_sets = {str(pod_set.get("name")): pod_set
                for pod_set in (workload.get("spec") or {}).get("podSets") or []}
    name = str((workload.get("metadata") or {}).get("name") or "")
    updates: dict[str, PodSetUpdate] = {}
    for assignment in (status.get("admission") or {}).get("podSetAssignments") or []:
        node_selector: dict[str, str] = {}
        tolerations: list[dict[str, Any]] = []
        for flavor in sorted(set((assignment.get("flavors") or {}).values())):
            spec = flavor_specs.get(flavor) or {}
            node_selector.update(spec.get("nodeLabels") or {})
            tolerations.extend(t for t in spec.get("tolerations") or [] if t not in tolerations)
        labels, annotations, gates = topology.admitted_metadata(
            name, pod_sets.get(str(assignment["name"])) or {}, assignment)
        updates[str(assignment["name"])] = PodSetUpdate(node_selector, tolerations, labels,
                                                        annotations, gates)
    for check in status.get("admissionChecks") or []:
        for entry in check.get("podSetUpdates") or []:
            current = updates.get(str(entry["name"]), PodSetUpdate())
            updates[str(entry["name"])] = PodSetUpdate(
                {**current.node_selector, **(entry.get("nodeSelector") or {})},
                current.tolerations + [t for t in entry.get("tolerations") or []
                                       if t not in current.tolerations],
                {**current.labels, **(entry.get("labels") or {})},
                {**current.annotations, **(entry.get("annotations") or {})},
                current.scheduling_gates)
    return updates


def with_updates(template: dict[str, Any], update: PodSetUpdate | None) -> dict[str, Any]:
    """A pod template (``spec.workers.template`` or ``spec.launcher.template``) with
    ``update`` merged in: node selector and labels added (the user's own keys kept unless
    admission sets them), tolerations and scheduling gates appended. The job's own templates
    are never changed, so
    an eviction restores them by building from the spec again."""
    merged = copy.deepcopy(template)
    if update is None:
        return merged
    spec = merged.setdefault("spec", {})
    if update.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **update.node_selector}
    if update.tolerations:
        spec["tolerations"] = list(spec.get("tolerations") or []) + [
            t for t in update.tolerations if t not in (spec.get("tolerations") or [])]
    gates = list(spec.get("schedulingGates") or [])
    for gate in update.scheduling_gates:
        if {"name": gate} not in gates:
            gates.append({"name": gate})
    if gates:
        spec["schedulingGates"] = gates
    metadata = merged.setdefault("metadata", {})
    if update.labels:
        metadata["labels"] = {**(metadata.get("labels") or {}), **update.labels}
    if update.annotations:
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **update.annotations}
    return merged


def _set_condition(conditions: list[dict[str, Any]], condition_type: str, status: str,
                   reason: str, message: str, now: str,
                   generation: int | None) -> list[dict[str, Any]]:
    """``conditions`` with one set (``lastTransitionTime`` kept unless the status flips)."""
    previous = next((c for c in conditions if c.get("type") == condition_type), None)
    condition = {"type": condition_type, "status": status, "reason": reason,
                 "message": message[:32768],
                 "lastTransitionTime": (previous or {}).get("lastTransitionTime", now)
                 if (previous or {}).get("status") == status else now}
    if generation is not None:
        condition["observedGeneration"] = generation
    return [c for c in conditions if c.get("type") != condition_type] + [condition]


def released_status(workload: dict[str, Any], now: str) -> dict[str, Any]:
    """The Workload's status once the evicted job stopped: the quota reservation given back
    (``status.admission`` removed, ``QuotaReserved`` False ``Pending``, ``Admitted`` False
    ``NoReservation``) and ``Requeued`` (True when evicted by preemption or node failures,
    which Kueue requeues at once), as jobframework's reconciler does after ``stopJob``."""
    status = copy.deepcopy(workload.get("status") or {})
    evicted = _condition(workload, EVICTED) or {}
    generation = workload.get("metadata", {}).get("generation")
    message = str(evicted.get("message") or "")
    requeued = "True" if evicted.get("reason") in (REASON_PREEMPTED,
                                                   REASON_NODE_FAILURES) else "False"
    conditions = list(status.get("conditions") or [])
    conditions = _set_condition(conditions, REQUEUED, requeued,
                                str(evicted.get("reason") or REASON_PENDING), message, now,
                                generation)
    conditions = _set_condition(conditions, QUOTA_RESERVED, "False", REASON_PENDING, message,
                                now, generation)
    conditions = _set_condition(conditions, ADMITTED, "False", REASON_NO_RESERVATION,
                                "The workload has no reservation", now, generation)
    status["conditions"] = conditions
    status.pop("admission", None)
    return status


def pods_ready_status(workload: dict[str, Any], running: bool, now: str) -> dict[str, Any] | None:
    """The Workload's status with ``PodsReady`` for an admitted job (``running``: every worker
    Ready and the launcher started), or None when it already says so. Reasons as Kueue's
    ``generatePodsReadyCondition``: Started, then WaitForRecovery / Recovered after a loss."""
    previous = _condition(workload, PODS_READY)
    if running:
        recovering = (previous or {}).get("reason") in (REASON_WAIT_FOR_RECOVERY,
                                                        REASON_RECOVERED)
        wanted = ("True", REASON_RECOVERED if recovering else REASON_STARTED,
                  "All pods reached readiness and the workload is running")
    elif (previous or {}).get("status") == "True" or (
            (previous or {}).get("reason") == REASON_WAIT_FOR_RECOVERY):
        wanted = ("False", REASON_WAIT_FOR_RECOVERY,
                  "At least one pod has failed, waiting for recovery")
    else:
        wanted = ("False", REASON_WAIT_FOR_START, "Not all pods are ready or succeeded")
    if previous and (previous.get("status"), previous.get("reason")) == wanted[:2]:
        return None
    status = copy.deepcopy(workload.get("status") or {})
    status["conditions"] = _set_condition(list(status.get("conditions") or []), PODS_READY,
                                          *wanted, now,
                                          workload.get("metadata", {}).get("generation"))
    return status


def finished_status(workload: dict[str, Any], succeeded: bool, message: str,
                    now: str) -> dict[str, Any] | None:
    """The Workload's status with ``Finished`` True (reason Succeeded or Failed), or None when
    it is finished already. Kueue then releases its quota."""
    if _is_true(workload, FINISHED):
        return None
    status = copy.deepcopy(workload.get("status") or {})
    status["conditions"] = _set_condition(
        list(status.get("conditions") or []), FINISHED, "True",
        REASON_SUCCEEDED if succeeded else REASON_FAILED, message or "job finished", now,
        workload.get("metadata", {}).get("generation"))
    return status

