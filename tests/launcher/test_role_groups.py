"""Each role a torch.distributed group (issue 23 item 2), over real loopback sshd.

A program (:mod:`tests.launcher.rolegroups`) has every proc of both roles join its role's group
and all-reduce at the same time: each group must hold its role's procs alone, with ranks, local
ranks and sizes of that role, meeting at the role's first host on a port of its own. Then the
rl_kl example trains its policy with DDP across two trainer hosts and its loss must fall, step
for step as one process training on the whole batch would.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import Launch, run_launch

pytestmark = pytest.mark.ssh

ROOT = Path(__file__).resolve().parents[2]
GROUP = re.compile(
    r"^group (?P<role>trainer|ref) rank=(?P<rank>\d+) local_rank=(?P<local>\d+) "
    r"world=(?P<world>\d+) local_world=(?P<local_world>\d+) master=(?P<addr>[\d.]+):"
    r"(?P<port>\d+) sum=(?P<sum>\d+) rank_sum=(?P<rank_sum>\d+) ifname=(?P<ifname>\S+) "
    r"backend=(?P<backend>\S+)$"
)
STEP = re.compile(r"^step (?P<step>\d+)/\d+ loss=(?P<loss>\S+) kl=(?P<kl>\S+)$")


def run_program(tmp_path: Path, cluster: SshCluster, port: int, hostfile: str,
                *flags: str) -> Launch:
    # The program module lives in this checkout: the launcher and (through the worker
    # environment) every host import it from here.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return run_launch(tmp_path, cluster, hostfile, port, *flags, program=True,
                      extra_env={"PYTHONPATH": path})


def groups(launch: Launch, role: str) -> list[re.Match[str]]:
    found = [m for m in map(GROUP.match, launch.lines) if m and m["role"] == role]
    return sorted(found, key=lambda m: int(m["rank"]))


def check_group(launch: Launch, role: str, world: int, local_world: int, master: str) -> int:
    """Assert the role's lines form one group of ``world`` ranks; return its port."""
    members = groups(launch, role)
    assert [int(m["rank"]) for m in members] == list(range(world)), launch.describe()
    assert [int(m["local"]) for m in members] == [r % local_world for r in range(world)], (
        launch.describe())
    for m in members:
        assert (int(m["world"]), int(m["local_world"])) == (world, local_world), launch.describe()
        assert int(m["sum"]) == world, launch.describe()  # the all-reduce saw this role only
        assert int(m["rank_sum"]) == world * (world - 1) // 2, launch.describe()
        assert m["addr"] == master and m["ifname"] == "lo", launch.describe()
        assert m["backend"] == "gloo", launch.describe()
    ports = {m["port"] for m in members}
    assert len(ports) == 1, launch.describe()
    return int(ports.pop())


def test_each_role_is_a_group_of_its_own_on_separate_hosts(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts

    launch = run_program(
        tmp_path, ssh_cluster, monarch_port, f"{a} slots=2\n{b} slots=2\n{c} slots=2\n",
        "--trainer-hosts", "2", "--ref-hosts", "1", "tests.launcher.rolegroups:main",
    )

    assert launch.returncode == 0, launch.describe()
    trainer_port = check_group(launch, "trainer", 4, 2, a)
    ref_port = check_group(launch, "ref", 2, 2, c)
    assert f"groups trainer {a}:{trainer_port} world=4 local_world=2" in launch.lines
    assert f"groups ref {c}:{ref_port} world=2 local_world=2" in launch.lines


def test_colocated_roles_meet_on_one_host_on_ports_of_their_own(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts

    launch = run_program(
        tmp_path, ssh_cluster, monarch_port, f"{a} slots=3\n{b} slots=3\n",
        "--colocate", "--trainer-hosts", "2", "--ref-hosts", "2",
        "--trainer-gpus", "1", "--ref-gpus", "2", "tests.launcher.rolegroups:main",
    )

    assert launch.returncode == 0, launch.describe()
    trainer_port = check_group(launch, "trainer", 2, 1, a)
    ref_port = check_group(launch, "ref", 4, 2, a)
    assert trainer_port != ref_port, launch.describe()


def expected_losses(steps: int, beta: float = 0.1) -> list[float]:
    """The rl_kl losses of one process training on each whole batch (what DDP's averaged
    gradients over equal shards must reproduce)."""
    import torch
    import torch.nn.functional as functional

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from rl_kl.actors import LEARNING_RATE, new_model
        from rl_kl.controller import make_batch
    finally:
        sys.path.remove(str(ROOT / "examples"))
    reference = new_model().requires_grad_(False)
    model = new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for step in range(1, steps + 1):
        tokens, targets = make_batch(step)
        ref_logprobs = functional.log_softmax(reference(tokens), dim=-1)
        optimizer.zero_grad()
        logprobs = functional.log_softmax(model(tokens), dim=-1)
        cross_entropy = functional.nll_loss(logprobs, targets)
        kl = (logprobs.exp() * (logprobs - ref_logprobs)).sum(dim=-1).mean()
        (cross_entropy + beta * kl).backward()
        optimizer.step()
        losses.append(float(cross_entropy.detach()))
    return losses


def test_rl_kl_trains_with_ddp_across_two_trainer_hosts(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts
    examples = str(ROOT / "examples")
    path = os.pathsep.join(filter(None, [examples, os.environ.get("PYTHONPATH", "")]))

    launch = run_launch(
        tmp_path, ssh_cluster, f"{a} slots=1\n{b} slots=1\n{c} slots=1\n", monarch_port,
        "--trainer-hosts", "2", "--ref-hosts", "1", "rl_kl.controller:main", "--steps", "4",
        program=True, extra_env={"PYTHONPATH": path},
    )

    assert launch.returncode == 0, launch.describe()
    assert "policy: DistributedDataParallel over 2 trainer ranks (gloo)" in launch.lines, (
        launch.describe())
    losses = [float(m["loss"]) for m in map(STEP.match, launch.lines) if m]
    assert len(losses) == 4, launch.describe()
    assert all(losses[i + 1] < losses[i] for i in range(len(losses) - 1)), launch.describe()
    assert losses == pytest.approx(expected_losses(4), abs=2e-4), launch.describe()
