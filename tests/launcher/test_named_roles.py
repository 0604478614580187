"""Named roles (issue 33) over real loopback sshd: four roles from MONARCH_ROLES, as the
operator gives them (explicit host names), on one hostfile of three hosts.

generator takes two hosts, reward runs CPU-only on the generator's hosts, trainer and ref share
the third host with disjoint GPUs. Every proc of every role reports its role, RANK, WORLD_SIZE
and CUDA_VISIBLE_DEVICES, and the all-reduce in each role's group must count that role alone.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh

ROOT = Path(__file__).resolve().parents[2]
ROLE = re.compile(
    r"^role (?P<role>[a-z0-9]+) rank=(?P<rank>\d+) world=(?P<world>\d+) "
    r"local_rank=(?P<local>\d+) cuda=(?P<cuda>\S+) master=(?P<addr>[\d.]+):(?P<port>\d+) "
    r"sum=(?P<sum>\d+) backend=(?P<backend>\S+)$"
)


def test_four_named_roles_from_monarch_roles_each_a_group_of_its_own(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts
    roles = [
        {"name": "generator", "hosts": [a, b]},
        {"name": "reward", "hosts": [a, b], "colocateWith": "generator", "gpus": 0},
        {"name": "trainer", "hosts": [c], "gpus": 1},
        {"name": "ref", "hosts": [c], "colocateWith": "trainer"},
    ]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))

    launch = run_launch(
        tmp_path, ssh_cluster, f"{a} slots=1\n{b} slots=1\n{c} slots=2\n", monarch_port,
        "tests.launcher.namedroles:main", program=True,
        extra_env={"PYTHONPATH": path, "MONARCH_ROLES": json.dumps(roles),
                   "MONARCH_TRAINER_HOSTS": "2"},
    )

    assert launch.returncode == 0, launch.describe()
    assert "monarch-launch: warning: MONARCH_ROLES is set, so MONARCH_TRAINER_HOSTS is ignored" \
        in launch.lines, launch.describe()
    assert "roles in order: generator,reward,trainer,ref" in launch.lines, launch.describe()
    reports = {}
    for match in filter(None, map(ROLE.match, launch.lines)):
        reports.setdefault(match["role"], []).append(
            (int(match["rank"]), int(match["world"]), match["cuda"], match["addr"],
             int(match["sum"]), match["backend"]))
    assert reports == {
        "generator": [(0, 2, "0", a, 2, "gloo"), (1, 2, "0", a, 2, "gloo")],
        "reward": [(0, 2, "empty", a, 2, "gloo"), (1, 2, "empty", a, 2, "gloo")],
        "trainer": [(0, 1, "0", c, 1, "gloo")],
        "ref": [(0, 1, "1", c, 1, "gloo")],
    }, launch.describe()
    ports = {role: {m["port"] for m in map(ROLE.match, launch.lines) if m and m["role"] == role}
             for role in reports}
    assert all(len(found) == 1 for found in ports.values()), launch.describe()
    # Roles meeting on the same host get ports of their own.
    assert ports["generator"] != ports["reward"] and ports["trainer"] != ports["ref"], (
        launch.describe())
    assert re.search(rf"^reward rank 1/2 host={re.escape(b)} .* gpus=none$",
                     "\n".join(launch.lines), re.M), launch.describe()
