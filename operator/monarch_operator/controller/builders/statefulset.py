"""The worker StatefulSet: GPU pods whose single container runs sshd (workers are its children),
or, in attach mode, Monarch's worker loop itself.

sshd must run in the GPU container: SSHJob starts each Monarch worker as a child of sshd, and
Kubernetes grants GPUs per container, so a separate sshd container would start GPU-less workers.
The attach-mode worker loop runs there for the same reason.
"""

from __future__ import annotations

import copy
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import (
    child_metadata,
    container_security_context,
    job_labels,
    pod_metadata,
    pod_security_context,
    quantities_as_strings,
    runtime_env,
    runtime_mount,
    runtime_volume,
    ssh_secret_volume,
)
from monarch_operator.controller.spec.groups import WorkerGroup
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec

WORKER_CONTAINER = "worker"
SSH_VOLUME = "ssh"
# Field case C25: a container's /dev/shm is 64 MiB unless something is mounted there, and NCCL,
# torch DataLoader workers and Monarch's shared-memory transport need far more. Each worker gets a
# memory-backed emptyDir there with no sizeLimit of ours: the kubelet then sizes the tmpfs to the
# pod's memory limit when it has one, else to the node's allocatable memory, and its pages count
# against the container's memory. A template changes it by name (a `sizeLimit` on volume
# "dshm"), or replaces it by mounting its own volume at /dev/shm.
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"
# Entrypoint of images/worker: prepares sshd's runtime paths and host keys, then runs sshd.
WORKER_ENTRYPOINT = "/usr/local/bin/monarch-worker-entrypoint"
# Attach mode: the worker image's Python runs Monarch's worker loop (launcher/attachworker.py).
ATTACH_WORKER_COMMAND = ("python", "-u", "-m", "monarch_operator.launcher.attachworker")
# With a checkpoint grace period: the worker pod's terminationGracePeriodSeconds is that period
# plus this margin (sshd's own stop, the kubelet's delay in sending SIGTERM).
WORKER_STOP_MARGIN_SECONDS = 15


def group_labels(job: JobSpec, group: WorkerGroup) -> dict[str, str]:
    """The labels that select worker group ``group``'s pods (its StatefulSet's and Service's
    selector): the job's worker labels, and for a named group its name
    (``monarch-operator.dev/group``; the unnamed group of ``spec.workers`` has none, so its
    StatefulSet's selector and template stay as they were)."""
    labels = job_labels(job, constants.ROLE_WORKER)
    if group.labelled:
        labels[constants.LABEL_GROUP] = group.name
    return labels


def build_worker_statefulsets(job: JobSpec, settings: Settings) -> list[dict[str, Any]]:
    """One StatefulSet per worker group, in hostfile order (:func:`build_worker_statefulset`)."""
    return [build_worker_statefulset(job, settings, group) for group in job.groups]


def build_worker_statefulset(job: JobSpec, settings: Settings,
                             group: WorkerGroup | None = None) -> dict[str, Any]:
    """StatefulSet ``<job>-<group>`` (``<job>-worker`` for a job without worker groups) with
    the group's ``replicas`` pods, Parallel pod management; ``group`` None: the job's first.

    Each pod requests the group's ``gpusPerWorker`` GPUs (none at 0), mounts only
    ``authorized_keys`` and the host key of the job's Secret (never the client's private key),
    is Ready once sshd accepts TCP on port 2222, and searches its group's Service domain. In
    attach mode (``spec.mode: attach``) each pod runs Monarch's worker loop instead, mounts no
    keys and is Ready once the loop accepts TCP on ``MONARCH_PORT`` (26600).
    ``spec.workers.template`` is merged over the generated pod template (containers by name),
    then the group's own ``template`` over that.
    """
    group = group or job.groups[0]
    labels = group_labels(job, group)
    metadata = pod_metadata(job, labels)
    # The operator's default worker labels (chart workerDefaults.labels) under the job's own.
    metadata["labels"] = {**dict(settings.worker_labels), **metadata["labels"]}
    template = {"metadata": metadata, "spec": _worker_pod_spec(job, settings, group)}
    template = merge_pod_template(template, job.worker_template)
    template = merge_pod_template(template, group.template)
    _keep_one_shm_mount(template["spec"])
    # `cpu: 2` in the user's template is valid Kubernetes; the client must send it as "2" (C12A).
    template["spec"] = quantities_as_strings(template["spec"])
    # The selector labels win over the user's template: the StatefulSet must find its pods.
    template["metadata"].setdefault("labels", {}).update(labels)
    metadata = child_metadata(job, names.group_set(job.name, group.name), constants.ROLE_WORKER)
    if group.labelled:
        metadata["labels"][constants.LABEL_GROUP] = group.name
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "serviceName": names.group_set(job.name, group.name),
            "replicas": group.replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": template,
        },
    }


def _worker_pod_spec(job: JobSpec, settings: Settings, group: WorkerGroup) -> dict[str, Any]:
    service_domain = (
        f"{names.group_set(job.name, group.name)}.{job.namespace}.svc.{settings.cluster_domain}"
    )
    spec: dict[str, Any] = {
        # No kubelet-style <SERVICE>_HOST variables pointing at ClusterIPs.
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(settings.worker_user_id),
        "dnsConfig": {"searches": [service_domain]},
        "containers": [_attach_container(job, group, service_domain) if job.attach
                       else _ssh_container(group)],
        "volumes": [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}, runtime_volume()],
    }
    if not job.attach:  # attach mode runs no sshd: no keys on the workers
        spec["volumes"].append(ssh_secret_volume(
            job, SSH_VOLUME, (constants.SSH_AUTHORIZED_KEYS, constants.SSH_HOST_KEY)))
    # The operator's default worker env (chart workerDefaults.env): its own names win, and a
    # template's env merges over all of it by name.
    container_env = spec["containers"][0]["env"]
    taken = {item["name"] for item in container_env}
    container_env.extend({"name": name, "value": value}
                         for name, value in settings.worker_env if name not in taken)
    grace = job.run_policy.checkpoint_grace_seconds
    if grace > 0:
        # Checkpoint before a stop: a drained or preempted worker keeps its open ssh sessions
        # (its ranks may be saving state for the launcher, which the operator asks to stop
        # first) for up to `grace` seconds after SIGTERM (images/worker/entrypoint.sh), and
        # the kubelet must not kill it before: the pod's grace period covers that and sshd's
        # own stop. A template's terminationGracePeriodSeconds still wins.
        spec["containers"][0]["env"].append({"name": constants.ENV_STOP_GRACE,
                                             "value": str(grace)})
        spec["terminationGracePeriodSeconds"] = grace + WORKER_STOP_MARGIN_SECONDS
    return spec


def _gpu_resources(group: WorkerGroup) -> dict[str, Any]:
    """The worker container's GPU limit; none for a CPU-only group (0 GPUs)."""
    if group.gpus_per_worker == 0:
        return {}
    return {"limits": {constants.GPU_RESOURCE: str(group.gpus_per_worker)}}


def _ssh_container(group: WorkerGroup) -> dict[str, Any]:
    """SSH mode's worker container: sshd (the image's entrypoint), Ready once it accepts TCP."""
    return {
        "name": WORKER_CONTAINER,
        "image": group.image,
        "command": [WORKER_ENTRYPOINT],
        "securityContext": container_security_context(),
        "env": [
            {"name": "SSH_PORT", "value": str(constants.SSH_PORT)},
            {
                "name": "SSH_AUTHORIZED_KEYS",
                "value": f"{constants.SSH_DIR}/{constants.SSH_AUTHORIZED_KEYS}",
            },
            # The job's host key, pinned in the launcher's known_hosts; the entrypoint
            # copies it to a private 0600 file (fsGroup makes the mounted one 0440).
            {
                "name": "SSH_HOST_KEY",
                "value": f"{constants.SSH_DIR}/{constants.SSH_HOST_KEY}",
            },
            # sshd's files, and the passwd entry and home of a uid the image does not know.
            runtime_env(),
        ],
        "ports": [
            {"name": "ssh", "containerPort": constants.SSH_PORT},
            {"name": "monarch", "containerPort": constants.MONARCH_WORKER_PORT},
        ],
        "readinessProbe": {
            "tcpSocket": {"port": constants.SSH_PORT},
            "periodSeconds": 2,
            "failureThreshold": 1,
        },
        "resources": _gpu_resources(group),
        "volumeMounts": [
            {"name": SSH_VOLUME, "mountPath": constants.SSH_DIR, "readOnly": True},
            {"name": SHM_VOLUME, "mountPath": SHM_PATH},
            runtime_mount(),
        ],
    }


def _attach_container(job: JobSpec, group: WorkerGroup, service_domain: str) -> dict[str, Any]:
    """Attach mode's worker container: Monarch's worker loop in the GPU container (procs it
    spawns see the GPUs), on ``MONARCH_PORT``, Ready once the loop accepts TCP there, so that
    Ready means what Monarch's ``KubernetesJob`` takes it to mean (it attaches to Ready pods).

    ``MONARCH_PORT`` comes first in the env, as a literal value: ``KubernetesJob`` reads the
    port from the first container's env that has it and ignores ``valueFrom``.
    """
    return {
        "name": WORKER_CONTAINER,
        "image": group.image,
        "command": list(ATTACH_WORKER_COMMAND),
        "securityContext": container_security_context(),
        "env": [
            {"name": constants.ENV_MONARCH_PORT, "value": str(constants.MONARCH_ATTACH_PORT)},
            {"name": constants.ENV_WORKER_DOMAIN, "value": service_domain},
            runtime_env(),
        ],
        "ports": [{"name": "monarch", "containerPort": constants.MONARCH_ATTACH_PORT}],
        "readinessProbe": {
            "tcpSocket": {"port": constants.MONARCH_ATTACH_PORT},
            "periodSeconds": 2,
            "failureThreshold": 1,
        },
        "resources": _gpu_resources(group),
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": SHM_PATH}, runtime_mount()],
    }


def _keep_one_shm_mount(spec: dict[str, Any]) -> None:
    """When the user's template mounts a volume of its own at ``/dev/shm`` in the worker
    container, drop ours (mount and volume): the user's wins, never two mounts on one path."""
    for container in spec.get("containers") or []:
        if container.get("name") != WORKER_CONTAINER:
            continue
        mounts = container.get("volumeMounts") or []
        theirs = [m for m in mounts if m.get("mountPath") == SHM_PATH
                  and m.get("name") != SHM_VOLUME]
        if theirs:
            container["volumeMounts"] = [m for m in mounts if m.get("name") != SHM_VOLUME]
            spec["volumes"] = [v for v in spec.get("volumes") or []
                               if v.get("name") != SHM_VOLUME]


def merge_pod_template(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base``; lists of named items merge by ``name``.

    Other lists and scalars from ``override`` replace those of ``base``. Neither input changes.
    """
    merged = copy.deepcopy(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = merge_pod_template(current, value)
        elif isinstance(current, list) and isinstance(value, list) and _all_named(current + value):
            by_name = {item["name"]: item for item in current}
            for item in value:
                by_name[item["name"]] = (
                    merge_pod_template(by_name[item["name"]], item)
                    if item["name"] in by_name
                    else copy.deepcopy(item)
                )
            merged[key] = list(by_name.values())
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _all_named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(item, dict) and "name" in item for item in items)
