"""The four-role GRPO example (examples/grpo, issue 33 item 5) standalone, as a user runs it
over any hostfile: ``monarch-launch run --role ...`` splits one hostfile by role in order, the
dry run prints that split, and the loop learns (its mean reward must pass ``--min-reward``,
well above the 1/16 a random policy gets)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh

STEP = re.compile(r"^step (?P<step>\d+)/(?P<steps>\d+) reward=(?P<reward>[\d.]+) ")
PLACEMENT = re.compile(r"^placement (?P<role>\w+) rank=(?P<rank>\d+) host=\S+ gpus=(?P<gpus>\S*) "
                       r"world=(?P<world>\d+)$")
# generator on the first host (2 GPUs), trainer and reference sharing the second (1 GPU each),
# reward on the third without a GPU.
ROLES = ["--role", "generator=1", "--role", "trainer=1,gpus=1", "--role", "reference=@trainer",
         "--role", "reward=1,gpus=0"]


def test_the_dry_run_shows_each_roles_share_of_one_hostfile(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("192.0.2.1 slots=2\n192.0.2.2 slots=2\n192.0.2.3 slots=1\n")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "monarch-launch"), "run", "--dry-run", "--json",
         "--hostfile", str(hostfile), *ROLES, "grpo.controller:main"],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    plan = next(event["plan"] for event in events if event["event"] == "plan")
    hosts = {mesh["name"]: mesh["hosts"] for mesh in plan["meshes"]}
    split = {role["role"]: (hosts[role["mesh"]], role["cuda_visible_devices"],
                            role["world_size"]) for role in plan["roles"]}
    assert split == {"generator": (["192.0.2.1"], "0,1", 2),
                     "trainer": (["192.0.2.2"], "0", 1),
                     "reference": (["192.0.2.2"], "1", 1),
                     "reward": (["192.0.2.3"], "", 1)}, result.stdout


def test_the_grpo_loop_learns_on_four_roles_over_one_hostfile(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts
    launch = run_launch(
        tmp_path, ssh_cluster, f"{a} slots=2\n{b} slots=2\n{c} slots=1\n", monarch_port,
        *ROLES, "grpo.controller:main", "--steps", "5", "--min-reward", "0.2", program=True)

    assert launch.returncode == 0, launch.describe()
    placed = {}
    for match in filter(None, map(PLACEMENT.match, launch.lines)):
        placed.setdefault(match["role"], []).append((match["gpus"], int(match["world"])))
    # Every proc of a role sees the role's devices; LOCAL_RANK picks its own.
    assert placed == {"generator": [("0,1", 2), ("0,1", 2)], "trainer": [("0", 1)],
                      "reference": [("1", 1)], "reward": [("", 1)]}, launch.describe()
    rewards = [float(m["reward"]) for m in map(STEP.match, launch.lines) if m]
    assert len(rewards) == 5 and rewards[-1] >= 0.2, launch.describe()
    assert "grpo: done" in launch.lines, launch.describe()
