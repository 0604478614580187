"""The host's processes that belong to chaos jobs (the node agent runs every pod's containers as
host processes, so ``/proc`` shows them all).

Two kinds are told apart by their environment, which ``/proc/<pid>/environ`` keeps as the
process was started whatever it did since (``setsid``, a double fork):
- a launcher pod's processes carry ``MONARCH_JOB_UID`` and ``MONARCH_ATTEMPT`` (the operator
  sets them on the launcher container) and no run mark;
- processes an attempt started on its workers carry ``MONARCH_RUN_MARK=<job uid>/<attempt>/<run>``
  (:mod:`monarch_operator.launcher.session.stragglers`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

RUN_MARK = b"MONARCH_RUN_MARK="
JOB_UID = b"MONARCH_JOB_UID="
ATTEMPT = b"MONARCH_ATTEMPT="


@dataclass(frozen=True)
class JobProcess:
    """A live host process of a chaos job.

    Attributes:
        pid: its pid.
        uid: the MonarchJob's uid (the run mark's lineage, or ``MONARCH_JOB_UID``).
        attempt: the attempt that started it.
        launcher: True for a launcher pod's process, False for one an attempt started on a
            worker (run mark).
        command: its command line, cut to 120 characters.
    """

    pid: int
    uid: str
    attempt: int
    launcher: bool
    command: str

    def describe(self) -> str:
        where = "launcher" if self.launcher else "worker"
        return f"pid {self.pid} ({where}, attempt {self.attempt}): {self.command}"


def scan(uids: frozenset[str] | set[str], proc: str = "/proc") -> list[JobProcess]:
    """Every live process (not a zombie) whose run mark or ``MONARCH_JOB_UID`` names one of
    ``uids``, in pid order. Processes that end during the scan, or whose environment this user
    cannot read, are skipped."""
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/environ", "rb") as environ_file:
                environ = environ_file.read()
            if b"MONARCH_" not in environ:
                continue
            with open(f"{proc}/{entry}/stat", "rb") as stat_file:
                if stat_file.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"{proc}/{entry}/cmdline", "rb") as cmdline_file:
                command = cmdline_file.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        process = _classify(int(entry), environ, command.strip()[:120], uids)
        if process is not None:
            found.append(process)
    return sorted(found, key=lambda process: process.pid)


def _classify(pid: int, environ: bytes, command: str,
              uids: frozenset[str] | set[str]) -> JobProcess | None:
    values = {}
    for item in environ.split(b"\0"):
        for key in (RUN_MARK, JOB_UID, ATTEMPT):
            if item.startswith(key):
                values[key] = item[len(key):].decode(errors="replace")
    mark = values.get(RUN_MARK)
    if mark is not None:
        lineage, _, rest = mark.partition("/")
        attempt, _, _ = rest.partition("/")
        if lineage in uids and attempt.isdigit():
            return JobProcess(pid, lineage, int(attempt), False, command)
        return None
    uid, attempt = values.get(JOB_UID), values.get(ATTEMPT, "")
    if uid in uids and attempt.isdigit():
        return JobProcess(pid, uid, int(attempt), True, command)
    return None
