"""A launcher whose pre-flight failed on workers the operator had just created or recreated
(field case C20): never an Application failure.

Pure: no I/O. After an infrastructure restart or a resume, recreated worker pods have new
addresses, and so have the pods of a job applied again under the name of one just deleted;
until cluster DNS catches up (CoreDNS caches answers, negative ones too, for ``cache 30``)
their names may not resolve or may still resolve to the old address, where
nothing answers or another host's key does. ``monarch-launch`` then fails its pre-flight
naming each host and reason (``launcher/session/preflight.py``); the program never ran, so the
attempt is an infrastructure failure (its own budget), not the program's.
"""

from __future__ import annotations

import re
from typing import Any

from monarch_operator.controller.state import timestamps

# Reasons that a worker recreated moments ago can give while the cluster catches up with it:
# its name does not resolve yet, or resolves to its old address (nothing answers there, or
# another pod's sshd with another key).
RECREATED_WORKER_REASONS = frozenset({"DNSNotResolvable", "DNSStale", "SSHUnreachable",
                                      "HostKeyChanged"})
# Every reason monarch-launch's pre-flight gives (launcher/session/preflight.py and ssh.py; a
# unit test keeps the two equal): a line naming another one is not decided here.
PREFLIGHT_REASONS = frozenset({"DNSNotResolvable", "DNSStale", "LoopbackAddress",
                               "SSHUnreachable", "SSHAuthFailed", "SSHSessionFailed",
                               "PythonNotFound", "ImportFailed", "PortInUse", "HostKeyUnknown",
                               "HostKeyChanged", "VersionSkew"})
# A host whose torchmonarch, torch, monarch-operator or Python differs from the launcher's
# (field case C27): no restart can fix it, the images must match.
VERSION_SKEW = "VersionSkew"

# "pre-flight failed on 1 of 2 hosts after 0.5s: <host> (<address>): <Reason>: <detail>; ..."
_HEAD = re.compile(r"pre-flight failed on (?P<failed>\d+) of \d+ hosts after [\d.]+s: ")
_HOST = re.compile(r"(?:^|; )(?P<host>[A-Za-z0-9][\w.-]*)(?: \([^)]*\))?: "
                   r"(?P<reason>" + "|".join(sorted(PREFLIGHT_REASONS)) + r"): ")


def preflight_failures(message: str) -> dict[str, str] | None:
    """``{host: reason}`` of the launcher's pre-flight failure line, or None when ``message``
    is not one (or names fewer hosts than it says failed: then it is not understood)."""
    head = _HEAD.search(message or "")
    if head is None:
        return None
    listing = message[head.end():]
    found = {match["host"]: match["reason"] for match in _HOST.finditer(listing)}
    return found if found and len(found) == int(head["failed"]) else None


def version_skew_hosts(message: str) -> list[str]:
    """The hosts a pre-flight failure in ``message`` refused for :data:`VERSION_SKEW`, in
    its order; ``[]`` when it is not such a failure."""
    return [host for host, reason in (preflight_failures(message) or {}).items()
            if reason == VERSION_SKEW]


def recreated_workers_unreachable(message: str, job_name: str, record: dict[str, Any],
                                  worker_pods: list[dict[str, Any]]) -> list[str]:
    """The worker pods named by a pre-flight failure in ``message`` when every host it names
    is a worker of ``job_name`` created for this attempt and failed for one of
    :data:`RECREATED_WORKER_REASONS`; else ``[]`` (the exit code decides as usual).

    Created for this attempt: the pod was created at or after the attempt's ``startTime`` in
    ``record``; workers kept from the attempt before are older. That is every worker in
    attempt 1 (whose names may still give an earlier job's pods: a job deleted and applied
    again under its name), and the recreated ones in a later attempt (after an infrastructure
    restart or a resume). A host is a worker by the first label of its name
    (``<job>-worker-<i>.<service>...``, the hostfile's names).
    """
    failures = preflight_failures(message)
    started = timestamps.parse(record.get("startTime"))
    if not failures or started is None:
        return []
    pods = {pod["metadata"]["name"]: pod for pod in worker_pods}
    named = []
    for host, reason in failures.items():
        pod = pods.get(host.split(".", 1)[0])
        created = timestamps.parse(((pod or {}).get("metadata") or {}).get("creationTimestamp"))
        if (reason not in RECREATED_WORKER_REASONS or pod is None or created is None
                or created < started or not pod["metadata"]["name"].startswith(job_name)):
            return []
        named.append(f"{pod['metadata']['name']} ({reason})")
    return named
