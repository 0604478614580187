"""Silence is noticed (issue 20, item 3): ssh keepalives on every launcher-worker session.

A host whose ssh session goes silent (its sshd session process stopped, as a hung host or a
dead link looks) is given up after ``--ssh-alive-interval`` x ``--ssh-alive-count`` seconds:
the run fails naming that host, and the ranks elsewhere are stopped. A rank that is only quiet
keeps its session through a middlebox that cuts idle flows, because keepalives cross it. The
intervals are shortened here; bench/ssh_silence.py measures the defaults (15 s x 4).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from monarch_operator.testing.idle_proxy import IdleTimeoutProxy
from monarch_operator.testing.loopback_sshd import SshCluster, processes_mentioning
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh

# A loopback address no sshd of the cluster uses: the proxied host.
PROXIED_HOST = "127.0.0.70"


def sshd_session_of(host: str, monarch_port: int) -> int:
    """Pid of the sshd process that serves ``host``'s worker session (the guard's parent)."""
    for pid, args in processes_mentioning(f"tcp://{host}:{monarch_port}"):
        if "monarch-session-guard" in args and not args.startswith("ssh "):
            with open(f"/proc/{pid}/stat") as stat:
                return int(stat.read().rsplit(")", 1)[1].split()[1])
    raise AssertionError(f"no worker session for {host}")


def test_a_silent_host_fails_the_run_naming_it_and_the_other_ranks_stop(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    needle = "sleep 297.3"
    stopped: list[int] = []

    def hang_host_b() -> None:
        session = sshd_session_of(b, monarch_port)
        os.kill(session, signal.SIGSTOP)
        stopped.append(session)

    try:
        launch = run_launch(
            tmp_path,
            ssh_cluster,
            f"{a} slots=1\n{b} slots=1\n",
            monarch_port,
            "--ssh-alive-interval",
            "1",
            "--ssh-alive-count",
            "3",
            "--no-python",
            "sh",
            "-c",
            f"echo started; {needle}",
            spmd=True,
            sigterm_after=f"[spmd/{b}/1] started",
            then=hang_host_b,
        )
        hung_at = time.monotonic()
        assert launch.returncode not in (0, None), launch.describe()
        assert b in launch.lines[-1] and "lost" in launch.lines[-1], launch.describe()
        # What was seen, not an exit code the host never had (issue 32).
        assert launch.lines[-1].endswith(
            f"{b} stopped answering: no reply to 3 ssh keepalives sent 1s apart (3s of silence)"
        ), launch.describe()
        assert "exited with code" not in launch.lines[-1], launch.describe()
        # a's rank was stopped by the launcher's teardown.
        deadline = time.monotonic() + 10
        while (left := processes_mentioning(needle)) and time.monotonic() < deadline:
            if len(left) <= 2:  # b's sh and sleep, held by its stopped session
                break
            time.sleep(0.2)
        assert len(left) <= 2, left
        assert time.monotonic() - hung_at < 60
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    # Once its sshd runs again it sees the launcher gone; the guard then ends b's rank too.
    deadline = time.monotonic() + 15
    while (left := processes_mentioning(needle)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"ranks left: {left}"


def test_a_quiet_rank_keeps_its_session_through_an_idle_timeout_middlebox(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    known_hosts = tmp_path / "known_hosts"
    shutil.copy(ssh_cluster.known_hosts, known_hosts)
    host_key = (ssh_cluster.state_dir / "host_key.pub").read_text()
    with known_hosts.open("a") as pins:
        pins.write(f"[{PROXIED_HOST}]:{ssh_cluster.port} {host_key}")
    cluster = SshCluster(
        ssh_cluster.hosts, ssh_cluster.port, ssh_cluster.key, ssh_cluster.state_dir, known_hosts
    )

    with IdleTimeoutProxy((PROXIED_HOST, ssh_cluster.port), (b, ssh_cluster.port), 4.0) as proxy:
        launch = run_launch(
            tmp_path,
            cluster,
            f"{a} slots=1\n{PROXIED_HOST} slots=1\n",
            monarch_port,
            "--ssh-alive-interval",
            "1",
            "--no-python",
            "sh",
            "-c",
            "sleep 9; echo done",
            spmd=True,
        )

    assert launch.returncode == 0, launch.describe()
    assert f"[spmd/{PROXIED_HOST}/1] done" in launch.lines, launch.describe()
    assert proxy.cut == 0
