"""The job's NetworkPolicy: only the job's own pods reach its workers and its launcher.

Monarch's worker loop runs code for any client that connects to it, and the workers' sshd, the
Monarch procs, the collectives (gloo, NCCL) and the launcher's Monarch client all listen on the
pod network. The policy makes the job's pods (workers and launcher) isolated for ingress and
admits traffic only from pods of the same job; egress is left alone. It does not name ports:
besides sshd (2222) and the Monarch worker (22222), procs, collectives and the launcher's client
(``tcp://<pod IP>:0``) use ports chosen at run time, all of them between the job's own pods.
Kubernetes always admits traffic from the pod's own node (kubelet probes). Enforced only by a
network plugin that implements NetworkPolicy.

Attach mode (docs/attach.md) needs the same between the job's pods: Monarch's ``KubernetesJob``
client in the launcher dials the workers' port 26600 and the ports their procs pick, and the
workers dial the client back on the port it picked. A client in another pod of the namespace
needs one more peer: pods labelled ``monarch-operator.dev/attach-to: <job>``. The workers dial
such a client back through its own pod's ingress, which this policy does not select. A client
outside the cluster comes through ``kubectl port-forward``, which reaches the worker from
inside its own pod and is not subject to NetworkPolicy.
"""

from __future__ import annotations

from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.common import child_metadata
from monarch_operator.controller.spec.spec import JobSpec


def job_pod_selector(job: JobSpec) -> dict[str, Any]:
    """Label selector of exactly the job's pods (workers and launcher): its job label, and the
    managed-by label that only the operator's own pods carry with it."""
    return {"matchLabels": {"app.kubernetes.io/managed-by": constants.MANAGED_BY,
                            constants.LABEL_JOB: job.name}}


def build_network_policy(job: JobSpec) -> dict[str, Any]:
    """NetworkPolicy ``<job>-isolation``: ingress to the job's pods only from the job's pods
    (same namespace, any port), and in attach mode from the pods labelled to attach to it;
    owned by the job.

    Follows the NetworkPolicy API (networking.k8s.io/v1): a pod selected by a policy with
    ``policyTypes: [Ingress]`` accepts only what one of its ``ingress`` rules allows.
    """
    selector = job_pod_selector(job)
    peers: list[dict[str, Any]] = [{"podSelector": selector}]
    if job.attach:
        peers.append({"podSelector": {"matchLabels": {constants.LABEL_ATTACH_TO: job.name}}})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(job, names.network_policy(job.name)),
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers}],
        },
    }
