"""Attach mode end to end on the real nodes (issue 23 item 1): the sample job
examples/attach_demo, whose program is written against Monarch's public ``KubernetesJob`` API
alone (no line for this cluster), attaches from the launcher pod to the job's role meshes,
fails its first attempt on purpose, and the second attempt re-attaches to the same worker pods; then, with the job's NetworkPolicy enforced
(kube-router), the same program attaches from a pod of the namespace that has the Role and the
``monarch-operator.dev/attach-to`` label docs/attach.md names, while a pod without the label
cannot reach the workers' Monarch port."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cluster.helpers import get_json, running_attempt, wait_phase, wait_until
from tests.cluster.test_attach_mode import CLIENT_RBAC
from tests.e2e.test_network_policy_enforced import CONNECT

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

JOB = "att-e2e"
ATTACH_PORT = 26600
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES_IMAGE = "ghcr.io/monarch-operator/examples:0.1.0"
# examples/attach_demo/main.py: Monarch's KubernetesJob and nothing of ours.
PROGRAM = ["python3", "-u", "-m", "attach_demo.main", "--job", JOB]
SECURITY = {"runAsNonRoot": True, "runAsUser": 1000}


def worker_uids(kubectl, namespace: str) -> dict[str, str]:
    pods = get_json(kubectl, "pods", "-n", namespace, "-l",
                    f"monarch-operator.dev/job={JOB},monarch-operator.dev/role=worker")["items"]
    return {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods}


def client_pod(name: str, command: list[str], labels: dict[str, str]) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"restartPolicy": "Never", "serviceAccountName": "attach-client",
                 "securityContext": SECURITY, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "client", "image": EXAMPLES_IMAGE,
                                 "command": command}]}})


def ended(kubectl, namespace: str, pod: str) -> str | None:
    phase = (get_json(kubectl, "pod", pod, "-n", namespace) or {}).get("status", {}).get("phase")
    return phase if phase in ("Succeeded", "Failed") else None


def test_an_unmodified_kubernetesjob_program_attaches_reattaches_and_outsiders_are_refused(
        kubectl, namespace):
    body = yaml.safe_load((EXAMPLES / "attach_demo" / "monarchjob.yaml").read_text())
    body["metadata"]["name"] = JOB
    body["spec"]["cleanupPolicy"] = "KeepAll"  # the workers stay for the clients below
    body["spec"]["launcher"]["command"] = [*PROGRAM, "--fail-on-attempt", "1"]
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    running_attempt(kubectl, namespace, JOB, 1)
    workers = worker_uids(kubectl, namespace)
    assert len(workers) == 3, workers

    done = wait_phase(kubectl, namespace, JOB, "Succeeded", timeout=480)
    assert done["restartCount"] == 1, done
    assert worker_uids(kubectl, namespace) == workers, "attempt 2 must re-attach to the same pods"
    first, last = json.dumps(done["attempts"][0]), kubectl("logs", f"{JOB}-launcher-2",
                                                           "-n", namespace)
    for output in (first, last):
        assert f"attached trainer: {JOB}-worker-0,{JOB}-worker-1" in output, output[-3000:]
        assert f"attached ref: {JOB}-worker-2" in output, output[-3000:]

    # From outside the job, with the NetworkPolicy enforced: the pod with the Role and the
    # attach-to label attaches; one without the label cannot reach a worker's Monarch port.
    kubectl("apply", "-n", namespace, "-f", "-", stdin=CLIENT_RBAC)
    kubectl("apply", "-n", namespace, "-f", "-", stdin=client_pod(
        "client", PROGRAM, {"monarch-operator.dev/attach-to": JOB}))
    worker_ip = kubectl("get", "pod", f"{JOB}-worker-0", "-n", namespace, "-o",
                        "jsonpath={.status.podIP}")
    kubectl("apply", "-n", namespace, "-f", "-", stdin=client_pod(
        "outsider", ["python3", "-c", _probe_program(worker_ip)], {"app": "outsider"}))
    phase = wait_until(lambda: ended(kubectl, namespace, "client"), 300, "the client pod ended")
    log = kubectl("logs", "client", "-n", namespace)
    assert phase == "Succeeded", log[-3000:]
    assert f"attached trainer: {JOB}-worker-0,{JOB}-worker-1" in log, log[-3000:]
    assert f"attached ref: {JOB}-worker-2" in log, log[-3000:]
    wait_until(lambda: ended(kubectl, namespace, "outsider"), 120, "the outsider pod ended")
    refused = kubectl("logs", "outsider", "-n", namespace).strip()
    # kube-router rejects (refused) or drops (a timeout); "open" or anything else fails.
    assert refused in ("ConnectionRefusedError", "TimeoutError", "timeout"), refused


def _probe_program(address: str) -> str:
    """CONNECT with its arguments given: prints ``open`` or the error's name."""
    return f"import sys\nsys.argv[1:] = [{address!r}, '{ATTACH_PORT}']\n" + CONNECT


def test_a_kubernetesjob_program_attaches_to_each_role_on_its_worker_group(kubectl, namespace):
    """Roles on worker groups in attach mode (issue 33): the unchanged KubernetesJob program
    attaches to each role's mesh by the selector and rank label the job publishes."""
    job = "att-roles"
    body = {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": {"name": job},
            "spec": {"image": EXAMPLES_IMAGE, "mode": "attach", "startupTimeoutSeconds": 300,
                     "workerGroups": [{"name": "gen", "replicas": 2, "gpusPerWorker": 1},
                                      {"name": "train", "replicas": 1, "gpusPerWorker": 1}],
                     "roles": [{"name": "generator", "group": "gen"},
                               {"name": "trainer", "group": "train"}],
                     "launcher": {"command": ["python3", "-u", "-m", "attach_demo.main",
                                              "--job", job, "--mesh", "generator=2",
                                              "--mesh", "trainer=1"]}}}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    done = wait_phase(kubectl, namespace, job, "Succeeded", timeout=420)
    published = {mesh["meshName"]: (mesh["replicas"], mesh["labelSelector"],
                                     mesh["podRankLabel"]) for mesh in done["meshes"]}
    # What examples/attach_demo/main.py gives add_mesh is what the job publishes.
    assert published == {
        role: (hosts, f"monarch-operator.dev/job={job},monarch-operator.dev/role=worker,"
                      f"monarch-operator.dev/{role}-rank", f"monarch-operator.dev/{role}-rank")
        for role, hosts in (("generator", 2), ("trainer", 1))}, done["meshes"]
    log = kubectl("logs", f"{job}-launcher", "-n", namespace)
    assert f"attached generator: {job}-gen-0,{job}-gen-1" in log, log[-3000:]
    assert f"attached trainer: {job}-train-0" in log, log[-3000:]
