"""Try ``monarch-launch`` (or ``monarch-torchrun``) on one machine, over loopback "hosts".

``python -m monarch_operator.testing.loopback_run --hosts 3 -- monarch-launch run ...`` starts
sshd on 127.0.0.2, 127.0.0.3 and 127.0.0.4 (:class:`.loopback_sshd.LoopbackSshd`: generated
host and client keys, key-only root login), writes their hostfile, runs the command with
``MONARCH_HOSTFILE``, ``MONARCH_SSH_PORT``, ``MONARCH_SSH_KEY`` and ``MONARCH_KNOWN_HOSTS``
set (the launcher reads them as its flags' defaults, as in a MonarchJob's launcher pod), then
stops the daemons and removes their files. The command's exit status is returned.

Every loopback host shares this machine's Python environment, so a program installed here
(``pip install -e examples``) is importable on every "host", as an image or a shared
filesystem makes it on real machines. Needs root, ``/usr/sbin/sshd`` and ``ssh-keygen``
(``scripts/setup.sh`` installs them).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from monarch_operator import constants
from monarch_operator.testing.loopback_sshd import (
    MAX_HOSTS,
    LoopbackSshd,
    SshdStartError,
    SshdUnavailable,
)


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module doc)."""
    parser = argparse.ArgumentParser(
        prog="python -m monarch_operator.testing.loopback_run",
        description="Run COMMAND with N loopback hosts (sshd on 127.0.0.2 onwards) in its "
                    "environment: MONARCH_HOSTFILE, MONARCH_SSH_PORT, MONARCH_SSH_KEY, "
                    "MONARCH_KNOWN_HOSTS.")
    parser.add_argument("--hosts", type=int, default=3,
                        help=f"number of loopback hosts, 1..{MAX_HOSTS} (default 3)")
    parser.add_argument("--slots", type=int, default=1,
                        help="slots (GPUs) per host in the hostfile (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command, after --, e.g. -- monarch-launch run ...")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Start the hosts, run the command, stop the hosts.

    Returns:
        The command's exit status; 2 for bad arguments; 1 when sshd cannot run here (the
        reason is printed).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not 1 <= args.hosts <= MAX_HOSTS:
        parser.error(f"--hosts must be 1..{MAX_HOSTS}, got {args.hosts}")
    if args.slots < 1:
        parser.error(f"--slots must be at least 1, got {args.slots}")
    with tempfile.TemporaryDirectory(prefix="monarch-loopback-") as state:
        try:
            with LoopbackSshd(args.hosts, Path(state)) as cluster:
                hostfile = Path(state) / "hosts"
                hostfile.write_text("".join(f"{host} slots={args.slots}\n"
                                            for host in cluster.hosts))
                env = {**os.environ,
                       constants.ENV_HOSTFILE: str(hostfile),
                       constants.ENV_SSH_PORT: str(cluster.port),
                       constants.ENV_SSH_KEY: str(cluster.key),
                       constants.ENV_KNOWN_HOSTS: str(cluster.known_hosts)}
                print(f"loopback_run: {args.hosts} hosts {', '.join(cluster.hosts)} "
                      f"(sshd port {cluster.port}); running: {' '.join(command)}",
                      file=sys.stderr, flush=True)
                try:
                    return subprocess.run(command, env=env, check=False).returncode
                except FileNotFoundError:
                    print(f"loopback_run: {command[0]}: no such command", file=sys.stderr)
                    return 127
        except (SshdUnavailable, SshdStartError) as error:
            print(f"loopback_run: cannot start the loopback hosts: {error}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
