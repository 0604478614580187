"""Every Monarch proc's stack in role mode and the job API (issue 35 items 3 and 4).

A :class:`.job.Job`'s rank probe, the first actor spawned in every proc of a role, registers
the proc's stack dump (:func:`.procstacks.register`) before any user actor runs. Once the job
is entered, :func:`install` registers, in the launcher's main thread, the same takers as SPMD
mode (:func:`.spmdstacks.install_taker`):

- before a run that stalled (``runPolicy.progressDeadlineSeconds`` /
  ``MONARCH_PROGRESS_DEADLINE_SECONDS``) is stopped, every proc's stack is taken: the final
  message names the odd one out of each role (:func:`odd_per_role`: ``trainer rank 2 on h is
  not in all_reduce #3 where 3 ranks wait: train.py:88 load_batch``) and each proc gets one
  line in the attempt's record;
- SIGUSR1 (``kill -USR1 <launcher>``; ``kubectl monarch stacks JOB``) prints every proc's stack
  and the run goes on.

:func:`before_stop`, called as the job is left, also takes them when the run is stopped from
outside (a stop signal) or a host was lost (from the hosts still there), before the meshes are
shut down. The dumps go where SPMD mode's go: the launcher's stderr and the job's
``<job>-progress`` ConfigMap (``kubectl monarch stacks``).

The launcher knows every proc's pid from the probe (:class:`.rankside.RankInfo`), so the
collector signals exactly those pids, each only while it still holds its stack file open.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from monarch_operator.launcher import stopsignal
from monarch_operator.launcher.programs import spmdstacks
from monarch_operator.launcher.programs.spmdstacks import StackReport
from monarch_operator.launcher.session import procstacks, stackdumps
from monarch_operator.launcher.session.procstacks import ProcTarget
from monarch_operator.launcher.session.workerloss import WorkerLost

if TYPE_CHECKING:
    from monarch_operator.launcher.programs.rankside import RankInfo
    from monarch_operator.launcher.session.lifecycle import SessionConfig


class EnteredJob(Protocol):
    """What this module reads of an entered :class:`.job.Job` (which imports this module)."""

    session: SessionConfig
    ranks: dict[str, list[RankInfo]]
    addresses: dict[str, str]

    @property
    def run_id(self) -> str: ...


def odd_per_role(dumps: Sequence[stackdumps.RankDump]) -> str:
    """The odd one out of each role (:func:`.stackdumps.odd_one_out` within the role: a role
    is a collective group of its own), joined by ``; `` in the roles' order; "" when no role
    has one."""
    roles: dict[str, list[stackdumps.RankDump]] = collections.defaultdict(list)
    for dump in sorted(dumps, key=lambda dump: (dump.order, dump.role, dump.rank)):
        roles[dump.role].append(dump)
    return "; ".join(odd for odd in map(stackdumps.odd_one_out, roles.values()) if odd)


def proc_targets(run_id: str, ranks: Mapping[str, Sequence[RankInfo]],
                 addresses: Mapping[str, str],
                 left_out: Collection[str] = ()) -> dict[str, tuple[str, list[ProcTarget]]]:
    """``{address: (host name, its procs)}`` of every role's ranks (``ranks``: the job's
    :class:`RankInfo` lists by role), leaving out the hosts ``left_out`` (lost ones)."""
    targets: dict[str, tuple[str, list[ProcTarget]]] = {}
    for infos in ranks.values():
        for info in infos:
            if info.host in left_out or info.host not in addresses:
                continue
            entry = targets.setdefault(addresses[info.host], (info.host, []))
            entry[1].append(ProcTarget(info.role, info.rank, info.pid,
                                       procstacks.stack_path(run_id, info.role, info.rank)))
    return targets


def take_job_stacks(session: SessionConfig, run_id: str, ranks: Mapping[str, Sequence[RankInfo]],
                    addresses: Mapping[str, str], limit_s: float,
                    left_out: Collection[str] = ()) -> StackReport:
    """Every proc's stack and flight recorder over ssh, each host's ssh at most ``limit_s``
    seconds; nothing is stopped. Procs are ordered by role (the job's order), then rank."""
    order = {role: index for index, role in enumerate(ranks)}
    results = procstacks.collect(
        session.ssh, proc_targets(run_id, ranks, addresses, left_out),
        concurrency=session.ssh.concurrency, limit_s=limit_s)
    dumps: list[stackdumps.RankDump] = []
    silent: dict[str, str] = {}
    for host, result in results.items():
        found = stackdumps.parse_host_output(host, result.stdout)
        for dump in found:
            dump.order = order.get(dump.role, len(order))
        dumps.extend(found)
        why = spmdstacks.silent_reason(result, bool(found))
        if why is not None:
            silent[host] = why
    dumps.sort(key=lambda dump: (dump.order, dump.rank))
    return StackReport(dumps, odd_per_role(dumps), silent)


def install(job: EnteredJob) -> Callable[[], None]:
    """Register the stall taker and the SIGUSR1 handler for the entered ``job`` (module doc);
    in the main thread only (Python runs signal handlers there), elsewhere nothing. Returns
    what unregisters them."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    return spmdstacks.install_taker(lambda limit_s: take_job_stacks(
        job.session, job.run_id, job.ranks, job.addresses, limit_s))


def stop_reason(error: BaseException | None) -> tuple[str, frozenset[str]] | None:
    """Why the run is being stopped, for :func:`before_stop`, and the hosts lost: a stop
    signal (not the launcher's own stop of a stalled run, whose stacks were taken then), or a
    lost host (``error`` a :class:`WorkerLost`); None otherwise (a normal end, a rank's
    failure)."""
    if stopsignal.stall_recorded():
        return None
    signal_number = stopsignal.received()
    if signal_number is not None:
        return f"stopped: {stopsignal.describe(signal_number)}", frozenset()
    if isinstance(error, WorkerLost):
        return f"host {', '.join(sorted(error.hosts))} lost", frozenset(error.hosts)
    return None


def before_stop(job: EnteredJob, error: BaseException | None) -> None:
    """Take and print every proc's stack as the entered ``job`` is left because of ``error``
    when :func:`stop_reason` says the run is being stopped; from the hosts still there, each
    host's ssh at most :data:`.spmdstacks.BEFORE_STOP_LIMIT_S` seconds; never raises."""
    reason = stop_reason(error)
    if reason is None or not job.ranks:
        return
    why, lost = reason
    spmdstacks.print_before_stop(lambda limit_s: take_job_stacks(
        job.session, job.run_id, job.ranks, job.addresses, limit_s, lost), why)

