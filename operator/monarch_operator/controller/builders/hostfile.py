"""The hostfile ConfigMap: worker FQDNs in ordinal order with their slots."""

from __future__ import annotations

from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import child_metadata
from monarch_operator.controller.settings import Settings
from monarch_operator.controller.spec import JobSpec
from monarch_operator.hostfile import Host, format_hostfile


def hostfile_hosts(job: JobSpec, settings: Settings) -> list[Host]:
    """Hosts of the job in ordinal order (worker-2 before worker-10), ``gpusPerWorker`` slots
    each."""
    return [
        Host(
            name=names.worker_fqdn(job.name, job.namespace, ordinal, settings.cluster_domain),
            slots=job.gpus_per_worker,
        )
        for ordinal in range(job.replicas)
    ]


def host_addresses(job: JobSpec, settings: Settings,
                   worker_pods: list[dict[str, Any]]) -> str:
    """``<fqdn> <pod IP>`` per worker in ordinal order, for the workers whose pod has an IP
    (field case C20: the launcher waits until each name resolves to that address)."""
    by_name = {pod["metadata"]["name"]: pod for pod in worker_pods}
    lines = []
    for host, ordinal in zip(hostfile_hosts(job, settings), range(job.replicas), strict=True):
        pod = by_name.get(names.worker_pod(job.name, ordinal))
        address = ((pod or {}).get("status") or {}).get("podIP")
        if address:
            lines.append(f"{host.name} {address}\n")
    return "".join(lines)


def build_hostfile_configmap(job: JobSpec, settings: Settings,
                             worker_pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """ConfigMap ``<job>-hostfile``: key ``hostfile`` (names and slots) and, given the worker
    pods the attempt starts on, key ``addresses`` (:func:`host_addresses`); annotated with the
    job uid."""
    metadata = child_metadata(job, names.hostfile_configmap(job.name))
    metadata["annotations"] = {constants.ANNOTATION_JOB_UID: job.uid}
    data = {constants.HOSTFILE_KEY: format_hostfile(hostfile_hosts(job, settings))}
    if worker_pods is not None:
        data[constants.ADDRESSES_KEY] = host_addresses(job, settings, worker_pods)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
