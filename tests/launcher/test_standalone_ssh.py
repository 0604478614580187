"""monarch-launch end to end over real ssh: sshd on 127.0.0.2-4, real Monarch workers and procs.

Each test runs the installed ``monarch-launch`` console script as a subprocess (Monarch's client
transport is process-global, and a subprocess can be given a hard wall limit), with its output
in a file: leaked ssh clients inherit the launcher's stdout and would keep a pipe open forever.
The expected losses and KL are recomputed here on one process from the same workload module:
gradient averaging over equal shards must equal the full-batch step.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launcher.conftest import SshCluster

pytestmark = pytest.mark.ssh

LAUNCH_WALL_LIMIT_S = 150
RANK_LINE = re.compile(
    r"^(?P<role>trainer|ref) rank (?P<rank>\d+)/(?P<world>\d+) host=(?P<host>\S+) "
    r"pid=(?P<pid>\d+) ssh=(?P<ssh>\S+)$"
)
STEP_LINE = re.compile(r"^step (?P<step>\d+)/(?P<steps>\d+) loss=(?P<loss>\S+) kl=(?P<kl>\S+)$")


@dataclass(frozen=True)
class Launch:
    """A finished monarch-launch run: exit status, combined output lines, wall seconds."""

    returncode: int
    lines: list[str]
    wall_s: float

    def ranks(self, role: str) -> list[re.Match[str]]:
        matches = [RANK_LINE.match(line) for line in self.lines]
        return [m for m in matches if m is not None and m["role"] == role]

    def steps(self) -> list[re.Match[str]]:
        return [m for m in map(STEP_LINE.match, self.lines) if m is not None]

    def describe(self) -> str:
        return f"rc={self.returncode} after {self.wall_s:.1f}s, output:\n" + "\n".join(self.lines)


def run_launch(
    tmp_path: Path,
    cluster: SshCluster,
    hostfile: str,
    monarch_port: int,
    *flags: str,
    sigterm_after: str | None = None,
) -> Launch:
    """Run monarch-launch on ``hostfile`` text against the loopback cluster and wait for it.

    With ``sigterm_after``, send SIGTERM once an output line starts with that text.
    """
    executable = Path(sys.executable).parent / "monarch-launch"
    assert executable.exists(), f"{executable} missing: pip install -e '.[dev]'"
    (tmp_path / "hostfile").write_text(hostfile)
    env = {key: value for key, value in os.environ.items() if not key.startswith("MONARCH_")}
    env["MONARCH_CLIENT_ADDRESS"] = "tcp://127.0.0.1:0"
    # Detect a dead proc in about 0.5 s instead of Monarch's default of several seconds.
    env["HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"] = "500ms"
    command = [
        str(executable),
        "--hostfile",
        str(tmp_path / "hostfile"),
        "--ssh-key",
        str(cluster.key),
        "--ssh-port",
        str(cluster.port),
        "--ssh-user",
        "root",
        "--monarch-port",
        str(monarch_port),
        "--attach-timeout",
        "10",
        "--call-timeout",
        "90",
        *flags,
    ]
    output_path = tmp_path / "launch.log"
    started = time.monotonic()
    with output_path.open("wb") as output:
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            if sigterm_after is not None:
                _wait_for_line(output_path, sigterm_after, process, started)
                process.send_signal(signal.SIGTERM)
            process.wait(timeout=LAUNCH_WALL_LIMIT_S - (time.monotonic() - started))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # the launcher tears down on SIGTERM
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    wall_s = time.monotonic() - started
    lines = output_path.read_text(errors="replace").splitlines()
    return Launch(process.returncode, [line.rstrip("\r") for line in lines], wall_s)


def _wait_for_line(
    path: Path, prefix: str, process: subprocess.Popen[bytes], started: float
) -> None:
    while time.monotonic() - started < LAUNCH_WALL_LIMIT_S and process.poll() is None:
        if any(line.startswith(prefix) for line in path.read_text(errors="replace").splitlines()):
            return
        time.sleep(0.1)
    raise subprocess.TimeoutExpired(str(process.args), LAUNCH_WALL_LIMIT_S)


def expected_steps(steps: int) -> list[tuple[float, float]]:
    """(loss, KL) per step of the built-in workload, computed on one process, full batch."""
    import torch
    import torch.nn.functional as functional

    from monarch_operator.launcher import workload

    model, frozen = workload.new_model(), workload.new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=workload.LEARNING_RATE)
    results = []
    for step in range(1, steps + 1):
        inputs, labels = workload.make_batch(step)
        optimizer.zero_grad()
        loss = functional.cross_entropy(model(inputs), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        with torch.no_grad():
            kl = workload.kl_divergence(
                functional.log_softmax(model(inputs), dim=-1),
                functional.log_softmax(frozen(inputs), dim=-1),
            )
        results.append((loss.item(), kl))
    return results


def assert_trained(launch: Launch, steps: int) -> None:
    """Steps printed in order, losses and KL equal to the single-process computation."""
    printed = launch.steps()
    assert [int(m["step"]) for m in printed] == list(range(1, steps + 1)), launch.describe()
    for match, (loss, kl) in zip(printed, expected_steps(steps), strict=True):
        assert math.isclose(float(match["loss"]), loss, abs_tol=2e-4), launch.describe()
        assert math.isclose(float(match["kl"]), kl, abs_tol=5e-6), launch.describe()
        assert float(match["kl"]) > 0
    losses = [float(m["loss"]) for m in printed]
    assert losses == sorted(losses, reverse=True), "loss should fall step by step"


def test_trainer_on_two_hosts_and_ref_on_a_third(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, c = ssh_cluster.hosts
    hostfile = f"{a} slots=2\n{b} slots=2\n{c} slots=1\n"

    launch = run_launch(
        tmp_path, ssh_cluster, hostfile, monarch_port, "--trainer-hosts", "2", "--ref-hosts", "1"
    )

    assert launch.returncode == 0, launch.describe()
    assert launch.lines[-1] == "monarch-launch: succeeded", launch.describe()
    trainer, ref = launch.ranks("trainer"), launch.ranks("ref")
    assert sorted(int(m["rank"]) for m in trainer) == [0, 1, 2, 3], launch.describe()
    assert {int(m["world"]) for m in trainer} == {4}
    assert Counter(m["ssh"] for m in trainer) == {a: 2, b: 2}, "2 trainer hosts x 2 procs"
    assert [(m["rank"], m["world"], m["ssh"]) for m in ref] == [("0", "1", c)], "1 ref host"
    assert len({m["pid"] for m in trainer + ref}) == 5, "one process per rank"
    assert_trained(launch, steps=3)


def test_colocated_roles_share_hosts_in_one_mesh(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--colocate",
        "--steps",
        "2",
    )

    assert launch.returncode == 0, launch.describe()
    assert "mesh workers: hosts=127.0.0.2,127.0.0.3 procs/host=1" in launch.lines
    for role in ("trainer", "ref"):
        ranks = launch.ranks(role)
        assert sorted((m["rank"], m["world"], m["ssh"]) for m in ranks) == [
            ("0", "2", a),
            ("1", "2", b),
        ], launch.describe()
    assert_trained(launch, steps=2)


def test_worker_exit_code_becomes_the_launcher_exit_code(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    # Field case C9: every trainer process exits 3 at once -> the launcher exits 3.
    a, b, c = ssh_cluster.hosts

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n{c} slots=1\n",
        monarch_port,
        "--trainer-hosts",
        "2",
        "--fail-at-step",
        "2",
        "--fail-exit-code",
        "3",
    )

    assert launch.returncode == 3, launch.describe()
    assert launch.lines[-1].startswith("monarch-launch: failed:"), launch.describe()
    assert "exited with non-zero code 3" in launch.lines[-1]
    assert [m["step"] for m in launch.steps()] == ["1"]


def test_sigterm_mid_run_tears_down_and_exits_143(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    # What a launcher pod gets when its MonarchJob is deleted. The monarch_port fixture then
    # checks that no worker or ssh client outlived the launcher.
    a, b, _ = ssh_cluster.hosts

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--steps",
        "1000000",
        sigterm_after="step 2/",
    )

    assert launch.returncode == 143, launch.describe()
    assert launch.lines[-1] == "monarch-launch: failed: terminated by signal 15"
    assert any(line.startswith("monarch-launch: torn down") for line in launch.lines)


def test_host_without_sshd_fails_fast_naming_it(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, _, _ = ssh_cluster.hosts
    # 127.0.0.9 is loopback too, so it passes the address checks, but nothing listens there.
    launch = run_launch(tmp_path, ssh_cluster, f"{a} slots=1\n127.0.0.9 slots=1\n", monarch_port)

    assert launch.returncode == 1, launch.describe()
    assert launch.wall_s < 10, launch.describe()
    failure = launch.lines[-1]
    assert failure.startswith("monarch-launch: failed:"), launch.describe()
    assert "127.0.0.9" in failure and "Connection refused" in failure
    assert a not in failure, "only the bad host is named"


def test_refused_key_fails_fast_naming_every_host(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    cluster = SshCluster(ssh_cluster.hosts, ssh_cluster.port, stranger, ssh_cluster.state_dir)

    launch = run_launch(tmp_path, cluster, f"{a} slots=1\n{b} slots=1\n", monarch_port)

    assert launch.returncode == 1, launch.describe()
    assert launch.wall_s < 10, launch.describe()
    failure = launch.lines[-1]
    assert "preflight failed" in failure and "Permission denied" in failure, launch.describe()
    assert a in failure and b in failure


def test_missing_worker_python_fails_fast_naming_the_path(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--python-exe",
        "/nonexistent/bin/python",
    )

    assert launch.returncode == 1, launch.describe()
    assert launch.wall_s < 10, launch.describe()
    assert "/nonexistent/bin/python exited 127" in launch.lines[-1], launch.describe()


def test_impossible_plan_is_refused_before_any_ssh(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--trainer-hosts",
        "2",
        "--ref-hosts",
        "1",
    )

    assert launch.returncode == 2, launch.describe()
    assert launch.lines == [
        "monarch-launch: failed: plan needs 3 hosts (2 trainer + 1 ref, separate), but the "
        "hostfile has 2; lower --trainer-hosts/--ref-hosts or use --colocate"
    ]
