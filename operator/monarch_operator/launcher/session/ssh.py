"""SSH login settings and the ssh options of every connection the launcher makes.

:func:`ssh_args` is shared by SSHJob (the workers), the pre-flight, the exit-record reader and
the cleanup of private env files, so all of them log in, and check host keys, the same way:
never prompting (BatchMode) and never with ``StrictHostKeyChecking=no``.

- With a known_hosts file (``--known-hosts FILE``, env ``MONARCH_KNOWN_HOSTS``; a MonarchJob's
  launcher pod gets the job's): strict checking against that file alone
  (``StrictHostKeyChecking=yes``, ``GlobalKnownHostsFile=/dev/null``); a host missing from it,
  or presenting another key, is refused.
- Without one: ssh's own files (``~/.ssh/known_hosts``, ``/etc/ssh/ssh_known_hosts``) with
  ``StrictHostKeyChecking=accept-new``: a host never seen is remembered on first use, a key that
  differs from the remembered one is refused.

Every host is looked up under the name it was given (hostfile, ``--hosts``, Slurm), as
``ssh -p PORT name`` would look it up, whatever address the launcher connects to
(``HostKeyAlias``; ssh_config(5)). :func:`host_key_failure` turns ssh's refusal into one line
that names the host, the file and what to do.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from monarch_operator.launcher.session.fanout import (
    DEFAULT_CONCURRENCY,
    DEFAULT_RETRIES,
    CommandResult,
)

# The port ssh files known_hosts entries under without a "[name]:port" wrapper.
DEFAULT_SSH_PORT = 22
# Pre-flight reasons for a refused host key (see host_key_failure).
HOST_KEY_UNKNOWN = "HostKeyUnknown"
HOST_KEY_CHANGED = "HostKeyChanged"
# Where ssh keeps what accept-new learns, when no known_hosts file is given.
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
# ssh keepalives on every connection (--ssh-alive-interval, --ssh-alive-count): a hung host or
# dead session is given up after 15 s x 4 = 60 s of silence (75 s at most), and an idle session
# sends something every 15 s, well within a 60 s idle timeout of a NAT or firewall. The worker
# image's sshd uses the same values (ClientAliveInterval, ClientAliveCountMax).
ALIVE_INTERVAL_S = 15
ALIVE_COUNT_MAX = 4


# Wall limit of one short command over ssh (a login and a few file operations), seconds: the
# pre-flight's checks, the removal of private env files, the reading of exit records. ssh's
# own ConnectTimeout (5 s, below) covers only the TCP connect and the banner; key exchange and
# authentication of many logins at once on a loaded host take longer (CI, 64 hosts behind 4
# sshd on 2 cores: 4 removals gave no answer within a 5 s limit while the same hosts had just
# answered pre-flight). Every such command gets this one limit, never less.
COMMAND_LIMIT_S = 20.0


@dataclass(frozen=True)
class SshSettings:
    """How to log in to every host and check its host key.

    Attributes:
        port: sshd port on every host.
        user: login user on every host.
        key: private key file, or None for ssh's own choice.
        known_hosts: the only known_hosts file to trust (strict checking), or None for ssh's
            own files with ``accept-new`` (see the module docstring).
        alive_interval_s: seconds of silence after which ssh asks the server whether it is
            still there (``ServerAliveInterval``).
        alive_count_max: unanswered asks after which ssh gives the host up and exits 255
            (``ServerAliveCountMax``).
        concurrency: ssh connections being opened at once (:mod:`launcher.session.fanout`).
        retries: retries of a transient refusal such as ``Exceeded MaxStartups``.
    """

    port: int
    user: str
    key: str | None = None
    known_hosts: str | None = None
    alive_interval_s: int = ALIVE_INTERVAL_S
    alive_count_max: int = ALIVE_COUNT_MAX
    concurrency: int = DEFAULT_CONCURRENCY
    retries: int = DEFAULT_RETRIES


def known_hosts_name(host: str, port: int) -> str:
    """The name ssh files ``host`` under in known_hosts: ``host`` on port 22, else
    ``[host]:port`` (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT")."""
    return host if port == DEFAULT_SSH_PORT else f"[{host}]:{port}"


def _option_value(value: str) -> str:
    # ssh expands %-tokens in UserKnownHostsFile and splits -o values on blanks unless quoted.
    value = value.replace("%", "%%")
    if re.search(r"[\s\"'\\]", value):
        value = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def ssh_args(settings: SshSettings, host: str | None, tty: bool = True) -> list[str]:
    """Return ssh options (everything before the destination) for one host.

    Args:
        settings: port, user, key, known_hosts.
        host: the host's name as the user gave it; its key is checked under this name
            (``HostKeyAlias``), whatever address ssh connects to. None: checked under the
            destination itself (callers that connect to the names they were given).
        tty: add ``-tt`` (a remote pseudo-terminal). The workers' sessions do not use it: it
            turns every line end of their output into ``\\r\\n`` (field case C30); the session
            guard (:mod:`launcher.session.guard`) does the hangup a terminal would do.

    Returns:
        The option list; never prompts (BatchMode), never skips host key checking.
    """
    args = ["-p", str(settings.port)]
    if settings.key:
        args += ["-i", settings.key]
    args += ["-l", settings.user]
    if tty:
        args.append("-tt")
    options = ["BatchMode=yes"]
    if host is not None:
        options.append(f"HostKeyAlias={known_hosts_name(host, settings.port)}")
    if settings.known_hosts:
        path = os.path.abspath(os.path.expanduser(settings.known_hosts))
        options += [
            "StrictHostKeyChecking=yes",
            f"UserKnownHostsFile={_option_value(path)}",
            "GlobalKnownHostsFile=/dev/null",
        ]
    else:
        options.append("StrictHostKeyChecking=accept-new")
    # The key is checked under the name; an IP address entry would add nothing but warnings.
    options += ["CheckHostIP=no", "LogLevel=ERROR", "ConnectTimeout=5"]
    # Keepalives inside the encrypted channel (ssh_config(5)): a silent host is given up after
    # interval x count seconds, and an idle session still sends a packet every interval, so
    # an idle-timeout middlebox never cuts it. TCPKeepAlive (on by default) is not enough: its
    # first probe comes after the kernel's 2 hours.
    options += [
        f"ServerAliveInterval={settings.alive_interval_s}",
        f"ServerAliveCountMax={settings.alive_count_max}",
    ]
    for option in options:
        args += ["-o", option]
    return args


def ssh_runner(
    settings: SshSettings, command_for: Callable[[str], str], timeout_s: float
) -> Callable[[str, str], CommandResult]:
    """``(address, host) -> CommandResult``: one attempt of a remote command, stdin closed
    (``-n``); for :func:`launcher.session.fanout.run_on_hosts`.

    Args:
        settings: how to log in.
        command_for: the remote shell command for an address.
        timeout_s: wall limit of one attempt, seconds; past it the result's ``exit_status`` is
            None (no answer).
    """

    def run_once(address: str, host: str) -> CommandResult:
        try:
            result = subprocess.run(
                ["ssh", *ssh_args(settings, host, tty=False), "-n", address, command_for(address)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return CommandResult(None, "", "")
        return CommandResult(result.returncode, result.stdout, result.stderr)

    return run_once


_OFFENDING = re.compile(r"Offending \S+ key in (?P<file>.+):(?P<line>\d+)")
_FINGERPRINT = re.compile(r"^(?P<fingerprint>SHA256:\S+?)\.?$", re.MULTILINE)
_UNKNOWN = re.compile(r"No \S+ host key is known for (?P<name>\S+)")


def host_key_failure(stderr: str, host: str, settings: SshSettings) -> tuple[str, str] | None:
    """Explain an ssh failure caused by host key checking, or return None for other failures.

    Args:
        stderr: ssh's whole error output (exit status 255).
        host: the host's name as given (what its key was checked under).
        settings: the settings ssh ran with.

    Returns:
        ``(reason, detail)``: :data:`HOST_KEY_CHANGED` when the host presented a key other than
        the one pinned for it, :data:`HOST_KEY_UNKNOWN` when no key is known for it under
        strict checking; ``detail`` names the host, the known_hosts file and what to do.
    """
    name = known_hosts_name(host, settings.port)
    given = settings.known_hosts or USER_KNOWN_HOSTS
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr or "has changed and you have" in stderr:
        offending = _OFFENDING.search(stderr)
        where = f"{offending['file']}:{offending['line']}" if offending else given
        path = offending["file"] if offending else given
        fingerprint = _FINGERPRINT.search(stderr)
        presented = f" ({fingerprint['fingerprint']})" if fingerprint else ""
        return HOST_KEY_CHANGED, (
            f"{host} presented a host key{presented} other than the one {where} pins for "
            f"{name}; refused: someone may be intercepting the connection, or the host has a "
            f"new key (in a MonarchJob: the worker is not presenting its job's host key from "
            f"the job's Secret). Only if you know the host was re-created: remove the old key "
            f"with ssh-keygen -f '{path}' -R '{name}' and run again"
        )
    unknown = _UNKNOWN.search(stderr)
    if unknown or "Host key verification failed" in stderr:
        return HOST_KEY_UNKNOWN, (
            f"no host key for {name} in {given}; refused (strict checking): add the host's key "
            f"to that file once you have checked it (ssh-keyscan -p {settings.port} {host} "
            f"prints it; compare its fingerprint with ssh-keygen -lf on the host), or fix "
            f"the host name"
        )
    return None
