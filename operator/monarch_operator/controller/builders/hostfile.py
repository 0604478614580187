"""The hostfile ConfigMap: worker FQDNs in hostfile order (group by group, ordinal order) with
their slots."""

from __future__ import annotations

from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import child_metadata
from monarch_operator.controller.spec.groups import GROUP_HOSTFILE_KEY_PREFIX, WorkerGroup
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.hostfile import Host, format_hostfile


def hostfile_hosts(job: JobSpec, settings: Settings) -> list[Host]:
    """Hosts of the job: group by group (``spec.workerGroups`` order), each in ordinal order
    (worker-2 before worker-10), with the group's ``gpusPerWorker`` slots (1 without GPUs)."""
    return [host for group in job.groups for host in group_hosts(job, settings, group)]


def group_hosts(job: JobSpec, settings: Settings, group: WorkerGroup) -> list[Host]:
    """The hosts of worker group ``group`` in ordinal order (:func:`hostfile_hosts`)."""
    return [
        Host(name=names.group_fqdn(job.name, group.name, job.namespace, ordinal,
                                   settings.cluster_domain),
             slots=group.slots)
        for ordinal in range(group.replicas)
    ]


def host_addresses(job: JobSpec, settings: Settings,
                   worker_pods: list[dict[str, Any]]) -> str:
    """``<fqdn> <pod IP>`` per worker in hostfile order, for the workers whose pod has an IP
    (field case C20: the launcher waits until each name resolves to that address)."""
    by_name = {pod["metadata"]["name"]: pod for pod in worker_pods}
    lines = []
    for host, pod_name in zip(hostfile_hosts(job, settings), job.worker_pod_names(),
                              strict=True):
        address = ((by_name.get(pod_name) or {}).get("status") or {}).get("podIP")
        if address:
            lines.append(f"{host.name} {address}\n")
    return "".join(lines)


def build_hostfile_configmap(job: JobSpec, settings: Settings,
                             worker_pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """ConfigMap ``<job>-hostfile``: key ``hostfile`` (names and slots of every worker) and,
    given the worker pods the attempt starts on, key ``addresses`` (:func:`host_addresses`);
    with ``spec.workerGroups`` also one key ``hostfile.<group>`` per group listing that
    group's lines only. Annotated with the job uid."""
    metadata = child_metadata(job, names.hostfile_configmap(job.name))
    metadata["annotations"] = {constants.ANNOTATION_JOB_UID: job.uid}
    data = {constants.HOSTFILE_KEY: format_hostfile(hostfile_hosts(job, settings))}
    for group in job.worker_groups:
        data[GROUP_HOSTFILE_KEY_PREFIX + group.name] = format_hostfile(
            group_hosts(job, settings, group))
    if worker_pods is not None:
        data[constants.ADDRESSES_KEY] = host_addresses(job, settings, worker_pods)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
