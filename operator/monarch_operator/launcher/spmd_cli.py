"""``monarch-launch spmd`` / ``monarch-torchrun``: torchrun's command line over Monarch.

Replace ``torchrun`` with ``monarch-torchrun --hostfile hosts.txt`` (or ``--hosts``/``--slurm``)
and the same script runs on every slot of every host, started once from this machine: there is
no per-node invocation, so ``--node-rank`` is not needed. torchrun's flags are accepted with
either ``-`` or ``_`` (``--nproc-per-node``/``--nproc_per_node``), as torchrun accepts them:

- used: ``--nnodes N`` (first N hosts; ``N:N`` accepted), ``--nproc-per-node N|cpu|gpu|auto``
  (default: the hosts' slots; ``cpu`` is this machine's CPU count and needs every host to be
  this machine, see :func:`launcher.programs.spmd.plan_spmd`), ``--master-addr``, ``--master-port``
  (1..65535), ``--rdzv-id`` (the run id),
  ``--role`` (output prefix), ``-m``/``--module``, ``--no-python``, ``--standalone`` (one host),
  ``--max-restarts 0``;
- accepted and ignored, with a note: ``--rdzv-backend``, ``--rdzv-endpoint``, ``--rdzv-conf``,
  ``--monitor-interval``, ``--start-method``, ``--log-dir``, ``--redirects``, ``--tee``,
  ``--local-addr``;
- refused with the reason: ``--node-rank`` and elastic ranges (``--nnodes 1:4``), restarts.

Reference: torch.distributed.run (https://pytorch.org/docs/stable/elastic/run.html).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from monarch_operator import hwerrors
from monarch_operator.launcher import exitcodes, stopguard
from monarch_operator.launcher.flagtypes import port_number
from monarch_operator.launcher.jobconfig import resolve_hosts, session_from_args
from monarch_operator.launcher.options import (
    UsageError,
    add_host_source_flags,
    add_output_flags,
    add_session_flags,
)
from monarch_operator.launcher.processexit import exit_process
from monarch_operator.launcher.programs.failures import (
    hardware_fields,
    hardware_line,
    report_failure,
)
from monarch_operator.launcher.programs.spmd import (
    NPROC_KEYWORDS,
    SPMD_MODULES,
    SpmdConfigError,
    SpmdLauncher,
    SpmdRunError,
)
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session.lifecycle import (
    Terminated,
    WorkerLost,
    install_termination_handlers,
    one_line,
)
from monarch_operator.launcher.userentry import reexec_with_entry

_EXAMPLES = """\
examples:
  # torchrun --nnodes 2 --nproc-per-node 4 train.py --epochs 3, on the hosts of a hostfile
  monarch-torchrun --hostfile hosts.txt --nnodes 2 --nproc-per-node 4 train.py --epochs 3

  # a module, inside a Slurm allocation, with NCCL debugging on every rank
  monarch-torchrun --slurm --env NCCL_DEBUG=INFO -m my_project.train --config big.yaml

  # any executable, not Python
  monarch-torchrun --hosts a,b --no-python ./run.sh

  # CPU-only ranks, one per CPU of this machine (gloo), as torchrun --nproc-per-node cpu
  monarch-torchrun --hosts 127.0.0.1 --nproc-per-node cpu p.py

--nproc-per-node: an integer is used as given (at most the hosts' slots); 'gpu' and 'auto' are
the hosts' slots (GPUs from the hostfile, --slots-per-host or Slurm), never a probe of this
machine; 'cpu' is this machine's CPU count, only when every host is this machine (localhost,
127.x or its host name): remote CPU counts are not probed, give an integer for them.
Ranks follow the host order given (never sorted): ranks 0..N-1 on the first host, which is
MASTER_ADDR.

Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR (first host), MASTER_PORT (free port there),
TORCHELASTIC_RUN_ID, as torchrun sets them. Output lines are prefixed [role/host/rank].
Every rank's Python stack and place in its collectives: kill -USR1 <this launcher's pid> prints
them and the run goes on; with MONARCH_PROGRESS_DEADLINE_SECONDS=N a run that printed a
MONARCH_PROGRESS line and then none for N s is stopped, its ranks' stacks taken first.
exit status: 0 when every rank exits 0; else the exit status of the rank that failed first
(128+S if killed by signal S); 2 bad flags or hosts; 1 a host failed pre-flight.
"""

_IGNORED = (
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-conf",
    "monitor-interval",
    "start-method",
    "log-dir",
    "redirects",
    "tee",
    "local-addr",
)


def _flag(parser: argparse._ActionsContainer, name: str, **kwargs: object) -> None:
    """Add ``--a-b`` with torchrun's ``--a_b`` spelling as an alias."""
    names = [f"--{name}"]
    if "-" in name:
        names.append(f"--{name.replace('-', '_')}")
    parser.add_argument(*names, **kwargs)  # type: ignore[arg-type]


def build_parser(prog: str = "monarch-torchrun") -> argparse.ArgumentParser:
    """Return the SPMD-mode parser (torchrun flags plus host source, ssh and output flags)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a torchrun-style script on every slot of every host over Monarch.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_host_source_flags(parser.add_argument_group("hosts (exactly one source)"))
    torchrun = parser.add_argument_group("torchrun-compatible")
    _flag(torchrun, "nnodes", metavar="N", help="hosts to use, the first N (default: all)")
    _flag(
        torchrun,
        "nproc-per-node",
        type=nproc_per_node,
        metavar="N|cpu|gpu|auto",
        help="ranks per host: an integer; 'gpu'/'auto' = the hosts' slots (default); 'cpu' = "
        "this machine's CPU count, local hosts only (see below)",
    )
    _flag(torchrun, "node-rank", help=argparse.SUPPRESS)
    _flag(torchrun, "master-addr", metavar="ADDR", help="MASTER_ADDR (default: first host)")
    _flag(
        torchrun,
        "master-port",
        type=port_number,
        metavar="PORT",
        help="MASTER_PORT, 1..65535 (default: a free port on the first host)",
    )
    _flag(torchrun, "rdzv-id", metavar="ID", help="TORCHELASTIC_RUN_ID (default: random)")
    _flag(torchrun, "role", default="spmd", help="name in output prefixes (default %(default)s)")
    _flag(torchrun, "max-restarts", type=int, default=0, help="only 0 is supported")
    _flag(torchrun, "standalone", action="store_true", help="one host (like --nnodes 1)")
    torchrun.add_argument("-m", "--module", action="store_true", help="script is a module")
    _flag(torchrun, "no-python", action="store_true", help="script is an executable")
    for name in _IGNORED:
        _flag(torchrun, name, help=argparse.SUPPRESS)
    add_session_flags(parser)
    add_output_flags(parser.add_argument_group("output"))
    parser.add_argument("script", help="the training script (or module, or executable)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments of the script")
    return parser


def _nnodes(value: str | None, standalone: bool) -> int | None:
    if standalone:
        return 1
    if value is None:
        return None
    low, _, high = value.partition(":")
    try:
        counts = {int(low), int(high or low)}
    except ValueError:
        raise UsageError(f"--nnodes {value!r}: expected N or N:N") from None
    if len(counts) > 1:
        raise UsageError(
            f"--nnodes {value}: elastic ranges are not supported; the hosts are preallocated, "
            "give a fixed count"
        )
    return counts.pop()


def nproc_per_node(text: str) -> int | str:
    """argparse ``type=`` for ``--nproc-per-node``: an integer of at least 1, or one of torchrun's
    keywords ``cpu``, ``gpu``, ``auto`` (resolved by :func:`launcher.programs.spmd.plan_spmd`).

    Args:
        text: the flag's value as given.

    Returns:
        The integer, or the keyword unchanged.

    Raises:
        argparse.ArgumentTypeError: anything else (a usage error naming the flag, exit 2).
    """
    if text in NPROC_KEYWORDS:
        return text
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer or one of {', '.join(NPROC_KEYWORDS)}, got {text!r}"
        ) from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {count}")
    return count


def command_argv(args: argparse.Namespace) -> list[str]:
    """The program each rank runs: ``[python, script, ...]``, ``[python, -m, mod, ...]`` or
    ``[script, ...]`` with ``--no-python``."""
    if args.no_python and args.module:
        raise UsageError("--no-python and -m/--module cannot be combined")
    if args.no_python:
        return [args.script, *args.script_args]
    if args.module:
        return [args.python_exe, "-m", args.script, *args.script_args]
    return [args.python_exe, args.script, *args.script_args]


def launcher_from_args(args: argparse.Namespace, reporter: Reporter) -> SpmdLauncher:
    """Build the :class:`SpmdLauncher` for parsed arguments.

    Raises:
        UsageError: refused flags, bad host source or ``--env``.
        SpmdConfigError: counts that do not fit the hosts.
    """
    if args.node_rank is not None:
        raise UsageError(
            "--node-rank is not needed: this launcher starts every host itself from the host "
            "list; run it once, from one machine"
        )
    if args.max_restarts != 0:
        raise UsageError(f"--max-restarts {args.max_restarts}: restarts are not supported, use 0")
    for name in _IGNORED:
        if getattr(args, name.replace("-", "_")) is not None:
            reporter.warning(f"--{name} is ignored: Monarch does the rendezvous over ssh")
    hosts, source = resolve_hosts(args, os.environ)
    reporter.progress(f"hosts from {source}")
    return SpmdLauncher(
        hosts,
        session_from_args(args, os.environ, SPMD_MODULES, hosts),
        nproc_per_node=args.nproc_per_node,
        nnodes=_nnodes(args.nnodes, args.standalone),
        master_addr=args.master_addr,
        master_port=args.master_port,
        run_id=args.rdzv_id,
        role=args.role,
        reporter=reporter,
        stack_dumps=True,
    )


def main(argv: Sequence[str] | None = None, prog: str = "monarch-torchrun") -> int:
    """Entry point of ``monarch-torchrun`` and ``monarch-launch spmd``; returns the exit status.
    Run as a command by a uid without a passwd entry, it first runs itself again with one
    (:func:`launcher.userentry.reexec_with_entry`); then under a stop guard
    (launcher/stopguard.py), and the process ends with the status it reported, without the
    interpreter's finalization (:mod:`.processexit`)."""
    if argv is None:
        reexec_with_entry()
        stopguard.guard(prog, json_mode="--json" in sys.argv[1:])
        exit_process(_main(sys.argv[1:], prog))
    return _main(argv, prog)


def _main(argv: Sequence[str], prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    reporter = Reporter(json_mode=args.json, quiet=args.quiet, prefix=f"{prog.split()[0]}:")
    try:
        argv_per_rank = command_argv(args)
        launcher = launcher_from_args(args, reporter)
    except (UsageError, SpmdConfigError) as error:
        return reporter.result(exitcodes.USAGE, str(error))
    reporter.plan(launcher.describe(), launcher.plan_dict(), args.dry_run)
    if args.dry_run:
        return reporter.result(exitcodes.SUCCESS, None, dry_run=True)
    install_termination_handlers()  # SIGTERM/SIGHUP: teardown runs, exit 128 + the signal
    try:
        with launcher:
            outcomes = launcher.run_command(argv_per_rank)
    except SpmdRunError as error:
        first = error.failures[0]
        found = hardware_line(launcher.recorder, first.host, [first.error])
        return reporter.result(
            error.exit_code,
            one_line(str(error), 2000)
            + (f" {hwerrors.marker(first.host, found)}" if found else ""),
            **hardware_fields(first.host, first.rank, found),
            failures=[
                {
                    "rank": f.rank,
                    "host": f.host,
                    "local_rank": f.local_rank,
                    "exit_code": f.exit_code,
                }
                for f in error.failures
            ],
        )
    except (Exception, Terminated, WorkerLost, KeyboardInterrupt) as error:  # noqa: BLE001 - reported
        return report_failure(error, launcher.recorder, reporter)
    return reporter.result(exitcodes.SUCCESS, None, ranks=len(outcomes))


if __name__ == "__main__":
    sys.exit(main())
