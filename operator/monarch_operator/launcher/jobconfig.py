"""A job's configuration (:class:`JobConfig`) made from its parsed flags: the hosts from their
source, the session (ssh, Monarch, the workers' environment) and the roles' placement.

The flags themselves are in :mod:`launcher.options`; ``Job.from_env``/``Job.from_args``
(:mod:`launcher.programs.job`), ``monarch-launch`` and ``monarch-torchrun`` turn what they parsed
into a configuration here. Nothing here imports the programs or the command lines.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from monarch_operator import constants, hwerrors
from monarch_operator.hostfile import Host
from monarch_operator.launcher.hosts.layout import RoleSpec
from monarch_operator.launcher.hosts.rolespecs import RolesFormatError, choose_roles
from monarch_operator.launcher.hosts.sources import HostSourceError, resolve_host_source
from monarch_operator.launcher.options import UsageError
from monarch_operator.launcher.session.environment import (
    EnvSpecError,
    parse_env_items,
    worker_environment,
)
from monarch_operator.launcher.session.lifecycle import SessionConfig
from monarch_operator.launcher.session.ssh import SshSettings
from monarch_operator.launcher.sshflags import host_addresses_from_args, ssh_settings_with_flags

# Environment variable carrying monarch-launch's flags to Job.from_env() in the user's program
# (``monarch-launch run``, :mod:`launcher.programs.user`).
LAUNCH_ARGS_ENV = "MONARCH_LAUNCH_ARGS"


@dataclass(frozen=True)
class JobConfig:
    """Where a job runs and how its roles are placed.

    Attributes:
        hosts: hosts in the order the source gave them (hostfile, ``--hosts``, Slurm).
        session: how to reach the hosts and start workers.
        source: a description of the host source, for the printed plan.
        trainer_hosts, ref_hosts: hosts per role (None: the defaults of
            :func:`launcher.hosts.placement.plan_placement`).
        colocate: both roles on the same hosts, disjoint GPU sets.
        trainer_gpus, ref_gpus: per-host GPUs of each role when colocated (None: split).
        roles: named roles in start order (``--role``, ``--roles``, ``MONARCH_ROLES``;
            :mod:`launcher.hosts.layout`), used instead of the trainer/ref fields; None: those.
        roles_source: where ``roles`` came from, to name it in errors (``MONARCH_ROLES``).
        warnings: lines to show with the plan (a variable that another source overrides).
    """

    hosts: list[Host]
    session: SessionConfig
    source: str = "hostfile"
    trainer_hosts: int | None = None
    ref_hosts: int | None = None
    colocate: bool = False
    trainer_gpus: int | None = None
    ref_gpus: int | None = None
    roles: tuple[RoleSpec, ...] | None = None
    roles_source: str = ""
    warnings: tuple[str, ...] = ()


def resolve_hosts(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[list[Host], str]:
    """Return ``(hosts, source description)`` from the host-source flags.

    The operator's ``MONARCH_HOSTFILE`` is used only when no source flag is given.

    Raises:
        UsageError: no source, several sources, or a source that cannot be read.
    """
    hostfile = args.hostfile
    if hostfile is None and args.hosts is None and not args.slurm:
        hostfile = environ.get(constants.ENV_HOSTFILE) or None
    try:
        return resolve_host_source(hostfile, args.hosts, args.slurm, args.slots_per_host, environ)
    except HostSourceError as error:
        raise UsageError(str(error)) from None


def session_from_args(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    modules: tuple[str, ...],
    hosts: Sequence[Host] = (),
) -> SessionConfig:
    """Build the :class:`SessionConfig` from the shared flags; ``hosts`` are the run's hosts.

    Raises:
        UsageError: a malformed ``--env`` or ``--host-address`` item, or an ``--ssh-key`` or
            ``--known-hosts`` file that does not exist.
    """
    try:
        host_addresses = host_addresses_from_args(args, environ, [h.name for h in hosts])
    except ValueError as error:
        raise UsageError(str(error)) from None
    try:
        extra = parse_env_items(args.env, environ)
    except EnvSpecError as error:
        raise UsageError(str(error)) from None
    try:
        in_env = hwerrors.from_env(environ)
        hardware = (*in_env, *hwerrors.patterns(getattr(args, "hardware_error_pattern", None)
                                                or (), True, "--hardware-error-pattern"))
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.ssh_key and not os.path.isfile(os.path.expanduser(args.ssh_key)):
        raise UsageError(f"--ssh-key {args.ssh_key}: no such file")
    if args.known_hosts and not os.path.isfile(os.path.expanduser(args.known_hosts)):
        raise UsageError(f"--known-hosts {args.known_hosts}: no such file")
    return SessionConfig(
        ssh=ssh_settings_with_flags(
            args,
            SshSettings(
                port=args.ssh_port,
                user=args.ssh_user,
                key=args.ssh_key,
                known_hosts=args.known_hosts,
            ),
        ),
        python_exe=args.python_exe,
        monarch_port=args.monarch_port,
        environment=worker_environment(environ, extra),
        client_address=args.client_address,
        attach_timeout_s=args.attach_timeout,
        host_wait_s=args.host_wait,
        clean_stale=args.clean_stale,
        modules=modules,
        host_addresses=host_addresses,
        dns_stable_s=args.dns_stable,
        hardware_patterns=hardware,
    )


def job_config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str], modules: tuple[str, ...]
) -> JobConfig:
    """Turn parsed host, placement and session flags into a
    :class:`launcher.programs.job.JobConfig`.

    Raises:
        UsageError: bad host source, ``--env`` item or ``--ssh-key``; roles that cannot be read
            or flags that cannot go together (``--role`` with ``--trainer-hosts``).
    """
    hosts, source = resolve_hosts(args, environ)
    try:
        roles, roles_source, warnings = choose_roles(
            args.role, args.roles, getattr(args, "placement_flags", []), environ)
    except RolesFormatError as error:
        raise UsageError(str(error)) from None
    return JobConfig(
        hosts=hosts,
        source=source,
        session=session_from_args(args, environ, modules, hosts),
        trainer_hosts=args.trainer_hosts,
        ref_hosts=args.ref_hosts,
        colocate=args.colocate,
        trainer_gpus=args.trainer_gpus,
        ref_gpus=args.ref_gpus,
        roles=None if roles is None else tuple(roles),
        roles_source=roles_source,
        warnings=tuple(warnings),
    )
