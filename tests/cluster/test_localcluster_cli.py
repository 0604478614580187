"""``monarch-localcluster`` works from any directory: ``status`` and ``env`` name the cluster's
absolute paths, and kubectl set up by ``env`` in /tmp reaches the cluster. The node agent's
kubelet API, which ``status`` names, lets in the apiserver only."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

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


def kubelet_get(local_cluster, path: str, client: str | None) -> int:
    """Status of GET ``path`` on the node agent's kubelet API, as ``client`` (a pki name)."""
    pki = local_cluster.state_dir / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if client:
        context.load_cert_chain(str(pki / f"{client}.crt"), str(pki / f"{client}.key"))
    port = local_cluster.record()["ports"]["kubelet"]
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context,
                                    timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_kubelet_api_serves_the_apiserver_only(local_cluster):
    """TLS with the cluster CA; the apiserver's kubelet client certificate is let in, any other
    client (even the cluster admin's) is refused, one without a certificate cannot connect."""
    assert kubelet_get(local_cluster, "/healthz", "apiserver-kubelet-client") == 200
    assert kubelet_get(local_cluster, "/healthz", "admin") == 403
    assert kubelet_get(local_cluster, "/attach/default/p/c", "apiserver-kubelet-client") == 404
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        kubelet_get(local_cluster, "/healthz", None)
