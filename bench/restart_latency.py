"""Time from a failed attempt to the next attempt running, for both restart paths of the run
policy, on a fresh local control plane with the operator.

- application: the launcher of attempt 1 prints the time and exits 3 (``runPolicy.backoffLimit:
  1``); the worker pods are kept and only a new launcher pod starts.
- infrastructure (field case C8): the launcher of attempt 1 runs until stopped; the benchmark
  deletes worker pod 1 and notes the time; the operator stops the attempt, the StatefulSet
  recreates the pod, the gate waits for it to be Ready, and attempt 2 starts.

Attempt 2's launcher writes the time it started as its first action (into its termination
message), so each number is wall time on this machine's clock from the failure to the first
instruction of the next attempt's launcher process: detection by the operator (its resync
timer), the new launcher pod, scheduling, the node agent starting the
container, and for the infrastructure path the worker pod's recreation and sshd readiness.

Run: ``flock /tmp/monarch-tests.lock .venv/bin/python bench/restart_latency.py --runs 3`` as root.
Also prints ``kubectl get monarchjobs`` while the jobs restart, fail and are suspended.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl, install_crds, start_operator, stop_process

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
NAMESPACE = "restarts"
STARTED = 'date +%s.%N > /dev/termination-log'
APPLICATION = f'if [ "$MONARCH_ATTEMPT" = 1 ]; then date +%s.%N; exit 3; fi; {STARTED}'
INFRASTRUCTURE = f'if [ "$MONARCH_ATTEMPT" = 1 ]; then exec sleep 600; fi; {STARTED}'


def manifest(name: str, command: str, **spec: Any) -> str:
    return yaml.safe_dump({
        "apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
        "metadata": {"name": name},
        "spec": {"image": IMAGE, "workers": {"replicas": 2, "gpusPerWorker": 1},
                 "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}},
                 "launcher": {"command": ["sh", "-c", command]}, **spec}})


def wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(what)


def status_of(kubectl: Kubectl, name: str) -> dict[str, Any]:
    return kubectl.json("monarchjob", name, "-n", NAMESPACE).get("status") or {}


def attempt_started(kubectl: Kubectl, name: str, attempt: int) -> float:
    """When attempt ``attempt``'s launcher process started (from its termination message)."""
    def message() -> str | None:
        pods = kubectl.json("pods", "-n", NAMESPACE, "-l", f"monarch-operator.dev/job={name},"
                            f"monarch-operator.dev/attempt={attempt},"
                            "monarch-operator.dev/role=launcher")
        for pod in pods["items"]:
            for container in pod["status"].get("containerStatuses") or []:
                terminated = container["state"].get("terminated") or {}
                if terminated.get("message"):
                    return str(terminated["message"])
        return None
    return float(wait(message, 180, f"{name} attempt {attempt} started"))


def application_run(kubectl: Kubectl, index: int) -> float:
    name = f"app-{index}"
    kubectl("apply", "-n", NAMESPACE, "-f", "-",
            stdin=manifest(name, APPLICATION, runPolicy={"backoffLimit": 1}))
    started = attempt_started(kubectl, name, 2)
    failed_at = float(status_of(kubectl, name)["attempts"][0]["outputTail"][-1])
    return started - failed_at


def infrastructure_run(kubectl: Kubectl, index: int) -> float:
    name = f"infra-{index}"
    kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest(name, INFRASTRUCTURE))
    wait(lambda: status_of(kubectl, name).get("attemptWorkers")
         and status_of(kubectl, name).get("phase") == "Running", 180, f"{name} running")
    failed_at = time.time()
    kubectl("delete", "pod", f"{name}-worker-1", "-n", NAMESPACE, "--wait=false")
    return attempt_started(kubectl, name, 2) - failed_at


def show_states(kubectl: Kubectl) -> None:
    """``kubectl get monarchjobs`` with a job in each state this benchmark makes."""
    kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest(
        "evicted", "exec sleep 600", runPolicy={"infrastructureBackoffLimit": 0}))
    kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest("held", "true", suspend=True))
    kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=manifest(
        "spent", 'exit $((6 + MONARCH_ATTEMPT))', runPolicy={"backoffLimit": 1}))
    wait(lambda: status_of(kubectl, "evicted").get("phase") == "Running", 180, "evicted running")
    kubectl("delete", "pod", "evicted-worker-0", "-n", NAMESPACE, "--wait=false")
    wait(lambda: status_of(kubectl, "evicted").get("phase") == "Failed"
         and status_of(kubectl, "spent").get("phase") == "Failed", 180, "failed jobs")
    print("$ kubectl get monarchjobs -o wide")
    print(kubectl("get", "monarchjobs", "-n", NAMESPACE, "-o", "wide"), end="")
    for name in ("evicted", "spent"):
        failed = next(c for c in status_of(kubectl, name)["conditions"] if c["type"] == "Failed")
        print(f"{name}: Failed {failed['reason']}: {failed['message']}")


def summary(label: str, seconds: list[float]) -> str:
    return (f"{label:<15} runs={len(seconds)} median={statistics.median(seconds):.2f}s "
            f"min={min(seconds):.2f}s max={max(seconds):.2f}s")


@contextlib.contextmanager
def cluster_with_operator(namespace: str, before_operator: Callable[[Kubectl], None] | None = None
                          ) -> Iterator[Kubectl]:
    """A fresh local control plane (3 nodes x 8 GPUs) with the CRDs, ``namespace`` and the
    operator running; ``before_operator(kubectl)`` runs before the operator starts. Yields a
    kubectl for it; everything is stopped and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="monarch-bench-") as state_dir:
        cluster = LocalCluster(Path(state_dir), nodes=3, gpus_per_node=8)
        cluster.up(progress=lambda message: print(f"[localcluster] {message}", flush=True))
        operator = None
        try:
            kubectl = Kubectl(cluster.env())
            install_crds(kubectl)
            kubectl("create", "namespace", namespace)
            if before_operator is not None:
                before_operator(kubectl)
            operator = start_operator(cluster.state_dir, cluster.env())
            yield kubectl
        finally:
            if operator is not None:
                stop_process(operator)
            cluster.down(quiet=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="jobs per path (default 3)")
    args = parser.parse_args(argv)
    with cluster_with_operator(NAMESPACE) as kubectl:
        application, infrastructure = [], []
        for index in range(args.runs):
            application.append(application_run(kubectl, index))
            infrastructure.append(infrastructure_run(kubectl, index))
            print(f"run {index + 1}: application {application[-1]:.2f}s, "
                  f"infrastructure {infrastructure[-1]:.2f}s", flush=True)
        print("failure -> next attempt's launcher running")
        print(summary("application", application))
        print(summary("infrastructure", infrastructure))
        show_states(kubectl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
