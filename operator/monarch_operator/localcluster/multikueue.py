"""Two local control planes as a Kueue MultiKueue pair: a manager (no nodes: Kueue with
MultiKueue and our operator, which only makes Workloads there) and a worker (the cluster with
nodes: Kueue, our operator running the jobs). Everything stays on loopback.

The pieces, in the order :func:`connect` applies them (Kueue v0.19.2;
``site/content/en/docs/tasks/manage/setup_multikueue.md`` and ``test/util/multikueue.go``):

1. on the worker, a ServiceAccount ``multikueue`` in ``kueue-system`` with a ClusterRole of what
   the manager's Kueue does there (:data:`WORKER_RULES`: Workloads, our MonarchJobs and the
   kinds of the manager's built-in integrations that have a MultiKueue adapter, which it
   watches on every worker) and a token for it;
2. on the manager, a Secret in ``kueue-system`` whose key ``kubeconfig`` has everything inline
   (the worker's CA as ``certificate-authority-data`` and the token: Kueue refuses file paths,
   ``validateKubeconfig`` in ``pkg/controller/admissionchecks/multikueue/multikueuecluster.go``),
   a MultiKueueCluster naming it, a MultiKueueConfig listing that cluster and an AdmissionCheck
   (controller ``kueue.x-k8s.io/multikueue``) naming the config, for the ClusterQueues to use.

The manager's Kueue needs :func:`manager_section` in its configuration and the gate
``MultiKueueAdaptersForCustomJobs`` (:data:`MANAGER_FEATURE_GATES`).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from monarch_operator import constants
from monarch_operator.localcluster.kueue import MONARCHJOB_FRAMEWORK, NAMESPACE

KUEUE = "kueue.x-k8s.io"
KUEUE_API = f"{KUEUE}/v1beta2"
# Kueue's MultiKueue admission check controller (apis/kueue/v1beta2, MultiKueueControllerName).
CONTROLLER_NAME = f"{KUEUE}/multikueue"
# Our names for the objects of one worker.
SERVICE_ACCOUNT = "multikueue"
CLUSTER_ROLE = "monarch-localcluster-multikueue"
CONFIG_NAME = "monarch-multikueue"
ADMISSION_CHECK = "monarch-multikueue"
# The generic adapter for our kind is built only with this gate (cmd/kueue/main.go; Beta and
# on by default since Kueue 0.15, set anyway so that an older default cannot turn it off).
MANAGER_FEATURE_GATES = {"MultiKueue": True, "MultiKueueAdaptersForCustomJobs": True}
_ALL = ["create", "update", "patch", "delete", "get", "list", "watch"]
WORKER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [KUEUE], "resources": ["workloads"], "verbs": _ALL},
    {"apiGroups": [KUEUE], "resources": ["workloads/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [KUEUE], "resources": ["clusterqueues", "localqueues"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": [constants.GROUP], "resources": [constants.PLURAL], "verbs": _ALL},
    {"apiGroups": [constants.GROUP], "resources": [f"{constants.PLURAL}/status"],
     "verbs": ["get"]},
    # The manager's built-in integrations with a MultiKueue adapter (localcluster.kueue
    # FRAMEWORKS: batch/job, pod, statefulset): watched on every worker, and a worker whose
    # watch fails is not connected (updateConfigAndRefreshWatchers).
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": _ALL},
    {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": _ALL},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": _ALL},
    {"apiGroups": ["apps"], "resources": ["statefulsets/status"], "verbs": ["get"]},
]


def manager_section(worker_lost_timeout_seconds: int = 900,
                    gc_interval_seconds: int = 60) -> dict[str, Any]:
    """The ``multiKueue`` section of the manager's Kueue ``Configuration``: MonarchJob under
    ``externalFrameworks`` (``Kind.version.group``), Kueue's defaults otherwise (15 minutes
    ``workerLostTimeout``, 1 minute ``gcInterval``) unless given."""
    return {"externalFrameworks": [{"name": MONARCHJOB_FRAMEWORK}],
            "workerLostTimeout": f"{worker_lost_timeout_seconds}s",
            "gcInterval": f"{gc_interval_seconds}s"}


def worker_access() -> list[dict[str, Any]]:
    """The worker's ServiceAccount, ClusterRole and binding for the manager's Kueue."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": CLUSTER_ROLE}, "rules": WORKER_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": CLUSTER_ROLE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": CLUSTER_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                       "namespace": NAMESPACE}]},
    ]


def worker_kubeconfig(server: str, ca_pem: bytes, token: str, name: str) -> str:
    """A kubeconfig with everything inline (CA data, bearer token), as MultiKueue requires."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": SERVICE_ACCOUNT}}],
    })


def manager_objects(cluster_name: str, kubeconfig: str) -> list[dict[str, Any]]:
    """The manager's Secret, MultiKueueCluster, MultiKueueConfig and AdmissionCheck for one
    worker named ``cluster_name``."""
    secret = f"{cluster_name}-kubeconfig"
    return [
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": secret, "namespace": NAMESPACE},
         "stringData": {"kubeconfig": kubeconfig}},
        {"apiVersion": KUEUE_API, "kind": "MultiKueueCluster",
         "metadata": {"name": cluster_name},
         "spec": {"clusterSource": {"kubeConfig": {"location": secret,
                                                   "locationType": "Secret"}}}},
        {"apiVersion": KUEUE_API, "kind": "MultiKueueConfig", "metadata": {"name": CONFIG_NAME},
         "spec": {"clusters": [cluster_name]}},
        {"apiVersion": KUEUE_API, "kind": "AdmissionCheck",
         "metadata": {"name": ADMISSION_CHECK},
         "spec": {"controllerName": CONTROLLER_NAME,
                  "parameters": {"apiGroup": KUEUE, "kind": "MultiKueueConfig",
                                 "name": CONFIG_NAME}}},
    ]


def connect(manager_kubectl: Any, worker_kubectl: Any, worker_server: str, worker_ca: Path,
            cluster_name: str = "worker", token_seconds: int = 86400) -> None:
    """Make the worker cluster a MultiKueue worker of the manager (both running, with Kueue's
    CRDs): the worker's access, a token, the manager's objects.

    Args:
        worker_server: the worker's API server URL as the manager's Kueue reaches it (e.g.
            ``https://127.0.0.1:<port>``, or a proxy in front of it).
        worker_ca: the worker cluster's CA certificate (PEM file).
    """
    worker_kubectl("apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": worker_access()}))
    token = worker_kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE,
                           f"--duration={token_seconds}s").strip()
    config = worker_kubeconfig(worker_server, worker_ca.read_bytes(), token, cluster_name)
    manager_kubectl("create", "namespace", NAMESPACE, check=False)
    manager_kubectl("apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": manager_objects(cluster_name, config)}))
