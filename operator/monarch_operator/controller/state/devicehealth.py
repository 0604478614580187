"""Which devices of a job's worker pods their kubelet reports Unhealthy (issue 35 item 1).
Pure: no I/O.

Kubernetes 1.36 (feature gate ``ResourceHealthStatus``, beta and on by default; kubelet and
API server) shows the health of every device allocated to a container in its status (KEP-4680,
https://kep.k8s.io/4680)::

    status.containerStatuses[].allocatedResourcesStatus[]:
      {name: nvidia.com/gpu, resources: [{resourceID: "1", health: Unhealthy, message?}]}

``resourceID`` is the device plugin's device ID (a GPU UUID for NVIDIA's plugin, the index for
ours); ``name`` is the resource (or ``claim:<claim>/<request>`` for a DRA claim, pod-level
``status.allocatedResourcesStatus``). Health is ``Healthy``, ``Unhealthy`` or ``Unknown``
(the plugin went away): only ``Unhealthy`` is a device fault. The kubelet does nothing else
with it (a container restart gets the same device), so the operator replaces such a worker's
pod: the device plugin's Unhealthy device is out of the node's allocatable, and a new pod
cannot get it. Without the gate the field is absent and nothing is found here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class UnhealthyDevice:
    """One device reported Unhealthy: the ``pod`` holding it, its ``node``, the ``container``
    (``""`` for a pod-level DRA claim), the ``resource`` (``nvidia.com/gpu``), the ``device``
    (``resourceID``) and the kubelet's ``message`` (``""`` when none)."""

    pod: str
    node: str
    container: str
    resource: str
    device: str
    message: str = ""

    def describe(self) -> str:
        """E.g. ``nvidia.com/gpu device 1 of pod demo-worker-1 on node node-1 Unhealthy``,
        the kubelet's message after a colon when it gave one."""
        where = f" on node {self.node}" if self.node else ""
        said = f": {self.message}" if self.message else ""
        return f"{self.resource} device {self.device} of pod {self.pod}{where} Unhealthy{said}"


def _unhealthy_in(statuses: Iterable[dict[str, Any]], pod: str, node: str,
                  container: str) -> list[UnhealthyDevice]:
    found = []
    for status in statuses:
        for resource in status.get("resources") or []:
            if resource.get("health") == UNHEALTHY:
                found.append(UnhealthyDevice(
                    pod, node, container, str(status.get("name") or ""),
                    str(resource.get("resourceID") or ""),
                    " ".join(str(resource.get("message") or "").split())))
    return found


def unhealthy_devices(pod: dict[str, Any]) -> list[UnhealthyDevice]:
    """Every device ``pod``'s status reports Unhealthy: its containers' and init containers'
    ``allocatedResourcesStatus``, then the pod-level one (DRA claims); ``[]`` when the field is
    absent (the gate off, a kubelet before 1.36, no devices).

    Args:
        pod: a Pod as the API returns it (``dict``).
    """
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    name = str(metadata.get("name") or "")
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    found = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            found += _unhealthy_in(container.get("allocatedResourcesStatus") or [], name, node,
                                   str(container.get("name") or ""))
    found += _unhealthy_in(status.get("allocatedResourcesStatus") or [], name, node, "")
    return found


def attempt_unhealthy(snapshot: list[dict[str, Any]],
                      worker_pods: list[dict[str, Any]]) -> list[UnhealthyDevice]:
    """The Unhealthy devices of the attempt's workers: the pods of ``snapshot`` (``[{name,
    uid}]``, taken at the attempt's launch) that are still the same pods (same uid: a
    replacement never held the device), in snapshot order."""
    pods = {pod["metadata"]["name"]: pod for pod in worker_pods}
    found = []
    for entry in snapshot:
        pod = pods.get(entry.get("name", ""))
        if pod is not None and (pod.get("metadata") or {}).get("uid") == entry.get("uid"):
            found += unhealthy_devices(pod)
    return found
