"""Nothing of attempt 1 survives into attempt 2 in the kept worker pods (issue 20, item 2).

A real ``monarch-torchrun`` runs in the launcher pod over ssh to the worker pods (on the local
cluster their containers are host processes). In attempt 1 every rank leaves processes outside
its group and session (``setsid``, a SIGTERM-ignoring ``nohup``, a double-forked daemon that
ignores SIGTERM and SIGHUP, rank 0's holding ``MASTER_ADDR:MASTER_PORT``), then the launcher is
killed with SIGKILL, so that nothing of it can clean up, and the attempt fails (exit 3): an
application restart that keeps the pods. None may be alive in attempt 2: those still under a
worker end with its ssh session (the session guard); the daemons, which left every process
tree, must be named and stopped by attempt 2's pre-flight before its rank 0 binds the same
rendezvous port.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.helpers import apply_manifest as apply
from tests.cluster.helpers import job_manifest, job_status, wait_until

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "spmd"
TORCHRUN = Path(sys.executable).parent / "monarch-torchrun"
# Attempt 1: start the stragglers, kill the launcher once all 6 are recorded, fail with 3.
# Attempt 2: rank 0 binds the rendezvous port that attempt 1's daemon held.
LAUNCHER = """
set -u
run="{torchrun} --nproc-per-node 1 --master-port {port} --attach-timeout 60"
if [ "$MONARCH_ATTEMPT" = 1 ]; then
  $run {folder}/leave_stragglers.py {folder}/pids sleep &
  launcher=$!
  i=0
  while [ "$(ls {folder}/pids | grep -c '[.]pid$')" -lt 6 ] && [ $i -lt 1800 ]; do
    sleep 0.1; i=$((i + 1))
  done
  kill -9 $launcher
  echo "attempt 1: launcher killed"
  exit 3
fi
exec $run {folder}/bind_master_port.py
"""


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder the launcher and worker pods' users can read and write (pods run non-root)."""
    folder = Path(tempfile.mkdtemp(prefix="stragglers-"))
    folder.chmod(0o777)
    (folder / "pids").mkdir(mode=0o777)
    (folder / "pids").chmod(0o777)
    for name in ("leave_stragglers.py", "bind_master_port.py"):
        shutil.copy(DATA / name, folder / name)
        (folder / name).chmod(0o644)
    yield folder
    for path in (folder / "pids").glob("*.pid"):
        try:
            os.kill(int(path.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_the_second_attempt_in_kept_pods_finds_no_survivor_of_the_first(
    kubectl, namespace, shared_folder: Path
) -> None:
    port = 29400 + os.getpid() % 500
    script = LAUNCHER.format(torchrun=TORCHRUN, port=port, folder=shared_folder)
    apply(kubectl, namespace, job_manifest(
        "strag",
        launcher={"command": ["sh", "-c", script],
                  # The launcher and, through it, the workers run this tree's code.
                  "env": [{"name": "PYTHONPATH", "value": str(REPO / "operator")}]},
        runPolicy={"backoffLimit": 1},
    ))

    def second_attempt_done() -> dict | None:
        status = job_status(kubectl, namespace, "strag")
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status = wait_until(second_attempt_done, 300, "strag to finish", interval=1)
    log = kubectl("logs", "strag-launcher-2", "-n", namespace, check=False)
    left = {path.stem: int(path.read_text()) for path in (shared_folder / "pids").glob("*.pid")}

    assert len(left) == 6, (status, log[-3000:])
    first = status["attempts"][0]
    assert first["class"] == "Application" and first["exitCode"] == 3, first
    assert status["phase"] == "Succeeded", (status.get("message"), log[-4000:])
    assert "rendezvous port bound" in log, log[-4000:]
    time.sleep(0.5)
    alive = [key for key, pid in left.items() if _alive(pid)]
    assert not alive, f"attempt 1's processes alive in attempt 2: {alive}\n{log[-4000:]}"
    named = [line for line in log.splitlines() if "of an earlier run on strag-worker-" in line]
    # Processes still under a worker when attempt 1's ssh sessions closed (setsid, nohup) were
    # already ended then by the worker's session guard (launcher/session/guard.py); the
    # double-forked daemons had left every process tree: attempt 2's pre-flight must have
    # named and stopped each of them.
    daemons = {key: pid for key, pid in left.items() if key.startswith("daemon-")}
    assert daemons, left
    for key, pid in daemons.items():
        line = next((n for n in named if f"pid {pid} (attempt 1 of this job)" in n), None)
        assert line is not None, f"{key} (pid {pid}) not named:\n{log[-4000:]}"
        assert "stopped (SIG" in line, line
