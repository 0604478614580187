"""The job's NetworkPolicy: only the job's own pods reach its workers and its launcher.

Monarch's worker loop runs code for any client that connects to it, and the workers' sshd, the
Monarch procs, the collectives (gloo, NCCL) and the launcher's Monarch client all listen on the
pod network. The policy makes the job's pods (workers and launcher) isolated for ingress and
admits traffic only from pods of the same job; egress is left alone. It does not name ports:
besides sshd (2222) and the Monarch worker (22222), procs, collectives and the launcher's client
(``tcp://<pod IP>:0``) use ports chosen at run time, all of them between the job's own pods.
Kubernetes always admits traffic from the pod's own node (kubelet probes). Enforced only by a
network plugin that implements NetworkPolicy.
"""

from __future__ import annotations

from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import child_metadata
from monarch_operator.controller.spec import JobSpec


def job_pod_selector(job: JobSpec) -> dict[str, Any]:
    """Label selector of exactly the job's pods (workers and launcher): its job label, and the
    managed-by label that only the operator's own pods carry with it."""
    return {"matchLabels": {"app.kubernetes.io/managed-by": constants.MANAGED_BY,
                            constants.LABEL_JOB: job.name}}


def build_network_policy(job: JobSpec) -> dict[str, Any]:
    """NetworkPolicy ``<job>-isolation``: ingress to the job's pods only from the job's pods
    (same namespace, any port); owned by the job.

    Follows the NetworkPolicy API (networking.k8s.io/v1): a pod selected by a policy with
    ``policyTypes: [Ingress]`` accepts only what one of its ``ingress`` rules allows.
    """
    selector = job_pod_selector(job)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(job, names.network_policy(job.name)),
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": selector}]}],
        },
    }
