"""``monarch-launch``: command line for the standalone launcher.

Every flag that the operator sets on its launcher pod defaults from the environment variable
named in :mod:`monarch_operator.constants`, so the pod runs ``monarch-launch`` with no arguments.
"""

from __future__ import annotations

import argparse
import getpass
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from monarch_operator import constants
from monarch_operator.launcher.runner import LaunchConfig, Terminated, launch
from monarch_operator.launcher.ssh import SshSettings

_EXAMPLES = """\
examples:
  # 2 trainer hosts and 1 reference host from a hostfile, key-based ssh on port 2222
  monarch-launch --hostfile hosts.txt --ssh-key ~/.ssh/id_ed25519 --ssh-port 2222 \\
      --trainer-hosts 2 --ref-hosts 1

  # both roles on the same 4 hosts (one host mesh, two proc meshes)
  monarch-launch --hostfile hosts.txt --colocate --trainer-hosts 4

  # inside a MonarchJob launcher pod: everything comes from MONARCH_* variables
  monarch-launch

hostfile format: one '<host> slots=<n>' per line; '#' comments and blank lines are ignored.
exit status: 0 success; 2 bad flags, hostfile or placement; N a worker exited with code N;
128+S a worker was killed by signal S; 1 any other failure.
"""


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
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
    """Return the argument parser; defaults are read from the environment when it is built."""
    parser = argparse.ArgumentParser(
        prog="monarch-launch",
        description="Start Monarch workers over ssh on the hosts of a hostfile and run a trainer\n"
        "mesh plus a reference-model mesh (built-in example workload).",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_placement_flags(parser.add_argument_group("hosts and placement"))
    _add_ssh_flags(parser.add_argument_group("ssh"))
    _add_monarch_flags(parser.add_argument_group("monarch"))
    _add_workload_flags(parser.add_argument_group("workload"))
    return parser


def _add_placement_flags(hosts: argparse._ArgumentGroup) -> None:
    hosts.add_argument(
        "--hostfile",
        default=os.environ.get(constants.ENV_HOSTFILE),
        help=f"hostfile path (env {constants.ENV_HOSTFILE}); required",
    )
    hosts.add_argument(
        "--trainer-hosts",
        type=int,
        default=_env_int(constants.ENV_TRAINER_HOSTS),
        metavar="N",
        help="hosts for the trainer, taken first in hostfile order "
        f"(env {constants.ENV_TRAINER_HOSTS}; default: all hosts not given to ref)",
    )
    hosts.add_argument(
        "--ref-hosts",
        type=int,
        default=_env_int(constants.ENV_REF_HOSTS),
        metavar="M",
        help="hosts for the reference model, the next M "
        f"(env {constants.ENV_REF_HOSTS}; default 1, or N with --colocate)",
    )
    hosts.add_argument(
        "--colocate",
        action=argparse.BooleanOptionalAction,
        default=_env_bool(constants.ENV_COLOCATE),
        help=f"run both roles on the same hosts (env {constants.ENV_COLOCATE})",
    )


def _add_ssh_flags(ssh: argparse._ArgumentGroup) -> None:
    ssh.add_argument(
        "--ssh-key",
        default=os.environ.get(constants.ENV_SSH_KEY) or None,
        help=f"private key file (env {constants.ENV_SSH_KEY}; default: ssh's own)",
    )
    ssh.add_argument(
        "--ssh-port",
        type=int,
        default=_env_int(constants.ENV_SSH_PORT) or 22,
        help=f"sshd port on every host (env {constants.ENV_SSH_PORT}; default 22)",
    )
    ssh.add_argument(
        "--ssh-user",
        default=getpass.getuser(),
        help="login user on every host (default: the current user)",
    )


def _add_monarch_flags(monarch: argparse._ArgumentGroup) -> None:
    monarch.add_argument(
        "--monarch-port",
        type=int,
        default=constants.MONARCH_WORKER_PORT,
        help="port every Monarch worker listens on (default %(default)s)",
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
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="limit for workers to start and attach (default %(default)s)",
    )
    monarch.add_argument(
        "--call-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="limit for each call into the meshes (default %(default)s)",
    )


def _add_workload_flags(work: argparse._ArgumentGroup) -> None:
    work.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
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


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Turn parsed arguments into a :class:`LaunchConfig`."""
    return LaunchConfig(
        hostfile=args.hostfile,
        ssh=SshSettings(port=args.ssh_port, user=args.ssh_user, key=args.ssh_key),
        python_exe=args.python_exe,
        trainer_hosts=args.trainer_hosts,
        ref_hosts=args.ref_hosts,
        colocate=args.colocate,
        monarch_port=args.monarch_port,
        client_address=args.client_address,
        steps=args.steps,
        attach_timeout_s=args.attach_timeout,
        call_timeout_s=args.call_timeout,
        fail_at_step=args.fail_at_step,
        fail_exit_code=args.fail_exit_code,
    )


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    # Raise instead of dying so that the teardown in runner's `finally` stops the remote workers
    # (a pod being deleted, or a test's wall timeout, sends SIGTERM). Further SIGTERMs are
    # ignored so that they cannot cut the teardown short; SIGKILL remains the hard stop.
    signal.signal(signum, signal.SIG_IGN)
    raise Terminated(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``monarch-launch``; returns the exit status (see ``--help``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.hostfile:
        parser.error(f"--hostfile is required (or set {constants.ENV_HOSTFILE})")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    signal.signal(signal.SIGTERM, _raise_terminated)
    return launch(config_from_args(args))


if __name__ == "__main__":
    sys.exit(main())
