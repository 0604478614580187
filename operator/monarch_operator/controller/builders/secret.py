"""The per-job SSH key Secret: the client key pair, the workers' host key, and known_hosts.

Workers mount ``authorized_keys`` and the host key; the launcher mounts the private client key
and ``known_hosts``, which pins the host key for every worker name of the job. Why one host key
for all the workers of a job (and not one per ordinal) is in docs/security.md.
"""

from __future__ import annotations

import base64
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import child_metadata
from monarch_operator.controller.builders.sshkeys import JobKeys
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec


def worker_host_pattern(job: JobSpec, settings: Settings) -> str:
    """The known_hosts host pattern that matches every worker of ``job`` on the sshd port
    (one per worker group, comma-separated, as known_hosts lists several patterns).

    ``[*.<job>-worker.<namespace>.svc.<cluster domain>]:2222``: ssh looks a host on a port
    other than 22 up as ``[name]:port`` (sshd(8), SSH_KNOWN_HOSTS FILE FORMAT), and the hostfile
    names each worker by its FQDN under the job's headless Service, so the one pattern covers
    every ordinal, including ones added by a later scale-up.
    """
    return ",".join(
        f"[*.{names.group_set(job.name, group.name)}.{job.namespace}.svc."
        f"{settings.cluster_domain}]:{constants.SSH_PORT}" for group in job.groups)


def known_hosts_text(job: JobSpec, settings: Settings, host_public_key_line: bytes) -> bytes:
    """The launcher's known_hosts: one line pinning the job's host key for all its workers.

    Args:
        host_public_key_line: ``ssh-ed25519 AAAA... comment`` of the workers' host key.

    Returns:
        ``[*.<job>-worker.<ns>.svc.<domain>]:2222 ssh-ed25519 AAAA... comment\\n``.
    """
    return worker_host_pattern(job, settings).encode() + b" " + host_public_key_line.strip() + b"\n"


def build_ssh_secret(job: JobSpec, settings: Settings, keys: JobKeys) -> dict[str, Any]:
    """Secret ``<job>-ssh`` with the keys generated for this job and the known_hosts pinning
    the host key.

    Args:
        keys: the job's client and host key pairs (:func:`controller.sshkeys.generate_job_keys`).

    Returns:
        The Secret, with data keys ``id_ed25519``, ``id_ed25519.pub``, ``authorized_keys``,
        ``ssh_host_ed25519_key``, ``ssh_host_ed25519_key.pub`` and ``known_hosts``.
    """

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(job, names.ssh_secret(job.name)),
        "type": "Opaque",
        "data": {
            constants.SSH_PRIVATE_KEY: b64(keys.client_private),
            constants.SSH_PUBLIC_KEY: b64(keys.client_public),
            constants.SSH_AUTHORIZED_KEYS: b64(keys.client_public),
            constants.SSH_HOST_KEY: b64(keys.host_private),
            constants.SSH_HOST_PUBLIC_KEY: b64(keys.host_public),
            constants.SSH_KNOWN_HOSTS: b64(known_hosts_text(job, settings, keys.host_public)),
        },
    }
