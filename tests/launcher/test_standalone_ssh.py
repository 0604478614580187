"""monarch-launch end to end over real ssh: sshd on 127.0.0.2-4, real Monarch workers and procs.

Each test runs the installed ``monarch-launch`` console script as a subprocess (Monarch's client
transport is process-global, and a subprocess can be given a hard wall limit), with its output
in a file: leaked ssh clients inherit the launcher's stdout and would keep a pipe open forever.
The expected losses and KL are recomputed here on one process from the same workload module:
gradient averaging over equal shards must equal the full-batch step.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import (
    SshCluster,
    processes_mentioning,
    reap_processes_mentioning,
)
from tests.launcher.launching import Launch, run_launch

pytestmark = pytest.mark.ssh


def expected_steps(steps: int) -> list[tuple[float, float]]:
    """(loss, KL) per step of the built-in workload, computed on one process, full batch."""
    import torch
    import torch.nn.functional as functional

    from monarch_operator.launcher.programs import workload

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
                functional.log_softmax(model(inputs), dim=-1).tolist(),
                functional.log_softmax(frozen(inputs), dim=-1).tolist(),
            )
        results.append((loss.item(), kl))
    return results


_RECORD_MODULES = """
import atexit, os, sys
def _record():
    if os.path.basename(sys.argv[0]) == "monarch-launch":
        folder = os.environ["MONARCH_TEST_MODULES_SEEN"]
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, str(os.getpid())), "w") as out:
            out.write("\\n".join(sorted({name.split(".")[0] for name in sys.modules})))
atexit.register(_record)
"""


def record_loaded_modules(folder: Path) -> dict[str, str]:
    """Environment that makes each ``monarch-launch`` process that exits normally write the
    top-level modules it had loaded to ``folder/<pid>``, one per line: a ``sitecustomize`` on
    PYTHONPATH (the ranks on the hosts do not get PYTHONPATH)."""
    site = folder.parent / "record-modules-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_RECORD_MODULES)
    return {"PYTHONPATH": str(site), "MONARCH_TEST_MODULES_SEEN": str(folder)}


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

    modules_seen = tmp_path / "modules-seen"
    launch = run_launch(
        tmp_path, ssh_cluster, hostfile, monarch_port, "--trainer-hosts", "2", "--ref-hosts", "1",
        extra_env=record_loaded_modules(modules_seen),
    )

    assert launch.returncode == 0, launch.describe()
    assert launch.lines[-1] == "monarch-launch: succeeded", launch.describe()
    assert any(line.startswith("monarch-launch: hosts ready 3/3") for line in launch.lines)
    # The launcher proper (the stop guard's child; the guard ends with os._exit) never loads
    # torch: only the ranks need it (launcher.programs.workload).
    seen = {path.name: path.read_text().split() for path in modules_seen.glob("*")}
    assert seen and all("monarch" in names for names in seen.values()), seen
    assert not [name for names in seen.values() for name in names if name == "torch"], seen
    trainer, ref = launch.ranks("trainer"), launch.ranks("ref")
    assert sorted(int(m["rank"]) for m in trainer) == [0, 1, 2, 3], launch.describe()
    assert {int(m["world"]) for m in trainer} == {4}
    assert Counter(m["ssh"] for m in trainer) == {a: 2, b: 2}, "2 trainer hosts x 2 procs"
    assert [(m["rank"], m["world"], m["ssh"]) for m in ref] == [("0", "1", c)], "1 ref host"
    assert len({m["pid"] for m in trainer + ref}) == 5, "one process per rank"
    assert_trained(launch, steps=3)


def test_colocated_roles_share_hosts_with_disjoint_gpus_and_one_worker_per_host(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=3\n{b} slots=3\n",
        monarch_port,
        "--colocate",
        "--trainer-gpus",
        "1",
        "--ref-gpus",
        "2",
        "--steps",
        "2",
    )

    assert launch.returncode == 0, launch.describe()
    assert "mesh workers: hosts=127.0.0.2,127.0.0.3 procs/host=3" in launch.lines
    trainer, ref = launch.ranks("trainer"), launch.ranks("ref")
    assert sorted((m["rank"], m["world"], m["ssh"]) for m in trainer) == [
        ("0", "2", a),
        ("1", "2", b),
    ], launch.describe()
    assert sorted((m["rank"], m["world"], m["ssh"]) for m in ref) == [
        ("0", "4", a),
        ("1", "4", a),
        ("2", "4", b),
        ("3", "4", b),
    ], launch.describe()
    # Disjoint GPU sets per role, the same on every host.
    assert {m["gpus"] for m in trainer} == {"0"}
    assert {m["gpus"] for m in ref} == {"1,2"}
    # One Monarch worker per host: every proc on a host, of either role, descends from it.
    workers = {host: {m["worker"] for m in trainer + ref if m["ssh"] == host} for host in (a, b)}
    assert all(len(pids) == 1 and "-1" not in pids for pids in workers.values()), workers
    assert workers[a] != workers[b]
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
    # The rank's own exit record names it and its code (never Monarch's "likely crashed").
    assert re.fullmatch(
        r"monarch-launch: failed: trainer rank [01] \(host 127\.0\.0\.[23], local rank 0\): "
        r"exited with code 3",
        launch.lines[-1],
    ), launch.describe()
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
    assert launch.lines[-1] == "monarch-launch: failed: terminated by signal 15 (SIGTERM)"
    assert any(line.startswith("monarch-launch: torn down") for line in launch.lines)


def test_a_killed_launcher_leaves_no_worker_and_the_next_run_works(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    # The OOM killer picks the launcher proper (the stop guard's child, the biggest process)
    # and SIGKILL gives it no chance to tear down. Its ssh clients die with it
    # (PR_SET_PDEATHSIG), each worker's session guard sees its channel close and ends the
    # worker, so the port is free. (A SIGKILL for the stop guard instead hands the launcher
    # SIGTERM, a teardown: test_rank_output_bytes and test_stragglers kill it so.)
    a, b, _ = ssh_cluster.hosts
    hostfile = f"{a} slots=1\n{b} slots=1\n"
    (tmp_path / "killed").mkdir()
    killed = run_launch(
        tmp_path / "killed",
        ssh_cluster,
        hostfile,
        monarch_port,
        "--steps",
        "1000000",
        sigterm_after="step 2/",
        stop_signal=signal.SIGKILL,
        to_launcher_proper=True,
    )
    # The guard exits as its child did: 128 + 9, and says so (no teardown ran to say it).
    assert killed.returncode == 128 + signal.SIGKILL, killed.describe()
    assert not any(line.startswith("monarch-launch: torn down") for line in killed.lines)
    assert killed.lines[-1].startswith(
        "monarch-launch: failed: the launcher was killed by signal 9 (SIGKILL)"
    ), killed.describe()
    assert not reap_processes_mentioning(f":{monarch_port}", grace_s=10), "left behind"

    launch = run_launch(tmp_path, ssh_cluster, hostfile, monarch_port, "--steps", "1")

    assert launch.returncode == 0, launch.describe()


def test_sighup_tears_down_and_exits_129(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    # The terminal closes or the login node drops the researcher's ssh session.
    a, b, _ = ssh_cluster.hosts

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--steps",
        "1000000",
        sigterm_after="step 2/",
        stop_signal=signal.SIGHUP,
    )

    assert launch.returncode == 129, launch.describe()
    assert launch.lines[-1] == "monarch-launch: failed: terminated by signal 1 (SIGHUP)"
    assert any(line.startswith("monarch-launch: torn down") for line in launch.lines)


def test_worker_lost_mid_run_is_detected_in_seconds_naming_the_host(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    # The OOM killer or a node reboot ends a host's Monarch worker while the trainer runs.
    a, b, _ = ssh_cluster.hosts

    def kill_worker_on_b() -> None:
        workers = [
            (pid, args)
            for pid, args in processes_mentioning(f"tcp://{b}:{monarch_port}")
            if not args.startswith("ssh ")  # the worker, not the launcher's ssh client
        ]
        assert workers, "the worker on b should be running"
        for pid, _ in workers:
            os.kill(pid, signal.SIGKILL)

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--steps",
        "1000000",
        sigterm_after="step 2/",
        then=kill_worker_on_b,
    )

    assert launch.returncode == 1, launch.describe()
    # The launcher's last line (Monarch's client may print an atexit traceback after it when
    # its shutdown times out on a loaded machine).
    failure = [line for line in launch.lines if line.startswith("monarch-launch:")][-1]
    assert failure.startswith("monarch-launch: failed: Monarch worker lost mid-run: "), (
        launch.describe()
    )
    assert b in failure and "exited with code" not in failure, launch.describe()
    assert a not in failure


def test_host_without_sshd_fails_fast_naming_it(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, _, _ = ssh_cluster.hosts
    # 127.0.0.9 is loopback too, so it passes the address checks, but nothing listens there.
    launch = run_launch(tmp_path, ssh_cluster, f"{a} slots=1\n127.0.0.9 slots=1\n", monarch_port)

    assert launch.returncode == 1, launch.describe()
    failure = launch.lines[-1]
    assert failure.startswith("monarch-launch: failed:"), launch.describe()
    assert "127.0.0.9" in failure and "SSHUnreachable" in failure, launch.describe()
    assert "Connection refused" in failure
    assert a not in failure, "only the bad host is named"


def test_refused_key_fails_fast_naming_every_host(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    cluster = dataclasses.replace(ssh_cluster, key=stranger)

    launch = run_launch(tmp_path, cluster, f"{a} slots=1\n{b} slots=1\n", monarch_port)

    assert launch.returncode == 1, launch.describe()
    failure = launch.lines[-1]
    assert "pre-flight failed on 2 of 2 hosts" in failure, launch.describe()
    assert failure.count("SSHAuthFailed") == 2 and "Permission denied" in failure
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
    failure = launch.lines[-1]
    assert "PythonNotFound: /nonexistent/bin/python" in failure, launch.describe()
    assert a in failure and b in failure


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
        "monarch-launch: failed: plan needs 3 hosts (2 trainer + 1 ref, separate), but 2 are "
        "given; lower --trainer-hosts/--ref-hosts or use --colocate"
    ]
