"""Each job's NetworkPolicy enforced on the real nodes (kube-router's firewall): a pod of another
job and a pod outside any job cannot reach a worker's sshd (2222) or Monarch port (22222), nor a
port the launcher listens on; the job's own launcher and workers can; with the operator's
``MONARCH_OPERATOR_NETWORK_POLICY=false`` (the chart's ``networkPolicy.enabled: false``) the
outsider gets through.

Each job keeps its workers and launcher running: the launcher listens on :data:`LAUNCHER_PORT`
(a stand-in for its Monarch client's run-time port).
"""

from __future__ import annotations

import json

import pytest

from monarch_operator import constants
from tests.cluster.helpers import job_manifest, wait_phase, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

WORKER_IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
LAUNCHER_PORT = 8000
LISTENING_LAUNCHER = {"command": ["python3", "-m", "http.server", str(LAUNCHER_PORT)]}
# Prints "open", or the error's name (ConnectionRefusedError: kube-router rejects; timeout).
CONNECT = ("import socket, sys\n"
           "try:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=4).close()"
           "; print('open')\n"
           "except OSError as error:\n print(type(error).__name__)\n")


def _pod_ip(kubectl, namespace: str, pod: str) -> str:
    return kubectl("get", "pod", pod, "-n", namespace, "-o", "jsonpath={.status.podIP}")


def _reach(kubectl, namespace: str, client: str, address: str, port: int,
           container: str | None = None) -> str:
    extra = ["-c", container] if container else []
    return kubectl("exec", "-n", namespace, client, *extra, "--", "python3", "-c", CONNECT,
                   address, str(port)).strip()


def _start_job(kubectl, namespace: str, name: str) -> tuple[str, str]:
    """A job whose launcher listens and keeps running; (worker-0 IP, launcher pod IP)."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
        name, image=WORKER_IMAGE, launcher=LISTENING_LAUNCHER))
    wait_phase(kubectl, namespace, name, "Running", timeout=240)
    launcher = f"{name}-launcher"
    wait_until(lambda: _pod_ip(kubectl, namespace, launcher), 60, f"{launcher} has an IP")
    return _pod_ip(kubectl, namespace, f"{name}-worker-0"), _pod_ip(kubectl, namespace, launcher)


def _outsider(kubectl, namespace: str) -> str:
    spec = {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
            "containers": [{"name": "c", "image": WORKER_IMAGE, "command": ["sleep", "3600"]}],
            "terminationGracePeriodSeconds": 0}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "outsider"}, "spec": spec}))
    kubectl("wait", "-n", namespace, "pod/outsider", "--for=condition=Ready", "--timeout=120s")
    return "outsider"


def test_only_the_jobs_own_pods_reach_its_workers_and_launcher(kubectl, namespace):
    worker_a, launcher_a = _start_job(kubectl, namespace, "np-a")
    _start_job(kubectl, namespace, "np-b")
    outsider = _outsider(kubectl, namespace)
    targets = [(worker_a, constants.SSH_PORT), (launcher_a, LAUNCHER_PORT)]

    # The job's own pods: its launcher reaches its workers' sshd, a worker its launcher.
    assert _reach(kubectl, namespace, "np-a-launcher", worker_a, constants.SSH_PORT) == "open"
    assert _reach(kubectl, namespace, "np-a-worker-1", launcher_a, LAUNCHER_PORT,
                  "worker") == "open"
    # Another job's worker and launcher, and a pod of no job: refused, on every port.
    for client, container in (("np-b-worker-0", "worker"), ("np-b-launcher", None),
                              (outsider, None)):
        for address, port in [*targets, (worker_a, constants.MONARCH_WORKER_PORT)]:
            got = _reach(kubectl, namespace, client, address, port, container)
            assert got != "open", f"{client} reached {address}:{port}"


def test_without_the_policy_an_outsider_gets_through(kubectl, namespace, operator_process):
    operator_process.start(MONARCH_OPERATOR_NETWORK_POLICY="false")
    try:
        worker, launcher = _start_job(kubectl, namespace, "open")
        assert kubectl("get", "networkpolicies", "-n", namespace, "-o", "name") == ""
        outsider = _outsider(kubectl, namespace)
        assert _reach(kubectl, namespace, outsider, worker, constants.SSH_PORT) == "open"
        assert _reach(kubectl, namespace, outsider, launcher, LAUNCHER_PORT) == "open"
    finally:
        operator_process.start()
