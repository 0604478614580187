"""The node agent behaves like a kubelet: init containers in order before the containers, and
restartPolicy with crash-loop back-off, restart counts and last states (``kubectl get pods``
RESTARTS); a MonarchJob whose worker init container always fails names it (field case C13)."""

from __future__ import annotations

import re

import pytest
import yaml
from tests.cluster.helpers import get_json, wait_until

pytestmark = pytest.mark.cluster

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
# On pods: the crash-loop back-off's first delay (kubelet: 10 s), so that restarts come quickly.
FAST_BACKOFF = {"localcluster.monarch-operator.dev/crash-loop-backoff-seconds": "1"}


def container(name: str, script: str, **fields) -> dict:
    return {"name": name, "image": IMAGE, "command": ["sh", "-c", script], **fields}


def apply_pod(kubectl, namespace: str, name: str, policy: str, containers: list[dict],
              init: list[dict] | None = None, fast_backoff: bool = False, **spec) -> None:
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": FAST_BACKOFF if fast_backoff else {}},
            "spec": {"restartPolicy": policy, "containers": containers,
                     "initContainers": init or [], **spec}}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))


def pod_in_phase(kubectl, namespace: str, name: str, phases: tuple[str, ...], timeout: float):
    return wait_until(lambda: (p := get_json(kubectl, "pod", name, "-n", namespace))
                      and p.get("status", {}).get("phase") in phases and p, timeout,
                      f"pod {name} in {phases}")


def get_pods_row(kubectl, namespace: str, name: str) -> dict[str, str]:
    header, *rows = kubectl("get", "pods", "-n", namespace, name).strip().splitlines()
    return dict(zip(header.split(), rows[0].split(), strict=False))


SHARED = {"volumes": [{"name": "work", "emptyDir": {}}]}
MOUNT = {"volumeMounts": [{"name": "work", "mountPath": "/work"}]}


def test_init_containers_run_in_order_before_the_container(kubectl, namespace):
    """Each init container runs to completion, in order, in the pod's sandbox (its volumes,
    hostname, env); the container starts after them and reads what they wrote."""
    apply_pod(kubectl, namespace, "ordered", "Never", init=[
        container("first", "sleep 1; echo -n one > /work/msg", **MOUNT),
        container("second", 'echo -n " two $(hostname) $GREETING" >> /work/msg', **MOUNT,
                  env=[{"name": "GREETING", "value": "hi"}]),
    ], containers=[container("main", "cat /work/msg > /dev/termination-log; "
                                     'test "$(cat /work/msg)" = "one two ordered hi"', **MOUNT)],
        **SHARED)
    pod = pod_in_phase(kubectl, namespace, "ordered", ("Succeeded", "Failed"), 60)
    status = pod["status"]
    (main,) = status["containerStatuses"]
    assert main["state"]["terminated"]["message"] == "one two ordered hi", main
    assert status["phase"] == "Succeeded"
    first, second = status["initContainerStatuses"]
    for init in (first, second):
        assert init["state"]["terminated"]["exitCode"] == 0
        assert init["state"]["terminated"]["reason"] == "Completed"
    assert first["state"]["terminated"]["finishedAt"] <= second["state"]["terminated"]["startedAt"]
    assert second["state"]["terminated"]["finishedAt"] <= main["state"]["terminated"]["startedAt"]
    initialized = next(c for c in status["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "True"


def test_failing_init_container_fails_a_never_pod_and_the_container_never_runs(kubectl,
                                                                               namespace):
    apply_pod(kubectl, namespace, "initfail", "Never",
              init=[container("prep", "echo prep broke > /dev/termination-log; exit 3")],
              containers=[container("main", "echo SHOULD-NOT-RUN")])
    pod = pod_in_phase(kubectl, namespace, "initfail", ("Succeeded", "Failed"), 60)
    status = pod["status"]
    assert status["phase"] == "Failed"
    (prep,) = status["initContainerStatuses"]
    terminated = prep["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (
        3, "Error", "prep broke\n")
    (main,) = status["containerStatuses"]
    assert "waiting" in main["state"] and main["restartCount"] == 0
    assert get_pods_row(kubectl, namespace, "initfail")["STATUS"] == "Init:Error"


def test_failing_init_container_crash_loops_under_always(kubectl, namespace):
    """restartPolicy Always: the init container is retried with back-off
    (Init:CrashLoopBackOff, restartCount growing); the container never starts."""
    apply_pod(kubectl, namespace, "initloop", "Always", fast_backoff=True,
              init=[container("prep", "exit 1")], containers=[container("main", "sleep 300")])

    def crash_looping():
        pod = get_json(kubectl, "pod", "initloop", "-n", namespace)
        (prep,) = (pod.get("status") or {}).get("initContainerStatuses") or [{}]
        waiting = (prep.get("state") or {}).get("waiting") or {}
        return pod if prep.get("restartCount", 0) >= 2 and (
            waiting.get("reason") == "CrashLoopBackOff") else None

    pod = wait_until(crash_looping, 60, "init container prep crash-looping")
    status = pod["status"]
    (prep,) = status["initContainerStatuses"]
    assert prep["lastState"]["terminated"]["exitCode"] == 1
    assert "back-off" in prep["state"]["waiting"]["message"]
    assert status["phase"] == "Pending"
    (main,) = status["containerStatuses"]
    assert main["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert main["restartCount"] == 0
    row = wait_until(lambda: (r := get_pods_row(kubectl, namespace, "initloop"))
                     and r["STATUS"] == "Init:CrashLoopBackOff" and r, 30,
                     "kubectl get pods showing Init:CrashLoopBackOff")
    assert int(row["RESTARTS"]) >= 2


def test_restart_policy_always_restarts_a_failing_container(kubectl, namespace):
    """`kubectl get pods` RESTARTS grows; CrashLoopBackOff between restarts; lastState keeps
    the previous exit and its termination message."""
    apply_pod(kubectl, namespace, "crasher", "Always", fast_backoff=True,
              containers=[container("main", "echo bye > /dev/termination-log; exit 1")])
    seen_restarts: list[int] = []

    def restarted_three_times():
        row = get_pods_row(kubectl, namespace, "crasher")
        seen_restarts.append(int(row["RESTARTS"].split()[0]))
        return row if seen_restarts[-1] >= 3 else None

    wait_until(restarted_three_times, 60, "3 restarts")
    assert seen_restarts == sorted(seen_restarts) and len(set(seen_restarts)) >= 3, seen_restarts
    pod = get_json(kubectl, "pod", "crasher", "-n", namespace)
    (main,) = pod["status"]["containerStatuses"]
    assert pod["status"]["phase"] == "Running"
    last = main["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"], last["message"]) == (1, "Error", "bye\n")
    wait_until(lambda: get_pods_row(kubectl, namespace, "crasher")["STATUS"]
               == "CrashLoopBackOff", 30, "STATUS CrashLoopBackOff")


def test_restart_policy_on_failure_restarts_until_success(kubectl, namespace):
    """OnFailure: the first run fails, the restart succeeds; the pod Succeeds with
    restartCount 1 and the failure as lastState. The emptyDir outlives the restart."""
    apply_pod(kubectl, namespace, "retry", "OnFailure", fast_backoff=True,
              containers=[container("main", "test -e /work/tried || { touch /work/tried; "
                                            "exit 2; }", **MOUNT)], **SHARED)
    pod = pod_in_phase(kubectl, namespace, "retry", ("Succeeded", "Failed"), 60)
    (main,) = pod["status"]["containerStatuses"]
    assert pod["status"]["phase"] == "Succeeded"
    assert main["restartCount"] == 1
    assert main["lastState"]["terminated"]["exitCode"] == 2
    assert main["state"]["terminated"]["reason"] == "Completed"


def test_job_with_failing_worker_init_container_fails_naming_it(kubectl, namespace):
    """Field case C13: the job never reaches Running; it fails (at the startup deadline at the
    latest) with a message naming the init container; no GPUs stay held."""
    body = {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": {"name": "demo"},
            "spec": {"image": IMAGE, "workers": {
                "replicas": 2, "gpusPerWorker": 1,
                "template": {"spec": {"initContainers": [
                    {"name": "prep", "image": "busybox", "command": ["sh", "-c", "exit 1"]}]}}},
                "meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}},
                "startupTimeoutSeconds": 15}}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
    phases = set()

    def failed():
        job = get_json(kubectl, "monarchjob", "demo", "-n", namespace) or {}
        phases.add((job.get("status") or {}).get("phase"))
        return job if (job.get("status") or {}).get("phase") == "Failed" else None

    job = wait_until(failed, 90, "job Failed")
    assert "Running" not in phases and "Succeeded" not in phases, phases
    failed_condition = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    message = failed_condition["message"]
    # Fast (the crash loop cannot heal: WorkerCannotStart) or at the latest at the startup
    # deadline (StartupTimeout), whichever the operator sees first; either names the container.
    assert failed_condition["reason"] in ("WorkerCannotStart", "StartupTimeout"), failed_condition
    assert re.search(r"demo-worker-[01] \(Init:", message), message
    assert "init container prep" in message, message
    assert "exited 1" in message, message
    assert job["status"]["readyWorkers"] == "0/2"
    assert get_json(kubectl, "pod", "demo-launcher", "-n", namespace) is None
    wait_until(lambda: get_json(kubectl, "statefulset", "demo-worker", "-n", namespace) is None,
               30, "worker StatefulSet deleted (no GPUs held)")
