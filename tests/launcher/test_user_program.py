"""A user's own Monarch program (examples/rl_kl) on the public job API, over real loopback sshd.

The example's actors and controller live outside monarch_operator (installed from
examples/rl_kl, as its image would have them). Each test runs ``monarch-launch run`` as a
subprocess against sshd on 127.0.0.2-4, with real Monarch workers and procs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import Launch, run_launch

pytestmark = pytest.mark.ssh

CONTROLLER = "rl_kl.controller:main"
PLACEMENT = re.compile(
    r"^placement (?P<role>trainer|ref) rank=(?P<rank>\d+) host=\S+ ssh=(?P<ssh>\S+) "
    r"gpus=(?P<gpus>\S+)$"
)
STEP = re.compile(r"^step (?P<step>\d+)/\d+ loss=(?P<loss>\S+) kl=(?P<kl>\S+)$")


def placements(launch: Launch, role: str) -> list[tuple[str, str]]:
    """(ssh address, CUDA_VISIBLE_DEVICES) of each rank of ``role``, by rank."""
    found = [m for m in map(PLACEMENT.match, launch.lines) if m and m["role"] == role]
    return [(m["ssh"], m["gpus"]) for m in sorted(found, key=lambda m: int(m["rank"]))]


def steps(launch: Launch) -> list[int]:
    return [int(m["step"]) for m in map(STEP.match, launch.lines) if m]


def run_program(
    tmp_path: Path, cluster: SshCluster, port: int, hostfile: str, *flags: str
) -> Launch:
    return run_launch(tmp_path, cluster, hostfile, port, *flags, program=True)


def test_user_program_trains_on_separate_trainer_and_ref_hosts(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts

    launch = run_program(
        tmp_path, ssh_cluster, monarch_port, f"{a} slots=1\n{b} slots=1\n{c} slots=1\n",
        "--trainer-hosts", "2", "--ref-hosts", "1", CONTROLLER, "--steps", "3",
    )

    assert launch.returncode == 0, launch.describe()
    assert placements(launch, "trainer") == [(a, "0"), (b, "0")], launch.describe()
    assert placements(launch, "ref") == [(c, "0")], launch.describe()
    assert steps(launch) == [1, 2, 3], launch.describe()
    losses = [float(m["loss"]) for m in map(STEP.match, launch.lines) if m]
    kls = [float(m["kl"]) for m in map(STEP.match, launch.lines) if m]
    assert losses == sorted(losses, reverse=True), launch.describe()
    assert kls[0] == 0.0 and all(kl > 0 for kl in kls[1:]), launch.describe()
    assert launch.lines[-1] == "monarch-launch: succeeded", launch.describe()


def test_user_program_colocated_roles_see_disjoint_gpus(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts

    launch = run_program(
        tmp_path, ssh_cluster, monarch_port, f"{a} slots=3\n{b} slots=3\n",
        "--colocate", "--trainer-hosts", "2", "--ref-hosts", "2",
        "--trainer-gpus", "1", "--ref-gpus", "2", CONTROLLER, "--steps", "2",
    )

    assert launch.returncode == 0, launch.describe()
    assert placements(launch, "trainer") == [(a, "0"), (b, "0")], launch.describe()
    assert placements(launch, "ref") == [(a, "1,2")] * 2 + [(b, "1,2")] * 2, launch.describe()
    assert steps(launch) == [1, 2], launch.describe()


def test_a_rank_that_raises_is_caught_by_the_controller(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts

    launch = run_program(
        tmp_path, ssh_cluster, monarch_port, f"{a} slots=1\n{b} slots=1\n{c} slots=1\n",
        "--trainer-hosts", "2", CONTROLLER, "--steps", "3", "--raise-at-step", "2", "--catch",
    )

    assert launch.returncode == 0, launch.describe()
    assert (
        f"caught: trainer rank 1 (host {b}, local rank 0): raised ValueError: bad batch at step 2"
        in launch.lines
    ), launch.describe()
    assert steps(launch) == [1, 3], launch.describe()


def test_an_uncaught_raise_fails_the_run_naming_role_rank_host(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts

    launch = run_program(
        tmp_path, ssh_cluster, monarch_port, f"{a} slots=1\n{b} slots=1\n{c} slots=1\n",
        "--trainer-hosts", "2", CONTROLLER, "--steps", "3", "--raise-at-step", "2",
    )

    assert launch.returncode == 1, launch.describe()
    assert launch.lines[-1] == (
        f"monarch-launch: failed: trainer rank 1 (host {b}, local rank 0): "
        "raised ValueError: bad batch at step 2"
    ), launch.describe()
    # The remote traceback reaches the launcher's output, pointing into the user's actor.
    assert any("rl_kl/actors.py" in line for line in launch.lines), launch.describe()
    assert steps(launch) == [1], launch.describe()


def test_a_rank_exiting_3_gives_exit_status_3(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts

    launch = run_program(
        tmp_path, ssh_cluster, monarch_port, f"{a} slots=1\n{b} slots=1\n{c} slots=1\n",
        "--trainer-hosts", "2", CONTROLLER, "--exit-at-step", "2", "--exit-code", "3",
    )

    assert launch.returncode == 3, launch.describe()
    assert re.fullmatch(
        rf"monarch-launch: failed: trainer rank [01] \(host ({re.escape(a)}|{re.escape(b)}), "
        r"local rank 0\): exited with code 3",
        launch.lines[-1],
    ), launch.describe()


def test_a_module_using_job_from_env_gets_the_launch_flags(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    # `monarch-launch run rl_kl.controller` runs the module as __main__; its own
    # Job.from_env() must see --hostfile, --trainer-hosts etc. given to monarch-launch.
    a, b, c = ssh_cluster.hosts

    launch = run_program(
        tmp_path, ssh_cluster, monarch_port, f"{a} slots=1\n{b} slots=1\n{c} slots=1\n",
        "--trainer-hosts", "1", "--ref-hosts", "2", "rl_kl.controller", "--steps", "2",
    )

    assert launch.returncode == 0, launch.describe()
    assert placements(launch, "trainer") == [(a, "0")], launch.describe()
    assert placements(launch, "ref") == [(b, "0"), (c, "0")], launch.describe()
    assert steps(launch) == [1, 2], launch.describe()


def test_a_bad_target_is_a_usage_error(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, _, _ = ssh_cluster.hosts

    launch = run_program(
        tmp_path, ssh_cluster, monarch_port, f"{a} slots=2\n",
        "--trainer-hosts", "1", "--colocate", "--ref-hosts", "1", "rl_kl.controller:nope",
    )

    assert launch.returncode == 2, launch.describe()
    assert launch.lines[-1] == (
        "monarch-launch: failed: rl_kl.controller:nope: rl_kl.controller has no function 'nope'"
    ), launch.describe()
