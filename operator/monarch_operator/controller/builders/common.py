"""Metadata shared by every child: labels and the controller owner reference."""

from __future__ import annotations

from typing import Any

from monarch_operator import constants
from monarch_operator.controller.spec import JobSpec


def job_labels(job: JobSpec, role: str | None = None) -> dict[str, str]:
    """Labels that tie a child to its job (and, for pods, their role)."""
    labels = {
        "app.kubernetes.io/name": "monarch",
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/managed-by": constants.MANAGED_BY,
        constants.LABEL_JOB: job.name,
    }
    if role:
        labels[constants.LABEL_ROLE] = role
    return labels


def owner_reference(job: JobSpec) -> dict[str, Any]:
    """Controller owner reference to the job, so deleting the job deletes the child (GC)."""
    return {
        "apiVersion": f"{constants.GROUP}/{constants.VERSION}",
        "kind": constants.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(job: JobSpec, name: str, role: str | None = None) -> dict[str, Any]:
    """``metadata`` of a child named ``name`` in the job's namespace, labelled and owned."""
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": job_labels(job, role),
        "ownerReferences": [owner_reference(job)],
    }
