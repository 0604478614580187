"""SSH login settings and the ssh options the launcher uses for SSHJob and its pre-flight.

:func:`ssh_args` is shared by SSHJob (the workers) and :mod:`launcher.session.preflight` (the
checks before
them), so both log in exactly the same way: never prompting, never touching known_hosts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SshSettings:
    """How to log in to every host: port, user and an optional private key file."""

    port: int
    user: str
    key: str | None = None


def ssh_args(settings: SshSettings, tty: bool = True) -> list[str]:
    """Return ssh options (everything before the host) for ``settings``.

    Args:
        settings: port, user, key.
        tty: add ``-tt``. SSHJob needs it: with a remote tty, killing the local ssh client (what
            ``SSHJob.kill()`` does) hangs up the remote worker; without it workers outlive the
            job and hold their port (seen with torchmonarch 0.7.0).

    Returns:
        The option list; never prompts (BatchMode), never writes known_hosts.
    """
    args = ["-p", str(settings.port)]
    if settings.key:
        args += ["-i", settings.key]
    args += ["-l", settings.user]
    if tty:
        args.append("-tt")
    for option in (
        "BatchMode=yes",
        "StrictHostKeyChecking=no",
        "UserKnownHostsFile=/dev/null",
        "LogLevel=ERROR",
        "ConnectTimeout=5",
    ):
        args += ["-o", option]
    return args
