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
import subprocess
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from monarch_operator import constants
from monarch_operator.launcher.session import straggler_scan
from monarch_operator.launcher.session.ssh import SshSettings, ssh_args

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


def survivor_lines(host: str, report: ScanReport | None, at_end: bool = False) -> list[str]:
    """Warning lines naming every process the scan found on ``host`` and what became of it."""
    if report is None:
        return []
    lines = []
    left = set(report.left)
    for survivor in report.found:
        if at_end:
            what = "left by this run"
        else:
            what = "of an earlier run"
        if survivor.pid in left and survivor.stopped is None:
            done = "left running (--no-clean-stale)" if not at_end else "could not be stopped"
        elif survivor.pid in left:
            done = f"still alive after {survivor.stopped}"
        else:
            done = f"stopped ({survivor.stopped})"
        lines.append(f"process {what} on {host}, {survivor.describe()}: {done}")
    return lines


def stop_run_processes(
    addresses: Mapping[str, str],
    ssh: SshSettings,
    python_exe: str,
    mark: RunMark,
    timeout_s: float = SWEEP_TIMEOUT_S,
) -> dict[str, ScanReport | None]:
    """End every process of ``mark``'s run on every host, in parallel (the end-of-run sweep).

    Args:
        addresses: ``{host name: address}``; each address is visited once.
        ssh: how to log in.
        python_exe: the worker Python.
        mark: the run that ended.
        timeout_s: limit per host, seconds.

    Returns:
        ``{host name: report}``; None for a host that could not be reached or did not answer.
    """
    unique: dict[str, str] = {}
    for host, address in addresses.items():
        unique.setdefault(address, host)
    command = scan_command(python_exe, mark, "run", stop=True)

    def sweep(address: str, host: str) -> ScanReport | None:
        try:
            result = subprocess.run(
                ["ssh", *ssh_args(ssh, host, tty=False), "-n", address, command],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None
        return parse_report(result.stdout)

    if not unique:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(unique))) as pool:
        reports = list(pool.map(sweep, unique.keys(), unique.values()))
    return dict(zip(unique.values(), reports, strict=True))
