"""The per-job SSH key Secret: private key for the launcher, authorized_keys for workers."""

from __future__ import annotations

import base64
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import child_metadata
from monarch_operator.controller.spec import JobSpec


def build_ssh_secret(job: JobSpec, private_key_pem: bytes, public_key_line: bytes) -> dict[str, Any]:
    """Secret ``<job>-ssh`` with the key pair generated for this job.

    Args:
        private_key_pem: OpenSSH private key (``-----BEGIN OPENSSH PRIVATE KEY-----``).
        public_key_line: ``ssh-ed25519 AAAA... comment`` line; also the ``authorized_keys``.
    """

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(job, names.ssh_secret(job.name)),
        "type": "Opaque",
        "data": {
            constants.SSH_PRIVATE_KEY: b64(private_key_pem),
            constants.SSH_PUBLIC_KEY: b64(public_key_line),
            constants.SSH_AUTHORIZED_KEYS: b64(public_key_line),
        },
    }
