"""Many hosts behind few sshd daemons (field case C28): do all ranks start, and how fast.

Starts ``--hosts`` loopback hosts served by ``--daemons`` sshd daemons with OpenSSH's default
``MaxStartups 10:30:100`` (:mod:`monarch_operator.testing.loopback_sshd`), then runs
``monarch-torchrun --no-python sh -c 'echo ok'`` on a hostfile of those hosts, ``slots=1``,
``--runs`` times, each a fresh process. Per run it prints the exit status, how many ranks printed
exactly ``[spmd/<host>/<rank>] ok`` (no ``\\r``), the seconds until the mesh attached and in
all, and how many connections the daemons dropped past ``MaxStartups`` during the run (each one
a refusal the launcher retried). Exits 1 unless every run started every rank.

Run as root: ``.venv/bin/python bench/ssh_scale.py --hosts 24 --daemons 2 --runs 5``
(``--hosts 64 --daemons 4`` for the large case).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from monarch_operator.testing.loopback_sshd import (
    LoopbackSshd,
    SshCluster,
    free_port,
    reap_processes_mentioning,
)

_ATTACHED = re.compile(r"mesh spmd attached \(\+([\d.]+)s\)")


def torchrun_command(cluster: SshCluster, hostfile: Path, monarch_port: int) -> list[str]:
    """The monarch-torchrun command line for ``hostfile`` on ``cluster``."""
    return [
        str(Path(sys.executable).parent / "monarch-torchrun"),
        "--hostfile", str(hostfile),
        "--ssh-key", str(cluster.key),
        "--known-hosts", str(cluster.known_hosts),
        "--ssh-port", str(cluster.port),
        "--ssh-user", "root",
        "--monarch-port", str(monarch_port),
        "--attach-timeout", "120",
        "--no-python", "sh", "-c", "echo ok",
    ]  # fmt: skip


def dropped(cluster: SshCluster) -> int:
    """Connections the daemons dropped past MaxStartups so far (their logs)."""
    return sum(
        log.read_text(errors="replace").count("past MaxStartups")
        for log in cluster.state_dir.glob("sshd-*.log")
    )


def one_run(
    cluster: SshCluster, workdir: Path, timeout_s: float, pythonpath: str | None = None
) -> dict[str, float | int]:
    """Run monarch-torchrun once (with ``pythonpath``, another checkout's launcher); return its
    exit status, ok ranks, times and drops."""
    hostfile = workdir / "hostfile"
    hostfile.write_text("".join(f"{host} slots=1\n" for host in cluster.hosts))
    monarch_port = free_port(cluster.hosts)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["MONARCH_CLIENT_ADDRESS"] = "tcp://127.0.0.1:0"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    drops_before = dropped(cluster)
    started = time.monotonic()
    result = subprocess.run(
        torchrun_command(cluster, hostfile, monarch_port),
        cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s,
    )  # fmt: skip
    wall_s = time.monotonic() - started
    out = result.stdout
    ok = {
        line for line in out.split(b"\n")
        if re.fullmatch(rb"\[spmd/127\.0\.0\.\d+/\d+\] ok", line)
    }  # fmt: skip
    attached = _ATTACHED.search(out.decode(errors="replace"))
    left = reap_processes_mentioning(f":{monarch_port}", grace_s=10)
    if result.returncode != 0:
        sys.stderr.write(result.stderr.decode(errors="replace")[-3000:])
    return {
        "rc": result.returncode,
        "ok_ranks": len(ok),
        "attached_s": float(attached.group(1)) if attached else float("nan"),
        "wall_s": wall_s,
        "dropped": dropped(cluster) - drops_before,
        "left": len(left),
    }


def main() -> int:
    """Parse flags, start the daemons, run, print one line per run and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=24)
    parser.add_argument("--daemons", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600.0, help="wall limit per run, s")
    parser.add_argument(
        "--launcher-pythonpath",
        help="PYTHONPATH for the launcher (and so its workers), e.g. another checkout's "
        "operator/ folder to compare with it",
    )
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="ssh-scale-") as tmp:
        state = Path(tmp) / "sshd"
        state.mkdir()
        with LoopbackSshd(args.hosts, state, daemons=args.daemons) as cluster:
            print(f"{args.hosts} hosts behind {args.daemons} sshd (MaxStartups 10:30:100)")
            print("run  rc  ok_ranks  attached_s  wall_s  dropped_by_sshd  left_behind")
            for run in range(1, args.runs + 1):
                workdir = Path(tmp) / f"run{run}"
                workdir.mkdir()
                r = one_run(cluster, workdir, args.timeout, args.launcher_pythonpath)
                print(
                    f"{run:>3}  {r['rc']:>2}  {r['ok_ranks']:>3}/{args.hosts:<4}  "
                    f"{r['attached_s']:>10.1f}  {r['wall_s']:>6.1f}  {r['dropped']:>15}  "
                    f"{r['left']:>11}",
                    flush=True,
                )
                failures += r["rc"] != 0 or r["ok_ranks"] != args.hosts or r["left"] != 0
    print(f"{args.runs - failures}/{args.runs} runs started every rank")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
