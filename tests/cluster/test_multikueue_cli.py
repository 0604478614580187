"""The MultiKueue pair from nothing, as docs/kueue.md ("From nothing") shows it: ``monarch-
localcluster multikueue up`` in an empty state dir, the sample applied on the manager with the
printed command, Succeeded on the manager, ``multikueue down``, and no process of either
cluster left (issue 37 item 3)."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from monarch_operator.localcluster.cluster import DEFAULT_POD_CIDR, POD_CIDR_ENV, LocalCluster
from monarch_operator.localcluster.demo import Kubectl
from monarch_operator.localcluster.multikueue_pair import SAMPLE
from tests.cluster.helpers import wait_phase

pytestmark = pytest.mark.cluster


def cli(state_dir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "MONARCH_LOCALCLUSTER_DIR": str(state_dir)}
    env.pop("KUBECONFIG", None)
    # The upper half of this run's pod range: the session's cluster, if one runs beside,
    # hands out the lower addresses first.
    pods = ipaddress.ip_network(os.environ.get(POD_CIDR_ENV, DEFAULT_POD_CIDR))
    env[POD_CIDR_ENV] = str(list(pods.subnets(1))[1])
    return subprocess.run([sys.executable, "-m", "monarch_operator.localcluster.cli",
                           "multikueue", *args], cwd="/tmp", env=env, capture_output=True,
                          text=True, check=False, timeout=timeout)


def recorded_pids(state_dir: Path) -> set[int]:
    """Every pid the pair recorded: components, Kueue and operator of both clusters."""
    pids: set[int] = set()
    for folder in (state_dir, state_dir / "manager"):
        record = folder / "cluster.json"
        if record.exists():
            pids |= {int(pid) for pid in json.loads(record.read_text())["pids"].values()}
        pids |= {int(path.read_text()) for path in folder.glob("*.pid")}
    return pids


def alive(proc: Path) -> bool:
    """Whether the process of ``/proc/<pid>`` runs (neither gone nor a zombie)."""
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def live_processes_of(state_dir: Path) -> list[str]:
    """Processes not dead (absent or zombie) whose command line or environment names
    ``state_dir`` (components, Kueue, operators, pods: KUBECONFIG or --kubeconfig)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        if not alive(proc):
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            text = cmdline + (proc / "environ").read_bytes()
        except OSError:
            continue
        if str(state_dir).encode() in text:
            args = cmdline.split(bytes(1))
            found.append(f"{proc.name}: " + " ".join(arg.decode(errors="replace") for arg in args))
    return found


def test_multikueue_up_from_nothing_runs_the_sample_and_down_leaves_nothing(tmp_path):
    state_dir = tmp_path / "state"
    try:
        up = cli(state_dir, "up")
        assert up.returncode == 0, up.stdout + up.stderr
        lines = up.stdout.splitlines()
        assert "[multikueue] manager: MultiKueueCluster worker Active" in lines, up.stdout
        fields = dict(line.split(":", 1) for line in lines if line.startswith(
            ("manager kubeconfig:", "worker kubeconfig:")))
        manager_kubeconfig = state_dir / "manager" / "kubeconfig"
        assert fields["manager kubeconfig"].strip() == str(manager_kubeconfig)
        assert fields["worker kubeconfig"].strip() == str(state_dir / "kubeconfig")
        [apply_line] = [line.strip() for line in lines if " apply " in line]
        assert shlex.split(apply_line) == ["kubectl", "--kubeconfig", str(manager_kubeconfig),
                                           "apply", "-n", "team-a", "-f", str(SAMPLE)]

        # The printed command, with kubectl from `monarch-localcluster env`.
        kubectl_dir = LocalCluster(state_dir).env()["PATH"].split(os.pathsep)[0]
        applied = subprocess.run(shlex.split(apply_line), capture_output=True, text=True,
                                 check=False, env={**os.environ, "PATH": f"{kubectl_dir}"
                                                   f"{os.pathsep}{os.environ['PATH']}"})
        assert applied.returncode == 0, applied.stderr

        # While the job is dispatched and runs: `up` again starts nothing a second time.
        again = cli(state_dir, "up")
        assert again.returncode == 0, again.stdout + again.stderr
        for side in ("worker", "manager"):
            assert f"[multikueue] {side}: Kueue already runs" in again.stdout, again.stdout
            assert f"[multikueue] {side}: monarch-operator already runs" in again.stdout
        status = cli(state_dir, "status")
        assert status.returncode == 0, status.stdout
        assert "MultiKueueCluster worker: Active=True" in status.stdout
        manager = Kubectl({"KUBECONFIG": str(manager_kubeconfig)})
        done = wait_phase(manager, "team-a", "dispatched", "Succeeded", timeout=240)
        assert done["progress"]["percent"] == "100%", done
        pids = recorded_pids(state_dir)
        assert len(pids) == 14, pids  # 6 + 4 components, 2 Kueues, 2 operators
    finally:
        down = cli(state_dir, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    left = [pid for pid in pids if alive(Path(f"/proc/{pid}"))]
    assert not left, left
    assert not live_processes_of(state_dir)
    status = cli(state_dir, "status")
    assert status.returncode == 1 and "not running" in status.stdout, status.stdout
