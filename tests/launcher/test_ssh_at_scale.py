"""Many hosts behind few sshd daemons (field case C28): every rank starts, every time.

The daemons keep OpenSSH's default ``MaxStartups 10:30:100`` unless a test says otherwise.
Today's failure: 24 hosts behind 2 daemons, 0 of 5 runs started (``Exceeded MaxStartups``).
bench/ssh_scale.py times these runs (and 64 hosts behind 4 daemons).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import (
    LoopbackSshd,
    SshCluster,
    free_port,
    reap_processes_mentioning,
)
from tests.launcher.conftest import running
from tests.launcher.launching import Launch, run_launch

pytestmark = pytest.mark.ssh

OK_LINE = re.compile(r"^\[spmd/(?P<host>127\.0\.0\.\d+)/(?P<rank>\d+)\] ok$")


@contextmanager
def cluster_of(
    tmp_path: Path, hosts: int, daemons: int, extra_config: str = ""
) -> Iterator[SshCluster]:
    """``hosts`` loopback hosts behind ``daemons`` sshd daemons."""
    state = tmp_path / "sshd"
    state.mkdir()
    daemon = LoopbackSshd(hosts, state, daemons=daemons, extra_config=extra_config)
    with running(daemon) as cluster:
        yield cluster


def echo_ok_everywhere(tmp_path: Path, cluster: SshCluster, *flags: str) -> Launch:
    """``monarch-torchrun --no-python sh -c 'echo ok'`` on every host, ``slots=1``; fails the
    test if any process is left on the run's Monarch port."""
    port = free_port(cluster.hosts)
    hostfile = "".join(f"{host} slots=1\n" for host in cluster.hosts)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    launch = run_launch(
        run_dir, cluster, hostfile, port, *flags, "--no-python", "sh", "-c", "echo ok", spmd=True
    )
    left = reap_processes_mentioning(f":{port}", grace_s=10)
    assert not left, f"left on the Monarch port: {left}"
    return launch


def started_ranks(launch: Launch) -> dict[int, str]:
    """``{rank: host}`` of every rank that printed exactly ``[spmd/<host>/<rank>] ok``."""
    return {int(m["rank"]): m["host"] for m in map(OK_LINE.match, launch.lines) if m}


def dropped_past_max_startups(cluster: SshCluster) -> int:
    return sum(
        log.read_text(errors="replace").count("past MaxStartups")
        for log in cluster.state_dir.glob("sshd-*.log")
    )


def test_c28_24_hosts_behind_two_sshd_all_ranks_start(tmp_path: Path) -> None:
    with cluster_of(tmp_path, 24, 2) as cluster:
        launch = echo_ok_everywhere(tmp_path, cluster)

    assert launch.returncode == 0, launch.describe()
    assert started_ranks(launch) == dict(enumerate(cluster.hosts)), launch.describe()


def test_c28_64_hosts_behind_four_sshd_all_ranks_start(tmp_path: Path) -> None:
    with cluster_of(tmp_path, 64, 4) as cluster:
        launch = echo_ok_everywhere(tmp_path, cluster, "--attach-timeout", "120")

    assert launch.returncode == 0, launch.describe()
    assert started_ranks(launch) == dict(enumerate(cluster.hosts)), launch.describe()


def test_connections_dropped_past_max_startups_are_retried(tmp_path: Path) -> None:
    # One daemon that starts dropping at 2 pending connections, 8 hosts opened at once: sshd
    # refuses some of them for certain, and every refusal must be retried.
    with cluster_of(tmp_path, 8, 1, extra_config="MaxStartups 2:60:8\n") as cluster:
        launch = echo_ok_everywhere(tmp_path, cluster, "--ssh-concurrency", "8")
        dropped = dropped_past_max_startups(cluster)

    assert launch.returncode == 0, launch.describe()
    assert started_ranks(launch) == dict(enumerate(cluster.hosts)), launch.describe()
    assert dropped > 0, "the test should have made sshd drop connections"
