"""What a rank inherits: locked memory (field case C26, standalone).

sshd is limited as a service manager would limit it (``LimitMEMLOCK=65536``). A rank's
``ulimit -l`` equals a fresh ``ssh HOST 'ulimit -l'``; the plan shows each host's limit, and
with RDMA in play (``NCCL_IB_*``) a warning names the host and its limit before any worker
starts.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator.launcher.session.ssh import SshSettings, ssh_args
from monarch_operator.testing.loopback_sshd import (
    LoopbackSshd,
    SshCluster,
    free_port,
    reap_processes_mentioning,
)
from tests.launcher.conftest import running
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh

MEMLOCK_BYTES = 65536


@pytest.fixture(scope="module")
def limited_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    """Two sshd daemons whose locked-memory limit is 64 KiB."""
    daemons = LoopbackSshd(2, tmp_path_factory.mktemp("limited"), memlock_bytes=MEMLOCK_BYTES)
    with running(daemons) as cluster:
        yield cluster


def login_ulimit(cluster: SshCluster, host: str) -> str:
    settings = SshSettings(
        port=cluster.port, user="root", key=str(cluster.key), known_hosts=str(cluster.known_hosts)
    )
    result = subprocess.run(
        ["ssh", *ssh_args(settings, host, tty=False), host, "ulimit -l"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return result.stdout.strip()


def test_c26_rank_limit_equals_a_login_and_rdma_warns_before_workers_start(
    tmp_path: Path, limited_cluster: SshCluster
) -> None:
    a, b = limited_cluster.hosts
    port = free_port(limited_cluster.hosts)

    launch = run_launch(
        tmp_path,
        limited_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        port,
        "--env",
        "NCCL_IB_HCA=mlx5",
        "--no-python",
        "sh",
        "-c",
        "echo memlock=$(ulimit -l)",
        spmd=True,
    )
    assert not reap_processes_mentioning(f":{port}")

    assert launch.returncode == 0, launch.describe()
    for rank, host in enumerate((a, b)):
        assert login_ulimit(limited_cluster, host) == "64"
        assert f"[spmd/{host}/{rank}] memlock=64" in launch.lines, launch.describe()
    lines = launch.lines
    plan = next(i for i, line in enumerate(lines) if "locked memory (ulimit -l)" in line)
    assert f"64 KiB on {a}, {b}" in lines[plan]
    warning = next(i for i, line in enumerate(lines) if "RDMA is in play" in line)
    assert "NCCL_IB_HCA is set" in lines[warning] and f"{a}, {b}: 64 KiB" in lines[warning]
    assert "container runtime" in lines[warning]
    attached = next(i for i, line in enumerate(lines) if "mesh spmd attached" in line)
    assert warning < attached, "warned before any worker started"
