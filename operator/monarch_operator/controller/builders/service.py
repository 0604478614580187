"""The headless Service that gives worker pods stable DNS names."""

from __future__ import annotations

from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import child_metadata
from monarch_operator.controller.builders.statefulset import group_labels
from monarch_operator.controller.spec.groups import WorkerGroup
from monarch_operator.controller.spec.spec import JobSpec


def build_worker_services(job: JobSpec) -> list[dict[str, Any]]:
    """One headless Service per worker group, in hostfile order (:func:`build_worker_service`)."""
    return [build_worker_service(job, group) for group in job.groups]


def build_worker_service(job: JobSpec, group: WorkerGroup | None = None) -> dict[str, Any]:
    """Headless Service ``<job>-<group>`` (``<job>-worker`` for a job without worker groups)
    over the group's worker pods; ``group`` None: the job's first.

    ``publishNotReadyAddresses`` lets names resolve before readiness, so the launcher never races
    DNS once pods are Ready (mpi-operator #470, kubernetes #92559). In attach mode the workers
    advertise these names to Monarch (launcher/attachworker.py), so each must resolve before
    its pod is Ready: Monarch's ``KubernetesJob`` attaches as soon as all are Ready.
    """
    group = group or job.groups[0]
    metadata = child_metadata(job, names.group_set(job.name, group.name))
    if group.labelled:
        metadata["labels"][constants.LABEL_GROUP] = group.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": group_labels(job, group),
            "ports": _ports(job),
        },
    }


def _ports(job: JobSpec) -> list[dict[str, Any]]:
    """The ports the workers serve: sshd and the Monarch workers SSHJob starts, or in attach
    mode the worker loop's."""
    if job.attach:
        port = constants.MONARCH_ATTACH_PORT
        return [{"name": "monarch", "port": port, "targetPort": port}]
    return [
        {"name": "ssh", "port": constants.SSH_PORT, "targetPort": constants.SSH_PORT},
        {
            "name": "monarch",
            "port": constants.MONARCH_WORKER_PORT,
            "targetPort": constants.MONARCH_WORKER_PORT,
        },
    ]
