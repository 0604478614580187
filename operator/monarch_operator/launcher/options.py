"""The job's options as flags, shared by the public API and the command lines.

:class:`launcher.programs.job.Job` parses them (``Job.from_env``, ``Job.from_args``) with
:func:`build_job_parser` and makes its configuration from them in :mod:`launcher.jobconfig`;
``monarch-launch`` (:mod:`launcher.cli`) and ``monarch-torchrun`` (:mod:`launcher.spmd_cli`) add
these same flag groups to their own parsers.
Every flag the operator sets on its launcher pod defaults from the environment variable named in
:mod:`monarch_operator.constants`. Nothing here imports the programs or the command lines.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from monarch_operator import constants
from monarch_operator.launcher.flagtypes import (
    non_negative_seconds,
    port_number,
    positive_seconds,
)
from monarch_operator.launcher.sshflags import (
    add_ssh_scale_flags,
)


def _marks_given(action: type[argparse.Action]) -> type[argparse.Action]:
    """``action`` that also lists its flag in ``placement_flags`` when given on the command
    line: a trainer/ref flag may come from a variable (allowed with ``--role``) or the command
    line (refused with it), and argparse alone cannot tell the two apart."""

    class Marked(action):  # type: ignore[valid-type,misc]
        def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
            super().__call__(parser, namespace, values, option)
            given = getattr(namespace, "placement_flags", [])
            namespace.placement_flags = [*given, option or self.option_strings[0]]

    return Marked


def _env_int(name: str, check: Callable[[str], int] = int) -> int | None:
    """The integer in environment variable ``name`` (None when unset or empty), read with
    ``check`` (a :mod:`launcher.flagtypes` function, so a variable obeys the same rule as its
    flag)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return check(value)
    except argparse.ArgumentTypeError as error:
        raise SystemExit(f"monarch-launch: {name}={value!r}: {error}") from None
    except ValueError:
        raise SystemExit(f"monarch-launch: {name}={value!r} is not an integer") from None


def _env_bool(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise SystemExit(f"monarch-launch: {name}={value!r} is not true/false")


def add_host_source_flags(hosts: argparse._ArgumentGroup) -> None:
    """Add ``--hostfile``, ``--hosts``, ``--slurm`` and ``--slots-per-host``."""
    hosts.add_argument(
        "--hostfile",
        help=f"'<host> slots=<n>' file (env {constants.ENV_HOSTFILE}, used when no other "
        "source is given)",
    )
    hosts.add_argument("--hosts", metavar="A,B,C", help="comma-separated host names")
    hosts.add_argument(
        "--slurm",
        action="store_true",
        help="the current Slurm allocation (SLURM_JOB_NODELIST; GPUs per node from "
        "SLURM_GPUS_ON_NODE / SLURM_GPUS_PER_NODE / SLURM_JOB_GPUS)",
    )
    hosts.add_argument(
        "--slots-per-host",
        type=int,
        metavar="N",
        help="slots (GPUs) of every host for --hosts (default 1) and --slurm (default: Slurm's)",
    )


def add_placement_flags(group: argparse._ArgumentGroup) -> None:
    """Add ``--role``, ``--roles``, ``--trainer-hosts``, ``--ref-hosts``, ``--colocate``,
    ``--trainer-gpus`` and ``--ref-gpus``."""
    group.add_argument(
        "--role",
        action="append",
        metavar="NAME=HOSTS[,gpus=G][,procs=P]",
        help="a named role, repeated in start order (instead of the trainer/ref flags; env "
        f"{constants.ENV_ROLES}); HOSTS: N (the next N hosts), host1+host2, or @ROLE (on "
        "ROLE's hosts, disjoint GPUs); gpus=0: CPU only",
    )
    group.add_argument(
        "--roles",
        metavar="FILE|JSON",
        help='the roles as a JSON or YAML file, or inline JSON: [{"name", "hosts": N or '
        '[names], "gpus", "procs", "colocateWith"}, ...]',
    )
    marked_store = _marks_given(argparse._StoreAction)
    group.add_argument(
        "--trainer-hosts",
        action=marked_store,
        type=int,
        default=_env_int(constants.ENV_TRAINER_HOSTS),
        metavar="N",
        help="hosts for the trainer, taken first in host order "
        f"(env {constants.ENV_TRAINER_HOSTS}; default: all hosts not given to ref)",
    )
    group.add_argument(
        "--ref-hosts",
        action=marked_store,
        type=int,
        default=_env_int(constants.ENV_REF_HOSTS),
        metavar="M",
        help="hosts for the reference model, the next M "
        f"(env {constants.ENV_REF_HOSTS}; default 1, or N with --colocate)",
    )
    group.add_argument(
        "--colocate",
        action=_marks_given(argparse.BooleanOptionalAction),
        default=_env_bool(constants.ENV_COLOCATE),
        help=f"run both roles on the same hosts, one worker per host, disjoint GPUs "
        f"(env {constants.ENV_COLOCATE})",
    )
    group.add_argument(
        "--trainer-gpus",
        action=marked_store,
        type=int,
        default=_env_int(constants.ENV_TRAINER_GPUS),
        metavar="G",
        help="with --colocate: GPUs per host for the trainer "
        f"(env {constants.ENV_TRAINER_GPUS}; default: the larger half)",
    )
    group.add_argument(
        "--ref-gpus",
        action=marked_store,
        type=int,
        default=_env_int(constants.ENV_REF_GPUS),
        metavar="G",
        help="with --colocate: GPUs per host for the reference model "
        f"(env {constants.ENV_REF_GPUS}; default: the rest)",
    )


def add_session_flags(parser: argparse.ArgumentParser) -> None:
    """Add the ssh, worker and environment flags shared by both modes."""
    ssh = parser.add_argument_group("ssh")
    ssh.add_argument(
        "--ssh-key",
        default=os.environ.get(constants.ENV_SSH_KEY) or None,
        help=f"private key file (env {constants.ENV_SSH_KEY}; default: ssh's own)",
    )
    ssh.add_argument(
        "--known-hosts",
        default=os.environ.get(constants.ENV_KNOWN_HOSTS) or None,
        metavar="FILE",
        help="check every host's key strictly against FILE alone; a host missing from it or "
        f"presenting another key is refused (env {constants.ENV_KNOWN_HOSTS}; default: ssh's "
        "own ~/.ssh/known_hosts, a host never seen is remembered on first use, a changed key "
        "is refused)",
    )
    ssh.add_argument(
        "--ssh-port",
        type=port_number,
        default=_env_int(constants.ENV_SSH_PORT, port_number) or 22,
        help=f"sshd port on every host, 1..65535 (env {constants.ENV_SSH_PORT}; default 22); "
        "hosts are plain names, never host:port",
    )
    ssh.add_argument(
        "--ssh-user",
        default=getpass.getuser(),
        help="login user on every host (default: the current user); hosts are plain names, "
        "never user@host",
    )
    ssh.add_argument(
        "--host-wait",
        type=non_negative_seconds,
        default=5.0,
        metavar="SECONDS",
        help="retry hosts whose name does not resolve or whose sshd does not answer yet for "
        "this long, 0 or more (default %(default)s)",
    )
    add_ssh_scale_flags(ssh)
    ssh.add_argument(
        "--no-clean-stale",
        dest="clean_stale",
        action="store_false",
        help="do not stop Monarch workers of an earlier run that still hold the worker port",
    )
    monarch = parser.add_argument_group("monarch")
    monarch.add_argument(
        "--monarch-port",
        type=port_number,
        default=constants.MONARCH_WORKER_PORT,
        help="port every Monarch worker listens on, 1..65535 (default %(default)s)",
    )
    monarch.add_argument(
        "--client-address",
        default=os.environ.get(constants.ENV_CLIENT_ADDRESS),
        metavar="tcp://IP:PORT",
        help="where this launcher's Monarch client "
        f"listens (env {constants.ENV_CLIENT_ADDRESS}; default: derived from "
        "this host's address, tcp://127.0.0.1:0 when all hosts are loopback)",
    )
    monarch.add_argument(
        "--python-exe",
        default=sys.executable,
        help="worker Python, same path on every host (default %(default)s)",
    )
    monarch.add_argument(
        "--attach-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="limit for workers to start and attach, more than 0 (default %(default)s)",
    )
    monarch.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY[=VALUE]",
        help="set KEY for every worker (repeatable); without =VALUE, copy it from here",
    )
    monarch.add_argument(
        "--hardware-error-pattern",
        action="append",
        default=[],
        metavar="REGEX",
        help="a failed rank whose output has a line matching REGEX (Python re) failed for its "
        "hardware (GPUHardwareError; repeatable); added to the built-in list and to env "
        "MONARCH_HARDWARE_ERRORS (docs/gpu-health.md)",
    )


def add_output_flags(group: argparse._ArgumentGroup) -> None:
    """Add ``--json``, ``--quiet`` and ``--dry-run``."""
    group.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line on stdout (plan, progress, results); worker output goes "
        "to stderr",
    )
    group.add_argument(
        "--quiet", action="store_true", help="print only results, worker output and failures"
    )
    group.add_argument(
        "--dry-run", action="store_true", help="print the plan and exit; connect to nothing"
    )

def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """Add every option of a job to ``parser``, in groups: hosts (exactly one source),
    placement, ssh, monarch and output (``--json``, ``--quiet``, ``--dry-run``)."""
    add_host_source_flags(parser.add_argument_group("hosts (exactly one source)"))
    add_placement_flags(parser.add_argument_group("placement"))
    add_session_flags(parser)
    add_output_flags(parser.add_argument_group("output"))


def build_job_parser(library_call: bool = True) -> argparse.ArgumentParser:
    """Return the parser of a job's options (:func:`add_job_flags`), as ``Job.from_env`` reads
    them; defaults are read from the environment when it is built.

    Args:
        library_call: a bad or abbreviated option raises :class:`UsageError` (True) instead of
            printing usage and exiting with status 2 (False, argparse's way).
    """
    parser = argparse.ArgumentParser(prog="monarch-launch", allow_abbrev=not library_call)
    add_job_flags(parser)
    if library_call:
        parser.error = _raise_usage  # type: ignore[method-assign]
    return parser


def _raise_usage(message: str) -> NoReturn:
    raise UsageError(message)


class UsageError(ValueError):
    """Flags that cannot be run as given; the message names the flag and the rule."""


