"""How long Monarch's SSHJob takes to attach 2, 4, 8, 16 hosts, on loopback sshd daemons.

For each host count N the parent starts N sshd daemons on 127.0.0.2 onwards
(:mod:`monarch_operator.testing.loopback_sshd`) and runs every repeat in a fresh child process
(``--one N``): Monarch allows one transport per process. The child times, in seconds, what the
launcher does before attach (``run_preflight``: resolve, sshd probe, ssh login, imports, port
check), then SSHJob's attach (``job.state()`` until ``hosts.initialized``),
``spawn_procs(per_host={"gpus": 1})`` until its procs are up, and teardown (``shutdown()`` plus
``job.kill()``), and writes them to a JSON file. After each child the parent kills, and
reports, any process still mentioning the Monarch port.

Run: ``.venv/bin/python bench/attach_hosts.py [--hosts 2 4 8 16] [--repeat 3]`` as root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from monarch_operator.launcher.session.preflight import PreflightSettings, run_preflight
from monarch_operator.launcher.session.ssh import SshSettings, ssh_args
from monarch_operator.testing.loopback_sshd import (
    LoopbackSshd,
    SshCluster,
    free_port,
    loopback_hosts,
    reap_processes_mentioning,
)

# The phases a child times, in the order it runs them, with their table headings.
PHASES = {
    "preflight_s": "preflight",
    "listen_s": "listen",
    "attach_s": "attach",
    "spawn_s": "spawn",
    "teardown_s": "teardown",
}
# Time a host shutdown may take before the child gives up on it, seconds (as in the launcher).
SHUTDOWN_TIMEOUT_S = 30.0
# The ``st`` field of a listening socket in /proc/net/tcp.
_TCP_LISTEN = "0A"
# Extra wall time a child gets on top of its Monarch timeouts before the parent kills it.
CHILD_SLACK_S = 60.0


# -- child: one host count, one repeat -------------------------------------------------------
def busy_cpu_seconds() -> float:
    """Return the CPU seconds this machine has spent busy since boot, summed over all cores.

    Busy is everything in ``/proc/stat`` but idle and iowait; it counts every process, sshd and
    the Monarch workers included, which are not children of the benchmark.
    """
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def listening_addresses(port: int) -> set[str]:
    """Return the IPv4 addresses on which a TCP socket listens on ``port``, from /proc/net/tcp."""
    wanted = f"{port:04X}"
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address_hex, _, port_hex = fields[1].partition(":")
        if port_hex == wanted and fields[3] == _TCP_LISTEN:
            # The kernel prints the address as a host-order (little-endian here) integer.
            found.add(socket.inet_ntoa(bytes.fromhex(address_hex)[::-1]))
    return found


def wait_all_listening(port: int, count: int, timeout_s: float) -> float:
    """Poll every 10 ms until ``count`` addresses listen on ``port``.

    Returns:
        Seconds from the call until then, or NaN after ``timeout_s`` seconds.
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if len(listening_addresses(port)) >= count:
            return time.monotonic() - started
        time.sleep(0.01)
    return float("nan")


def _timed(step: Callable[[], object]) -> float:
    """Run ``step`` and return its wall time in seconds."""
    started = time.monotonic()
    step()
    return time.monotonic() - started


def measure_once(
    count: int, ssh_port: int, key: Path, monarch_port: int, attach_timeout_s: float
) -> dict[str, float]:
    """Attach ``count`` loopback hosts with SSHJob in this process and time every phase.

    Args:
        count: number of hosts, 127.0.0.2 onwards; their sshd listens on ``ssh_port``.
        ssh_port: the sshd port on every host.
        key: the client's private key for root.
        monarch_port: the port every Monarch worker listens on; must be free on every host.
        attach_timeout_s: Monarch's ``mesh_attach_config_timeout`` and the base of each
            ``.get()`` timeout, seconds.

    Returns:
        ``{phase: seconds}`` for each key of :data:`PHASES`, plus ``job_s`` (building SSHJob)
        and ``attach_cpu_s`` (machine-wide busy CPU seconds during attach, all cores).
        ``listen_s`` is part of ``attach_s``: until every worker listens on ``monarch_port``.

    Raises:
        Whatever the launcher checks or Monarch raise; teardown still runs once SSHJob exists.
    """
    import monarch.actor
    import monarch.config
    from monarch._src.job.job import SSHJob

    # Report faults as exceptions from .get() instead of Monarch's default sys.exit(1).
    monarch.actor.unhandled_fault_hook = lambda failure: print(
        f"unhandled monarch fault: {failure}", file=sys.stderr
    )
    # LoopbackSshd writes the known_hosts pinning its host key beside the client key.
    settings = SshSettings(
        port=ssh_port, user="root", key=str(key), known_hosts=str(key.parent / "known_hosts")
    )
    checks = PreflightSettings(
        ssh=settings, python_exe=sys.executable, monarch_port=monarch_port, modules=("monarch",)
    )
    started = time.monotonic()
    addresses = run_preflight(loopback_hosts(count), checks)
    timings = {"preflight_s": time.monotonic() - started}
    started = time.monotonic()
    # Upstream SSHJob takes one option list for all hosts: keys checked under the addresses.
    options = ssh_args(settings, None)
    job = SSHJob(python_exe=sys.executable, ssh_args=options, monarch_port=monarch_port)
    timings["job_s"] = time.monotonic() - started
    # Must follow SSHJob(): its constructor enables the hostname transport, which panics when
    # the hostname resolves only to loopback (notes/monarch-sshjob.md, G1).
    monarch.config.configure(
        default_transport="tcp://127.0.0.1:0",
        mesh_attach_config_timeout=f"{attach_timeout_s:g}s",
    )
    job.add_mesh("hosts", list(addresses.values()))
    get_timeout_s = attach_timeout_s + 30
    hosts: Any = None
    try:
        with ThreadPoolExecutor(max_workers=1) as watcher:
            # Started with attach: when every worker listens, as against when Monarch sees it.
            listen = watcher.submit(wait_all_listening, monarch_port, count, get_timeout_s)
            started, busy_before = time.monotonic(), busy_cpu_seconds()
            hosts = job.state(cached_path=None).hosts
            hosts.initialized.get(timeout=get_timeout_s)
            timings["attach_s"] = time.monotonic() - started
            timings["listen_s"] = listen.result()
        timings["attach_cpu_s"] = busy_cpu_seconds() - busy_before
        timings["spawn_s"] = _timed(
            lambda: hosts.spawn_procs(per_host={"gpus": 1}).initialized.get(timeout=get_timeout_s)
        )
    finally:
        started = time.monotonic()
        try:
            if hosts is not None:
                hosts.shutdown().get(timeout=SHUTDOWN_TIMEOUT_S)
        finally:
            job.kill()
        timings["teardown_s"] = time.monotonic() - started
    return timings


def run_child(args: argparse.Namespace) -> int:
    """The ``--one N`` entry point: measure once and write the timings to ``--result``."""
    timings = measure_once(
        args.one, args.ssh_port, Path(args.key), args.monarch_port, args.attach_timeout
    )
    Path(args.result).write_text(json.dumps(timings))
    return 0


# -- parent: start sshd, run children, check for leftovers --------------------------------
def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_one(
    cluster: SshCluster, count: int, attach_timeout_s: float, work_dir: Path
) -> tuple[dict[str, float] | None, list[tuple[int, str]]]:
    """Run one ``--one count`` child against ``cluster`` and clean up after it.

    Args:
        cluster: running sshd daemons, at least ``count`` of them.
        count: number of hosts to attach.
        attach_timeout_s: passed to the child as ``--attach-timeout``, seconds.
        work_dir: where the child's log and result file go.

    Returns:
        The child's ``{phase: seconds}`` (None if it failed; its log tail is printed), and the
        ``(pid, command line)`` of processes still on the Monarch port afterwards, now killed.
    """
    monarch_port = free_port(cluster.hosts)
    result, log = work_dir / f"result-{monarch_port}.json", work_dir / f"child-{monarch_port}.log"
    command = [sys.executable, __file__, "--one", str(count), "--ssh-port", str(cluster.port)]
    command += ["--key", str(cluster.key), "--monarch-port", str(monarch_port)]
    command += ["--attach-timeout", f"{attach_timeout_s:g}", "--result", str(result)]
    # A file, not a pipe: ssh clients inherit the child's output and could hold a pipe open.
    with log.open("wb") as log_file:
        child = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        child.wait(timeout=3 * attach_timeout_s + SHUTDOWN_TIMEOUT_S + CHILD_SLACK_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        print(f"  N={count}: child killed after its wall limit; log tail:\n{_tail(log)}")
    leftovers = reap_processes_mentioning(f":{monarch_port}")
    if child.returncode == 0:
        return json.loads(result.read_text()), leftovers
    if child.returncode != -signal.SIGKILL:
        print(f"  N={count}: child exited {child.returncode}; log tail:\n{_tail(log)}")
    return None, leftovers


def measure_count(
    count: int, repeat: int, attach_timeout_s: float, work_dir: Path
) -> tuple[list[dict[str, float]], list[tuple[int, str]]]:
    """Start ``count`` sshd daemons and run ``repeat`` children against them.

    Returns:
        The timings of every successful run and every leftover process found (and killed)
        after the runs or after stopping sshd.
    """
    state_dir = work_dir / f"sshd-{count}"
    state_dir.mkdir()
    runs, leftovers = [], []
    with LoopbackSshd(count, state_dir) as cluster:
        for index in range(repeat):
            timings, strays = run_one(cluster, count, attach_timeout_s, work_dir)
            leftovers += strays
            if timings is not None:
                runs.append(timings)
            status = "ok" if timings else "FAILED"
            print(f"  N={count} run {index + 1}/{repeat}: {status}, {len(strays)} leftover(s)")
    # The listeners are gone; their per-connection sshd children must be too.
    leftovers += reap_processes_mentioning(str(state_dir))
    return runs, leftovers


# -- report ----------------------------------------------------------------------------------
def _cell(values: Sequence[float]) -> str:
    """``median (min)`` of ``values`` in seconds, or ``-`` when there are none."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f})"


def _percent(shares: Sequence[float]) -> str:
    """The median of ``shares`` (0 to 1) as a whole percentage, or ``-``."""
    return f"{100 * statistics.median(shares):.0f}%" if shares else "-"


def format_table(results: dict[int, list[dict[str, float]]]) -> str:
    """Return a text table: one row per host count, ``median (min)`` seconds per phase.

    The last column is the median share of all cores' time the machine was busy during attach.

    Args:
        results: ``{host count: [timings of each successful run]}``.
    """
    headings = ["N", "runs", *PHASES.values(), "attach/host", "attach CPU%"]
    rows = [headings]
    cores = os.cpu_count() or 1
    for count, runs in results.items():
        cells = [str(count), str(len(runs))]
        cells += [_cell([run[phase] for run in runs]) for phase in PHASES]
        cells.append(_cell([run["attach_s"] / count for run in runs]))
        cells.append(_percent([run["attach_cpu_s"] / run["attach_s"] / cores for run in runs]))
        rows.append(cells)
    widths = [max(len(row[column]) for row in rows) for column in range(len(headings))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    return "\n".join(lines)


def growth_summary(results: dict[int, list[dict[str, float]]], phase: str) -> str:
    """One line on how the median of ``phase`` grows with the host count.

    It gives the ratio between the largest and smallest count and a least-squares line
    ``seconds = fixed + slope * hosts`` over the medians.
    """
    points = [
        (count, statistics.median(run[phase] for run in runs))
        for count, runs in results.items()
        if runs
    ]
    if len(points) < 2:
        return f"{PHASES[phase]}: too few successful host counts to fit"
    (low, low_s), (high, high_s) = min(points), max(points)
    fit = statistics.linear_regression([float(c) for c, _ in points], [s for _, s in points])
    return (
        f"{PHASES[phase]}: {high} hosts take {high_s / low_s:.1f}x as long as {low} "
        f"({high / low:g}x the hosts); fit {fit.slope:.3f} s/host, intercept {fit.intercept:.2f} s"
    )


def run_parent(args: argparse.Namespace) -> int:
    """Measure every ``--hosts`` count ``--repeat`` times and print the table.

    Returns:
        0 when every run succeeded and nothing was left behind, else 1.
    """
    results: dict[int, list[dict[str, float]]] = {}
    all_leftovers = []
    with tempfile.TemporaryDirectory(prefix="attach-bench-") as work:
        for count in args.hosts:
            results[count], leftovers = measure_count(
                count, args.repeat, args.attach_timeout, Path(work)
            )
            all_leftovers += leftovers
    print(f"\nseconds, median (min) of {args.repeat} run(s) per host count:")
    print(format_table(results))
    for phase in ("listen_s", "attach_s", "spawn_s", "teardown_s", "preflight_s"):
        print(growth_summary(results, phase))
    for pid, command in all_leftovers:
        print(f"leftover process killed: {pid} {command}")
    print(f"leftover processes: {len(all_leftovers)}")
    failed = sum(args.repeat - len(runs) for runs in results.values())
    return 1 if failed or all_leftovers else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the parent, or one child with ``--one``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--repeat", type=int, default=3, help="runs per host count")
    parser.add_argument(
        "--attach-timeout",
        type=float,
        default=60.0,
        help="Monarch mesh_attach_config_timeout, seconds (its default: 60)",
    )
    child = parser.add_argument_group("internal: one measurement in a fresh process")
    child.add_argument("--one", type=int, help="host count to measure")
    child.add_argument("--ssh-port", type=int)
    child.add_argument("--key")
    child.add_argument("--monarch-port", type=int)
    child.add_argument("--result", help="JSON file for the timings")
    args = parser.parse_args(argv)
    return run_child(args) if args.one is not None else run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
