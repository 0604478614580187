"""Rank output arrives as the ranks wrote it (field case C30), and a killed launcher leaves no rank.

The workers' ssh sessions have no remote tty: a tty would end every line in ``\\r\\n``. The
session guard (launcher.session.guard) does the tty's other job, ending the worker when the
session closes, so a launcher killed with SIGKILL still stops every rank on every host.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import SshCluster, processes_mentioning
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh


def test_c30_rank_lines_end_without_carriage_return_and_keep_the_prefix(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--no-python",
        "sh",
        "-c",
        # rank 0: a tab and a byte that is not UTF-8; rank 1, once rank 0 is done: a line past
        # asyncio's 64 KiB readline limit
        "echo ok; if [ $RANK = 0 ]; then printf 'tab\\there \\377\\n'; else sleep 2; "
        "head -c 100000 /dev/zero | tr '\\0' x; echo; fi",
        spmd=True,
    )

    assert launch.returncode == 0, launch.describe()
    raw = (tmp_path / "launch.log").read_bytes()
    assert b"\r" not in raw, raw[:2000]
    lines = raw.split(b"\n")
    # grep 'ok$' finds every rank.
    assert sorted(line for line in lines if re.search(rb"ok$", line)) == [
        f"[spmd/{a}/0] ok".encode(),
        f"[spmd/{b}/1] ok".encode(),
    ]
    assert f"[spmd/{a}/0] tab\there ".encode() + b"\xff" in lines
    assert f"[spmd/{b}/1] ".encode() + b"x" * 100_000 in lines


def test_a_launcher_killed_with_sigkill_leaves_no_rank_on_any_host(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    # An odd duration names the ranks' processes (sh and its sleep) on the hosts.
    needle = "sleep 313.7"

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--no-python",
        "sh",
        "-c",
        f"echo started; {needle}; echo never",
        spmd=True,
        sigterm_after=f"[spmd/{b}/1] started",
        stop_signal=signal.SIGKILL,
    )

    assert launch.returncode == -signal.SIGKILL, launch.describe()
    deadline = time.monotonic() + 15
    while (left := processes_mentioning(needle)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"ranks left running after the launcher was killed: {left}"
