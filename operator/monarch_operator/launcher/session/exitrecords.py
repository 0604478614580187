"""Exit records: a rank that ends its own process says so, in a file, before it goes.

Monarch reports a proc that died with its exit status most of the time, but under CPU load its
supervision may first say only "timeout waiting for message from proc mesh agent ... The process
likely crashed", with no code (seen with torchmonarch 0.7.0 on a busy 2-core machine). Parsing
that text cannot give field case C9's exact exit status. So each role proc wraps ``os._exit``
(which Monarch's own teardown never calls for a live actor) to write a one-line JSON record
(role, rank, host, local rank, exit code, time) under ``~/.cache/monarch-launch/`` first, and
the launcher reads and deletes those records over ssh when a run fails (:func:`collect`).

A record is on disk before the process exits, and Monarch can only notice the exit afterwards,
so a launcher that reads after a failure was reported always finds it. Killed processes
(SIGKILL, the OOM killer) write nothing; their status still comes from Monarch's report.

The proc side (:func:`install_exit_recorder`) uses the standard library only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from monarch_operator.launcher.session.fanout import RetryPolicy, run_on_hosts
from monarch_operator.launcher.session.ssh import COMMAND_LIMIT_S, SshSettings, ssh_runner

RECORD_DIR = "~/.cache/monarch-launch"
_PREFIX = "exit-"


@dataclass(frozen=True)
class ExitRecord:
    """One rank that ended its own process.

    Attributes:
        role: the rank's role (``trainer``, ``ref``, ...).
        rank: the rank within its role (host-major, as Monarch numbers a proc mesh).
        host: host name as the launcher knows it.
        local_rank: the rank's index on its host.
        exit_code: the status passed to ``os._exit``.
        time: wall-clock time of the exit on that host, seconds since the epoch.
    """

    role: str
    rank: int
    host: str
    local_rank: int
    exit_code: int
    time: float


def record_path(run_id: str, role: str, rank: int) -> str:
    """The remote file (``~``-relative) a rank writes its record to; one per run, role, rank."""
    return f"{RECORD_DIR}/{_PREFIX}{run_id}-{role}-{rank}.json"


def install_exit_recorder(run_id: str, role: str, rank: int, host: str, local_rank: int) -> None:
    """In this proc, make ``os._exit(code)`` write this rank's :class:`ExitRecord` first.

    Best effort: a record that cannot be written never keeps the process from exiting.
    Idempotent (a second call replaces the identity). Children forked from the proc (a data
    loader's workers end with ``os._exit`` too) inherit the wrapper but write nothing.
    """
    real_exit: Callable[[int], NoReturn] = getattr(os._exit, "__wrapped__", os._exit)
    path = os.path.expanduser(record_path(run_id, role, rank))
    proc_pid = os.getpid()

    def exit_with_record(status: int) -> NoReturn:
        if os.getpid() != proc_pid:
            real_exit(status)
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            record = ExitRecord(role, rank, host, local_rank, int(status), time.time())
            with open(path, "w") as out:
                out.write(json.dumps(record.__dict__) + "\n")
        except (OSError, TypeError, ValueError):
            pass
        real_exit(status)

    exit_with_record.__wrapped__ = real_exit  # type: ignore[attr-defined]
    os._exit = exit_with_record


def parse_records(text: str) -> list[ExitRecord]:
    """Parse the JSON lines written by :func:`install_exit_recorder`; bad lines are skipped.

    Returns:
        The records, earliest first (ties by role and rank), without duplicates.
    """
    records = set()
    for line in text.splitlines():
        try:
            records.add(ExitRecord(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return sorted(records, key=lambda record: (record.time, record.role, record.rank))


def collect(
    addresses: Mapping[str, str], ssh: SshSettings, run_id: str,
    timeout_s: float = COMMAND_LIMIT_S,
) -> list[ExitRecord]:
    """Read and delete this run's exit records on ``addresses`` over ssh, in parallel.

    Args:
        addresses: ``{host name: address}`` of the hosts to read (each address once; the host
            key is checked under the name).
        ssh: how to log in.
        run_id: the run whose records to read (hex, so safe in a shell glob).
        timeout_s: limit per host, seconds; a host that does not answer adds no records.

    Returns:
        Every record found, earliest first (see :func:`parse_records`).
    """
    pattern = f"{RECORD_DIR}/{_PREFIX}{run_id}-*.json".replace("~", "$HOME", 1)
    # Each record file is read and deleted in one step, so hosts sharing a home directory (as
    # loopback test hosts do) report each record once.
    command = f'for f in {pattern}; do [ -f "$f" ] && cat "$f" && rm -f -- "$f"; done; true'
    unique: dict[str, str] = {}  # address -> the first host name given for it
    for host, address in addresses.items():
        unique.setdefault(address, host)
    # Bounded and retried as every other connection (launcher.session.fanout, C28).
    results = run_on_hosts(
        unique,
        ssh_runner(ssh, lambda _: command, timeout_s),
        ssh.concurrency,
        RetryPolicy(retries=ssh.retries),
    )
    return parse_records("\n".join(result.stdout for result in results.values()))
