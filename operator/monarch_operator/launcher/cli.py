"""``monarch-launch``: command line for the standalone launcher.

Two modes:

- role mode (``monarch-launch [flags]``): the trainer and reference-model meshes of the built-in
  example workload, placed on the hosts by :mod:`launcher.hosts.placement`. Every flag the operator
  sets on its
  launcher pod defaults from the environment variable named in :mod:`monarch_operator.constants`,
  so the pod runs ``monarch-launch`` with no arguments.
- SPMD mode (``monarch-launch spmd [torchrun flags] script.py args``, also ``monarch-torchrun``):
  see :mod:`launcher.spmd_cli`.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from monarch_operator import constants
from monarch_operator.hostfile import Host
from monarch_operator.launcher.flagtypes import (
    non_negative_seconds,
    port_number,
    positive_int,
    positive_seconds,
)
from monarch_operator.launcher.hosts.sources import HostSourceError, resolve_host_source
from monarch_operator.launcher.programs.job import JobConfig
from monarch_operator.launcher.programs.roles import ROLE_MODULES, LaunchConfig, launch
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session.environment import (
    EnvSpecError,
    parse_env_items,
    worker_environment,
)
from monarch_operator.launcher.session.lifecycle import SessionConfig, install_termination_handlers
from monarch_operator.launcher.session.ssh import SshSettings
from monarch_operator.launcher.sshflags import (
    add_ssh_scale_flags,
    host_addresses_from_args,
    ssh_settings_with_flags,
)

_EXAMPLES = """\
examples:
  # 2 trainer hosts and 1 reference host from a hostfile, key-based ssh on port 2222
  monarch-launch --hostfile hosts.txt --ssh-key ~/.ssh/id_ed25519 --ssh-port 2222 \\
      --trainer-hosts 2 --ref-hosts 1

  # both roles on the same 4 hosts, one worker per host: trainer on GPUs 0-5, ref on 6-7
  monarch-launch --hostfile hosts.txt --colocate --trainer-gpus 6 --ref-gpus 2

  # inside a Slurm allocation (hosts from SLURM_JOB_NODELIST, GPUs from SLURM_GPUS_ON_NODE)
  monarch-launch --slurm --env NCCL_DEBUG=INFO

  # show the placement plan as JSON without connecting to anything
  monarch-launch --hosts node1,node2,node3 --slots-per-host 8 --dry-run --json

  # torchrun-style SPMD: run train.py on 2 ranks per host of the hostfile
  monarch-launch spmd --hostfile hosts.txt --nproc-per-node 2 train.py --lr 0.1

  # your own trainer/reference program on the same meshes: 'monarch-launch run --help'
  monarch-launch run --hostfile hosts.txt --trainer-hosts 2 my_rl.controller:main

  # inside a MonarchJob launcher pod: everything comes from MONARCH_* variables
  monarch-launch

hostfile format: one '<host> slots=<n>' per line ('slots' = GPUs, default 1); '#' comments and
blank lines are ignored. A host is a name or an IPv4 address: no user@host or host:port (use
--ssh-user, --ssh-port), no IPv6. Hosts are used in the order given (hostfile, --hosts or Slurm's
nodelist), never sorted: the trainer takes the first ones.
environment: workers get PATH, LD_LIBRARY_PATH, PYTHONPATH, VIRTUAL_ENV, OMP_NUM_THREADS and
NCCL_*, CUDA_* (not CUDA_VISIBLE_DEVICES), HF_*, TORCH_*, GLOO_*, HYPERACTOR_* from this
environment, plus every --env.
exit status: 0 success; 2 bad flags, hosts or placement, nothing started; N the first failing
worker exited with code N; 128+S it was killed by signal S (or the launcher was); 1 any other
failure (a host failing pre-flight, attach timeout, an exception in an actor).
"""


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


def build_parser() -> argparse.ArgumentParser:
    """Return the role-mode parser; defaults are read from the environment when it is built."""
    parser = argparse.ArgumentParser(
        prog="monarch-launch",
        description="Start Monarch workers over ssh, one per host, and run a trainer mesh plus a\n"
        "reference-model mesh (built-in example workload). 'monarch-launch spmd --help' for the\n"
        "torchrun-compatible mode.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_host_source_flags(parser.add_argument_group("hosts (exactly one source)"))
    _add_placement_flags(parser.add_argument_group("placement"))
    add_session_flags(parser)
    add_output_flags(parser.add_argument_group("output"))
    _add_workload_flags(parser.add_argument_group("workload"))
    return parser


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


def _add_placement_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--trainer-hosts",
        type=int,
        default=_env_int(constants.ENV_TRAINER_HOSTS),
        metavar="N",
        help="hosts for the trainer, taken first in host order "
        f"(env {constants.ENV_TRAINER_HOSTS}; default: all hosts not given to ref)",
    )
    group.add_argument(
        "--ref-hosts",
        type=int,
        default=_env_int(constants.ENV_REF_HOSTS),
        metavar="M",
        help="hosts for the reference model, the next M "
        f"(env {constants.ENV_REF_HOSTS}; default 1, or N with --colocate)",
    )
    group.add_argument(
        "--colocate",
        action=argparse.BooleanOptionalAction,
        default=_env_bool(constants.ENV_COLOCATE),
        help=f"run both roles on the same hosts, one worker per host, disjoint GPUs "
        f"(env {constants.ENV_COLOCATE})",
    )
    group.add_argument(
        "--trainer-gpus",
        type=int,
        default=_env_int(constants.ENV_TRAINER_GPUS),
        metavar="G",
        help="with --colocate: GPUs per host for the trainer "
        f"(env {constants.ENV_TRAINER_GPUS}; default: the larger half)",
    )
    group.add_argument(
        "--ref-gpus",
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


def _add_workload_flags(work: argparse._ArgumentGroup) -> None:
    work.add_argument(
        "--steps", type=positive_int, default=3, help="training steps, at least 1 (default 3)"
    )
    work.add_argument(
        "--call-timeout",
        type=positive_seconds,
        default=120.0,
        metavar="SECONDS",
        help="limit for each call into the meshes, more than 0 (default %(default)s)",
    )
    work.add_argument(
        "--fail-at-step",
        type=int,
        default=0,
        metavar="K",
        help="fault injection: every trainer process exits at step K (default: off)",
    )
    work.add_argument(
        "--fail-exit-code",
        type=int,
        default=1,
        metavar="CODE",
        help="exit code used by --fail-at-step (default 1)",
    )


class UsageError(ValueError):
    """Flags that cannot be run as given; the message names the flag and the rule."""


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
    )


def job_config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str], modules: tuple[str, ...]
) -> JobConfig:
    """Turn parsed host, placement and session flags into a
    :class:`launcher.programs.job.JobConfig`.

    Raises:
        UsageError: bad host source, ``--env`` item or ``--ssh-key``.
    """
    hosts, source = resolve_hosts(args, environ)
    return JobConfig(
        hosts=hosts,
        source=source,
        session=session_from_args(args, environ, modules, hosts),
        trainer_hosts=args.trainer_hosts,
        ref_hosts=args.ref_hosts,
        colocate=args.colocate,
        trainer_gpus=args.trainer_gpus,
        ref_gpus=args.ref_gpus,
    )


def config_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> LaunchConfig:
    """Turn parsed role-mode arguments into a :class:`LaunchConfig`.

    Raises:
        UsageError: bad host source, ``--env`` item or ``--steps``.
    """
    environ = os.environ if environ is None else environ
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    job = job_config_from_args(args, environ, ROLE_MODULES)
    return LaunchConfig(
        **{field.name: getattr(job, field.name) for field in dataclasses.fields(job)},
        steps=args.steps,
        call_timeout_s=args.call_timeout,
        fail_at_step=args.fail_at_step,
        fail_exit_code=args.fail_exit_code,
        dry_run=args.dry_run,
    )


def install_sigterm_handler() -> None:
    """Turn SIGTERM and SIGHUP into :class:`launcher.session.lifecycle.Terminated` so that teardown
    runs (see
    :func:`launcher.session.lifecycle.install_termination_handlers`); the exit status is then 128 +
    the signal."""
    install_termination_handlers()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``monarch-launch``; returns the exit status (see ``--help``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["spmd"]:
        from monarch_operator.launcher.spmd_cli import main as spmd_main

        return spmd_main(argv[1:], prog="monarch-launch spmd")
    if argv[:1] == ["run"]:
        return run_main(argv[1:])
    args = build_parser().parse_args(argv)
    reporter = Reporter(json_mode=args.json, quiet=args.quiet)
    try:
        config = config_from_args(args)
    except UsageError as error:
        return reporter.result(2, str(error))
    install_sigterm_handler()
    return launch(config, reporter)


_RUN_EXAMPLES = """\
examples:
  # your controller function receives the entered job (trainer and ref proc meshes)
  monarch-launch run --hostfile hosts.txt --trainer-hosts 2 --ref-hosts 1 \\
      my_rl.controller:main --lr 1e-4

  # a module or script that builds its own job with Job.from_env(); these flags reach it
  monarch-launch run --hostfile hosts.txt --colocate --trainer-gpus 6 --ref-gpus 2 my_rl.train
  monarch-launch run --slurm train_rl.py --steps 100

  # inside a MonarchJob launcher pod (spec.launcher.program): hosts and roles come from MONARCH_*
  monarch-launch run my_rl.controller:main

  # check the placement and that TARGET resolves, without connecting to anything
  monarch-launch run --hostfile hosts.txt --trainer-hosts 2 --dry-run my_rl.controller:main

The program's own arguments follow TARGET and are in sys.argv[1:]. Exit status: 0 when the
program returns; SystemExit's code; a failed rank's code (N when it exited with N, 128+S when
killed by signal S, 1 when an endpoint raised); 2 for bad flags or TARGET; 1 otherwise.
"""


def build_run_parser() -> argparse.ArgumentParser:
    """Return the parser of ``monarch-launch run``: host, placement, ssh and output flags, then
    TARGET and the program's own arguments."""
    parser = argparse.ArgumentParser(
        prog="monarch-launch run",
        description="Run your own Monarch program on the job's trainer and reference meshes\n"
        "(see monarch_operator.job). TARGET is module:function (called with the entered job),\n"
        "a module, or a script path (run as __main__; they use Job.from_env()).",
        epilog=_RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_host_source_flags(parser.add_argument_group("hosts (exactly one source)"))
    _add_placement_flags(parser.add_argument_group("placement"))
    add_session_flags(parser)
    add_output_flags(parser.add_argument_group("output"))
    parser.add_argument("target", metavar="TARGET", help="module:function, module or script.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the program's own arguments")
    return parser


def run_main(argv: Sequence[str]) -> int:
    """``monarch-launch run``: check the flags, then run TARGET (see
    :mod:`launcher.programs.user`)."""
    from monarch_operator.launcher.hosts.placement import PlacementError
    from monarch_operator.launcher.programs.job import JOB_MODULES, Job
    from monarch_operator.launcher.programs.user import check_target, run_program

    args = build_run_parser().parse_args(list(argv))
    reporter = Reporter(json_mode=args.json, quiet=args.quiet)
    launch_args = list(argv[: len(argv) - len(args.args) - 1])
    try:
        # Refuse bad flags and impossible placements before the program starts (exit 2).
        job = Job(job_config_from_args(args, os.environ, JOB_MODULES), reporter)
    except (UsageError, PlacementError) as error:
        return reporter.result(2, str(error))
    if args.dry_run:
        return check_target(args.target, job, reporter, args.args)
    install_sigterm_handler()
    return run_program(args.target, args.args, launch_args, reporter)


if __name__ == "__main__":
    sys.exit(main())
