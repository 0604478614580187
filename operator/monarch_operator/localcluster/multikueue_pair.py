"""A MultiKueue pair on this machine from nothing: ``monarch-localcluster multikueue up|down|
status`` (and the manager of ``tests/cluster/test_multikueue.py``).

- the **worker**: the usual local cluster (``--dir``; simulated nodes, or real ones with
  ``--real-nodes``), with our CRD, Kueue (MonarchJob as external framework) and our operator;
- the **manager**: a control plane without nodes (``<dir>/manager``), with our CRD, Kueue
  (:func:`.multikueue.manager_section`, :data:`.multikueue.MANAGER_FEATURE_GATES`) and our
  operator, which only makes the jobs' Workloads there;
- :func:`.multikueue.connect` between them (the worker's API server as the cluster's kubeconfig
  gives it: 127.0.0.1, or the node network's host address with real nodes), then a
  ResourceFlavor, ClusterQueue ``cluster-queue`` (the manager's with the MultiKueue check) and
  LocalQueue ``user-queue`` in the user's namespace on both sides.

Every step is skipped when what it makes already runs (:func:`start_side`) or is applied again
(CRDs, the MultiKueue objects with a fresh token, the queues), so ``up`` twice is fine. Kueue and
the operator record their pids in the cluster's state dir (``kueue.pid``, ``operator.pid``), and
``LocalCluster.down`` stops them with the cluster.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monarch_operator.localcluster import kueue as kueue_mod
from monarch_operator.localcluster import multikueue
from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl, install_crds, start_operator

Progress = Callable[[str], None]
MANAGER_DIR = "manager"
CLUSTER_QUEUE = "cluster-queue"
LOCAL_QUEUE = "user-queue"
FLAVOR = "default-flavor"
WORKER_NAME = "worker"
SAMPLE = Path(__file__).resolve().parents[3] / "crds" / "samples" / "multikueue.yaml"
# The operators of the pair run with Kueue on (a job without the queue label goes to the
# namespace's "default" LocalQueue, as the chart's kueue.enabled has it).
OPERATOR_ENV = {"MONARCH_OPERATOR_KUEUE": "true"}
# Quota for what the ClusterQueues cover besides GPUs: not meant to limit anything.
CPU_QUOTA, MEMORY_QUOTA = "1000", "4Ti"


@dataclass
class Side:
    """What :func:`start_side` started on one cluster (None: it already ran, or was not asked)."""

    kueue: kueue_mod.KueueProcess | None
    operator: subprocess.Popen[bytes] | None


def start_side(cluster: LocalCluster, kubectl: Kubectl, progress: Progress, *,
               multikueue_section: dict[str, Any] | None = None,
               feature_gates: dict[str, bool] | None = None,
               operator_env: dict[str, str] | None = None, namespaces: tuple[str, ...] = (),
               stop_with_owner: bool = False) -> Side:
    """Our CRD, Kueue and our operator on the running ``cluster``, in that order (the operator
    watches Workloads from its start, so Kueue's CRDs first), each unless it already runs.

    Args:
        multikueue_section, feature_gates: Kueue's, see :class:`.kueue.KueueProcess`.
        operator_env: extra environment of the operator (default :data:`OPERATOR_ENV`).
        namespaces: the operator's ``--namespace`` patterns (none: every namespace).
        stop_with_owner: both die with the calling process (tests).
    Raises:
        RuntimeError: Kueue failed to start (its log's end in the message), kubectl failed.
    """
    install_crds(kubectl)
    progress("CRD monarchjobs.monarch-operator.dev installed")
    started = Side(None, None)
    pid = kueue_mod.running_pid(cluster.state_dir)
    if pid is not None:
        progress(f"Kueue already runs (pid {pid})")
    else:
        started.kueue = kueue_mod.KueueProcess(
            cluster.state_dir, cluster.kubeconfig, kubectl, stop_with_owner=stop_with_owner,
            multikueue=multikueue_section, feature_gates=feature_gates)
        started.kueue.up()
        progress(f"Kueue {kueue_mod.KUEUE_VERSION} up (log: {started.kueue.log_path})")
    pid = cluster.operator_pid()
    if pid is not None:
        progress(f"monarch-operator already runs (pid {pid})")
    else:
        started.operator = start_operator(
            cluster.state_dir, {**cluster.env(), **(OPERATOR_ENV if operator_env is None
                                                    else operator_env)},
            namespaces=namespaces, stop_with_owner=stop_with_owner)
        progress(f"monarch-operator started (log: {cluster.state_dir / 'logs' / 'operator.log'})")
    return started


def worker_active(manager_kubectl: Kubectl, name: str = WORKER_NAME) -> dict[str, Any]:
    """The manager's MultiKueueCluster ``name``'s ``Active`` condition ({} if none yet)."""
    found = json.loads(manager_kubectl("get", "multikueuecluster", name, "-o", "json",
                                       "--ignore-not-found") or "{}")
    return next((c for c in (found.get("status") or {}).get("conditions") or []
                 if c["type"] == "Active"), {})


def wait_worker_active(manager_kubectl: Kubectl, name: str = WORKER_NAME,
                       timeout: float = 60) -> None:
    """Wait until the manager's Kueue reaches worker ``name`` (``Active=True``).

    Raises:
        TimeoutError: not Active after ``timeout`` seconds; the condition's reason and message.
    """
    deadline = time.monotonic() + timeout
    while (active := worker_active(manager_kubectl, name)).get("status") != "True":
        if time.monotonic() > deadline:
            raise TimeoutError(f"MultiKueueCluster {name} not Active after {timeout:.0f}s: "
                               f"{active.get('reason')}: {active.get('message')}")
        time.sleep(0.5)


def queue_objects(namespace: str, gpus: int, admission_check: str | None) -> list[dict[str, Any]]:
    """ResourceFlavor :data:`FLAVOR`, ClusterQueue :data:`CLUSTER_QUEUE` (every namespace;
    ``gpus`` ``nvidia.com/gpu``, CPU and memory not limiting; with ``admission_check`` on the
    manager) and LocalQueue :data:`LOCAL_QUEUE` in ``namespace``."""
    api = multikueue.KUEUE_API
    resources = [("nvidia.com/gpu", gpus), ("cpu", CPU_QUOTA), ("memory", MEMORY_QUOTA)]
    queue: dict[str, Any] = {"apiVersion": api, "kind": "ClusterQueue",
                             "metadata": {"name": CLUSTER_QUEUE}, "spec": {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": [name for name, _ in resources], "flavors": [{
            "name": FLAVOR, "resources": [{"name": name, "nominalQuota": quota}
                                          for name, quota in resources]}]}]}}
    if admission_check:
        queue["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": admission_check}]}
    return [{"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}}, queue,
            {"apiVersion": api, "kind": "LocalQueue",
             "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
             "spec": {"clusterQueue": CLUSTER_QUEUE}}]


def apply_queues(kubectl: Kubectl, namespace: str, gpus: int,
                 admission_check: str | None) -> None:
    """The namespace (if missing) and :func:`queue_objects` applied."""
    kubectl("create", "namespace", namespace, check=False)
    kubectl("apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "List",
         "items": queue_objects(namespace, gpus, admission_check)}))


def manager_of(worker: LocalCluster) -> LocalCluster:
    """The manager control plane that belongs to ``worker`` (``<worker dir>/manager``)."""
    return LocalCluster(worker.state_dir / MANAGER_DIR, nodes=0, node_agent=False)


def worker_server(worker: LocalCluster) -> str:
    """The worker's API server URL, as its kubeconfig names it."""
    return str(json.loads(worker.kubeconfig.read_text())["clusters"][0]["cluster"]["server"])


def up(worker: LocalCluster, namespace: str, progress: Progress) -> LocalCluster:
    """Bring up (or complete) the pair; returns the manager.

    Raises:
        RuntimeError: a component failed to start (see ``LocalCluster.up``, ``start_side``).
        TimeoutError: the manager's Kueue did not reach the worker within a minute.
    """
    worker.up(progress=lambda message: progress(f"worker: {message}"))
    worker_kubectl = Kubectl(worker.env())
    start_side(worker, worker_kubectl, lambda message: progress(f"worker: {message}"))
    manager = manager_of(worker)
    manager.up(progress=lambda message: progress(f"manager: {message}"))
    manager_kubectl = Kubectl(manager.env())
    start_side(manager, manager_kubectl, lambda message: progress(f"manager: {message}"),
               multikueue_section=multikueue.manager_section(),
               feature_gates=multikueue.MANAGER_FEATURE_GATES)
    multikueue.connect(manager_kubectl, worker_kubectl, worker_server(worker),
                       worker.state_dir / "pki" / "ca.crt", WORKER_NAME)
    progress(f"manager: MultiKueueCluster {WORKER_NAME} (Secret {WORKER_NAME}-kubeconfig), "
             f"MultiKueueConfig {multikueue.CONFIG_NAME}, AdmissionCheck "
             f"{multikueue.ADMISSION_CHECK} applied")
    wait_worker_active(manager_kubectl)
    progress(f"manager: MultiKueueCluster {WORKER_NAME} Active")
    gpus = (worker.real_nodes or worker.nodes) * worker.gpus_per_node
    apply_queues(worker_kubectl, namespace, gpus, None)
    progress(f"worker: ClusterQueue {CLUSTER_QUEUE} ({gpus} GPUs), LocalQueue "
             f"{namespace}/{LOCAL_QUEUE}")
    apply_queues(manager_kubectl, namespace, gpus, multikueue.ADMISSION_CHECK)
    progress(f"manager: ClusterQueue {CLUSTER_QUEUE} ({gpus} GPUs, check "
             f"{multikueue.ADMISSION_CHECK}), LocalQueue {namespace}/{LOCAL_QUEUE}")
    return manager


def down(worker: LocalCluster, progress: Progress) -> None:
    """Stop the manager, then the worker (each with its operator and Kueue)."""
    for name, cluster in (("manager", manager_of(worker)), ("worker", worker)):
        cluster.down(quiet=True)
        progress(f"{name}: stopped ({cluster.state_dir})")


def status(worker: LocalCluster) -> tuple[bool, list[str]]:
    """Whether the whole pair runs, and one line per part saying what runs."""
    lines, ok = [], True
    manager = manager_of(worker)
    for name, cluster in (("worker", worker), ("manager", manager)):
        running = cluster.is_running()
        kueue_pid, operator_pid = kueue_mod.running_pid(cluster.state_dir), cluster.operator_pid()
        ok = ok and running and kueue_pid is not None and operator_pid is not None
        lines.append(f"{name + ':':<9}{'running' if running else 'not running'}, "
                     f"kubeconfig {cluster.kubeconfig}")
        lines.append(f"  kueue            {_pid(kueue_pid)}")
        lines.append(f"  monarch-operator {_pid(operator_pid)}")
    if manager.is_running():
        active = worker_active(Kubectl(manager.env()))
        ok = ok and active.get("status") == "True"
        lines.append(f"  MultiKueueCluster {WORKER_NAME}: Active={active.get('status', '-')}"
                     f"{' (' + active['reason'] + ')' if active.get('reason') else ''}")
    return ok, lines


def _pid(pid: int | None) -> str:
    return f"pid {pid} running" if pid is not None else "not running"
