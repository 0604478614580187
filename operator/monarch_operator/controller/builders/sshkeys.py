"""Per-job SSH keys, made with ``cryptography`` (ed25519, OpenSSH encodings).

A job gets two key pairs, both generated once when its Secret is made and never rotated:
the client key (the launcher logs in with it; workers list it in ``authorized_keys``) and the
host key (every worker's sshd presents it; the launcher pins it in ``known_hosts``).
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def generate_ssh_keypair(comment: str) -> tuple[bytes, bytes]:
    """Generate a new ed25519 key pair.

    Args:
        comment: appended to the public key line (e.g. ``monarch-job team-a/demo``).

    Returns:
        ``(private_key_pem, public_key_line)``: the unencrypted OpenSSH private key and the
        ``ssh-ed25519 AAAA... comment\\n`` line for ``authorized_keys``.
    """
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.OpenSSH,
        encryption_algorithm=serialization.NoEncryption(),
    )
    public_line = key.public_key().public_bytes(
        encoding=serialization.Encoding.OpenSSH, format=serialization.PublicFormat.OpenSSH
    )
    return private_pem, public_line + b" " + comment.encode() + b"\n"


@dataclass(frozen=True)
class JobKeys:
    """A job's two key pairs (see the module docstring); OpenSSH encodings as bytes.

    Attributes:
        client_private: the launcher's private key (``-----BEGIN OPENSSH PRIVATE KEY-----``).
        client_public: its ``ssh-ed25519 AAAA... comment`` line, the workers' authorized_keys.
        host_private: the workers' sshd host key.
        host_public: its ``ssh-ed25519 AAAA... comment`` line, pinned in known_hosts.
    """

    client_private: bytes
    client_public: bytes
    host_private: bytes
    host_public: bytes


def generate_job_keys(namespace: str, job_name: str) -> JobKeys:
    """Generate a fresh client key pair and host key pair for job ``namespace/job_name``.

    The public key comments name the job (``monarch-job team-a/demo`` and
    ``monarch-job team-a/demo host key``), so a key found in a file says where it came from.
    """
    client_private, client_public = generate_ssh_keypair(f"monarch-job {namespace}/{job_name}")
    host_private, host_public = generate_ssh_keypair(
        f"monarch-job {namespace}/{job_name} host key"
    )
    return JobKeys(client_private, client_public, host_private, host_public)
