"""Every child object name of a MonarchJob, and the limit on job names derived from them.

Children of job ``<job>``:
- ``<job>-ssh``: Secret with the per-job SSH key pair.
- ``<job>-worker``: headless Service and StatefulSet; pods ``<job>-worker-<ordinal>``.
- ``<job>-hostfile``: ConfigMap with the hostfile.
- ``<job>-launcher``: batch Job running ``monarch-launch`` (attempt 1), ``<job>-launcher-<n>``
  for attempt ``n`` after restarts.
- ``<job>-isolation``: NetworkPolicy admitting only the job's own pods.
- ``<job>-progress``: ConfigMap the launcher writes the program's progress reports to, and the
  Role (that ConfigMap only) and RoleBinding that let the launcher's ServiceAccount
  ``<job>-launcher`` write it.

Limits (kubernetes/kubernetes#64023, lws #410): the StatefulSet controller labels each pod with
``controller-revision-hash=<statefulset name>-<10 character hash>``, and a label value holds at
most 63 characters, so the StatefulSet name may be at most 52 characters. Service names must be
DNS-1035 labels (start with a letter, no dots). The job-name rule below follows from both and is
the one enforced by the CRD's CEL rule (a test keeps the two equal).
"""

from __future__ import annotations

import hashlib
import re

# Longest label value / DNS label.
DNS_LABEL_MAX = 63
# "-" + 10-character hash that the StatefulSet controller appends in controller-revision-hash.
REVISION_HASH_SUFFIX = 11

WORKER_SUFFIX = "-worker"
SSH_SUFFIX = "-ssh"
HOSTFILE_SUFFIX = "-hostfile"
LAUNCHER_SUFFIX = "-launcher"
NETWORK_POLICY_SUFFIX = "-isolation"
PROGRESS_SUFFIX = "-progress"

# The longest child name that has to fit a limit is the StatefulSet name inside the revision
# hash label: len(job) + len("-worker") + 11 <= 63.
MAX_JOB_NAME_LENGTH = DNS_LABEL_MAX - REVISION_HASH_SUFFIX - len(WORKER_SUFFIX)
# DNS-1035 label: what a Service name (and so every child) accepts.
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_JOB_NAME_RE = re.compile(JOB_NAME_PATTERN)


def validate_job_name(job_name: str) -> None:
    """Check that every child of a job called ``job_name`` gets a valid name.

    Raises:
        ValueError: the name is longer than :data:`MAX_JOB_NAME_LENGTH` or is not a DNS-1035
            label (lowercase letters, digits and '-', starting with a letter). The CRD refuses
            such names at admission; this is the same rule for callers without a cluster.
    """
    if len(job_name) > MAX_JOB_NAME_LENGTH:
        raise ValueError(
            f"metadata.name {job_name!r} has {len(job_name)} characters; at most "
            f"{MAX_JOB_NAME_LENGTH} fit every child name (<name>{WORKER_SUFFIX} plus the "
            "StatefulSet revision hash must stay within 63)"
        )
    if not _JOB_NAME_RE.match(job_name):
        raise ValueError(
            f"metadata.name {job_name!r} must be a DNS-1035 label: lowercase letters, digits "
            "and '-', starting with a letter and ending with a letter or digit"
        )


def network_policy(job_name: str) -> str:
    """Name of the job's NetworkPolicy (isolates its pods for ingress)."""
    return job_name + NETWORK_POLICY_SUFFIX


def progress_configmap(job_name: str) -> str:
    """ConfigMap of the program's progress reports; also the name of the Role and RoleBinding
    that let the launcher write it (and nothing else)."""
    return job_name + PROGRESS_SUFFIX


def launcher_account(job_name: str) -> str:
    """The launcher pods' ServiceAccount (when ``spec.launcher.template`` names none)."""
    return job_name + LAUNCHER_SUFFIX


def ssh_secret(job_name: str) -> str:
    """Name of the Secret holding the job's SSH key pair."""
    return job_name + SSH_SUFFIX


def worker_set(job_name: str) -> str:
    """Name of the worker StatefulSet and of its headless Service (they share it)."""
    return job_name + WORKER_SUFFIX


def worker_service(job_name: str) -> str:
    """Name of the headless Service that gives worker pods their DNS names."""
    return worker_set(job_name)


def worker_pod(job_name: str, ordinal: int) -> str:
    """Name of worker pod ``ordinal`` (0-based) of the StatefulSet."""
    return f"{worker_set(job_name)}-{ordinal}"


def worker_fqdn(job_name: str, namespace: str, ordinal: int, cluster_domain: str) -> str:
    """Fully qualified DNS name of a worker pod through the headless Service.

    ``<pod>.<service>.<namespace>.svc.<cluster_domain>``, e.g.
    ``demo-worker-0.demo-worker.team-a.svc.cluster.local``.
    """
    return f"{worker_pod(job_name, ordinal)}.{worker_service(job_name)}.{namespace}.svc.{cluster_domain}"


def hostfile_configmap(job_name: str) -> str:
    """Name of the ConfigMap holding the hostfile."""
    return job_name + HOSTFILE_SUFFIX


def launcher_pod(job_name: str, attempt: int = 1) -> str:
    """Name of the pod that runs the launcher of ``attempt`` (1-based).

    ``<job>-launcher`` for the first attempt, ``<job>-launcher-<attempt>`` for later ones: a new
    pod per attempt, so a restart never waits for the old pod's deletion to finish. With the
    45-character job name limit, ``-launcher-`` and up to 5 digits still fit 63 characters (the
    pod's hostname is its name).
    """
    base = job_name + LAUNCHER_SUFFIX
    return base if attempt <= 1 else f"{base}-{attempt}"


def workload(job_name: str, job_uid: str) -> str:
    """The job's Kueue Workload (``kueue.x-k8s.io``): ``<job>-<5 hex of sha256(uid)>``; a job
    deleted and created again under its name gets a new one (Kueue keys workloads by owner
    uid, ``kueue.x-k8s.io/job-uid``). At most 51 characters."""
    return f"{job_name}-{hashlib.sha256(job_uid.encode()).hexdigest()[:5]}"
