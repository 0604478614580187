"""The launcher pod of an attempt: ``monarch-launch`` over the mounted hostfile.

What the pod runs, in order of precedence (the CRD allows at most one of the first three):
``spec.spmd`` -> ``monarch-torchrun``; ``spec.launcher.program`` -> ``monarch-launch run``;
``spec.launcher.command`` as given; otherwise the built-in trainer/ref example.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from monarch_operator import constants, hwerrors, names
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
from monarch_operator.controller.builders.statefulset import merge_pod_template
from monarch_operator.controller.spec.attachmode import published_meshes
from monarch_operator.controller.spec.groups import roles_env_value
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec, SpmdSpec

LAUNCHER_CONTAINER = "launcher"
# Console scripts of this package in the launcher image (pyproject.toml [project.scripts]).
ROLE_LAUNCHER_COMMAND = "monarch-launch"
SPMD_LAUNCHER_COMMAND = "monarch-torchrun"


def default_launcher_command(job: JobSpec) -> list[str]:
    """Command of the built-in trainer/ref example; meshes come from the environment."""
    return [ROLE_LAUNCHER_COMMAND, "--steps", str(job.steps)]


def spmd_command(job: JobSpec, spmd: SpmdSpec) -> list[str]:
    """``monarch-torchrun --nproc-per-node N <script | -m module> args...``.

    Hosts, ssh key and port come from the ``MONARCH_*`` environment, as for ``monarch-launch``;
    ``N`` defaults to the workers' ``gpusPerWorker`` (one rank per GPU).
    """
    nproc_per_node = spmd.nproc_per_node or job.gpus_per_worker
    target = ["-m", spmd.module] if spmd.module else [str(spmd.script)]
    return [SPMD_LAUNCHER_COMMAND, "--nproc-per-node", str(nproc_per_node), *target, *spmd.args]


def launcher_command(job: JobSpec) -> list[str]:
    """The launcher container's command (see the module docstring for the precedence)."""
    if job.spmd is not None:
        return spmd_command(job, job.spmd)
    if job.launcher_program:
        base = [ROLE_LAUNCHER_COMMAND, "run", job.launcher_program]
    else:
        base = list(job.launcher_command or default_launcher_command(job))
    return [*base, *job.launcher_args]


def launcher_env(job: JobSpec, attempt: int = 1, restart_count: int = 0,
                 checkpoint: str | None = None,
                 cluster_domain: str = "cluster.local") -> list[dict[str, Any]]:
    """The launcher container's env: the operator's ``MONARCH_*`` contract, then the user's.

    ``MONARCH_ATTEMPT`` is ``attempt`` (1 for the first run, 2 after one restart, ...);
    ``MONARCH_RESTART_COUNT`` is ``restart_count`` (``status.restartCount`` when the attempt
    started: restarts after failures, not resumes) and ``MONARCH_MAX_RESTARTS`` the most the
    run policy allows, ``backoffLimit + infrastructureBackoffLimit`` (field case C21).
    ``MONARCH_PROGRESS_CONFIGMAP`` and ``MONARCH_PROGRESS_INTERVAL_SECONDS`` say where and how
    often the launcher writes the program's progress reports (``spec.progress``).
    ``MONARCH_STOP_GRACE_SECONDS`` is ``runPolicy.checkpointGracePeriodSeconds`` when above 0,
    and ``MONARCH_CHECKPOINT`` the last checkpoint an earlier launcher named (``checkpoint``,
    ``status.lastCheckpoint.location``), when there is one (launcher/stoprequest.py).
    In attach mode, ``MONARCH_OPERATOR_NAMESPACE`` and ``MONARCH_OPERATOR_MESHES`` (JSON, as
    ``status.meshes``) say what to give Monarch's ``KubernetesJob`` (docs/attach.md).
    ``MONARCH_RUNTIME_DIR`` names the pod's writable runtime folder (launcher/userentry.py).
    The mesh layout (``MONARCH_TRAINER_*``, ``MONARCH_REF_*``, ``MONARCH_COLOCATE``) is left out
    for ``spec.spmd`` jobs, which ignore the meshes; the GPU split only when the job gives it.
    A job with ``spec.roles`` gets ``MONARCH_ROLES`` instead (JSON, each role's hosts as the
    hostfile names them; docs/roles.md), the workers' names under ``cluster_domain``.
    """
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": constants.ENV_JOB_NAME, "value": job.name},
        {"name": constants.ENV_NAMESPACE, "value": job.namespace},
        {"name": constants.ENV_ATTEMPT, "value": str(attempt)},
        {"name": constants.ENV_JOB_UID, "value": job.uid},
        {"name": constants.ENV_RESTART_COUNT, "value": str(restart_count)},
        {"name": constants.ENV_MAX_RESTARTS, "value": str(
            job.run_policy.backoff_limit + job.run_policy.infrastructure_backoff_limit)},
        {
            "name": constants.ENV_HOSTFILE,
            "value": f"{constants.HOSTFILE_DIR}/{constants.HOSTFILE_KEY}",
        },
        {
            "name": constants.ENV_HOST_ADDRESSES,
            "value": f"{constants.HOSTFILE_DIR}/{constants.ADDRESSES_KEY}",
        },
        {
            "name": constants.ENV_SSH_KEY,
            "value": f"{constants.SSH_DIR}/{constants.SSH_PRIVATE_KEY}",
        },
        {"name": constants.ENV_SSH_PORT, "value": str(constants.SSH_PORT)},
        {
            "name": constants.ENV_KNOWN_HOSTS,
            "value": f"{constants.SSH_DIR}/{constants.SSH_KNOWN_HOSTS}",
        },
    ]
    if job.roles:
        env.append({"name": constants.ENV_ROLES, "value": roles_env_value(
            job.name, job.namespace, cluster_domain, job.worker_groups, job.roles)})
    elif job.spmd is None:
        env += [
            {"name": constants.ENV_TRAINER_HOSTS, "value": str(job.trainer_hosts)},
            {"name": constants.ENV_REF_HOSTS, "value": str(job.ref_hosts)},
            {"name": constants.ENV_COLOCATE, "value": "true" if job.colocate else "false"},
        ]
        for name, gpus in [
            (constants.ENV_TRAINER_GPUS, job.trainer_gpus),
            (constants.ENV_REF_GPUS, job.ref_gpus),
        ]:
            if gpus is not None:
                env.append({"name": name, "value": str(gpus)})
    if job.run_policy.checkpoint_grace_seconds > 0:
        env.append({"name": constants.ENV_STOP_GRACE,
                    "value": str(job.run_policy.checkpoint_grace_seconds)})
    if checkpoint:
        env.append({"name": constants.ENV_CHECKPOINT, "value": checkpoint})
    env += [{"name": constants.ENV_PROGRESS_CONFIGMAP,
             "value": names.progress_configmap(job.name)},
            {"name": constants.ENV_PROGRESS_INTERVAL, "value": str(job.progress_interval_seconds)}]
    if job.run_policy.progress_deadline_seconds is not None:
        env.append({"name": constants.ENV_PROGRESS_DEADLINE,
                    "value": str(job.run_policy.progress_deadline_seconds)})
    if job.run_policy.hardware_errors_env:  # the launcher names the host of a hardware fault
        env.append({"name": hwerrors.ENV, "value": job.run_policy.hardware_errors_env})
    env.append({"name": constants.ENV_CLIENT_ADDRESS, "value": "tcp://$(POD_IP):0"})
    env.append(runtime_env())
    if job.attach:
        env += [{"name": constants.ENV_OPERATOR_NAMESPACE, "value": job.namespace},
                {"name": constants.ENV_OPERATOR_MESHES,
                 "value": json.dumps(published_meshes(job), sort_keys=True)}]
    return env + copy.deepcopy(job.launcher_env)


def build_launcher_pod(job: JobSpec, settings: Settings, attempt: int = 1,
                       restart_count: int = 0, checkpoint: str | None = None) -> dict[str, Any]:
    """The launcher Pod of ``attempt`` (``<job>-launcher``, then ``<job>-launcher-<n>``), owned
    by the job and created by the operator itself, never restarted in place
    (``restartPolicy: Never``; the operator's run policy decides on restarts).
    ``restart_count``: the job's restarts after failures when the attempt started, and
    ``checkpoint`` the last checkpoint an earlier launcher named (:func:`launcher_env`).

    A bare pod rather than a batch Job: the Job would add nothing the run policy does not do
    (it ran with ``backoffLimit: 0``), and its pod waited for the controller manager's Job
    controller, whose API rate limit the StatefulSet controller shares; with 200 jobs starting
    at once that put the launcher pod 1.7 s (p50) behind the last Ready worker (docs/performance.md,
    "The launcher is a pod of its own"). KubeRay and Volcano create their pods directly too.

    The hostfile ConfigMap is mounted at ``/etc/monarch/hostfile``, and the job's private key
    and the known_hosts pinning the workers' host key at ``/etc/monarch/ssh``; ``MONARCH_*``
    variables carry the mesh layout and the client address
    (the pod IP, so workers can reach the Monarch client). ``spec.launcher.template`` is merged
    over the generated pod template (containers by name, as for workers; its labels and
    annotations go on the pod); the job's labels, the owner reference and
    ``restartPolicy: Never`` stay, because the operator finds and judges the pod by them.
    Quantities written as numbers (``cpu: 2``) are sent as strings.
    """
    labels = {**job_labels(job, constants.ROLE_LAUNCHER), constants.LABEL_ATTEMPT: str(attempt)}
    container: dict[str, Any] = {
        "name": LAUNCHER_CONTAINER,
        "image": job.launcher_image,
        "command": launcher_command(job),
        "securityContext": container_security_context(),
        "env": launcher_env(job, attempt, restart_count, checkpoint, settings.cluster_domain),
        "volumeMounts": [
            {"name": "hostfile", "mountPath": constants.HOSTFILE_DIR, "readOnly": True},
            {"name": "ssh", "mountPath": constants.SSH_DIR, "readOnly": True},
            # The passwd entry and home of a uid the image does not know (userentry.py).
            runtime_mount(),
        ],
        # The launcher writes its final failure line to /dev/termination-log; a crash before
        # it could (a traceback) still reaches status through the log tail.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if job.launcher_resources:
        container["resources"] = copy.deepcopy(job.launcher_resources)
    pod_spec = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        # A token for its own ServiceAccount, which may write the job's progress ConfigMap
        # and nothing else (builders/progress.py).
        "serviceAccountName": names.launcher_account(job.name),
        "automountServiceAccountToken": True,
        "securityContext": pod_security_context(settings.worker_user_id),
        "containers": [container],
        "volumes": [
            {"name": "hostfile", "configMap": {"name": names.hostfile_configmap(job.name)}},
            ssh_secret_volume(job, "ssh", (constants.SSH_PRIVATE_KEY, constants.SSH_KNOWN_HOSTS)),
            runtime_volume(),
        ],
    }
    template = merge_pod_template(
        {"metadata": pod_metadata(job, labels), "spec": pod_spec}, job.launcher_template
    )
    from_template = template.get("metadata") or {}
    metadata = child_metadata(job, names.launcher_pod(job.name, attempt), constants.ROLE_LAUNCHER)
    metadata["labels"] = {**(from_template.get("labels") or {}), **labels}
    if from_template.get("annotations"):
        metadata["annotations"] = dict(from_template["annotations"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": quantities_as_strings({**template["spec"], "restartPolicy": "Never"}),
    }
