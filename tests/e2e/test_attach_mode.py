"""Attach mode end to end on the real nodes (issue 23 item 1): a program written against
Monarch's public ``KubernetesJob`` API alone, unmodified (no line for this cluster), attaches
from the launcher pod to the job's role meshes, fails its first attempt on purpose, and the
second attempt re-attaches to the same worker pods; then, with the job's NetworkPolicy enforced
(kube-router), the same program attaches from a pod of the namespace that has the Role and the
``monarch-operator.dev/attach-to`` label docs/attach.md names, while a pod without the label
cannot reach the workers' Monarch port."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cluster.helpers import get_json, running_attempt, wait_phase, wait_until
from tests.cluster.test_attach_mode import CLIENT_RBAC
from tests.e2e.test_network_policy_enforced import CONNECT, WORKER_IMAGE

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

JOB = "att-e2e"
ATTACH_PORT = 26600
# Monarch's GRPO-on-Kubernetes tutorial's shape with our selectors; nothing else.
PROGRAM = """
import os, socket, sys
from monarch.actor import Actor, endpoint
from monarch.job.kubernetes import KubernetesJob

class Where(Actor):
    @endpoint
    def host(self) -> str:
        return socket.gethostname()

job = KubernetesJob(namespace=NAMESPACE, timeout=180)
for mesh, hosts in (("trainer", 2), ("ref", 1)):
    job.add_mesh(mesh, hosts, pod_rank_label=f"monarch-operator.dev/{mesh}-rank",
                 label_selector=f"monarch-operator.dev/job={JOB},"
                                f"monarch-operator.dev/role=worker,monarch-operator.dev/{mesh}-rank")
state = job.state(cached_path=None)
for mesh in ("trainer", "ref"):
    procs = getattr(state, mesh).spawn_procs(per_host={"procs": 1})
    hosts = sorted(procs.spawn("where", Where).host.call().get().values())
    print("ATTACHED", mesh, ",".join(hosts), flush=True)
    procs.stop().get()
if os.environ.get("MONARCH_ATTEMPT") == "1":
    sys.exit(3)
"""
SECURITY = {"runAsNonRoot": True, "runAsUser": 1000}


def worker_uids(kubectl, namespace: str) -> dict[str, str]:
    pods = get_json(kubectl, "pods", "-n", namespace, "-l",
                    f"monarch-operator.dev/job={JOB},monarch-operator.dev/role=worker")["items"]
    return {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods}


def client_pod(name: str, program: str, labels: dict[str, str]) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"restartPolicy": "Never", "serviceAccountName": "attach-client",
                 "securityContext": SECURITY, "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "client", "image": WORKER_IMAGE,
                                 "command": ["python3", "-u", "-c", program]}]}})


def ended(kubectl, namespace: str, pod: str) -> str | None:
    phase = (get_json(kubectl, "pod", pod, "-n", namespace) or {}).get("status", {}).get("phase")
    return phase if phase in ("Succeeded", "Failed") else None


def test_an_unmodified_kubernetesjob_program_attaches_reattaches_and_outsiders_are_refused(
        kubectl, namespace):
    program = f"NAMESPACE, JOB = {namespace!r}, {JOB!r}\n" + PROGRAM
    body = {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": {"name": JOB},
            "spec": {"image": WORKER_IMAGE, "mode": "attach", "cleanupPolicy": "KeepAll",
                     "workers": {"replicas": 3, "gpusPerWorker": 1},
                     "meshes": {"trainer": {"hosts": 2}, "ref": {"hosts": 1}},
                     "runPolicy": {"backoffLimit": 1},
                     "launcher": {"command": ["python3", "-u", "-c", program]}}}
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
        assert f"ATTACHED trainer {JOB}-worker-0,{JOB}-worker-1" in output, output[-3000:]
        assert f"ATTACHED ref {JOB}-worker-2" in output, output[-3000:]

    # From outside the job, with the NetworkPolicy enforced: the pod with the Role and the
    # attach-to label attaches; one without the label cannot reach a worker's Monarch port.
    kubectl("apply", "-n", namespace, "-f", "-", stdin=CLIENT_RBAC)
    kubectl("apply", "-n", namespace, "-f", "-", stdin=client_pod(
        "client", program, {"monarch-operator.dev/attach-to": JOB}))
    worker_ip = kubectl("get", "pod", f"{JOB}-worker-0", "-n", namespace, "-o",
                        "jsonpath={.status.podIP}")
    kubectl("apply", "-n", namespace, "-f", "-", stdin=client_pod(
        "outsider", _probe_program(worker_ip), {"app": "outsider"}))
    phase = wait_until(lambda: ended(kubectl, namespace, "client"), 300, "the client pod ended")
    log = kubectl("logs", "client", "-n", namespace)
    assert phase == "Succeeded", log[-3000:]
    assert f"ATTACHED trainer {JOB}-worker-0,{JOB}-worker-1" in log, log[-3000:]
    assert f"ATTACHED ref {JOB}-worker-2" in log, log[-3000:]
    wait_until(lambda: ended(kubectl, namespace, "outsider"), 120, "the outsider pod ended")
    refused = kubectl("logs", "outsider", "-n", namespace).strip()
    assert refused and refused != "open", f"a pod without the label reached the worker: {refused}"


def _probe_program(address: str) -> str:
    """CONNECT with its arguments given: prints ``open`` or the error's name."""
    return f"import sys\nsys.argv[1:] = [{address!r}, '{ATTACH_PORT}']\n" + CONNECT
