"""SPMD mode: run one program (or one function) on every slot, as torchrun would, over Monarch.

Two ways in:

- the command line, ``monarch-launch spmd [torchrun flags] script.py args`` (also installed as
  ``monarch-torchrun``), see :mod:`launcher.spmd_cli`;
- the in-code API, for notebooks and scripts::

      from monarch_operator.launcher import spmd_launcher

      with spmd_launcher(hostfile="hosts.txt", nproc_per_node=2) as launcher:
          try:
              losses = launcher.run(train, cfg)      # train(cfg) on every rank
          except SpmdRunError as error:               # raised in train on some rank
              print(error.failures[0].rank, error.failures[0].error)

Every rank gets torchrun's variables (see :mod:`launcher.programs.spmd_actor`). When one rank
fails, the others
are stopped (SIGTERM, then SIGKILL after a grace period) and the run's exit status is that of
the rank that failed first (by the time it ended; ties go to the lowest rank), ``128 + N`` for a
signal N, as in field case C9.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from monarch_operator import constants
from monarch_operator.hostfile import Host
from monarch_operator.launcher import exitcodes, stopsignal
from monarch_operator.launcher.hosts.placement import is_loopback_name
from monarch_operator.launcher.hosts.sources import resolve_host_source
from monarch_operator.launcher.programs import spmdstacks
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session import waiting
from monarch_operator.launcher.session.causes import monarch_loss
from monarch_operator.launcher.session.lifecycle import (
    FaultRecorder,
    SessionConfig,
    WorkerLost,
    check_hosts,
    install_fault_hook,
    one_line,
    signals_deferred,
    started_job,
)
from monarch_operator.launcher.session.rankstacks import stacks_dir
from monarch_operator.launcher.session.ssh import SshSettings

if TYPE_CHECKING:
    from monarch_operator.launcher.programs.spmd_actor import RankOutcome

SPMD_MESH = "spmd"
SPMD_MODULES = ("monarch", "monarch_operator.launcher.programs.spmd_actor")
# After the first rank fails: how long the others get to stop before they are killed, and how
# long the launcher waits for their outcomes after that, seconds.
STOP_GRACE_S = 5.0
COLLECT_GRACE_S = 10.0
# Poll interval per pending rank while waiting, seconds.
_POLL_S = 0.05
# At teardown: how long after the stop grace the procs may take to confirm, seconds.
_STOP_ANSWER_S = 3.0
# torchrun's words for --nproc-per-node (torch.distributed.run): "cpu" is resolved from this
# machine's CPU count, "gpu" and "auto" from the hosts' slots; see plan_spmd.
NPROC_KEYWORDS = ("cpu", "gpu", "auto")


def restart_variables(environ: Mapping[str, str]) -> dict[str, int | None]:
    """``{"restart_count", "max_restarts", "attempt"}`` of the run, for every rank's
    ``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS`` and ``MONARCH_ATTEMPT``
    (field case C21), from the launcher's ``MONARCH_RESTART_COUNT`` and
    ``MONARCH_MAX_RESTARTS`` (0 when unset: a standalone run is no restart) and
    ``MONARCH_ATTEMPT`` (None when unset), which the operator sets on its launcher pod.

    Raises:
        SpmdConfigError: a variable that is set but not a whole number (at least 0, at least 1
            for the attempt); the message names it.
    """
    found: dict[str, int | None] = {}
    for key, variable, default, least in (
        ("restart_count", constants.ENV_RESTART_COUNT, 0, 0),
        ("max_restarts", constants.ENV_MAX_RESTARTS, 0, 0),
        ("attempt", constants.ENV_ATTEMPT, None, 1),
    ):
        text = environ.get(variable, "").strip()
        if not text:
            found[key] = default
            continue
        if not text.isdigit() or int(text) < least:
            raise SpmdConfigError(f"{variable}={text!r}: must be a whole number, at least {least}")
        found[key] = int(text)
    return found


class SpmdConfigError(ValueError):
    """The SPMD request does not fit the hosts (counts, slots); the message gives the numbers."""


class SpmdRunError(RuntimeError):
    """One or more ranks failed.

    Attributes:
        failures: the failed ranks' :class:`launcher.programs.spmd_actor.RankOutcome`, first
        failure first
            (ranks the launcher stopped after that first failure are included, last).
        exit_code: the run's exit status, the first failure's (see the module doc).
    """

    def __init__(self, failures: Sequence[RankOutcome], world_size: int) -> None:
        self.failures = list(failures)
        first = self.failures[0]
        self.exit_code = first.exit_code or exitcodes.FAILURE
        others = len(self.failures) - 1
        tail = f"; {others} other rank(s) failed or were stopped" if others else ""
        trace = (
            f"\n--- remote traceback of rank {first.rank} ---\n{first.error}"
            if _is_traceback(first.error)
            else ""
        )
        super().__init__(
            f"rank {first.rank} of {world_size} (host {first.host}, local rank "
            f"{first.local_rank}) {describe_exit(first)}{tail}{trace}"
        )
        if first.exception is not None:
            self.__cause__ = first.exception


def _is_traceback(text: str) -> bool:
    return text.lstrip().startswith("Traceback")


def describe_exit(outcome: RankOutcome) -> str:
    """Say how a failed rank ended: ``raised ValueError: boom``, ``exited with code 3``,
    ``was killed by signal 9 (exit 137)`` or, for a rank whose host was lost, ``was lost: host b
    stopped answering ...`` (never an exit code it did not have)."""
    if outcome.lost:
        return f"was lost: {outcome.lost}"
    if _is_traceback(outcome.error):
        return "raised " + outcome.error.strip().splitlines()[-1]
    if outcome.exit_code > exitcodes.SIGNAL_BASE:
        signal_number = outcome.exit_code - exitcodes.SIGNAL_BASE
        return f"was killed by signal {signal_number} (exit {outcome.exit_code})"
    detail = f": {outcome.error}" if outcome.error else ""
    return f"exited with code {outcome.exit_code}{detail}"


def plan_spmd(
    hosts: Sequence[Host],
    nnodes: int | None,
    nproc_per_node: int | str | None,
    *,
    local_cpu_count: int | None = None,
    local_names: Collection[str] = (),
) -> tuple[list[Host], int]:
    """Choose the hosts and ranks per host of an SPMD run.

    Ranks are host-major in the order the hosts are given, never sorted (field case C11): ranks
    ``0..n-1`` run on the first host used, and that host is ``MASTER_ADDR``'s default.

    ``nproc_per_node`` follows torchrun, resolved here, before anything starts, so the printed
    plan is the run:

    - an integer: used as given (it never triggers a probe); it must fit every host's slots;
    - ``None``, ``"gpu"`` or ``"auto"``: the hosts' slots (GPUs from the hostfile, ``--hosts
      --slots-per-host`` or Slurm), the same on every host used; never a probe of this machine,
      whose GPUs say nothing about a remote host's;
    - ``"cpu"``: ``local_cpu_count``, allowed only when every host used is this machine (a
      loopback name or address, or one of ``local_names``): torchrun counts the CPUs of each
      node where it runs, which a launcher planning remote hosts from here cannot see. Slots
      count GPUs, and CPU ranks use none, so this count is not bounded by the slots.

    Args:
        hosts: hosts in order (hostfile, ``--hosts`` or Slurm).
        nnodes: hosts to use, the first ``nnodes``; None = all.
        nproc_per_node: ranks per host, an integer or one of :data:`NPROC_KEYWORDS`.
        local_cpu_count: this machine's CPU count (``os.cpu_count()``), for ``"cpu"``.
        local_names: names of this machine besides loopback ones (its host name), for ``"cpu"``.

    Returns:
        ``(hosts used, ranks per host)``.

    Raises:
        SpmdConfigError: more hosts asked for than given, counts below 1, an unknown keyword,
            hosts with different slots when the count comes from the slots, more ranks per host
            than a host has slots, or ``"cpu"`` with a remote host or an unknown CPU count.
    """
    count = len(hosts) if nnodes is None else nnodes
    if count < 1:
        raise SpmdConfigError(f"--nnodes must be at least 1, got {count}")
    if count > len(hosts):
        raise SpmdConfigError(f"--nnodes {count} asks for more hosts than the {len(hosts)} given")
    used = list(hosts[:count])
    if nproc_per_node == "cpu":
        return used, _local_cpu_ranks(used, local_cpu_count, local_names)
    if nproc_per_node is None or nproc_per_node in NPROC_KEYWORDS:
        slots = {host.slots for host in used}
        if len(slots) > 1:
            listing = ", ".join(f"{host.name} slots={host.slots}" for host in used)
            raise SpmdConfigError(f"hosts have different slots ({listing}); give --nproc-per-node")
        return used, slots.pop()
    if isinstance(nproc_per_node, str):
        raise SpmdConfigError(
            f"--nproc-per-node {nproc_per_node!r}: expected an integer or one of "
            f"{', '.join(NPROC_KEYWORDS)}"
        )
    if nproc_per_node < 1:
        raise SpmdConfigError(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    short = [host for host in used if host.slots < nproc_per_node]
    if short:
        listing = ", ".join(f"{host.name} slots={host.slots}" for host in short)
        raise SpmdConfigError(f"--nproc-per-node {nproc_per_node} exceeds the slots of {listing}")
    return used, nproc_per_node


def _local_cpu_ranks(
    used: Sequence[Host], local_cpu_count: int | None, local_names: Collection[str]
) -> int:
    """``--nproc-per-node cpu``: this machine's CPU count, when every host is this machine."""
    local = {name.lower() for name in local_names}
    remote = [
        host.name
        for host in used
        if not is_loopback_name(host.name) and host.name.lower() not in local
    ]
    if remote:
        raise SpmdConfigError(
            "--nproc-per-node cpu: the CPU count is known here only for this machine, not for "
            f"{', '.join(remote)}; give the ranks per host as an integer (torchrun counts each "
            "node's CPUs where it runs, this launcher plans every host from here)"
        )
    if local_cpu_count is None or local_cpu_count < 1:
        raise SpmdConfigError(
            "--nproc-per-node cpu: this machine's CPU count is unknown; give an integer"
        )
    return local_cpu_count


def this_machine_names() -> list[str]:
    """Names under which this machine may be listed besides loopback ones: its host name and
    that name's first label (``node7`` for ``node7.cluster``); no DNS lookup.

    Returns:
        The names, possibly with one repeated.
    """
    hostname = socket.gethostname()
    return [hostname, hostname.split(".", 1)[0]] if hostname else []


def default_master_addr(
    names: Sequence[str], addresses: Mapping[str, str], master_addr: str | None = None
) -> str:
    """``MASTER_ADDR`` of an SPMD run: ``master_addr`` when given, else the address of the host
    that runs rank 0, the first of ``names`` (field case C11).

    Args:
        names: the hosts used, in rank order (from :func:`plan_spmd`).
        addresses: each host's resolved address (from the pre-flight).
        master_addr: the ``--master-addr`` override, or None.

    Returns:
        The address every rank gets as ``MASTER_ADDR``.

    Raises:
        KeyError: the first host has no address in ``addresses``.
    """
    return master_addr or addresses[names[0]]


class SpmdLauncher:
    """Runs functions or programs on every rank of one set of hosts; see the module doc.

    The workers start on first use (or :meth:`start`) and stay up between runs until
    :meth:`close` (or the end of a ``with`` block). One launcher per process: Monarch's client
    transport is process-global.
    """

    def __init__(
        self,
        hosts: Sequence[Host],
        session: SessionConfig,
        nproc_per_node: int | str | None = None,
        nnodes: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
        run_id: str | None = None,
        role: str = "spmd",
        reporter: Reporter | None = None,
        prefix_output: bool = True,
        stack_dumps: bool = False,
    ) -> None:
        """Plan the run; nothing connects yet. ``stack_dumps``: every rank's stack is taken
        before a stalled run is stopped and on SIGUSR1 (:mod:`.spmdstacks`; the command line's
        choice: it sets a signal handler, so only from the main thread).

        Raises:
            SpmdConfigError: see :func:`plan_spmd`.
        """
        self.hosts, self.nproc_per_node = plan_spmd(
            hosts,
            nnodes,
            nproc_per_node,
            local_cpu_count=os.cpu_count(),
            local_names=this_machine_names(),
        )
        self.world_size = len(self.hosts) * self.nproc_per_node
        self.session = session
        self.reporter = reporter or Reporter()
        self.recorder = FaultRecorder(self.reporter)
        self._master_addr = master_addr
        self._master_port = master_port
        self._run_id = run_id or uuid.uuid4().hex[:12]
        self._restarts = restart_variables(os.environ)
        self._role = role
        self._prefix_output = prefix_output
        self._stack: contextlib.ExitStack | None = None
        self._ranks: Any = None
        self._control: Any = None
        self._broken: str | None = None
        self._lost_hosts: set[str] = set()
        self._stack_dumps = stack_dumps
        self._uninstall_stacks: Callable[[], None] | None = None
        self._addresses: dict[str, str] = {}

    def describe(self) -> list[str]:
        """Lines describing the plan, printed before start."""
        return [
            f"plan: spmd hosts={','.join(host.name for host in self.hosts)} "
            f"nproc_per_node={self.nproc_per_node} world_size={self.world_size}"
        ]

    def plan_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data."""
        return {
            "mode": "spmd",
            "hosts": [host.name for host in self.hosts],
            "nproc_per_node": self.nproc_per_node,
            "world_size": self.world_size,
        }

    def start(self) -> None:
        """Check the hosts, start one worker per host and one proc per rank.

        Raises:
            monarch_operator.launcher.session.preflight.PreflightError: a host failed pre-flight.
            Exception: whatever Monarch raises while attaching; nothing is left running.
        """
        if self._stack is not None:
            return
        names = [host.name for host in self.hosts]
        addresses = check_hosts(self.session, names, self.reporter)
        self.reporter.progress(f"pre-flight ok on {len(addresses)} hosts")
        install_fault_hook(self.recorder)  # before the first Monarch import (its log settings)
        from monarch_operator.launcher.programs.spmd_actor import (
            LOCAL_LABEL,
            SpmdControl,
            SpmdRank,
            World,
        )

        stack = contextlib.ExitStack()
        try:
            host_meshes = stack.enter_context(
                started_job(self.session, [(SPMD_MESH, names)], addresses, self.reporter,
                            self.recorder)
            )
            procs = host_meshes[SPMD_MESH].spawn_procs(
                per_host={LOCAL_LABEL: self.nproc_per_node}, name=self._role
            )
            master_addr = default_master_addr(names, addresses, self._master_addr)
            world = World(
                hosts=tuple(names),
                addresses=tuple(addresses[name] for name in names),
                nproc_per_node=self.nproc_per_node,
                master_addr=master_addr,
                master_port=0,
                run_id=self._run_id,
                role=self._role,
                prefix_output=self._prefix_output,
                cwd=os.getcwd(),
                stacks_dir=stacks_dir(self.session.run_id),
                **self._restarts,  # type: ignore[arg-type]
            )
            probe = procs.spawn("spmd_probe", SpmdRank, world)
            port = self._master_port or waiting.get(
                probe.slice(hosts=0, **{LOCAL_LABEL: 0}).free_port.call_one(addresses[names[0]]),
                self.session.attach_timeout_s,
            )
            world = dataclasses.replace(world, master_port=port)
            self._ranks = procs.spawn("spmd_rank", SpmdRank, world)
            self._control = procs.spawn("spmd_control", SpmdControl)
            self.reporter.progress(
                f"{self.world_size} ranks ready, MASTER_ADDR={master_addr} MASTER_PORT={port}"
            )
            if self._stack_dumps:
                self._addresses = dict(addresses)
                self._uninstall_stacks = spmdstacks.install(
                    self.session, addresses, stacks_dir(self.session.run_id))
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def close(self) -> None:
        """Stop every rank and worker and end the ssh sessions; safe to call twice.

        Running scripts are stopped first with their whole process group (SIGTERM, SIGKILL after
        ``STOP_GRACE_S``), so that what a script started itself (a data loader worker, a shell
        pipeline) ends with it; shutting the procs down alone would kill only the scripts.
        """
        stack, self._stack = self._stack, None
        control, self._ranks, self._control = self._control, None, None
        uninstall, self._uninstall_stacks = self._uninstall_stacks, None
        if uninstall is not None:
            uninstall()
            self._stacks_before_stop(control)
        try:
            if control is not None:
                self._stop_scripts(control)
        finally:
            if stack is not None:
                stack.close()

    def _stacks_before_stop(self, control: Any) -> None:
        """Every rank's stack, from the hosts still there, when the run is being stopped from
        outside (a stop signal) or after a host was lost; not after a stall (taken then) nor
        at a normal end."""
        signal_number = stopsignal.received()
        if control is None or stopsignal.stall_recorded():
            return
        if signal_number is not None:
            why = f"stopped: {stopsignal.describe(signal_number)}"
        elif self._lost_hosts:
            why = f"host {', '.join(sorted(self._lost_hosts))} lost"
        else:
            return
        spmdstacks.before_stop(self.session, {host: address for host, address in
                                              self._addresses.items()
                                              if host not in self._lost_hosts},
                               stacks_dir(self.session.run_id), why)

    def _stop_scripts(self, control: Any) -> None:
        """SIGTERM then SIGKILL every running script's process group, host by host, skipping
        hosts whose worker was lost (they cannot answer); bounded, errors ignored."""
        with signals_deferred():
            calls = []
            for host_index, host in enumerate(self.hosts):
                if host.name in self._lost_hosts:
                    continue
                try:
                    calls.append(control.slice(hosts=host_index).terminate.call(STOP_GRACE_S))
                except Exception:  # noqa: BLE001 - best effort: the procs are shut down next
                    pass
            deadline = time.monotonic() + STOP_GRACE_S + _STOP_ANSWER_S
            for call in calls:
                try:
                    call.get(timeout=max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - e.g. a proc that died: go on with teardown
                    pass

    def __enter__(self) -> SpmdLauncher:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def run(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``function(*args, **kwargs)`` on every rank, with torchrun's variables set.

        ``function`` is pickled by value when defined in ``__main__`` or a notebook, else by
        reference (its module must be importable on the hosts).

        Returns:
            The return values, indexed by rank.

        Raises:
            SpmdRunError: ``function`` raised (or called ``sys.exit`` non-zero) on some rank;
                ``__cause__`` is the first rank's exception when it could be pickled.
        """
        outcomes = self._run("run_function", function, args, kwargs)
        return [outcome.value for outcome in outcomes]

    def run_command(self, argv: Sequence[str]) -> list[RankOutcome]:
        """Run the program ``argv`` on every rank, relaying output prefixed ``[role/host/rank]``.

        Returns:
            Every rank's outcome, by rank, when all exited 0.

        Raises:
            SpmdRunError: some rank exited non-zero or was killed; the others were stopped.
        """
        return self._run("run_command", list(argv))

    def _run(self, endpoint: str, *args: Any) -> list[RankOutcome]:
        if self._broken:
            raise RuntimeError(
                f"this launcher cannot run again: {self._broken}; close() it and make a new one"
            )
        self.start()
        from monarch_operator.launcher.programs.spmd_actor import LOCAL_LABEL

        futures = {}
        for host_index in range(len(self.hosts)):
            for local in range(self.nproc_per_node):
                rank = host_index * self.nproc_per_node + local
                actor = self._ranks.slice(hosts=host_index, **{LOCAL_LABEL: local})
                futures[rank] = getattr(actor, endpoint).call_one(*args)
        try:
            outcomes = self._collect(futures, stoppable=endpoint == "run_command")
        except WorkerLost as lost:
            self._broken = str(lost)
            self._lost_hosts.update(lost.hosts)
            raise SpmdRunError(self._lost_ranks(lost), self.world_size) from None
        failures = sorted(
            (outcome for outcome in outcomes if outcome.exit_code != 0),
            key=lambda outcome: (outcome.ended_at, outcome.rank),
        )
        if failures:
            raise SpmdRunError(failures, self.world_size)
        return outcomes

    def _lost_ranks(self, lost: WorkerLost) -> list[RankOutcome]:
        """Outcomes for every rank on a host whose worker was lost."""
        from monarch_operator.launcher.programs.spmd_actor import RankOutcome

        now = time.time()
        return [
            RankOutcome(
                index * self.nproc_per_node + local,
                host.name,
                local,
                exitcodes.FAILURE,
                now,
                error=str(lost),
                lost=lost.reasons.get(host.name, str(lost)),
            )
            for index, host in enumerate(self.hosts)
            if host.name in lost.hosts
            for local in range(self.nproc_per_node)
        ]

    def _outcome_from_error(self, rank: int, error: BaseException) -> RankOutcome:
        from monarch_operator.launcher.programs.spmd_actor import RankOutcome

        text = str(error)
        code = exitcodes.exit_code_for_failure([*self.recorder.reports, text])
        host_index, local = divmod(rank, self.nproc_per_node)
        host = self.hosts[host_index].name
        # A host that went silent has no exit code: say so instead of "exited with code 1".
        lost = monarch_loss(text, host) if code == exitcodes.FAILURE else None
        # The rank's process is gone; Monarch cannot respawn it into this mesh.
        self._broken = f"the process of rank {rank} on {host} died"
        return RankOutcome(
            rank, host, local, code, time.time(), error=one_line(text, 2000), lost=lost or ""
        )

    def _collect(self, futures: dict[int, Any], stoppable: bool) -> list[RankOutcome]:
        """Wait for every rank; after the first failure stop the rest and wait a bounded time."""
        outcomes: dict[int, RankOutcome] = {}
        failed_at: float | None = None
        while len(outcomes) < len(futures):
            for rank, future in futures.items():
                if rank in outcomes:
                    continue
                try:
                    outcome = future.get(timeout=_POLL_S)
                except TimeoutError:
                    continue
                except Exception as error:  # noqa: BLE001 - the proc died: report it as the rank's
                    outcome = self._outcome_from_error(rank, error)
                outcomes[rank] = outcome
                if outcome.exit_code != 0 and failed_at is None:
                    failed_at = time.monotonic()
                    self._stop_ranks(stoppable)
            if (
                failed_at is not None
                and time.monotonic() - failed_at > STOP_GRACE_S + COLLECT_GRACE_S
            ):
                missing = sorted(set(futures) - set(outcomes))
                self._broken = f"ranks {missing} did not finish after rank failures"
                self.reporter.warning(f"{self._broken}; they are stopped with the workers")
                break
        return [outcomes[rank] for rank in sorted(outcomes)]

    def _stop_ranks(self, stoppable: bool) -> None:
        if stoppable and self._control is not None:
            self._control.terminate.broadcast(STOP_GRACE_S)


def spmd_launcher(
    hostfile: str | None = None,
    hosts: str | Sequence[str] | None = None,
    slurm: bool = False,
    nproc_per_node: int | str | None = None,
    nnodes: int | None = None,
    ssh_key: str | None = None,
    ssh_port: int = 22,
    ssh_user: str | None = None,
    known_hosts: str | None = None,
    python_exe: str | None = None,
    env: dict[str, str] | None = None,
    monarch_port: int = 22222,
    master_port: int | None = None,
    quiet: bool = False,
    **session: Any,
) -> SpmdLauncher:
    """Build an :class:`SpmdLauncher` from the same choices as the command line.

    Args:
        hostfile, hosts, slurm: exactly one host source (path; ``"a,b"`` or a list; Slurm).
        nproc_per_node: ranks per host: an integer, ``"gpu"``/``"auto"`` (the hosts' slots,
            the default) or ``"cpu"`` (this machine's CPU count, local hosts only); see
            :func:`plan_spmd`.
        nnodes: hosts to use (default: all).
        ssh_key, ssh_port, ssh_user: how to log in (default user: the current one).
        known_hosts: the known_hosts file every host's key is checked against strictly
            (default: ``$MONARCH_KNOWN_HOSTS`` when set, else ssh's own files with
            ``accept-new``; see :mod:`launcher.session.ssh`).
        python_exe: worker Python, same path on every host (default: this interpreter).
        env: extra variables for every rank, on top of the allow-list of
        :mod:`launcher.session.environment`. monarch_port: the Monarch worker port on every host.
        master_port: ``MASTER_PORT`` (default: a free port on the first host).
        quiet: print only failures.
        **session: further :class:`launcher.session.lifecycle.SessionConfig` fields (e.g.
        ``attach_timeout_s``).

    Raises:
        HostSourceError, SpmdConfigError: bad host source or counts.
    """
    import getpass
    import sys

    from monarch_operator.launcher.session.environment import worker_environment

    host_list = hosts if hosts is None or isinstance(hosts, str) else ",".join(hosts)
    if ssh_key and not os.path.isfile(os.path.expanduser(ssh_key)):
        raise SpmdConfigError(f"ssh_key {ssh_key}: no such file")
    known_hosts = known_hosts or os.environ.get(constants.ENV_KNOWN_HOSTS) or None
    if known_hosts and not os.path.isfile(os.path.expanduser(known_hosts)):
        raise SpmdConfigError(f"known_hosts {known_hosts}: no such file")
    resolved, _source = resolve_host_source(hostfile, host_list, slurm, None, os.environ)
    config = SessionConfig(
        ssh=SshSettings(
            port=ssh_port,
            user=ssh_user or getpass.getuser(),
            key=os.path.expanduser(ssh_key) if ssh_key else None,
            known_hosts=os.path.expanduser(known_hosts) if known_hosts else None,
        ),
        python_exe=python_exe or sys.executable,
        monarch_port=monarch_port,
        environment=worker_environment(os.environ, env),
        modules=SPMD_MODULES,
        **session,
    )
    return SpmdLauncher(
        resolved,
        config,
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        master_port=master_port,
        reporter=Reporter(quiet=quiet),
    )
