"""Pure readings of a kube-apiserver audit log (JSON lines) and small statistics for benchmarks.

The local cluster's API server writes ``<state>/logs/audit.log`` (``LocalCluster.audit_log``):
every write, and every request of the users named in ``LocalCluster(audit_users=...)``, at level
``Metadata`` with stage ``RequestReceived`` omitted, so a short request leaves one
``ResponseComplete`` event and a watch one ``ResponseStarted`` event when it opens (and one
``ResponseComplete`` when it ends). Each
request counts once: a watch when it opens, anything else when it completes. Event fields follow
the ``audit.k8s.io/v1`` ``Event`` type (Kubernetes docs, "Auditing").
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Verbs that change objects; everything else (get, list, watch) only reads.
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class Request:
    """One API request from the audit log.

    Attributes:
        time: when the API server received it (UTC, microseconds).
        user: the authenticated user name (a client certificate's CN).
        verb: ``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``, ...
        resource: the resource, with ``/subresource`` when there is one (``pods/status``);
            for a non-resource URL, the path (``/healthz``).
        namespace: empty for cluster-scoped resources.
        name: empty for lists and for creates where the server has not named the object.
        code: the HTTP status code of the response (0 when none was recorded).
        user_agent: the client's ``User-Agent`` (the operator's is ``monarch-operator/<v>``,
            kopf's ``kopf/<v>``), "" when none was recorded.
    """

    time: dt.datetime
    user: str
    verb: str
    resource: str
    namespace: str
    name: str
    code: int
    user_agent: str = ""

    @property
    def is_write(self) -> bool:
        """Whether the verb changes objects (``WRITE_VERBS``)."""
        return self.verb in WRITE_VERBS


def parse_line(line: str) -> Request | None:
    """The request an audit event line stands for, or ``None`` when the line does not count
    (blank, another stage of a request already counted, or not an audit event).

    Raises:
        ValueError: the line is not JSON, or its timestamp is not RFC 3339.
    """
    line = line.strip()
    if not line:
        return None
    event = json.loads(line)
    if event.get("kind") != "Event":
        return None
    stage, verb = event.get("stage"), event.get("verb", "")
    counts = stage == "ResponseStarted" or (stage == "ResponseComplete" and verb != "watch")
    if not counts:
        return None
    ref = event.get("objectRef") or {}
    resource = ref.get("resource", "")
    if resource and ref.get("subresource"):
        resource = f"{resource}/{ref['subresource']}"
    if not resource:
        resource = event.get("requestURI", "").split("?")[0]
    return Request(
        time=parse_time(event["requestReceivedTimestamp"]),
        user=(event.get("user") or {}).get("username", ""),
        verb=verb,
        resource=resource,
        namespace=ref.get("namespace", ""),
        name=ref.get("name", ""),
        code=int((event.get("responseStatus") or {}).get("code", 0)),
        user_agent=str(event.get("userAgent", "")),
    )


def parse_time(text: str) -> dt.datetime:
    """An RFC 3339 timestamp as the API server writes it (``2026-11-30T09:03:55.123456Z``).

    Raises:
        ValueError: not such a timestamp.
    """
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def read_log(path: Path, offset: int = 0) -> tuple[list[Request], int]:
    """The requests in ``path`` from byte ``offset`` on, up to the last complete line.

    Returns:
        The requests and the offset to continue from (a partly written last line is left for
        the next call). A missing file reads as no requests; a file shorter than ``offset``
        (rotated by the API server) is read from its start.
    """
    try:
        with open(path, "rb") as log:
            if log.seek(0, 2) < offset:
                offset = 0
            log.seek(offset)
            data = log.read()
    except FileNotFoundError:
        return [], offset
    complete = data.rfind(b"\n") + 1
    requests = [request for line in data[:complete].decode().splitlines()
                if (request := parse_line(line)) is not None]
    return requests, offset + complete


def count_by_verb_resource(requests: Iterable[Request], user: str, start: dt.datetime,
                           end: dt.datetime) -> Counter[tuple[str, str]]:
    """How many requests ``user`` sent in ``[start, end)``, keyed by ``(verb, resource)``."""
    return Counter((r.verb, r.resource) for r in requests
                   if r.user == user and start <= r.time < end)


def split_writes(counts: Counter[tuple[str, str]]) -> tuple[int, int]:
    """``(writes, reads)``: the totals of ``counts`` for write verbs and for the others."""
    writes = sum(n for (verb, _), n in counts.items() if verb in WRITE_VERBS)
    return writes, sum(counts.values()) - writes


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks (as
    numpy's default, "linear"); ``nan`` for no values.

    Raises:
        ValueError: ``q`` outside 0-100.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0-100, got {q}")
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q / 100
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)
