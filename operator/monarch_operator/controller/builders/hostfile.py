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


def build_hostfile_configmap(job: JobSpec, settings: Settings) -> dict[str, Any]:
    """ConfigMap ``<job>-hostfile`` with key ``hostfile``; annotated with the job uid."""
    metadata = child_metadata(job, names.hostfile_configmap(job.name))
    metadata["annotations"] = {constants.ANNOTATION_JOB_UID: job.uid}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {constants.HOSTFILE_KEY: format_hostfile(hostfile_hosts(job, settings))},
    }
