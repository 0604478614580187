"""What finding a run's leftover processes costs on one host (issue 20, item 2).

The launcher runs :mod:`monarch_operator.launcher.session.straggler_scan` on every host twice
per run: in the pre-flight (inside the ssh session the pre-flight opens anyway, before its own
check) and at the end of the run (one more ssh session per host, all hosts in parallel). The
scan reads ``/proc/<pid>/environ`` of every process, so its cost grows with the number of
processes on the host.

For each process count it starts that many extra processes (``sleep``; ``--marked`` of them
with a run mark of a run still in an ssh session, which the scan must read, walk up and then
leave alone), and times, ``--repeat`` times each:

| column | what |
|---|---|
| scan ms | the first scan inside the script (its own clock: listing ``/proc`` and reading) |
| scan CPU ms | CPU time of one scan (``Scan.targets()`` in this process): load-independent |
| local ms | ``python -I -S -c <scan> ...`` start to end: what the pre-flight's ssh session adds |
| local CPU ms | CPU time of that whole process (interpreter start included) |
| ssh ms | ``ssh host <scan>`` start to end over loopback sshd: the end-of-run sweep per host |
| ssh true ms | ``ssh host true``: the bare login, for comparison |

Cells are ``median (max)``. The wall times depend on the machine's load; the CPU times
much less. Run as root (loopback sshd): ``.venv/bin/python bench/straggler_scan.py``.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from monarch_operator.launcher.session import straggler_scan
from monarch_operator.launcher.session.ssh import SshSettings, ssh_args
from monarch_operator.launcher.session.stragglers import (
    MARK_ENV,
    RunMark,
    parse_report,
    scan_command,
)
from monarch_operator.testing.loopback_sshd import LoopbackSshd


def _start(count: int, marked: int, folder: Path) -> list[subprocess.Popen[bytes]]:
    """``count`` sleeping processes; the first ``marked`` under a stand-in sshd, marked with
    a live run's mark (the scan reads them and walks up to their "sshd")."""
    sshd = folder / "sshd-session"
    sshd.write_text('#!/bin/sh\n"$@"\n')
    sshd.chmod(0o755)
    processes = []
    env_live = {**os.environ, MARK_ENV: "-/0/benchlive"}
    for index in range(count):
        if index < marked:
            command = [str(sshd), "sh", "-c", "sleep 600 & wait"]
            processes.append(subprocess.Popen(command, env=env_live, start_new_session=True))
        else:
            processes.append(subprocess.Popen(["sleep", "600"], start_new_session=True))
    time.sleep(0.5 + count / 500)
    return processes


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} ({max(values):6.1f})"


def _timed(command: list[str]) -> tuple[float, str, float]:
    """Wall ms, stdout and the CPU ms of ``command`` and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    wall = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
    return wall, result.stdout, cpu


def _scan_cpu_ms(mark: RunMark) -> float:
    scan = straggler_scan.Scan(MARK_ENV, "earlier", mark.value)
    started = time.process_time()
    assert scan.targets() == {}
    return (time.process_time() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 500, 2000])
    parser.add_argument("--marked", type=int, default=50, help="live marked ones among them")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    mark = RunMark("-", 0, "benchasker")
    local = ["sh", "-c", scan_command(sys.executable, mark, "earlier", stop=True)]
    rows = []
    with tempfile.TemporaryDirectory() as state, LoopbackSshd(1, Path(state)) as cluster:
        login = SshSettings(cluster.port, "root", str(cluster.key), str(cluster.known_hosts))
        host = cluster.hosts[0]
        ssh = ["ssh", *ssh_args(login, host, tty=False), "-n", host]
        remote = [*ssh, scan_command(sys.executable, mark, "run", stop=True)]
        for count in args.counts:
            processes = _start(count, min(args.marked, count), Path(state))
            try:
                cells: list[list[float]] = [[] for _ in range(6)]
                scanned = 0
                for _ in range(args.repeat):
                    wall, out, cpu = _timed(local)
                    report = parse_report(out)
                    assert report is not None and not report.found, out
                    scanned = report.scanned
                    for cell, value in zip(cells, [
                        report.scan_ms, _scan_cpu_ms(mark), wall, cpu, _timed(remote)[0],
                        _timed([*ssh, "true"])[0],
                    ], strict=True):
                        cell.append(value)
                rows.append((scanned, cells))
            finally:
                for process in processes:
                    os.killpg(process.pid, signal.SIGKILL)  # its own group: sh and its sleep
                for process in processes:
                    process.wait()
    names = ["scan ms", "scan CPU ms", "local ms", "local CPU ms", "ssh ms", "ssh true ms"]
    print(f"{'processes':>9} | " + " | ".join(f"{name:>15}" for name in names))
    for scanned, cells in rows:
        print(f"{scanned:>9} | " + " | ".join(_cell(cell) for cell in cells))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
