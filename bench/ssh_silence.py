"""Silence on a launcher-worker ssh session, with the launcher's default keepalives (15 s x 4).

Two measurements on loopback sshd daemons (:mod:`monarch_operator.testing.loopback_sshd`):

1. hung host: two ranks sleep; once both run, the sshd session process serving host B is
   stopped (SIGSTOP: no byte, no keepalive answer, as a hung host or a dead link). Prints the
   seconds from the stop until the launcher exits, its exit status and last line (which must
   name B), and whether A's rank was stopped.
2. idle rank: host B is reached through a forwarder that cuts flows idle for ``--idle``
   seconds (a NAT or firewall, 60 s by default); B's rank prints nothing for ``--quiet``
   seconds (70 by default), then ``done``. Prints the exit status and how many flows the
   forwarder cut (0 expected: keepalives cross it every 15 s).

Run as root: ``.venv/bin/python bench/ssh_silence.py [--idle 60 --quiet 70]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from monarch_operator.testing.idle_proxy import IdleTimeoutProxy
from monarch_operator.testing.loopback_sshd import (
    LoopbackSshd,
    SshCluster,
    free_port,
    processes_mentioning,
    reap_processes_mentioning,
)

PROXIED_HOST = "127.0.0.70"


def start(cluster: SshCluster, workdir: Path, hosts: list[str], port: int, script: str,
          known_hosts: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start monarch-torchrun on ``hosts`` running ``sh -c script``; output to a file."""
    (workdir / "hostfile").write_text("".join(f"{h} slots=1\n" for h in hosts))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["MONARCH_CLIENT_ADDRESS"] = "tcp://127.0.0.1:0"
    log = workdir / "launch.log"
    command = [
        str(Path(sys.executable).parent / "monarch-torchrun"),
        "--hostfile", str(workdir / "hostfile"), "--ssh-key", str(cluster.key),
        "--known-hosts", str(known_hosts), "--ssh-port", str(cluster.port),
        "--ssh-user", "root", "--monarch-port", str(port),
        "--no-python", "sh", "-c", script,
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT)
    return process, log


def wait_for(log: Path, text: str, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while text not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not seen: {log.read_text(errors='replace')}")
        time.sleep(0.1)


def hung_host(cluster: SshCluster, workdir: Path) -> None:
    """Measurement 1 (module doc)."""
    a, b = cluster.hosts[:2]
    port = free_port(cluster.hosts)
    needle = "sleep 611.1"
    process, log = start(cluster, workdir, [a, b], port, f"echo started; {needle}",
                         cluster.known_hosts)
    wait_for(log, f"[spmd/{b}/1] started")
    session = next(
        int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        for pid, args in processes_mentioning(f"tcp://{b}:{port}")
        if "monarch-session-guard" in args and not args.startswith("ssh ")
    )
    os.kill(session, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        code = process.wait(timeout=300)
        detected_s = time.monotonic() - stopped
        time.sleep(3)
        on_a = [p for p, args in processes_mentioning(needle)]
    finally:
        os.kill(session, signal.SIGCONT)
    last = log.read_text(errors="replace").strip().splitlines()[-1]
    print(f"hung host: detected after {detected_s:.1f} s, exit {code}, names {b}: "
          f"{b in last}, rank processes left 3 s later (B's, held by its stopped sshd): "
          f"{len(on_a)}")
    print(f"  last line: {last}")
    time.sleep(6)
    print(f"  left after sshd resumed: {len(processes_mentioning(needle))}, "
          f"on the Monarch port: {len(reap_processes_mentioning(f':{port}', grace_s=10))}")


def idle_rank(cluster: SshCluster, workdir: Path, idle_s: float, quiet_s: float) -> None:
    """Measurement 2 (module doc)."""
    a, b = cluster.hosts[:2]
    port = free_port(cluster.hosts)
    known_hosts = workdir / "known_hosts"
    shutil.copy(cluster.known_hosts, known_hosts)
    key = (cluster.state_dir / "host_key.pub").read_text()
    known_hosts.write_text(known_hosts.read_text() + f"[{PROXIED_HOST}]:{cluster.port} {key}")
    with IdleTimeoutProxy((PROXIED_HOST, cluster.port), (b, cluster.port), idle_s) as proxy:
        started = time.monotonic()
        process, log = start(cluster, workdir, [a, PROXIED_HOST], port,
                             f"sleep {quiet_s:g}; echo done", known_hosts)
        code = process.wait(timeout=quiet_s + 300)
    done = f"[spmd/{PROXIED_HOST}/1] done" in log.read_text(errors="replace")
    print(f"idle rank: {quiet_s:g} s silent through a {idle_s:g} s idle-timeout forwarder: "
          f"exit {code}, its output arrived: {done}, flows cut: {proxy.cut}, "
          f"run took {time.monotonic() - started:.1f} s")
    reap_processes_mentioning(f":{port}", grace_s=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=float, default=60.0, help="forwarder idle timeout, s")
    parser.add_argument("--quiet", type=float, default=70.0, help="rank's silence, s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ssh-silence-") as tmp:
        state = Path(tmp) / "sshd"
        state.mkdir()
        with LoopbackSshd(2, state) as cluster:
            for name in ("hung", "idle"):
                (Path(tmp) / name).mkdir()
            hung_host(cluster, Path(tmp) / "hung")
            idle_rank(cluster, Path(tmp) / "idle", args.idle, args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
