"""``monarch-localcluster up`` after ``down`` starts an empty cluster: nothing of the earlier run
is left in the API (its objects would point at the earlier run's kubelet port, keys and pods),
and ``kubectl logs`` reaches pods of the new run (a newcomer saw "connection refused" on the old
port after a second ``up`` in the same checkout)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from monarch_operator.localcluster.cluster import LocalCluster

pytestmark = pytest.mark.cluster

POD = """
apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: default}
spec:
  restartPolicy: Never
  containers:
  - {name: main, image: busybox, command: [sh, -c, "echo hello from the second run; sleep 300"]}
"""


def kubectl(cluster: LocalCluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **cluster.env()}
    return subprocess.run(["kubectl", *args], input=stdin, env=env, capture_output=True,
                          text=True, check=False, timeout=60)


def test_up_after_down_is_a_new_empty_cluster(tmp_path):
    cluster = LocalCluster(tmp_path / "state", nodes=1)
    try:
        cluster.up(progress=lambda _: None)
        made = kubectl(cluster, "create", "configmap", "from-the-first-run", "-n", "default")
        assert made.returncode == 0, made.stderr
        cluster.down(quiet=True)

        cluster.up(progress=lambda _: None)
        port = kubectl(cluster, "get", "nodes", "-o",
                       "jsonpath={.items[*].status.daemonEndpoints.kubeletEndpoint.Port}")
        assert port.stdout.split() == [str(cluster.record()["ports"]["kubelet"])], port.stderr
        left = kubectl(cluster, "get", "configmap", "from-the-first-run", "-n", "default")
        assert left.returncode != 0 and "NotFound" in left.stderr, left.stdout + left.stderr

        made = kubectl(cluster, "apply", "-f", "-", stdin=POD)
        assert made.returncode == 0, made.stderr
        deadline = time.monotonic() + 120
        logs = kubectl(cluster, "logs", "hello", "-n", "default")
        while "hello from the second run" not in logs.stdout and time.monotonic() < deadline:
            time.sleep(1)
            logs = kubectl(cluster, "logs", "hello", "-n", "default")
        assert "hello from the second run" in logs.stdout, logs.stderr
    finally:
        cluster.down(quiet=True)
