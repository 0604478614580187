"""Attach mode's role meshes: which workers form each role's Monarch mesh, and how Monarch's
``KubernetesJob`` finds them (docs/attach.md).

Pure: no I/O. ``KubernetesJob.add_mesh(name, num_replicas, label_selector, pod_rank_label,
port)`` (torchmonarch 0.7.0, ``monarch/_src/job/kubernetes.py``) watches the pods that
``label_selector`` matches and attaches once the pods with ranks ``0..num_replicas-1`` in label
``pod_rank_label`` are all Ready. Our roles share one StatefulSet (trainer hosts first, then
ref hosts, in hostfile order), so ``apps.kubernetes.io/pod-index`` is a rank for the trainer
only; every role gets a rank label of its own instead, ``monarch-operator.dev/<mesh>-rank``,
which the operator sets on each worker pod (colocated roles: both labels on each pod).

A job with worker groups (``spec.roles``, docs/roles.md) publishes one mesh per role the same
way: a role's pods are its slice of its group's workers (:func:`.groups.role_ordinals`), ranked
in ordinal order, and its mesh name is the role's name (the CRD holds role names to Monarch's
mesh-name rule).
"""

from __future__ import annotations

import re
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.spec import groups
from monarch_operator.controller.spec.spec import JobSpec

# KubernetesJob.add_mesh's rule for a mesh name: 1-63 characters, lowercase letters and digits,
# starting with a letter (no '-' or '_').
MESH_NAME = re.compile(r"^[a-z][a-z0-9]{0,62}$")


def mesh_name(role: str) -> str:
    """The Monarch mesh name of ``role``: the role name lowercased without the characters a
    mesh name may not hold (``ref_model`` -> ``refmodel``).

    Raises:
        ValueError: nothing valid is left (the name must start with a letter).
    """
    candidate = re.sub(r"[^a-z0-9]", "", role.lower())[:63]
    if not MESH_NAME.match(candidate):
        raise ValueError(f"role {role!r} gives no valid Monarch mesh name ({candidate!r}): "
                         "one needs a lowercase letter first, then letters and digits")
    return candidate


def rank_label(role: str) -> str:
    """The label holding a worker pod's rank in ``role``'s mesh, e.g.
    ``monarch-operator.dev/trainer-rank``."""
    return f"{constants.GROUP}/{mesh_name(role)}{constants.RANK_LABEL_SUFFIX}"


def role_ordinals(job: JobSpec) -> dict[str, list[int]]:
    """Worker ordinals of each role, rank order: the trainer's first ``trainer_hosts``, then
    the ref's next ``ref_hosts``, or the same first ones when the roles are colocated (as the
    launcher places them over the hostfile)."""
    trainer = list(range(job.trainer_hosts))
    start = 0 if job.colocate else job.trainer_hosts
    return {"trainer": trainer, "ref": list(range(start, start + job.ref_hosts))}


def role_pods(job: JobSpec) -> dict[str, list[str]]:
    """Each role's worker pod names in rank order, roles in start order: the trainer and ref
    over ``<job>-worker-<i>`` (:func:`role_ordinals`), or each of ``spec.roles`` over its
    group's pods ``<job>-<group>-<i>``."""
    if job.roles:
        ordinals = groups.role_ordinals(job.worker_groups, job.roles)
        return {role.name: [names.group_pod(job.name, role.group, ordinal)
                            for ordinal in ordinals[role.name]] for role in job.roles}
    return {role: [names.worker_pod(job.name, ordinal) for ordinal in ordinals]
            for role, ordinals in role_ordinals(job).items()}


def mesh_selector(job: JobSpec, role: str) -> str:
    """Label selector of exactly ``role``'s worker pods of the job: the job and worker labels
    and the role's rank label (any value)."""
    return (f"{constants.LABEL_JOB}={job.name},{constants.LABEL_ROLE}={constants.ROLE_WORKER},"
            f"{rank_label(role)}")


def published_meshes(job: JobSpec) -> list[dict[str, Any]]:
    """``status.meshes`` and the launcher's ``MONARCH_OPERATOR_MESHES``: per role, what
    ``KubernetesJob.add_mesh`` takes (``meshName``, ``replicas``, ``labelSelector``,
    ``podRankLabel``, ``port``); empty outside attach mode."""
    if not job.attach:
        return []
    return [{"role": role, "meshName": mesh_name(role), "labelSelector": mesh_selector(job, role),
             "podRankLabel": rank_label(role), "replicas": len(pods),
             "port": constants.MONARCH_ATTACH_PORT}
            for role, pods in role_pods(job).items()]


def pod_rank_labels(job: JobSpec, pod: str) -> dict[str, str]:
    """The rank labels worker pod ``pod`` must carry: ``{<mesh>-rank label: rank}`` for each
    role it belongs to (none for a spare worker beyond the roles' hosts)."""
    return {rank_label(role): str(pods.index(pod))
            for role, pods in role_pods(job).items() if pod in pods}


def label_changes(job: JobSpec, pods: list[dict[str, Any]]) -> dict[str, dict[str, str | None]]:
    """Per worker pod name, the label patch that gives it exactly its rank labels (a value
    to set, or None to remove a rank label it must not carry); pods already right, pods being
    deleted and pods that are not the job's workers are left out. Empty outside attach mode."""
    if not job.attach:
        return {}
    workers = set(job.worker_pod_names())
    ours = {rank_label(role) for role in role_pods(job)}
    changes: dict[str, dict[str, str | None]] = {}
    for pod in pods:
        metadata = pod.get("metadata") or {}
        name = metadata.get("name")
        if name not in workers or metadata.get("deletionTimestamp"):
            continue
        wanted = pod_rank_labels(job, name)
        labels = metadata.get("labels") or {}
        patch: dict[str, str | None] = {key: value for key, value in wanted.items()
                                        if labels.get(key) != value}
        patch.update({key: None for key in ours if key in labels and key not in wanted})
        if patch:
            changes[name] = patch
    return changes
