"""Simulated pods for benchmarks (bench/operator_scale.py): kwok Stages make a pod labelled
``localcluster.monarch-operator.dev/simulate`` Ready and then Succeeded after the delays in its
annotations, and the node agent runs nothing for it. A client certificate per user makes that
user's requests carry its own name."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from monarch_operator.localcluster.agent import ANNOTATION_STATUS, LABEL_SIMULATE
from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl

pytestmark = pytest.mark.cluster


def _pod(name: str, mode: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {LABEL_SIMULATE: mode},
                         "annotations": {
                             "localcluster.monarch-operator.dev/simulate-ready-after": "1s",
                             "localcluster.monarch-operator.dev/simulate-succeed-after": "2s"}},
            # A command that would fail at once if anything ran it.
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "ghcr.io/monarch-operator/worker:0.1.0",
                                     "command": ["sh", "-c", "exit 7"]}]}}


def test_simulated_pod_turns_ready_then_succeeds_without_a_process(
        kubectl: Kubectl, bare_namespace: str, local_cluster: LocalCluster) -> None:
    kubectl("apply", "-n", bare_namespace, "-f", "-", stdin=yaml.safe_dump_all(
        [_pod("finishes", "succeed"), _pod("stays", "ready")]))
    phases: dict[str, list[str]] = {"finishes": [], "stays": []}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for name, seen in phases.items():
            pod = json.loads(kubectl("get", "pod", name, "-n", bare_namespace, "-o", "json"))
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in pod["status"].get("conditions", []))
            state = f"{pod['status'].get('phase')}{'+Ready' if ready else ''}"
            if not seen or seen[-1] != state:
                seen.append(state)
        if phases["finishes"][-1] == "Succeeded" and phases["stays"][-1] == "Running+Ready":
            break
        time.sleep(0.2)
    assert phases["finishes"][-2:] == ["Running+Ready", "Succeeded"], phases
    assert phases["stays"][-1] == "Running+Ready", phases
    finished = json.loads(kubectl("get", "pod", "finishes", "-n", bare_namespace, "-o", "json"))
    terminated = finished["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    # The agent never took the pods on: no status of its own, no pod directory.
    for name in phases:
        pod = json.loads(kubectl("get", "pod", name, "-n", bare_namespace, "-o", "json"))
        assert ANNOTATION_STATUS not in (pod["metadata"].get("annotations") or {})
        assert not (local_cluster.state_dir / "pods" / bare_namespace / name).exists()


def test_user_kubeconfig_authenticates_as_that_user(local_cluster: LocalCluster) -> None:
    kubeconfig = local_cluster.user_kubeconfig("bench-user")
    who = Kubectl({**local_cluster.env(), "KUBECONFIG": str(kubeconfig)})
    review = json.loads(who("auth", "whoami", "-o", "json"))
    assert review["status"]["userInfo"]["username"] == "bench-user"
    assert "system:masters" in review["status"]["userInfo"]["groups"]
