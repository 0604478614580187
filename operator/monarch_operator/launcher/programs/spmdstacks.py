"""Every rank's stack in SPMD mode (issue 35): before a stalled run is stopped, and on SIGUSR1.

Role mode and the job API use the same takers and report (:func:`install_taker`,
:func:`print_before_stop`, :class:`StackReport`) for their procs (:mod:`.jobstacks`).

:class:`.spmd.SpmdLauncher` starts every Python rank with the stack bootstrap
(:mod:`launcher.session.rankstacks`); :func:`install` then registers

- with :mod:`launcher.progress` a taker of every rank's stack that runs before a run that
  stalled (``MONARCH_PROGRESS_DEADLINE_SECONDS`` / ``runPolicy.progressDeadlineSeconds``) is
  stopped: the final message names the odd rank out and each rank gets one line in the
  attempt's record;
- a SIGUSR1 handler: the launcher takes every rank's stack and prints them, and the run goes on
  (``kill -USR1 <launcher>`` standalone; ``kubectl monarch stacks JOB`` on a MonarchJob).

:meth:`.spmd.SpmdLauncher.close` also takes them (:func:`before_stop`) when the run is stopped
from outside (a stop signal: ``activeDeadlineSeconds``, a deletion, Ctrl-C) or a host was
lost, from the hosts still there, before the ranks are stopped.

Both print the whole dumps between :data:`BEGIN` and :data:`END` lines on stderr, which is the
launcher's log (``kubectl monarch logs``); in a MonarchJob's launcher they also go to the job's
``<job>-progress`` ConfigMap (key ``stacks.txt``, the last dump), which lives as long as the
job: ``kubectl monarch stacks`` shows it after the pods are gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from monarch_operator import constants
from monarch_operator.launcher import progress
from monarch_operator.launcher.session import rankstacks, stackdumps
from monarch_operator.launcher.session.fanout import CommandResult
from monarch_operator.launcher.session.lifecycle import SessionConfig, signals_deferred

ON_DEMAND_SIGNAL = signal.SIGUSR1
# Each host's ssh limit when the stacks are taken as the run is stopped from outside (a stop
# signal: the operator's deadline, a deletion) or after a host was lost: the stop must not wait
# for long on a silent host.
BEFORE_STOP_LIMIT_S = 8.0
BEGIN = "==== monarch stacks begin ===="
END = "==== monarch stacks end ===="


@dataclass
class StackReport:
    """Every rank's dump (``dumps``), the odd one out (``odd``, "" when none), and the hosts
    that gave nothing (``silent``: host -> why)."""

    dumps: list[stackdumps.RankDump]
    odd: str
    silent: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """One bounded line per rank (:func:`.stackdumps.summary_lines`), then one per silent
        host."""
        return [*stackdumps.summary_lines(self.dumps),
                *(f"host {host}: {why}" for host, why in sorted(self.silent.items()))]


def take_stacks(session: SessionConfig, addresses: Mapping[str, str], folder: str,
                limit_s: float = rankstacks.COLLECT_LIMIT_S) -> StackReport:
    """Every rank's stack and flight recorder on the hosts ``addresses`` (``{host name:
    address}``) over ssh, each host's ssh at most ``limit_s`` seconds; nothing is stopped."""
    results = rankstacks.collect(session.ssh, {address: host for host, address in
                                               addresses.items()}, folder, limit_s=limit_s)
    dumps: list[stackdumps.RankDump] = []
    silent: dict[str, str] = {}
    for host, result in results.items():
        found = stackdumps.parse_host_output(host, result.stdout)
        dumps.extend(found)
        why = silent_reason(result, bool(found))
        if why is not None:
            silent[host] = why
    dumps.sort(key=lambda dump: dump.rank)
    return StackReport(dumps, stackdumps.odd_one_out(dumps), silent)


def silent_reason(result: CommandResult, found: bool) -> str | None:
    """Why a host's collector gave nothing (no answer, ssh's failure, no rank running), or
    None when it answered with ranks."""
    if result.exit_status == 0 and found:
        return None
    if result.exit_status is None:
        return "no answer within the time limit"
    if result.exit_status:
        return f"ssh exit {result.exit_status}: {result.stderr.strip()[:160]}"
    return "no rank running"


def print_report(report: StackReport, why: str) -> None:
    """The summary lines and the whole dumps on stderr, and in a MonarchJob's ConfigMap
    (:func:`.progress.store_stacks`; see the module doc)."""
    head = f"monarch-launch: stacks of every rank ({why})"
    lines = [head + (f": {report.odd}" if report.odd else ""),
             *(f"monarch-launch:   {line}" for line in report.lines()),
             BEGIN, stackdumps.full_text(report.dumps), END]
    print("\n".join(lines), file=sys.stderr, flush=True)
    attempt = os.environ.get(constants.ENV_ATTEMPT, "")
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    progress.store_stacks("\n".join([
        f"{constants.STACKS_DUMP_HEADER} attempt={attempt or '-'} time={moment} ({why})",
        *lines, ""]))


def before_stop(session: SessionConfig, addresses: Mapping[str, str], folder: str,
                why: str) -> None:
    """Take and print every rank's stack as the run is stopped (``why``), each host's ssh
    bounded by :data:`BEFORE_STOP_LIMIT_S`; a failure is said, never raised."""
    print_before_stop(lambda limit_s: take_stacks(session, addresses, folder, limit_s), why)


def print_before_stop(take: Callable[[float], StackReport], why: str) -> None:
    """``take(BEFORE_STOP_LIMIT_S)`` printed as the run is stopped (``why``); a failure is
    said, never raised. Stop signals are only recorded meanwhile (the teardown that follows
    must run), and a host lost meanwhile is said, not raised: the run is already ending."""
    try:
        with signals_deferred():
            print_report(take(BEFORE_STOP_LIMIT_S), why)
    except BaseException as error:  # noqa: BLE001 - the stop goes on whatever happens here
        print(f"monarch-launch: could not take the ranks' stacks: {error}", file=sys.stderr,
              flush=True)


def pid_file_path(environ: Mapping[str, str]) -> str | None:
    """:data:`constants.STACKS_PID_FILE` for a MonarchJob's launcher (its job uid and attempt
    in ``environ``), None elsewhere."""
    uid, attempt = environ.get(constants.ENV_JOB_UID), environ.get(constants.ENV_ATTEMPT)
    if not uid or not attempt:
        return None
    return (constants.STACKS_PID_FILE.replace("${MONARCH_JOB_UID}", uid)
            .replace("${MONARCH_ATTEMPT}", attempt))


def _write_pid_file(environ: Mapping[str, str]) -> str | None:
    path = pid_file_path(environ)
    if path is None:
        return None
    try:
        with open(path, "w") as out:
            out.write(str(os.getpid()))
    except OSError as error:
        print(f"monarch-launch: {path} not written ({error}): `kubectl monarch stacks` will "
              "signal the container's first process", file=sys.stderr, flush=True)
        return None
    return path


def install(session: SessionConfig, addresses: Mapping[str, str],
            folder: str) -> Callable[[], None]:
    """Register the stall taker and the SIGUSR1 handler (see the module doc); call in the
    launcher's main thread once its ranks' hosts are known. Returns what unregisters both
    (the earlier SIGUSR1 handler back)."""
    return install_taker(lambda limit_s: take_stacks(session, addresses, folder, limit_s))


def install_taker(take: Callable[[float], StackReport]) -> Callable[[], None]:
    """Register ``take`` (``take(limit_s)``: every rank's stacks, each host's ssh at most
    ``limit_s`` seconds) as the stall taker and the SIGUSR1 handler of this launcher, in SPMD
    mode (:func:`install`) or role mode (:mod:`.jobstacks`); call in the main thread. Returns
    what unregisters both (the earlier SIGUSR1 handler back)."""
    busy = threading.Lock()

    def on_stall() -> tuple[str, list[str]] | None:
        with busy:  # a dump on request still running would empty the files this one reads
            report = take(rankstacks.COLLECT_LIMIT_S)
        print_report(report, "the run stalled")
        return (report.odd, report.lines()) if report.dumps else None

    def on_demand() -> None:
        try:
            print_report(take(rankstacks.COLLECT_LIMIT_S), "on request")
        except Exception as error:  # noqa: BLE001 - a failed dump never ends the run
            print(f"monarch-launch: could not take the ranks' stacks: {error}", file=sys.stderr,
                  flush=True)
        finally:
            busy.release()

    def handler(signum: int, frame: Any) -> None:
        # The session's worker watch signals the main thread with SIGUSR1 too: its handler
        # raises WorkerLost when a host's worker ended, and does nothing otherwise.
        if callable(previous):
            previous(signum, frame)
        if busy.acquire(blocking=False):  # one dump at a time; the ssh runs off the main thread
            threading.Thread(target=on_demand, name="rank-stacks", daemon=True).start()

    progress.set_stall_stacks(on_stall)
    previous = signal.getsignal(ON_DEMAND_SIGNAL)
    signal.signal(ON_DEMAND_SIGNAL, handler)
    pid_file = _write_pid_file(os.environ)

    def uninstall() -> None:
        progress.set_stall_stacks(None)
        signal.signal(ON_DEMAND_SIGNAL, previous)
        if pid_file:
            with contextlib.suppress(OSError):
                os.unlink(pid_file)

    return uninstall
