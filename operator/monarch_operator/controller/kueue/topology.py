"""Pure: Kueue's topology-aware scheduling (TAS) for a MonarchJob's Workload.

A user asks for a placement with Kueue's own annotations on a pod template's metadata
(``spec.workers.template`` or ``spec.launcher.template``), as for any Kueue job:
``kueue.x-k8s.io/podset-required-topology: <node label of a level>`` (every pod of the pod set
in one domain of that level), ``...-preferred-topology``, ``...-unconstrained-topology:
"true"``, and ``...-slice-required-topology`` with ``...-slice-size`` (groups of that many
pods, each group in one domain). :func:`topology_request` turns them into the pod set's
``topologyRequest``; the workers' pod set always names the StatefulSet's pod index label, so
that Kueue ranks pods by ordinal (as its StatefulSet integration does) and a ClusterQueue whose
flavor has a topology places them even without an annotation.

When Kueue assigned a topology to a pod set (``topologyAssignment``), its pods are created with
the scheduling gate ``kueue.x-k8s.io/topology``; Kueue's TAS ungater finds them by the
``kueue.x-k8s.io/podset`` label and the ``kueue.x-k8s.io/workload`` annotation, pins each to its
domain (a node selector) and removes the gate (Kueue v0.19, ``pkg/controller/tas`` and
``jobframework.getPodSetsInfoFromStatus``, which this mirrors).
"""

from __future__ import annotations

from typing import Any

PREFIX = "kueue.x-k8s.io/"
ANNOTATION_REQUIRED = f"{PREFIX}podset-required-topology"
ANNOTATION_PREFERRED = f"{PREFIX}podset-preferred-topology"
ANNOTATION_UNCONSTRAINED = f"{PREFIX}podset-unconstrained-topology"
ANNOTATION_SLICE_REQUIRED = f"{PREFIX}podset-slice-required-topology"
ANNOTATION_SLICE_SIZE = f"{PREFIX}podset-slice-size"
ANNOTATION_GROUP_NAME = f"{PREFIX}podset-group-name"
# Put on the pods of an admitted job, as Kueue's job integrations do.
LABEL_PODSET = f"{PREFIX}podset"
ANNOTATION_WORKLOAD = f"{PREFIX}workload"
TOPOLOGY_GATE = f"{PREFIX}topology"
# The StatefulSet controller's label with each pod's ordinal (Kubernetes 1.28+).
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


class TopologyRequestError(ValueError):
    """A topology annotation Kueue could not read; the message names the field and the rule."""


def topology_request(template: dict[str, Any], field: str,
                     pod_index_label: str | None = None) -> dict[str, Any] | None:
    """The pod set's ``topologyRequest`` from ``template``'s annotations, or None when it
    asks for nothing (and no ``pod_index_label`` is given).

    Args:
        template: the pod template (``metadata.annotations`` is read).
        field: where the template comes from, for errors (``spec.workers.template``).
        pod_index_label: the label holding each pod's index, for Kueue to rank pods.

    Raises:
        TopologyRequestError: an unconstrained value that is not a boolean, or a slice size
            that is not a positive integer, naming the annotation.
    """
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    request: dict[str, Any] = {}
    if ANNOTATION_REQUIRED in annotations:
        request["required"] = str(annotations[ANNOTATION_REQUIRED])
    elif ANNOTATION_PREFERRED in annotations:
        request["preferred"] = str(annotations[ANNOTATION_PREFERRED])
    elif ANNOTATION_UNCONSTRAINED in annotations:
        value = str(annotations[ANNOTATION_UNCONSTRAINED])
        if value not in _TRUE | _FALSE:
            raise TopologyRequestError(
                f"{field}.metadata.annotations[{ANNOTATION_UNCONSTRAINED}]: {value!r} must be "
                "true or false")
        request["unconstrained"] = value in _TRUE
    if ANNOTATION_SLICE_REQUIRED in annotations and ANNOTATION_SLICE_SIZE in annotations:
        size = str(annotations[ANNOTATION_SLICE_SIZE])
        if not size.isdigit() or int(size) < 1:
            raise TopologyRequestError(
                f"{field}.metadata.annotations[{ANNOTATION_SLICE_SIZE}]: {size!r} must be a "
                "positive integer (pods per slice)")
        request["podSetSliceRequiredTopology"] = str(annotations[ANNOTATION_SLICE_REQUIRED])
        request["podSetSliceSize"] = int(size)
    if not request and pod_index_label is None:
        return None
    if pod_index_label is not None:
        request["podIndexLabel"] = pod_index_label
    if ANNOTATION_GROUP_NAME in annotations and ("required" in request or "preferred" in request):
        request["podSetGroupName"] = str(annotations[ANNOTATION_GROUP_NAME])
    return request


def admitted_metadata(workload_name: str, pod_set: dict[str, Any],
                      assignment: dict[str, Any]) -> tuple[dict[str, str], dict[str, str],
                                                           list[str]]:
    """``(labels, annotations, scheduling gates)`` that admission adds to a pod set's pods:
    the pod set label and the Workload annotation always; with a ``topologyAssignment`` the
    topology gate too, and the unconstrained annotation when the pod set asked for no
    level (Kueue placed it through its flavor's topology alone)."""
    labels = {LABEL_PODSET: str(assignment["name"])}
    annotations = {ANNOTATION_WORKLOAD: workload_name}
    if not assignment.get("topologyAssignment"):
        return labels, annotations, []
    request = pod_set.get("topologyRequest") or {}
    if not any(key in request for key in ("required", "preferred", "unconstrained")):
        annotations[ANNOTATION_UNCONSTRAINED] = "true"
    return labels, annotations, [TOPOLOGY_GATE]
