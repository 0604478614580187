"""The launcher batch Job: one pod running ``monarch-launch`` over the mounted hostfile."""

from __future__ import annotations

from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import child_metadata, job_labels
from monarch_operator.controller.settings import Settings
from monarch_operator.controller.spec import JobSpec

LAUNCHER_CONTAINER = "launcher"


def default_launcher_command(job: JobSpec) -> list[str]:
    """Command of the built-in trainer/ref example; meshes come from the environment."""
    return ["monarch-launch", "--steps", str(job.steps)]


def build_launcher_job(job: JobSpec, settings: Settings) -> dict[str, Any]:
    """batch/v1 Job ``<job>-launcher``: no retries (``backoffLimit: 0``), never restarted.

    The hostfile ConfigMap is mounted at ``/etc/monarch/hostfile`` and the job's private key at
    ``/etc/monarch/ssh``; ``MONARCH_*`` variables carry the mesh layout and the client address
    (the pod IP, so workers can reach the Monarch client).
    """
    labels = job_labels(job, constants.ROLE_LAUNCHER)
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {
            "name": constants.ENV_HOSTFILE,
            "value": f"{constants.HOSTFILE_DIR}/{constants.HOSTFILE_KEY}",
        },
        {"name": constants.ENV_SSH_KEY, "value": f"{constants.SSH_DIR}/{constants.SSH_PRIVATE_KEY}"},
        {"name": constants.ENV_SSH_PORT, "value": str(constants.SSH_PORT)},
        {"name": constants.ENV_TRAINER_HOSTS, "value": str(job.trainer_hosts)},
        {"name": constants.ENV_REF_HOSTS, "value": str(job.ref_hosts)},
        {"name": constants.ENV_COLOCATE, "value": "true" if job.colocate else "false"},
        {"name": constants.ENV_CLIENT_ADDRESS, "value": "tcp://$(POD_IP):0"},
    ]
    pod_spec = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.worker_user_id,
            "runAsGroup": settings.worker_user_id,
            "fsGroup": settings.worker_user_id,
        },
        "containers": [
            {
                "name": LAUNCHER_CONTAINER,
                "image": job.launcher_image,
                "command": job.launcher_command or default_launcher_command(job),
                "env": env,
                "volumeMounts": [
                    {"name": "hostfile", "mountPath": constants.HOSTFILE_DIR, "readOnly": True},
                    {"name": "ssh", "mountPath": constants.SSH_DIR, "readOnly": True},
                ],
                # The launcher writes its final failure line to /dev/termination-log; a crash
                # before it could (a traceback) still reaches status through the log tail.
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
        "volumes": [
            {"name": "hostfile", "configMap": {"name": names.hostfile_configmap(job.name)}},
            {
                "name": "ssh",
                "secret": {
                    "secretName": names.ssh_secret(job.name),
                    "defaultMode": 0o400,
                    "items": [
                        {"key": constants.SSH_PRIVATE_KEY, "path": constants.SSH_PRIVATE_KEY}
                    ],
                },
            },
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": child_metadata(job, names.launcher_job(job.name), constants.ROLE_LAUNCHER),
        "spec": {
            "backoffLimit": 0,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
