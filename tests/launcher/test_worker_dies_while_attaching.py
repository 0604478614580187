"""A worker that dies before it attached is reported within seconds, naming its host and why.

The worker on one loopback host fails at start-up after the pre-flight passed (see
``tests/data/crash_worker/sitecustomize.py``), as one whose port another process took after the
pre-flight, or whose Python crashes, would. The launcher must not wait for the attach timeout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh

CRASH_WORKER = Path(__file__).parent.parent / "data" / "crash_worker"
ATTACH_TIMEOUT_S = 60


def test_worker_crashing_at_start_fails_the_launch_in_seconds_naming_the_host(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    (tmp_path / "never_run.py").write_text("raise SystemExit('the ranks must never start')\n")

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--attach-timeout",
        str(ATTACH_TIMEOUT_S),
        "--env",
        f"PYTHONPATH={CRASH_WORKER}",
        "--env",
        f"CRASH_WORKER_ON={b}",
        str(tmp_path / "never_run.py"),
        spmd=True,
    )

    assert launch.returncode == 1, launch.describe()
    failure = launch.lines[-1]
    assert failure.startswith("monarch-launch: failed: "), launch.describe()
    assert f"worker on {b} exited" in failure, launch.describe()
    assert "ssh exit status 1" in failure, launch.describe()
    assert f"ImportError: deliberate worker crash on {b}" in failure, launch.describe()
    assert a not in failure, launch.describe()


def test_json_result_carries_the_dead_workers_last_lines(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    (tmp_path / "never_run.py").write_text("raise SystemExit('the ranks must never start')\n")

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        "--json",
        "--env",
        f"PYTHONPATH={CRASH_WORKER}",
        "--env",
        f"CRASH_WORKER_ON={a}",
        str(tmp_path / "never_run.py"),
        spmd=True,
    )

    assert launch.returncode == 1, launch.describe()
    result = json.loads(next(line for line in reversed(launch.lines) if '"result"' in line))
    [failed] = result["failed_hosts"]
    assert (failed["host"], failed["ssh_exit"]) == (a, 1), result
    assert failed["output_tail"][-1] == f"ImportError: deliberate worker crash on {a}", result
    assert any("Traceback" in line for line in failed["output_tail"]), result
