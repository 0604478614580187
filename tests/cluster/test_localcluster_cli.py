"""``monarch-localcluster`` works from any directory: ``status`` and ``env`` name the cluster's
absolute paths, and kubectl set up by ``env`` in /tmp reaches the cluster."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster


def cli(*args: str, state_dir, cwd: str = "/tmp") -> subprocess.CompletedProcess:
    env = {**os.environ, "MONARCH_LOCALCLUSTER_DIR": str(state_dir)}
    env.pop("KUBECONFIG", None)
    return subprocess.run([sys.executable, "-m", "monarch_operator.localcluster.cli", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, check=False,
                          timeout=120)


def test_status_and_env_from_another_directory(local_cluster):
    status = cli("status", state_dir=local_cluster.state_dir)
    assert status.returncode == 0, status.stdout + status.stderr
    fields = dict(line.split(":", 1) for line in status.stdout.splitlines()
                  if not line.startswith(" "))
    assert fields["kubeconfig"].strip() == str(local_cluster.kubeconfig)
    assert fields["status"].strip() == "running"
    assert fields["kubelet API"].strip().startswith("https://127.0.0.1:")

    env = cli("env", state_dir=local_cluster.state_dir)
    assert env.returncode == 0, env.stderr
    assert f"export KUBECONFIG={local_cluster.kubeconfig}" in env.stdout.splitlines()
    nodes = subprocess.run(["bash", "-c", f'{env.stdout}\nkubectl get nodes -o name'],
                           cwd="/tmp", capture_output=True, text=True, check=False,
                           env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})
    assert nodes.returncode == 0, nodes.stderr
    assert "node/kwok-gpu-0" in nodes.stdout.split()


def test_status_of_a_directory_without_a_cluster(tmp_path):
    status = cli("status", state_dir=tmp_path / "none")
    assert status.returncode == 1
    assert f"kubeconfig:  {tmp_path / 'none' / 'kubeconfig'}" in status.stdout
    assert "not running" in status.stdout
