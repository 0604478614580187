"""Why an ssh login that sshd accepted still failed: the session could not start on the host.

A worker whose sshd runs as another user than the one the launcher logs in as (a MonarchJob
worker template with ``runAsUser``, a container started as non-root) accepts the key and then
cannot switch to that user: sshd logs that it could not set the uid, and the client only sees
the connection end (``client_loop: send disconnect: Broken pipe``, or nothing at all), which the
pre-flight used to report as ``SSHUnreachable`` (issue 20, item 6). :func:`session_refused`
asks again with ssh's verbose log, which says whether authentication succeeded; if it did, the
failure is the host's session set-up, reported as :data:`SSH_SESSION_FAILED` with whatever the
server said.
"""

from __future__ import annotations

import subprocess

from monarch_operator.launcher.session.ssh import SshSettings, ssh_args

# sshd accepted the login but could not start a session for the user.
SSH_SESSION_FAILED = "SSHSessionFailed"
# ssh's verbose log line once the server accepted the key (OpenSSH 7.8 and later).
_AUTHENTICATED = "Authenticated to "
# Verbose lines that say nothing about why the session ended.
_NOISE = ("Authenticated to ", "Transferred: ", "Bytes per second", "Warning: Permanently added")


def session_refused(
    host: str, address: str, settings: SshSettings, timeout_s: float = 15.0
) -> str | None:
    """Return a detail line when ``host`` accepts our key but cannot start a session, else None.

    Args:
        host: the host's name as given (its key is checked under it).
        address: where ssh connects.
        settings: login settings.
        timeout_s: wall limit of the diagnostic login, seconds.

    Returns:
        ``"logged in as root with the key, but the host's sshd ended the session before running
        anything ..."`` naming the user, the likely cause and the server's own words, or None
        when authentication did not succeed (or the diagnostic could not run).
    """
    # ssh uses the first value given for an option: this LogLevel wins over ssh_args' own.
    command = ["ssh", "-o", "LogLevel=VERBOSE", *ssh_args(settings, host, tty=False)]
    try:
        result = subprocess.run(
            [*command, "-n", address, "true"],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except (subprocess.TimeoutExpired, OSError):
        return None
    if result.returncode == 0 or _AUTHENTICATED not in result.stderr:
        return None
    said = [
        line.strip()
        for line in result.stderr.splitlines()
        if line.strip() and not line.startswith(_NOISE) and not line.startswith("debug")
    ]
    words = f"; ssh said: {said[-1]}" if said else ""
    return (
        f"logged in as {settings.user} with the key, but the host's sshd ended the session "
        f"before running anything: it could not start a session for {settings.user}. Most often "
        f"sshd runs as another, non-root user and cannot set its uid to {settings.user} (a "
        "worker container run as non-root: log in as the user sshd runs as with --ssh-user, "
        f"or run sshd as root){words}"
    )
