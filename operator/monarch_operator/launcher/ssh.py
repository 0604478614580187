"""SSH options for Monarch's SSHJob and a preflight that runs the worker Python on every host.

The preflight turns the usual silent failures (key refused, wrong ``--python-exe``, package not
installed on a host) into an error naming the host and quoting ssh's stderr within seconds; once
SSHJob has started, the same faults only show as an attach timeout.
"""

from __future__ import annotations

import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

# What a worker host must be able to import: Monarch itself, and the module holding the actor
# classes, which the procs unpickle by reference. find_spec avoids importing torch (~2 s CPU).
_PREFLIGHT_SCRIPT = """
import importlib.util, sys
missing = []
for name in ("monarch", "monarch_operator.launcher.workload"):
    try:
        found = importlib.util.find_spec(name) is not None
    except ImportError:
        found = False
    if not found:
        missing.append(name)
if missing:
    print("cannot import: " + ", ".join(missing), file=sys.stderr)
    sys.exit(3)
"""

# ssh's own exit status for connection or authentication errors.
_SSH_ERROR = 255


class PreflightError(RuntimeError):
    """ssh or the worker Python failed on one or more hosts; the message names each."""


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


def _preflight_one(
    address: str, settings: SshSettings, python_exe: str, timeout_s: float
) -> str | None:
    command = f"{shlex.quote(python_exe)} -c {shlex.quote(_PREFLIGHT_SCRIPT)}"
    try:
        result = subprocess.run(
            ["ssh", *ssh_args(settings, tty=False), "-n", address, command],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:g} s"
    if result.returncode == 0:
        return None
    detail = result.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
    what = (
        "ssh failed"
        if result.returncode == _SSH_ERROR
        else f"{python_exe} exited {result.returncode}"
    )
    return f"{what}: {detail[0]}"


def preflight(
    addresses: dict[str, str], settings: SshSettings, python_exe: str, timeout_s: float = 20.0
) -> None:
    """Log in to every host in parallel and check that ``python_exe`` can import the workers.

    Args:
        addresses: ``{host name: address}``; ssh connects to the address.
        settings: ssh login settings.
        python_exe: the worker interpreter path, the same on every host.
        timeout_s: wall limit per host, seconds.

    Raises:
        PreflightError: listing every failing host with its address and the last stderr line.
    """
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(addresses)))) as pool:
        futures = {
            name: pool.submit(_preflight_one, address, settings, python_exe, timeout_s)
            for name, address in addresses.items()
        }
        failures = {name: future.result() for name, future in futures.items()}
    bad = [f"{name} ({addresses[name]}): {reason}" for name, reason in failures.items() if reason]
    if bad:
        raise PreflightError("preflight failed on " + "; ".join(bad))
