"""The job behind the public API (:mod:`monarch_operator.job`): trainer and reference meshes.

:class:`Job` is a context manager. Entering it plans the placement, runs the pre-flight (every
host, in parallel, with a reason per failing host), starts one Monarch worker per host over ssh,
attaches the host meshes, spawns each role's procs (one per GPU, with the role's
``CUDA_VISIBLE_DEVICES``), identifies every rank (:mod:`launcher.programs.rankside`) and gives
each role's procs the variables of a torch.distributed group of that role alone
(:mod:`launcher.programs.distributed`; ``job.groups[role]``). Leaving
it, normally, by an exception or by SIGTERM/SIGHUP, shuts the meshes down and ends the ssh sessions.

Failures of user actors reach the controller as :class:`RankFailure` (role, rank, host, local
rank, exit code or signal, remote traceback): from :meth:`Job.get`, from :meth:`Job.failure`
on a caught Monarch error, or raised out of the ``with`` block in place of Monarch's error.
A rank that ended its own process is reported with its own exit status
(:mod:`launcher.session.exitrecords`), never a guess from Monarch's supervision text.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any

from monarch_operator.launcher import exitcodes
from monarch_operator.launcher.hosts.layout import plan_layout
from monarch_operator.launcher.hosts.placement import (
    PlacementError,
    Plan,
    RolePlan,
    format_plan,
    plan_placement,
    plan_to_dict,
)
from monarch_operator.launcher.hosts.rolespecs import roles_argv
from monarch_operator.launcher.jobconfig import LAUNCH_ARGS_ENV, JobConfig, job_config_from_args
from monarch_operator.launcher.options import UsageError, build_job_parser
from monarch_operator.launcher.programs import jobstacks
from monarch_operator.launcher.programs.distributed import RoleGroup, form_role_groups
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session import waiting
from monarch_operator.launcher.session.causes import monarch_loss
from monarch_operator.launcher.session.exitrecords import ExitRecord, collect
from monarch_operator.launcher.session.lifecycle import (
    FaultRecorder,
    SessionConfig,
    check_hosts,
    install_fault_hook,
    install_termination_handlers,
    one_line,
    started_job,
)
from monarch_operator.launcher.session.procenv import set_environment

# Modules every role proc imports (pre-flight ``ImportFailed`` names a host that lacks them).
JOB_MODULES = ("monarch", "monarch_operator.launcher.programs.rankside")
# Label of the per-host proc dimension (Monarch's SPMD helpers read the last label as local rank).
_PROCS_LABEL = "gpus"
# Limit for identifying the ranks after their procs started, seconds.
IDENTIFY_TIMEOUT_S = 60.0


class JobError(RuntimeError):
    """A job failed; ``exit_code`` is the launcher's exit status for it
    (:mod:`launcher.exitcodes`)."""

    exit_code: int = exitcodes.FAILURE


class RankFailure(JobError):
    """A rank of a role failed: its endpoint raised, or its process exited or was killed.

    Attributes:
        role: the rank's role (``trainer``, ``ref``).
        rank: rank within the role.
        host: the host name given to the launcher.
        local_rank: the rank's index on its host.
        exit_code: the launcher's exit status for this failure: the process's own exit code,
            ``128 + N`` when killed by signal N, 1 when an endpoint raised.
        signal: the signal number when the process was killed by one, else None.
        what: how it failed, e.g. ``raised ValueError: boom`` or ``exited with code 3``.
        traceback: the remote traceback when an endpoint raised, else "".
        detail: Monarch's own message, one line.
    """

    def __init__(
        self,
        role: str,
        rank: int,
        host: str,
        local_rank: int,
        exit_code: int,
        what: str,
        traceback: str = "",
        detail: str = "",
    ) -> None:
        self.role, self.rank, self.host, self.local_rank = role, rank, host, local_rank
        self.exit_code = exit_code
        self.signal = (
            exit_code - exitcodes.SIGNAL_BASE if exit_code > exitcodes.SIGNAL_BASE else None
        )
        self.what, self.traceback, self.detail = what, traceback, detail
        super().__init__(self.summary)

    @property
    def summary(self) -> str:
        """One line: ``<role> rank R (host H, local rank L): <what>``."""
        return (
            f"{self.role} rank {self.rank} (host {self.host}, local rank {self.local_rank}): "
            f"{self.what}"
        )

    def __reduce__(self) -> Any:
        return (
            RankFailure,
            (
                self.role,
                self.rank,
                self.host,
                self.local_rank,
                self.exit_code,
                self.what,
                self.traceback,
                self.detail,
            ),
        )


def describe_exit_code(code: int) -> str:
    """``exited with code 3`` or ``was killed by signal 9 (exit 137)``."""
    if code > exitcodes.SIGNAL_BASE:
        return f"was killed by signal {code - exitcodes.SIGNAL_BASE} (exit {code})"
    return f"exited with code {code}"


class Job:
    """A trainer mesh and a reference-model mesh on the hosts of a hostfile; see the module doc.

    One job per process at a time: Monarch's client transport is process-global.

    Example::

        with Job.from_env() as job:            # in a MonarchJob launcher pod, or any hostfile
            trainer = job.trainer.spawn("trainer", MyTrainer, lr=1e-4)
            ref = job.ref.spawn("ref", MyReference)
            try:
                job.get(trainer.step.call(batch))
            except RankFailure as failure:
                print(failure.role, failure.rank, failure.host, failure.traceback)
    """

    def __init__(
        self,
        config: JobConfig,
        reporter: Reporter | None = None,
        modules: Sequence[str] = (),
    ) -> None:
        """Plan the placement; nothing connects until the job is entered.

        Args:
            config: hosts, session and placement.
            reporter: output sink (default: human text, progress on stderr).
            modules: further modules every host must be able to import (pre-flight).

        Raises:
            monarch_operator.launcher.hosts.placement.PlacementError: the roles do not fit the
            hosts (named roles: the message starts with their source, e.g. ``MONARCH_ROLES``).
        """
        self.config = config
        self.plan: Plan = plan_job(config)
        self.reporter = reporter or Reporter()
        self.recorder = FaultRecorder(self.reporter)
        self.session = _with_modules(config.session, modules)
        self.host_meshes: dict[str, Any] = {}
        self.addresses: dict[str, str] = {}
        self.ranks: dict[str, list[Any]] = {}
        self.groups: dict[str, RoleGroup] = {}
        self._probes: dict[str, Any] = {}
        self._procs: dict[str, Any] = {}
        self._stack: contextlib.ExitStack | None = None
        self._exit_records: list[ExitRecord] = []

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_env(
        cls,
        argv: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
        reporter: Reporter | None = None,
        modules: Sequence[str] = (),
        library_call: bool = True,
    ) -> Job:
        """Build the job as ``monarch-launch`` would from ``argv`` and the environment.

        ``modules``: further modules every host must import (pre-flight ``ImportFailed``),
        typically the package of the program's actors. ``library_call``: a bad flag raises
        UsageError (True, the default) instead of printing usage and exiting.

        In a MonarchJob's launcher pod the operator's ``MONARCH_*`` variables give the hostfile,
        key, port and roles (docs/launcher-contract.md), so ``Job.from_env()``
        needs no arguments; under ``monarch-launch run`` it takes that command's flags.
        ``argv`` takes ``monarch-launch``'s host, placement and ssh flags
        (e.g. ``["--hostfile", "hosts", "--trainer-hosts", "2"]``).

        Raises:
            monarch_operator.launcher.options.UsageError: bad flags or host source.
            monarch_operator.launcher.hosts.placement.PlacementError: the roles do not fit.
        """
        environ = os.environ if environ is None else environ
        if not argv and environ.get(LAUNCH_ARGS_ENV):
            # Inside `monarch-launch run module` / `run script.py`: the launcher's own flags.
            argv = json.loads(environ[LAUNCH_ARGS_ENV])
        # From code (library_call) a bad option raises instead of printing usage and exiting.
        args = build_job_parser(library_call).parse_args(list(argv))
        reporter = reporter or Reporter(json_mode=args.json, quiet=args.quiet)
        return cls(job_config_from_args(args, environ, JOB_MODULES), reporter, modules)

    @classmethod
    def from_args(cls, reporter: Reporter | None = None, **options: Any) -> Job:
        """Build the job from keyword options named like ``monarch-launch``'s flags.

        Example: ``Job.from_args(hostfile="hosts", trainer_hosts=2, ref_hosts=1,
        ssh_key="~/.ssh/id_ed25519", env={"NCCL_DEBUG": "INFO"})``. ``True`` gives a bare
        flag (``colocate=True``), ``False`` its ``--no-`` form where one exists, a dict
        ``env`` one ``--env K=V`` each, a list ``hosts`` a comma-separated list. ``roles``
        names the roles: ``["generator=2", "trainer=1,gpus=4", "ref=@trainer"]`` (``--role``
        values), role objects as in ``MONARCH_ROLES`` (``[{"name": "generator", "hosts": 2},
        ...]``) or :class:`RoleSpec` s, or a ``--roles`` file name.

        Raises:
            monarch_operator.launcher.options.UsageError, PlacementError: as :meth:`from_env`.
        """
        workload_only = {"steps", "call_timeout", "fail_at_step", "fail_exit_code", "dry_run"}
        misplaced = sorted(workload_only & set(options))
        if misplaced:
            raise UsageError(
                f"Job.from_args: {', '.join(misplaced)} belong to the built-in example "
                "(monarch-launch), not to a job"
            )
        return cls.from_env(argv_from_options(options), None, reporter)

    # -- the meshes -------------------------------------------------------------------------

    @property
    def trainer(self) -> Any:
        """The trainer's ProcMesh (dims ``hosts`` x ``gpus``), once entered; raises
        :class:`RoleNotFound` (a KeyError) when the layout has no ``trainer`` role."""
        return self.procs("trainer")

    @property
    def ref(self) -> Any:
        """The reference model's ProcMesh (dims ``hosts`` x ``gpus``), once entered; raises
        :class:`RoleNotFound` when the layout has no ``ref`` role."""
        return self.procs("ref")

    @property
    def roles(self) -> Mapping[str, Any]:
        """Every role's ProcMesh by name, in start order (``job.roles["generator"]``), once
        entered; read-only. ``job.plan.role_names`` gives the names before entering.

        Raises:
            RuntimeError: the job is not entered.
        """
        if self._stack is None:
            raise RuntimeError("the job's meshes exist only inside 'with job:'")
        return types.MappingProxyType(self._procs)

    def procs(self, role: str) -> Any:
        """The ProcMesh of ``role``.

        Raises:
            RuntimeError: the job is not entered.
            RoleNotFound: no such role in the plan (a KeyError naming the roles it has).
        """
        if self._stack is None:
            raise RuntimeError("the job's meshes exist only inside 'with job:'")
        if role not in self._procs:
            self.plan.role(role)  # raises RoleNotFound, naming the roles there are
        return self._procs[role]

    def report_plan(self, essential: bool = False) -> None:
        """Print the placement plan and any warning about the options (``essential``: even
        with ``--quiet``, as a dry run does)."""
        for warning in self.config.warnings:
            self.reporter.warning(warning)
        self.reporter.plan([f"hosts: {self.config.source}", *format_plan(self.plan)],
                           plan_to_dict(self.plan), essential)

    @property
    def run_id(self) -> str:
        """This run's id (names its files on the hosts)."""
        return self.session.run_id

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> Job:
        """Pre-flight, start the workers, spawn each role's procs and identify the ranks.

        Raises:
            monarch_operator.launcher.session.preflight.PreflightError: hosts failed the pre-flight.
            monarch_operator.launcher.session.lifecycle.Terminated: SIGTERM/SIGHUP while starting.
            Exception: what Monarch raises while attaching; nothing is left running.
        """
        if self._stack is not None:
            raise RuntimeError("this job is already entered")
        stack = contextlib.ExitStack()
        try:
            stack.callback(install_termination_handlers())
            self.report_plan()
            hosts = [host for mesh in self.plan.meshes for host in mesh.hosts]
            self.addresses = check_hosts(self.session, hosts, self.reporter)
            self.reporter.progress(f"pre-flight ok on {len(self.addresses)} hosts")
            install_fault_hook(self.recorder)
            meshes = [(mesh.name, mesh.hosts) for mesh in self.plan.meshes]
            self.host_meshes = stack.enter_context(
                started_job(self.session, meshes, self.addresses, self.reporter, self.recorder)
            )
            for role in self.plan.roles:
                self._procs[role.role] = self._spawn_role(role)
            self._stack = stack
            for role in self.plan.roles:
                self.ranks[role.role] = self._identify(role)
            self.groups = self._form_groups()
            stack.callback(jobstacks.install(self))  # every proc's stack (issue 35)
        except BaseException as error:
            failure = self.failure(error) if self.host_meshes else None
            self._stack = None
            stack.close()
            if failure is not None:
                raise failure from error
            raise
        return self

    def __exit__(self, _type: Any, error: BaseException | None, _tb: Any) -> None:
        """Tear everything down; a Monarch error leaving the block becomes a RankFailure."""
        stack, self._stack = self._stack, None
        failure = self.failure(error) if error is not None and stack is not None else None
        if stack is not None:
            jobstacks.before_stop(self, error)  # stopped from outside, or a host lost
            stack.close()
        self._procs, self._probes = {}, {}
        if failure is not None and failure is not error:
            raise failure from error

    def _spawn_role(self, role: RolePlan) -> Any:
        return self.host_meshes[role.mesh].spawn_procs(
            per_host={_PROCS_LABEL: role.procs_per_host},
            name=role.role,
            bootstrap=functools.partial(
                set_environment, {"CUDA_VISIBLE_DEVICES": role.cuda_visible_devices}
            ),
        )

    def _identify(self, role: RolePlan) -> list[Any]:
        from monarch_operator.launcher.programs.rankside import RankProbe

        hosts = self.plan.mesh(role.mesh).hosts
        probe = self._procs[role.role].spawn(
            f"{role.role}_probe", RankProbe, role.role, tuple(hosts), self.run_id
        )
        self._probes[role.role] = probe
        infos = sorted(
            waiting.get(probe.identify.call(), IDENTIFY_TIMEOUT_S).values(),
            key=lambda info: info.rank,
        )
        for info in infos:
            self.reporter.event(
                "rank",
                f"{info.role} rank {info.rank}/{info.world_size} host={info.host} "
                f"pid={info.pid} ssh={info.ssh_address} worker={info.worker_pid} "
                f"gpus={info.cuda_visible_devices or 'none'}",
                role=info.role,
                rank=info.rank,
                world_size=info.world_size,
                host=info.host,
                local_rank=info.local_rank,
                pid=info.pid,
                ssh=info.ssh_address,
                worker_pid=info.worker_pid,
                cuda_visible_devices=info.cuda_visible_devices,
            )
        return infos

    def _form_groups(self) -> dict[str, RoleGroup]:
        """Give each role's procs the variables of the role's torch.distributed group."""
        roles = self.plan.roles
        groups = form_role_groups(
            self._probes,
            {r.role: [self.addresses[h] for h in self.plan.mesh(r.mesh).hosts] for r in roles},
            {role.role: role.procs_per_host for role in roles},
            {role.role: len(self.ranks[role.role]) for role in roles},
            IDENTIFY_TIMEOUT_S,
        )
        for group in groups.values():
            ranks = f"{group.world_size} rank{'' if group.world_size == 1 else 's'}"
            self.reporter.progress(
                f"{group.role} group: {ranks}, MASTER_ADDR={group.master_addr} "
                f"MASTER_PORT={group.master_port}")
        return groups

    # -- failures ---------------------------------------------------------------------------

    def get(self, future: Any, timeout: float | None = None) -> Any:
        """``future.get(timeout)``, with Monarch's errors turned into :class:`RankFailure`;
        waited for in slices (:func:`.session.waiting.get`), so that a stop or a lost worker
        interrupts the wait at once.

        Raises:
            RankFailure: a rank raised, exited or was killed (see :meth:`failure`).
            TimeoutError: the call did not finish in ``timeout`` seconds.
        """
        try:
            return waiting.get(future, timeout)
        except Exception as error:
            failure = self.failure(error)
            if failure is not None:
                raise failure from error
            raise

    def failure(self, error: BaseException | None) -> RankFailure | None:
        """Say which rank ``error`` (raised by a Monarch call) is about, and how it failed.

        Args:
            error: an exception caught from a call into this job's meshes.

        Returns:
            The :class:`RankFailure`, or None when ``error`` is not about a rank (a timeout,
            an error of the controller's own code).
        """
        from monarch_operator.launcher.session.monarch_compat import ActorError

        if error is None or isinstance(error, RankFailure):
            return error
        if isinstance(error, ActorError):
            return self._raised(error)
        text = " ".join(str(error).split())
        if "has failed" not in text and "Supervision" not in type(error).__name__:
            return None
        records = self.exit_records()
        if records:
            first = records[0]
            return RankFailure(
                first.role,
                first.rank,
                first.host,
                first.local_rank,
                # A rank whose process ends with 0 mid-run still failed the job.
                first.exit_code or exitcodes.FAILURE,
                describe_exit_code(first.exit_code),
                detail=one_line(text, 600),
            )
        return self._from_supervision_text(text)

    def exit_records(self) -> list[ExitRecord]:
        """Exit records of this run's ranks so far, earliest first (read from every host)."""
        if self.addresses:
            self._exit_records = sorted(
                set(self._exit_records)
                | set(collect(self.addresses, self.session.ssh, self.run_id)),
                key=lambda record: (record.time, record.role, record.rank),
            )
        return list(self._exit_records)

    def _raised(self, error: Any) -> RankFailure | None:
        from monarch_operator.launcher.programs.rankside import NOTE_PATTERN

        formatted = str(getattr(error, "exception_formatted", "") or error)
        match = NOTE_PATTERN.search(formatted)
        if match is None:
            return None
        original = getattr(error, "exception", None)
        if isinstance(original, BaseException):
            what = f"raised {type(original).__name__}: {original}"
        else:
            lines = formatted[: match.start()].strip().splitlines()
            what = f"raised {lines[-1].strip()}" if lines else "raised an exception"
        return RankFailure(
            match["role"],
            int(match["rank"]),
            match["host"],
            int(match["local_rank"]),
            exitcodes.FAILURE,
            one_line(what, 300),
            traceback=formatted,
            detail=one_line(str(getattr(error, "message", "")), 300),
        )

    def _from_supervision_text(self, text: str) -> RankFailure | None:
        parsed = parse_failed_actor(text)
        if parsed is None:
            return None
        role_name, host_index, local_rank, what = parsed
        roles = {role.role: role for role in self.plan.roles}
        role = roles.get(role_name)
        hosts = self.plan.mesh(role.mesh).hosts if role is not None else ()
        if role is None or host_index >= len(hosts):
            return None
        code = exitcodes.exit_code_for_failure([*self.recorder.reports, text])
        if code == exitcodes.FAILURE:
            what = monarch_loss(what, hosts[host_index]) or what
        return RankFailure(
            role.role,
            host_index * role.procs_per_host + local_rank,
            hosts[host_index],
            local_rank,
            code,
            describe_exit_code(code) if code != exitcodes.FAILURE else what,
            detail=one_line(text, 600),
        )


# How Monarch names a failed actor in supervision errors (torchmonarch 0.7.0), e.g.
# "The actor <root>.<monarch_operator.launcher.programs.workload.Trainer trainer{'hosts': 1/2,
# 'gpus': 0/1}> and all its descendants have failed: the process ... exited with non-zero code 3"
_FAILED_ACTOR = re.compile(
    r"<(?:[\w.]+\.)?\w+ (?P<role>\w+)\{'hosts': (?P<host>\d+)/\d+, '"
    + _PROCS_LABEL
    + r"': (?P<local>\d+)/\d+\}> and all its descendants have failed: (?P<what>[^\n]+)"
)


def plan_job(config: JobConfig) -> Plan:
    """The placement plan of ``config``: its named roles, else the trainer/ref placement.

    Raises:
        PlacementError: the roles do not fit the hosts; for named roles the message starts
            with where they came from (``MONARCH_ROLES: ...``, ``--role: ...``).
    """
    if config.roles is None:
        return plan_placement(config.hosts, config.trainer_hosts, config.ref_hosts,
                              config.colocate, config.trainer_gpus, config.ref_gpus)
    try:
        return plan_layout(config.hosts, list(config.roles))
    except PlacementError as error:
        raise PlacementError(f"{config.roles_source}: {error}") from None


def parse_failed_actor(message: str) -> tuple[str, int, int, str] | None:
    """Read ``(actor name, host index, local rank, what happened)`` from a supervision message.

    The actor name is the name it was spawned with (our role names). Returns None when the
    message names no actor on a ``hosts`` x ``gpus`` mesh.
    """
    match = _FAILED_ACTOR.search(message)
    if match is None:
        return None
    return match["role"], int(match["host"]), int(match["local"]), match["what"].strip().rstrip(".")


def argv_from_options(options: Mapping[str, Any]) -> list[str]:
    """``monarch-launch`` flags for keyword options (see :meth:`Job.from_args`).

    Raises:
        TypeError: an option value that has no flag form (e.g. a dict for a scalar flag).
    """
    argv: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if name == "env" and isinstance(value, Mapping):
            for key, item in value.items():
                argv += ["--env", f"{key}={item}"]
        elif name == "roles" and isinstance(value, (list, tuple)):
            argv += roles_argv(value)
        elif name == "hosts" and isinstance(value, (list, tuple)):
            argv += [flag, ",".join(str(host) for host in value)]
        elif value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + name.replace("_", "-"))
        elif isinstance(value, (str, int, float, os.PathLike)):
            argv += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
        else:
            raise TypeError(f"option {name}={value!r}: no monarch-launch flag takes that type")
    return argv


def _with_modules(session: SessionConfig, modules: Sequence[str]) -> SessionConfig:
    import dataclasses

    wanted = tuple(dict.fromkeys([*session.modules, *JOB_MODULES, *modules]))
    return dataclasses.replace(session, modules=wanted)
