"""Field case C11 over real ssh: ranks follow the hostfile's order through Monarch's host mesh.

The loopback hosts are listed in reverse (127.0.0.4 before 127.0.0.2, the opposite of any sort),
so a sort anywhere between the hostfile and the ranks would show here. The pure rules are in
tests/unit/test_host_order.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh

DATA = Path(__file__).parent.parent / "data" / "spmd"


def test_ranks_and_master_addr_follow_the_hostfile_order(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, _, c = ssh_cluster.hosts
    script = tmp_path / "torchrun_allreduce.py"
    script.write_text((DATA / script.name).read_text())

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{c} slots=1\n{a} slots=1\n",
        monarch_port,
        str(script),
        spmd=True,
    )

    assert launch.returncode == 0, launch.describe()
    assert f"plan: spmd hosts={c},{a} nproc_per_node=1 world_size=2" in launch.lines
    found: dict[int, dict[str, Any]] = {}
    for line in launch.lines:
        _, marker, payload = line.partition("REPORT ")
        if marker:
            report = json.loads(payload)
            found[int(report["env"]["RANK"])] = report
    assert sorted(found) == [0, 1], launch.describe()
    assert (found[0]["ssh_server"], found[1]["ssh_server"]) == (c, a), "rank 0 on the first host"
    assert {report["env"]["MASTER_ADDR"] for report in found.values()} == {c}
