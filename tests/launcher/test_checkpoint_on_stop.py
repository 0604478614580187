"""Checkpoint before a stop, end to end on the launcher (issue 21 item 4): the example program
(examples/rl_kl with ``--checkpoint-dir``) under ``monarch-launch run`` over real loopback sshd
gets SIGTERM with a grace period, saves its state, names it in the termination message and
still exits 143; run again with that location it resumes at the next step."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from monarch_operator.launcher import stoprequest, termination
from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh

STEP = re.compile(r"^step (?P<step>\d+)/\d+ ")


def test_the_example_saves_on_sigterm_and_resumes_from_it(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    hostfile = f"{a} slots=1\n{b} slots=1\n"
    saved_dir = tmp_path / "ckpt"
    saved_dir.mkdir()
    log = tmp_path / "termination-log"
    first_dir = tmp_path / "first"
    first_dir.mkdir()
    stopped = run_launch(
        first_dir, ssh_cluster, hostfile, monarch_port,
        "--trainer-hosts", "1", "--ref-hosts", "1", "rl_kl.controller:main", "--steps", "1000",
        "--step-seconds", "0.2", "--checkpoint-dir", str(saved_dir),
        program=True, sigterm_after="step 3/", stop_signal=signal.SIGTERM,
        extra_env={stoprequest.ENV_STOP_GRACE: "30",
                   termination.ENV_TERMINATION_LOG: str(log)})

    assert stopped.returncode == 143, stopped.describe()  # stopped from outside: never 0
    saved = [line for line in stopped.lines if line.startswith("asked to stop: saved ")]
    assert saved, stopped.describe()
    where = saved[0].split()[-1]
    last_step = max(int(m["step"]) for m in map(STEP.match, stopped.lines) if m)
    assert where == str(saved_dir / f"step-{last_step}.pt"), (where, last_step)
    assert Path(where).is_file()
    assert stoprequest.parse_marker(log.read_text()) == where, log.read_text()

    second_dir = tmp_path / "second"
    second_dir.mkdir()
    resumed = run_launch(
        second_dir, ssh_cluster, hostfile, monarch_port,
        "--trainer-hosts", "1", "--ref-hosts", "1", "rl_kl.controller:main",
        "--steps", str(last_step + 2), "--checkpoint-dir", str(saved_dir),
        program=True, extra_env={stoprequest.ENV_CHECKPOINT: where})

    assert resumed.returncode == 0, resumed.describe()
    assert f"resumed from {where} at step {last_step + 1}" in resumed.lines, resumed.describe()
    assert [int(m["step"]) for m in map(STEP.match, resumed.lines) if m] == [
        last_step + 1, last_step + 2], resumed.describe()
