"""Shared by the builders: labels, the controller owner reference, the pods' security
contexts, quantity normalising."""

from __future__ import annotations

import copy
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.spec.rules import resource_amounts
from monarch_operator.controller.spec.spec import JobSpec


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


def pod_metadata(job: JobSpec, labels: dict[str, str]) -> dict[str, Any]:
    """A pod template's ``metadata``: the job's own labels and annotations (so that e.g. Kueue's
    ``kueue.x-k8s.io/queue-name`` reaches the pods), then ``labels``, which win."""
    metadata: dict[str, Any] = {"labels": {**job.pod_labels, **labels}}
    if job.pod_annotations:
        metadata["annotations"] = dict(job.pod_annotations)
    return metadata


def pod_security_context(user_id: int) -> dict[str, Any]:
    """The pod-level ``securityContext`` of worker and launcher pods: Pod Security "restricted".

    Non-root ``user_id`` (the image's ``monarch`` user) for every container, its group, and
    ``fsGroup`` so that the Secret and ConfigMap files are readable by that group (a kubelet
    mounts them ``root:<fsGroup>``, mode OR 0440); seccomp ``RuntimeDefault``, the container
    runtime's default filter (Pod Security Standards, kubernetes.io/docs/concepts/security/
    pod-security-standards/). A template may change any field; the API server's Pod Security
    admission then judges the result.
    """
    return {
        "runAsNonRoot": True,
        "runAsUser": user_id,
        "runAsGroup": user_id,
        "fsGroup": user_id,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """The container-level ``securityContext`` of the operator's own containers (worker,
    launcher): no privilege escalation (``no_new_privs``) and no capabilities, as the
    "restricted" level requires; both fields exist only per container in the Kubernetes API.
    A non-root sshd needs neither: it only logs in its own user."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


# The volume holding constants.RUNTIME_DIR in worker and launcher pods.
RUNTIME_VOLUME = "monarch-runtime"


def runtime_volume() -> dict[str, Any]:
    """The per-pod emptyDir mounted at ``/run/monarch`` (``constants.RUNTIME_DIR``).

    On the node's disk, not in memory: a uid the image does not know gets its home there, and
    homes hold caches. A kubelet makes an emptyDir mode 0777, so any uid can write in it
    (field case C38: sshd's files and such a uid's passwd entry must not depend on HOME).
    """
    return {"name": RUNTIME_VOLUME, "emptyDir": {}}


def runtime_mount() -> dict[str, Any]:
    """The container's mount of :func:`runtime_volume`."""
    return {"name": RUNTIME_VOLUME, "mountPath": constants.RUNTIME_DIR}


def runtime_env() -> dict[str, Any]:
    """``MONARCH_RUNTIME_DIR``, which tells the worker entrypoint and the launcher where it is."""
    return {"name": constants.ENV_RUNTIME_DIR, "value": constants.RUNTIME_DIR}


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


def quantities_as_strings(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``pod_spec`` whose resource quantities written as numbers are strings.

    ``cpu: 2`` is valid Kubernetes (a quantity may be a JSON number), but the typed client's
    models take only strings, so a user's integer once failed every reconcile before reaching
    the API server (field case C12A). Creates now go as JSON (:func:`.writes.ensure`); the
    strings stay, as the API server stores and returns quantities, so that a built object reads
    as the stored one does. Covers the pod's own ``resources`` and those of its containers and
    init containers.
    """
    converted = copy.deepcopy(pod_spec)
    for _, amounts in resource_amounts(converted):
        for name, amount in amounts.items():
            if isinstance(amount, int | float) and not isinstance(amount, bool):
                amounts[name] = str(amount)
    return converted


def ssh_secret_volume(job: JobSpec, volume: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A pod volume named ``volume`` holding the ``keys`` of the job's SSH key Secret, each as
    a file of its own, readable by its owner only (mode 0400)."""
    return {"name": volume, "secret": {"secretName": names.ssh_secret(job.name),
                                       "defaultMode": 0o400,
                                       "items": [{"key": key, "path": key} for key in keys]}}
