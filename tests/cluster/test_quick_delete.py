"""A job deleted while it starts takes every child with it at once: a pass that was running
when the job went creates nothing more, and what it created (or was creating) is deleted by the
operator when it sees the job's DELETED event, not when garbage collection gets to it (up to
~40 s while the collector does not know the MonarchJob kind yet: a fresh CRD).

The garbage collector runs in the controller manager; the tests stop that process (SIGSTOP)
around the deletion, so that only the operator can delete the job's own children, then let it
go on (SIGCONT) for the worker pods, which their StatefulSet's deletion takes with it.
Against the real local control plane."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import kubernetes
import pytest
import yaml

from tests.cluster.helpers import LABEL_JOB, job_manifest, wait_until

pytestmark = pytest.mark.cluster

LONG_LAUNCHER = {"command": ["sh", "-c", "sleep 600"]}
# The kinds the operator creates for a job besides pods (the workers are their StatefulSet's;
# the launcher pod, the job's own, comes only once every worker is Ready).
OWN_KINDS = "statefulsets,secrets,services,configmaps,networkpolicies"
# Correctness bounds, not speed: the operator's deletes take well under a second; garbage
# collection of a fresh CRD's dependents took ~40 s before the fix. Pods end gracefully (the
# launcher's within its grace period).
OWN_GONE_SECONDS = 15
PODS_GONE_SECONDS = 45


@pytest.fixture
def custom(local_cluster) -> Iterator[kubernetes.client.CustomObjectsApi]:
    """The custom objects API of the local cluster (a create and a delete in milliseconds,
    where kubectl takes a process start each)."""
    api = kubernetes.config.new_client_from_config(str(local_cluster.kubeconfig))
    try:
        yield kubernetes.client.CustomObjectsApi(api)
    finally:
        api.close()


@contextmanager
def garbage_collector_stopped(local_cluster) -> Iterator[None]:
    """The controller manager (garbage collector, StatefulSet controller) stopped within."""
    pid = local_cluster.pid("kube-controller-manager")
    assert pid is not None and local_cluster.alive("kube-controller-manager")
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def labelled(kubectl, namespace: str, name: str, kinds: str, owner_kind: str | None = None,
             deleting: bool = True) -> list[str]:
    """``Kind/name`` of every object of ``kinds`` labelled for job ``name``; only those whose
    controller is a ``owner_kind`` when given, and without those being deleted unless
    ``deleting``."""
    items = kubectl.json(kinds, "-n", namespace, "-l", f"{LABEL_JOB}={name}")["items"]
    return [f"{item['kind']}/{item['metadata']['name']}" for item in items
            if (owner_kind is None or any(
                ref.get("controller") and ref.get("kind") == owner_kind
                for ref in item["metadata"].get("ownerReferences") or []))
            and (deleting or not item["metadata"].get("deletionTimestamp"))]


def own_children(kubectl, namespace: str, name: str) -> list[str]:
    """The children the job controls itself (its launcher pod among them, not its workers)
    that are not being deleted (a pod then ends within its grace period, its kubelet's part)."""
    return labelled(kubectl, namespace, name, f"{OWN_KINDS},pods", owner_kind="MonarchJob",
                    deleting=False)


def _has(kind: str) -> Callable[[list[str]], bool]:
    return lambda found: any(item.startswith(f"{kind}/") for item in found)


def _launcher(found: list[str]) -> bool:
    return any(item.startswith("Pod/") and "launcher" in item for item in found)


# When in its life the job is deleted: right after its creation, once the first pass's Secret
# is there, once the StatefulSet is, once a worker pod is, once its launcher pod is (Running).
DELETE_POINTS = {"at-once": None, "after-secret": _has("Secret"),
                 "after-statefulset": _has("StatefulSet"), "after-worker-pod": _has("Pod"),
                 "running": _launcher}


def delete_while_starting(kubectl, custom, local_cluster, namespace: str, name: str,
                          point: str) -> None:
    """Create job ``name``, delete it at ``point`` with the garbage collector stopped, and
    wait until its own children are gone (launcher pod included), then (collector running) its
    worker pods."""
    custom.create_namespaced_custom_object(
        "monarch-operator.dev", "v1alpha1", namespace, "monarchjobs",
        yaml.safe_load(job_manifest(name, launcher=LONG_LAUNCHER)))
    reached = DELETE_POINTS[point]
    if reached is not None:
        wait_until(lambda: reached(labelled(kubectl, namespace, name, f"{OWN_KINDS},pods")),
                   90, f"{name} reaching {point}", interval=0.1)
    with garbage_collector_stopped(local_cluster):
        custom.delete_namespaced_custom_object(
            "monarch-operator.dev", "v1alpha1", namespace, "monarchjobs", name)
        deleted_at = time.monotonic()
        wait_until(lambda: not own_children(kubectl, namespace, name),
                   OWN_GONE_SECONDS, f"the children of deleted job {name} gone", interval=0.2)
        print(f"{point} {name}: children gone {time.monotonic() - deleted_at:.1f}s after the "
              "job's deletion (garbage collector stopped)")
    wait_until(lambda: not labelled(kubectl, namespace, name, "pods"), PODS_GONE_SECONDS,
               f"the worker pods of deleted job {name} gone", interval=0.2)


@pytest.mark.parametrize("point", list(DELETE_POINTS))
def test_job_deleted_while_starting_leaves_no_children(kubectl, custom, namespace, operator,
                                                       local_cluster, point):
    log_start = operator.stat().st_size
    names = [f"quick-{index}" for index in range(3)]  # the race differs a little each time
    for name in names:
        delete_while_starting(kubectl, custom, local_cluster, namespace, name, point)
    # Nothing comes back later (no pass of a deleted job creates anything).
    time.sleep(2)
    left = {name: labelled(kubectl, namespace, name, f"{OWN_KINDS},pods") for name in names}
    assert not any(left.values()), left
    with open(operator, errors="replace") as log:
        log.seek(log_start)
        lines = log.read().splitlines()
    assert not [line for line in lines if "Traceback" in line], "\n".join(lines[-40:])
    complaints = [line for line in lines if f"{namespace}/quick-" in line
                  and ("WARNING" in line or "ERROR" in line)]
    assert not complaints, complaints


def test_a_job_deleted_with_orphan_propagation_leaves_its_children(kubectl, custom, namespace,
                                                                    operator, operator_process):
    """``kubectl delete monarchjob --cascade=orphan`` keeps the children (their owner
    references taken off by the garbage collector): the operator's quick delete of a deleted
    job's children must not take them, whatever its cache still shows. The operator is stopped
    (SIGSTOP) while the deletion happens, so that it sees the job's events and its children's
    at once, in no set order, as a busy operator would."""
    names = [f"orphan-{index}" for index in range(3)]  # the race differs a little each time
    for name in names:
        custom.create_namespaced_custom_object(
            "monarch-operator.dev", "v1alpha1", namespace, "monarchjobs",
            yaml.safe_load(job_manifest(name, launcher=LONG_LAUNCHER)))
    for name in names:
        wait_until(lambda name=name: _has("StatefulSet")(labelled(kubectl, namespace, name,
                                                                  OWN_KINDS)),
                   90, f"{name}'s StatefulSet", interval=0.2)
        before = sorted(labelled(kubectl, namespace, name, OWN_KINDS, deleting=False))
        pid = operator_process.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            custom.delete_namespaced_custom_object(
                "monarch-operator.dev", "v1alpha1", namespace, "monarchjobs", name,
                propagation_policy="Orphan")
            wait_until(lambda name=name: not kubectl.json(
                "monarchjobs", "-n", namespace, "--field-selector",
                f"metadata.name={name}")["items"], 60, f"{name} deleted", interval=0.2)
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(3)  # what the operator would do on the DELETED event, it has done by now
        after = sorted(labelled(kubectl, namespace, name, OWN_KINDS, deleting=False))
        # Everything the job had when it was deleted is still there, none owned by it.
        assert set(before) <= set(after), (name, before, after)
        assert not labelled(kubectl, namespace, name, OWN_KINDS, owner_kind="MonarchJob"), name
