"""Per-job SSH key pairs, made with ``cryptography`` (ed25519, OpenSSH encodings)."""

from __future__ import annotations

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
