"""The script that finds and stops a run's processes on one host (sent over ssh; stdlib only).

The launcher sends this file's source as ``python -I -S -c <source> ARGS`` (see
:mod:`launcher.session.stragglers`), so it must run on any worker Python without the
launcher's package installed, and it never imports anything but the standard library.

Arguments: ``VARIABLE MODE MARK STOP GRACE_S``

- ``VARIABLE``: the environment variable that carries a run's mark (``MONARCH_RUN_MARK``);
- ``MODE``: ``earlier`` (the pre-flight: processes that earlier runs left) or ``run`` (the end
  of a run: every process of the run ``MARK`` names);
- ``MARK``: ``<lineage>/<attempt>/<run>`` of the launch that asks;
- ``STOP``: ``1`` to stop what is found (SIGTERM, then SIGKILL after ``GRACE_S``), ``0`` to only
  report it.

A process is considered at all only when its real uid is the caller's and the environment it
was started with (``/proc/<pid>/environ``) holds ``VARIABLE=<lineage>/<attempt>/<run>`` with the
caller's lineage. In ``earlier`` mode it is a survivor when its run is another run and either
the lineage is a MonarchJob's (any other attempt of the same job is over: the operator never
runs two launchers of one job at once) or, for standalone runs (lineage ``-``), no process of
its run on this host is still inside an ssh session (an ``sshd`` among its ancestors): the run's
launcher, and with it every ssh session of the run, is gone.

Prints one line, ``monarch-stragglers {json}``, with ``found`` (``[{pid, command, mark,
stopped}]``; ``stopped`` is ``SIGTERM``, ``SIGKILL`` or null), ``left`` (pids still alive),
``scanned`` (processes looked at) and ``scan_ms`` (the first scan, milliseconds).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

REPORT_PREFIX = "monarch-stragglers "
# A run's lineage when no MonarchJob owns it (a standalone launch).
STANDALONE = "-"
# How long SIGKILL is repeated for processes that a survivor keeps forking, seconds.
KILL_LIMIT_S = 5.0
POLL_S = 0.05
COMMAND_CHARS = 200
# A "-c" argument longer than this, or of several lines, is a program: it is named, not shown,
# so that no warning prints a whole program (issue 32).
PROGRAM_CHARS = 40
# Programs the launcher itself starts with "python -c", by a word only they contain.
KNOWN_PROGRAMS = (
    ("run_worker_loop_forever", "Monarch worker"),
    ("monarch-session-guard", "session guard"),
)


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _parent_and_state(pid: int) -> tuple[int, str]:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
    fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
    return int(fields[1]), fields[0].decode()


def _real_uid(pid: int) -> int:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(b"Uid:"):
            return int(line.split()[1])
    return -1


def _mark_of(pid: int, key: bytes) -> str | None:
    environ = _read(f"/proc/{pid}/environ")
    start = 0 if environ.startswith(key) else environ.find(b"\0" + key) + 1
    if start == 0 and not environ.startswith(key):
        return None
    end = environ.find(b"\0", start)
    return environ[start + len(key) : end if end >= 0 else None].decode(errors="replace")


def command_words(argv: list[str]) -> str:
    """A process's command line for a warning: its words joined by spaces, each ``-c`` program
    replaced by its name (``<Monarch worker program>``, ``<session guard program>``) or its
    size (``<program of 12 lines>``), cut to :data:`COMMAND_CHARS` characters."""
    words = []
    for index, word in enumerate(argv):
        if index and argv[index - 1] == "-c" and (len(word) > PROGRAM_CHARS or "\n" in word):
            names = [name for marker, name in KNOWN_PROGRAMS if marker in word]
            lines = len(word.strip().splitlines())
            word = f"<{names[0]} program>" if names else f"<program of {lines} lines>"
        words.append(word)
    text = " ".join(words).strip()
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 3] + "..."


def _command(pid: int) -> str:
    try:
        raw = _read(f"/proc/{pid}/cmdline").decode(errors="replace")
        text = command_words(raw.rstrip("\0").split("\0")) if raw else ""
        if not text:
            text = "[" + _read(f"/proc/{pid}/comm").decode(errors="replace").strip() + "]"
    except OSError:
        return "?"
    return text


def _split(mark: str) -> tuple[str, str, str] | None:
    parts = mark.split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def _ancestors(pid: int) -> list[int]:
    chain: list[int] = []
    while pid > 1 and pid not in chain:
        chain.append(pid)
        try:
            pid = _parent_and_state(pid)[0]
        except (OSError, ValueError, IndexError):
            break
    return chain


def _in_ssh_session(pid: int) -> bool:
    for ancestor in _ancestors(pid)[1:]:
        try:
            if _read(f"/proc/{ancestor}/comm").strip().startswith(b"sshd"):
                return True
        except OSError:
            return False
    return False


class Scan:
    """The processes of the caller's user and lineage that carry a run mark."""

    def __init__(self, variable: str, mode: str, mark: str) -> None:
        self.key = variable.encode() + b"="
        self.mode = mode
        self.lineage, self.attempt, self.run = _split(mark) or (STANDALONE, "0", mark)
        self.uid = os.getuid()
        self.protected = set(_ancestors(os.getpid()))
        self.scanned = 0

    def marked(self) -> dict[int, tuple[str, str, str]]:
        """``{pid: (lineage, attempt, run)}``: our user's processes marked with our lineage."""
        found: dict[int, tuple[str, str, str]] = {}
        self.scanned = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in self.protected:
                continue
            self.scanned += 1
            try:
                mark = _mark_of(pid, self.key)  # EACCES for other users' processes (non-root)
                if mark is None:
                    continue
                parts = _split(mark)
                if parts is None or parts[0] != self.lineage or _real_uid(pid) != self.uid:
                    continue
                if _parent_and_state(pid)[1] in ("Z", "X"):
                    continue  # already ended; only its parent can reap it
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile, or not ours to read
            found[pid] = parts
        return found

    def targets(self) -> dict[int, str]:
        """``{pid: mark}`` of the processes this mode stops (see the module docstring)."""
        marked = self.marked()
        if self.mode == "run":
            return {pid: "/".join(p) for pid, p in marked.items() if p[2] == self.run}
        others = {pid: parts for pid, parts in marked.items() if parts[2] != self.run}
        if self.lineage == STANDALONE:
            live: set[str] = set()
            for pid, parts in others.items():
                if parts[2] not in live and _in_ssh_session(pid):
                    live.add(parts[2])  # one process in a session is enough for its run
            others = {pid: parts for pid, parts in others.items() if parts[2] not in live}
        return {pid: "/".join(parts) for pid, parts in others.items()}


def _signal(pid: int, number: int, scan: Scan, mark: str) -> bool:
    # A pidfd pins the process: if the pid was reused after the scan, the mark read through
    # /proc no longer matches and nothing is sent; a process that died meanwhile gets nothing.
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):
        handle = None
    try:
        if _mark_of(pid, scan.key) != mark:
            return False
        if handle is not None:
            signal.pidfd_send_signal(handle, number)
        else:
            os.kill(pid, number)
        return True
    except OSError:
        return False
    finally:
        if handle is not None:
            os.close(handle)


def stop(
    scan: Scan, grace_s: float, stopping: bool
) -> tuple[dict[int, dict[str, Any]], list[int], float]:
    """SIGTERM every target, SIGKILL those left after ``grace_s`` (and what they fork meanwhile).

    Returns:
        ``({pid: entry}, [pids still alive])``; each entry says the signal that ended it.
    """
    found: dict[int, dict[str, Any]] = {}

    def note(targets: dict[int, str], number: int) -> None:
        for pid, mark in targets.items():
            entry = found.setdefault(
                pid, {"pid": pid, "command": _command(pid), "mark": mark, "stopped": None}
            )
            if stopping and _signal(pid, number, scan, mark):
                entry["stopped"] = signal.Signals(number).name

    started = time.monotonic()
    targets = scan.targets()
    scan_ms = (time.monotonic() - started) * 1000
    note(targets, signal.SIGTERM)
    if not stopping:
        return found, sorted(targets), scan_ms
    deadline = time.monotonic() + grace_s
    while targets and time.monotonic() < deadline:
        time.sleep(POLL_S)
        targets = scan.targets()
        note({pid: m for pid, m in targets.items() if pid not in found}, signal.SIGTERM)
    deadline = time.monotonic() + KILL_LIMIT_S
    while targets and time.monotonic() < deadline:
        note(targets, signal.SIGKILL)
        time.sleep(POLL_S)
        targets = scan.targets()
    return found, sorted(targets), scan_ms


def main(argv: list[str]) -> int:
    """Run the scan for ``argv`` (see the module docstring) and print the report line."""
    variable, mode, mark, stopping, grace_s = argv[0], argv[1], argv[2], argv[3] == "1", argv[4]
    scan = Scan(variable, mode, mark)
    found, left, scan_ms = stop(scan, float(grace_s), stopping)
    report = {
        "found": sorted(found.values(), key=lambda entry: entry["pid"]),
        "left": left,
        "scanned": scan.scanned,
        "scan_ms": round(scan_ms, 2),
    }
    print(REPORT_PREFIX + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
