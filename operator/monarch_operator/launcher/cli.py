"""``monarch-launch``: command line for the standalone launcher.

Two modes:

- role mode (``monarch-launch [flags]``): the trainer and reference-model meshes of the built-in
  example workload, placed on the hosts by :mod:`launcher.hosts.placement`. The job's flags are
  the public API's options (:mod:`launcher.options`); every flag the operator sets on its
  launcher pod defaults from the environment variable named in :mod:`monarch_operator.constants`,
  so the pod runs ``monarch-launch`` with no arguments.
- SPMD mode (``monarch-launch spmd [torchrun flags] script.py args``, also ``monarch-torchrun``):
  see :mod:`launcher.spmd_cli`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

from monarch_operator.launcher import stopguard
from monarch_operator.launcher.flagtypes import positive_int, positive_seconds
from monarch_operator.launcher.jobconfig import (  # noqa: F401 - re-exported: cli's names before
    job_config_from_args,
    resolve_hosts,
    session_from_args,
)
from monarch_operator.launcher.options import (  # noqa: F401 - re-exported: cli's names before
    UsageError,
    add_host_source_flags,
    add_job_flags,
    add_output_flags,
    add_session_flags,
)
from monarch_operator.launcher.processexit import exit_process
from monarch_operator.launcher.programs.roles import ROLE_MODULES, LaunchConfig, launch
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session.lifecycle import install_termination_handlers
from monarch_operator.launcher.userentry import reexec_with_entry

_EXAMPLES = """\
examples:
  # 2 trainer hosts and 1 reference host from a hostfile, key-based ssh on port 2222
  monarch-launch --hostfile hosts.txt --ssh-key ~/.ssh/id_ed25519 --ssh-port 2222 \\
      --trainer-hosts 2 --ref-hosts 1

  # both roles on the same 4 hosts, one worker per host: trainer on GPUs 0-5, ref on 6-7
  monarch-launch --hostfile hosts.txt --colocate --trainer-gpus 6 --ref-gpus 2

  # inside a Slurm allocation (hosts from SLURM_JOB_NODELIST, GPUs from SLURM_GPUS_ON_NODE)
  monarch-launch --slurm --env NCCL_DEBUG=INFO

  # named roles (instead of the trainer/ref flags), here with your own program: the next 2
  # hosts, the next one, its GPUs shared with ref, and a CPU-only role on host node5
  monarch-launch run --hostfile hosts.txt --role generator=2 --role trainer=1,gpus=6 \\
      --role ref=@trainer --role reward=node5,gpus=0 my_rl.controller:main

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
    add_job_flags(parser)  # the job's own options, as the public API reads them
    _add_workload_flags(parser.add_argument_group("workload"))
    return parser


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
    """Entry point of ``monarch-launch``; returns the exit status (see ``--help``).

    Run as the program (``argv`` None) by a uid without a passwd entry, it first runs itself
    again with one (:func:`launcher.userentry.reexec_with_entry`, field case C38); then the
    launcher runs under a stop guard (:mod:`.stopguard`): a stop signal decides the exit status
    whatever the user's program does with it, and ends the process with the status it
    reported, without the interpreter's finalization (:mod:`.processexit`)."""
    if argv is None:
        reexec_with_entry()
        stopguard.guard("monarch-launch", json_mode="--json" in sys.argv[1:])
        exit_process(_main(sys.argv[1:]))
    return _main(list(argv))


def _main(argv: list[str]) -> int:
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

  # named roles: job.roles["generator"], job.roles["reward"], ... (--roles FILE for a list)
  monarch-launch run --hostfile hosts.txt --role generator=2 --role reward=1,gpus=0 my_rl.main

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
    add_job_flags(parser)
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
