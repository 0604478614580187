"""Nothing of a run outlives it, on any host: marks, the pre-flight's survivor stop, the end sweep.

A rank may leave its process group and session (``setsid``, ``nohup``, a daemonized data
loader, a double fork) and ignore SIGHUP and SIGTERM; such a process holds its GPU memory, a
port (``MASTER_PORT``, the Monarch worker port) or a rendezvous into the next run, or, in a
MonarchJob whose restart keeps the worker pods, into the next attempt. Killing the worker's
process group or ssh session cannot reach it.

**How a run's processes are found.** Every Monarch worker is started with
``MONARCH_RUN_MARK=<lineage>/<attempt>/<run>`` on its ssh command line, and every process it
starts (Monarch procs, ranks, their children, daemons) inherits it; the environment a process
was started with stays readable in ``/proc/<pid>/environ`` to its own user whatever it does to
its session, group or signals. ``lineage`` is the MonarchJob's uid (``MONARCH_JOB_UID``, set by
the operator on the launcher pod) or ``-`` for a standalone run; ``attempt`` is
``MONARCH_ATTEMPT`` (0 standalone); ``run`` is the launch's own id.

kubelet and slurmstepd track a step's processes by cgroup, which nothing inside can leave. The
launcher cannot use one: on plain ssh hosts a non-root login may not create cgroups (systemd's
``systemd-run --user --scope`` needs a user manager and delegation most clusters do not give),
and inside a worker pod ``/sys/fs/cgroup`` is read-only under Pod Security "restricted". A
mark in the environment works in both, as the login user. Its limits, documented in
docs/standalone.md ("Nothing of a run outlives it"): a process that replaces its whole
environment (``env -i``, ``sudo``, a daemon that clears it) or overwrites the memory it was
started with (``setproctitle`` on long titles) loses the mark; a process in another PID
namespace (a container the rank starts) or of another user is not seen; ``/proc`` mounted with
``hidepid`` hides nothing from its own user.

**When they are stopped.** (1) At the end of every run, after the meshes are shut down, every
process with this run's mark on every host gets SIGTERM, and SIGKILL :data:`GRACE_S` seconds
later. (2) A launcher that could not do that (SIGKILL, its pod or node lost) leaves them to the
next run's pre-flight, which stops, on each host before any worker starts, every process of
the caller's user and lineage whose run is over: any other attempt of the same MonarchJob, or
a standalone run none of whose processes on the host is still in an ssh session (its launcher
is gone). Processes of another job, of a standalone run still in progress, and of other users
are never touched. The scan itself is :mod:`launcher.session.straggler_scan`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from monarch_operator import constants
from monarch_operator.launcher.session import straggler_scan

# The environment variable every process of a run inherits from its Monarch worker.
MARK_ENV = "MONARCH_RUN_MARK"
# Seconds between SIGTERM and SIGKILL for a run's leftover processes.
GRACE_S = 3.0
# Wall limit of the end-of-run sweep on one host, seconds (ssh login, grace, SIGKILL rounds).
SWEEP_TIMEOUT_S = GRACE_S + straggler_scan.KILL_LIMIT_S + 7
_LINEAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_SOURCE = Path(straggler_scan.__file__).read_text()


class RunMarkError(ValueError):
    """The launcher's environment cannot make a run mark; the message names the variable."""


@dataclass(frozen=True)
class RunMark:
    """What every process of one launch carries (see the module docstring).

    Attributes:
        lineage: the MonarchJob's uid, or ``-`` for a standalone run.
        attempt: the MonarchJob's attempt (1, 2, ...), 0 for a standalone run.
        run: this launch's id (hex).
    """

    lineage: str
    attempt: int
    run: str

    @property
    def value(self) -> str:
        """The variable's value, ``<lineage>/<attempt>/<run>``."""
        return f"{self.lineage}/{self.attempt}/{self.run}"

    @classmethod
    def parse(cls, value: str) -> RunMark | None:
        """Read a value written by :attr:`value`; None when it is not one."""
        lineage, _, rest = value.partition("/")
        attempt, _, run = rest.partition("/")
        if not (lineage and run and attempt.isdigit()):
            return None
        return cls(lineage, int(attempt), run)


def run_mark(run_id: str, environ: Mapping[str, str]) -> RunMark:
    """The mark of a launch with id ``run_id`` in a launcher whose environment is ``environ``.

    Raises:
        RunMarkError: ``MONARCH_JOB_UID`` is set but is no uid (letters, digits, ``.``, ``_``,
            ``-``, at most 63), or ``MONARCH_ATTEMPT`` is set with it but is no positive integer.
    """
    uid = environ.get(constants.ENV_JOB_UID, "").strip()
    if not uid:
        return RunMark(straggler_scan.STANDALONE, 0, run_id)
    if not _LINEAGE.match(uid):
        raise RunMarkError(
            f"{constants.ENV_JOB_UID}={uid!r}: must be a job uid (letters, digits, '.', '_', "
            "'-', at most 63 characters)"
        )
    attempt = environ.get(constants.ENV_ATTEMPT, "1").strip() or "1"
    if not attempt.isdigit() or int(attempt) < 1:
        raise RunMarkError(f"{constants.ENV_ATTEMPT}={attempt!r}: must be 1 or more")
    return RunMark(uid, int(attempt), run_id)


def mark_env(mark: RunMark) -> dict[str, str]:
    """``{MONARCH_RUN_MARK: value}``: add it to the worker's command-line environment, where it
    is in the worker's own ``/proc/<pid>/environ`` (a variable set later would not be)."""
    return {MARK_ENV: mark.value}


@dataclass(frozen=True)
class Survivor:
    """A process of an earlier run (or, at the end of a run, of that run) found on a host.

    Attributes:
        pid: its pid on the host.
        command: its command line (cut to 200 characters).
        mark: the run it belongs to.
        stopped: ``SIGTERM`` or ``SIGKILL`` when that signal was the one that ended it, None when
            it was only reported.
    """

    pid: int
    command: str
    mark: RunMark | None
    stopped: str | None

    def describe(self) -> str:
        """E.g. ``pid 4242 (attempt 1 of this job): sleep 1000``."""
        if self.mark is None:
            whose = "unknown run"
        elif self.mark.lineage == straggler_scan.STANDALONE:
            whose = f"run {self.mark.run}"
        else:
            whose = f"attempt {self.mark.attempt} of this job"
        return f"pid {self.pid} ({whose}): {self.command}"


@dataclass(frozen=True)
class ScanReport:
    """What the scan on one host found and did.

    Attributes:
        found: the processes it matched, in pid order.
        left: pids still alive afterwards (only reported, or not stoppable).
        scanned: processes looked at.
        scan_ms: how long the first scan took, milliseconds.
    """

    found: tuple[Survivor, ...] = ()
    left: tuple[int, ...] = ()
    scanned: int = 0
    scan_ms: float = 0.0


def scan_command(python_exe: str, mark: RunMark, mode: str, stop: bool) -> str:
    """The remote shell command that runs the scan (stdin from /dev/null, one report line).

    Args:
        python_exe: the worker Python on the host.
        mark: the asking launch's mark.
        mode: ``earlier`` (pre-flight) or ``run`` (end of ``mark``'s run).
        stop: stop what is found (else only report it).
    """
    if mode not in ("earlier", "run"):
        raise ValueError(f"mode must be 'earlier' or 'run', not {mode!r}")
    # -I -S: the script needs only the standard library; skipping site halves its start-up.
    args = [MARK_ENV, mode, mark.value, "1" if stop else "0", f"{GRACE_S:g}"]
    return (
        f"{shlex.quote(python_exe)} -I -S -c {shlex.quote(_SOURCE)} {shlex.join(args)} </dev/null"
    )


def preflight_prefix(python_exe: str, mark: RunMark | None, stop: bool) -> str:
    """What the pre-flight puts before its own remote check: the scan for earlier runs, so that
    a survivor holding the worker port is gone before the check looks at the port.
    ``""`` without a mark."""
    if mark is None:
        return ""
    return scan_command(python_exe, mark, "earlier", stop) + "; "


def parse_report(stdout: str) -> ScanReport | None:
    """The scan's report in a remote command's output, or None when it printed none."""
    for line in stdout.splitlines():
        if not line.startswith(straggler_scan.REPORT_PREFIX):
            continue
        try:
            data = json.loads(line[len(straggler_scan.REPORT_PREFIX) :])
            found = tuple(
                Survivor(
                    int(item["pid"]),
                    str(item["command"]),
                    RunMark.parse(str(item["mark"])),
                    item.get("stopped"),
                )
                for item in data["found"]
            )
            return ScanReport(
                found, tuple(int(p) for p in data["left"]), int(data["scanned"]),
                float(data["scan_ms"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
    return None


def survivor_lines(
    host: str, report: ScanReport | None, at_end: bool = False, stopping: bool = False
) -> list[str]:
    """Warning lines naming every process the scan found on ``host`` and what became of it.

    Args:
        host: the host's name.
        report: the scan's report; None gives no lines.
        at_end: the end-of-run sweep (the run's own processes, always stopped) instead of the
            pre-flight's scan (earlier runs' processes).
        stopping: whether the pre-flight's scan was told to stop what it found (not with
            ``--no-clean-stale``).

    Returns:
        One line per process, e.g. ``process left by this run on node-1, pid 41 (run a): sleep
        1000: stopped (SIGTERM)``; what became of it is one of ``stopped (SIGTERM)``, ``stopped
        (SIGKILL)``, ``ended by itself before it was signalled``, ``still running after
        SIGKILL``, ``still running: it could not be signalled`` or ``left running
        (--no-clean-stale)``.
    """
    if report is None:
        return []
    what = "left by this run" if at_end else "of an earlier run"
    left = set(report.left)
    lines = []
    for survivor in report.found:
        lines.append(
            f"process {what} on {host}, {survivor.describe()}: "
            f"{_outcome(survivor, survivor.pid in left, at_end or stopping)}"
        )
    return lines


def _outcome(survivor: Survivor, alive: bool, stopping: bool) -> str:
    """What became of one process the scan found (see :func:`survivor_lines`)."""
    if alive and survivor.stopped is not None:
        return f"still running after {survivor.stopped}"
    if alive and stopping:
        return "still running: it could not be signalled"
    if alive:
        return "left running (--no-clean-stale)"
    if survivor.stopped is None:
        return "ended by itself before it was signalled"
    return f"stopped ({survivor.stopped})"
