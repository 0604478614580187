"""Every child object name of a MonarchJob, and the limit on job names derived from them.

Children of job ``<job>``:
- ``<job>-ssh``: Secret with the per-job SSH key pair.
- ``<job>-worker``: headless Service and StatefulSet; pods ``<job>-worker-<ordinal>``.
- ``<job>-<group>`` for each of ``spec.workerGroups`` instead (docs/roles.md): headless Service
  and StatefulSet; pods ``<job>-<group>-<ordinal>``. The single group of a job without
  ``spec.workerGroups`` is :data:`LEGACY_GROUP`, so ``<job>-worker`` is that case of the rule.
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


# Group names: what Monarch's mesh names allow (lowercase letters and digits, starting with a
# letter), so no '-' can make ``<job>-<group>`` ambiguous with another child's name.
GROUP_NAME_PATTERN = r"^[a-z][a-z0-9]*$"
# The name of the one worker group of a job given by ``spec.workers`` alone.
LEGACY_GROUP = WORKER_SUFFIX.removeprefix("-")
# A group may not take the suffix of another child of its job: a group "launcher" would name
# its pod 2 as the launcher of attempt 2.
RESERVED_GROUP_NAMES = tuple(suffix.removeprefix("-") for suffix in (
    SSH_SUFFIX, HOSTFILE_SUFFIX, LAUNCHER_SUFFIX, NETWORK_POLICY_SUFFIX, PROGRESS_SUFFIX))
# ``<job>-<group>`` is a StatefulSet name inside the revision hash label (see above).
MAX_GROUP_SET_LENGTH = DNS_LABEL_MAX - REVISION_HASH_SUFFIX


_GROUP_NAME_RE = re.compile(GROUP_NAME_PATTERN)


def valid_group_name(group: str) -> bool:
    """Whether ``group`` may name a worker group: :data:`GROUP_NAME_PATTERN`, at most 63
    characters, none of :data:`RESERVED_GROUP_NAMES`."""
    return (len(group) <= DNS_LABEL_MAX and bool(_GROUP_NAME_RE.match(group))
            and group not in RESERVED_GROUP_NAMES)


def valid_role_name(role: str) -> bool:
    """Whether ``role`` may name a role: a Monarch mesh name (``KubernetesJob.add_mesh``),
    1-63 lowercase letters and digits starting with a letter."""
    return len(role) <= DNS_LABEL_MAX and bool(_GROUP_NAME_RE.match(role))


def group_set_name_problem(job_name: str, group: str) -> str | None:
    """Why group ``group`` of job ``job_name`` cannot have StatefulSet ``<job>-<group>``, or
    None: the name would be longer than :data:`MAX_GROUP_SET_LENGTH` (52) characters."""
    length = len(group_set(job_name, group))
    if length <= MAX_GROUP_SET_LENGTH:
        return None
    return (f"worker group {group!r}: StatefulSet {group_set(job_name, group)!r} has {length} "
            f"characters; metadata.name plus '-' plus the group name must be at most "
            f"{MAX_GROUP_SET_LENGTH} (the StatefulSet revision hash label must stay within 63)")


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


def group_set(job_name: str, group: str) -> str:
    """Name of worker group ``group``'s StatefulSet and of its headless Service (they share
    it): ``<job>-<group>``; ``<job>-worker`` for :data:`LEGACY_GROUP`."""
    return f"{job_name}-{group}"


def group_pod(job_name: str, group: str, ordinal: int) -> str:
    """Name of pod ``ordinal`` (0-based) of worker group ``group``."""
    return f"{group_set(job_name, group)}-{ordinal}"


def group_fqdn(job_name: str, group: str, namespace: str, ordinal: int,
               cluster_domain: str) -> str:
    """Fully qualified DNS name of pod ``ordinal`` of worker group ``group`` through its
    headless Service: ``<pod>.<service>.<namespace>.svc.<cluster_domain>``."""
    service = group_set(job_name, group)
    return f"{group_pod(job_name, group, ordinal)}.{service}.{namespace}.svc.{cluster_domain}"


def worker_set(job_name: str) -> str:
    """Name of the worker StatefulSet and of its headless Service (they share it)."""
    return group_set(job_name, LEGACY_GROUP)


def worker_service(job_name: str) -> str:
    """Name of the headless Service that gives worker pods their DNS names."""
    return worker_set(job_name)


def worker_pod(job_name: str, ordinal: int) -> str:
    """Name of worker pod ``ordinal`` (0-based) of the StatefulSet."""
    return group_pod(job_name, LEGACY_GROUP, ordinal)


def worker_fqdn(job_name: str, namespace: str, ordinal: int, cluster_domain: str) -> str:
    """Fully qualified DNS name of a worker pod through the headless Service.

    ``<pod>.<service>.<namespace>.svc.<cluster_domain>``, e.g.
    ``demo-worker-0.demo-worker.team-a.svc.cluster.local``.
    """
    return group_fqdn(job_name, LEGACY_GROUP, namespace, ordinal, cluster_domain)


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
