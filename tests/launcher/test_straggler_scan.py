"""The straggler scan's rules on this machine, run exactly as the launcher runs it on a host
(``python -I -S -c <source> ARGS``), without ssh: which marked processes it stops, which it
leaves alone (another lineage, another user, a standalone run still in an ssh session, the
asking run itself), SIGKILL for those that ignore SIGTERM, and a survivor that keeps forking.

A process "in an ssh session" is one with an ``sshd`` among its ancestors; here a shell script
named ``sshd-session`` stands in for sshd (the scan reads ``/proc/<pid>/comm``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator.launcher.session import straggler_scan
from monarch_operator.launcher.session.stragglers import (
    MARK_ENV,
    RunMark,
    ScanReport,
    parse_report,
    scan_command,
)

OTHER_UID = 65534
IGNORE_TERM = 'trap "" TERM; exec sleep 1000'


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class Processes:
    """Starts marked processes for one test and kills whatever is left of them afterwards."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pids: list[int] = []
        self.marks: set[str] = set()
        self.sshd = folder / "sshd-session"
        self.sshd.write_text('#!/bin/sh\n"$@"\n')
        self.sshd.chmod(0o755)

    def orphan(self, mark: str | None, command: str = "exec sleep 1000", uid: int | None = None,
               in_ssh: bool = False) -> int:
        """Start ``sh -c command`` with ``MONARCH_RUN_MARK=mark`` whose parent is init, or (with
        ``in_ssh``) under the stand-in sshd; return the pid of ``sh`` (or what it exec'd)."""
        as_user = f"setpriv --reuid={uid} --regid={uid} --clear-groups " if uid is not None else ""
        inner = f"{as_user}sh -c '{command}' </dev/null >/dev/null 2>&1 & echo $!"
        env = {key: value for key, value in os.environ.items() if key != MARK_ENV}
        if mark is not None:
            env[MARK_ENV] = mark
            self.marks.add(mark)
        if in_ssh:
            pid_file = self.folder / f"{uuid.uuid4().hex}.pid"
            launcher = subprocess.Popen(
                [str(self.sshd), "sh", "-c", f"{inner} > {pid_file}; wait"],
                env=env, start_new_session=True,
            )
            self.pids.append(launcher.pid)
            deadline = time.monotonic() + 5
            while not (pid_file.exists() and pid_file.read_text().strip()):
                assert time.monotonic() < deadline, "the process in the ssh session did not start"
                time.sleep(0.02)
            pid = int(pid_file.read_text())
        else:
            pid = int(subprocess.check_output(["setsid", "sh", "-c", inner], env=env, text=True))
        self.pids.append(pid)
        deadline = time.monotonic() + 5
        while uid is not None and _uid_of(pid) != uid and time.monotonic() < deadline:
            time.sleep(0.02)  # setpriv has not switched yet
        return pid

    def kill_all(self) -> None:
        for pid in [*self.pids, *(p for mark in self.marks for p in _marked_with(mark))]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return -1


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    yield started
    started.kill_all()


def scan(mark: RunMark, mode: str, stop: bool = True) -> ScanReport:
    """Run the scan as the launcher does on a host; return its parsed report."""
    result = subprocess.run(
        ["sh", "-c", scan_command(sys.executable, mark, mode, stop)],
        capture_output=True, text=True, timeout=30, check=True,
    )
    report = parse_report(result.stdout)
    assert report is not None, result.stdout + result.stderr
    return report


def _run() -> str:
    return uuid.uuid4().hex[:12]


def test_a_standalone_preflight_stops_ended_runs_only_and_never_other_users_or_jobs(
    processes: Processes,
) -> None:
    ended, live = _run(), _run()
    ended_plain = processes.orphan(f"-/0/{ended}")
    ended_stubborn = processes.orphan(f"-/0/{ended}", IGNORE_TERM)
    live_orphan = processes.orphan(f"-/0/{live}")  # left its session, but its run goes on:
    live_attached = processes.orphan(f"-/0/{live}", in_ssh=True)
    other_job = processes.orphan(f"job-{_run()}/1/{_run()}")
    other_user = processes.orphan(f"-/0/{_run()}", uid=OTHER_UID)
    unmarked = processes.orphan(None)
    ours = RunMark("-", 0, _run())
    mine = processes.orphan(ours.value)

    report = scan(ours, "earlier")

    stopped = {survivor.pid: survivor for survivor in report.found}
    assert set(stopped) >= {ended_plain, ended_stubborn}, report
    assert stopped[ended_plain].stopped == "SIGTERM"
    assert stopped[ended_stubborn].stopped == "SIGKILL"
    assert stopped[ended_plain].mark == RunMark("-", 0, ended)
    assert "sleep 1000" in stopped[ended_plain].command
    assert not _alive(ended_plain) and not _alive(ended_stubborn)
    for name, pid in [("a live run's orphan", live_orphan), ("a live run's", live_attached),
                      ("another job's", other_job), ("another user's", other_user),
                      ("an unmarked", unmarked), ("the asking run's", mine)]:
        assert pid not in stopped, f"{name} process was chosen: {report}"
        assert _alive(pid), f"{name} process {pid} was stopped"
    assert report.left == ()
    assert report.scanned > 0 and report.scan_ms > 0


def test_a_jobs_next_attempt_stops_the_earlier_attempt_even_while_its_ssh_session_lingers(
    processes: Processes,
) -> None:
    job = f"job-{_run()}"
    lingering = processes.orphan(f"{job}/1/{_run()}", in_ssh=True)
    orphaned = processes.orphan(f"{job}/1/{_run()}", IGNORE_TERM)
    other_job = processes.orphan(f"job-{_run()}/1/{_run()}")
    other_user = processes.orphan(f"{job}/1/{_run()}", uid=OTHER_UID)

    report = scan(RunMark(job, 2, _run()), "earlier")

    found = {survivor.pid for survivor in report.found}
    assert {lingering, orphaned} <= found and not {other_job, other_user} & found, report
    assert not _alive(lingering) and not _alive(orphaned)
    assert _alive(other_job) and _alive(other_user)


def test_the_end_of_a_run_stops_all_of_it_and_only_it(processes: Processes) -> None:
    ours = RunMark(f"job-{_run()}", 3, _run())
    attached = processes.orphan(ours.value, in_ssh=True)
    stubborn = processes.orphan(ours.value, IGNORE_TERM)
    # A survivor that starts a new child every 20 ms: its children are marked too.
    forking = processes.orphan(ours.value, "while :; do sleep 1000 & sleep 0.02; done")
    earlier = processes.orphan(f"{ours.lineage}/2/{_run()}")

    report = scan(ours, "run")

    assert {attached, stubborn, forking} <= {survivor.pid for survivor in report.found}, report
    assert report.left == ()
    time.sleep(0.3)
    left = _marked_with(ours.value)
    assert left == [], f"processes of the run still alive: {left}"
    assert _alive(earlier), "the run's end must not stop another run's process"


def test_without_stop_survivors_are_only_reported(processes: Processes) -> None:
    lineage = f"job-{_run()}"
    ended = processes.orphan(f"{lineage}/1/{_run()}")

    report = scan(RunMark(lineage, 2, _run()), "earlier", stop=False)

    assert [(s.pid, s.stopped) for s in report.found] == [(ended, None)]
    assert report.left == (ended,)
    assert _alive(ended)


def test_the_scan_reports_even_when_proc_holds_unreadable_and_vanishing_processes() -> None:
    # A process that exits between listdir and open, and kernel threads (no environ), are
    # skipped: the report still comes. Nothing is marked with this lineage.
    report = scan(RunMark(f"job-{_run()}", 1, _run()), "earlier")
    assert report.found == () and report.left == ()
    assert report.scanned > 10


def _marked_with(value: str) -> list[int]:
    needle = f"{MARK_ENV}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0") and _alive(
                    int(entry.name)
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_the_script_is_sent_whole_and_runs_without_the_package() -> None:
    # -I -S: no site, no PYTHONPATH; the script must only need the standard library.
    source = Path(straggler_scan.__file__).read_text()
    assert "monarch_operator" not in source.split('"""', 2)[2]
    command = scan_command("/usr/bin/python3", RunMark("-", 0, "abc"), "run", stop=False)
    assert command.startswith("/usr/bin/python3 -I -S -c ")
    assert command.endswith(f"{MARK_ENV} run -/0/abc 0 3 </dev/null")
