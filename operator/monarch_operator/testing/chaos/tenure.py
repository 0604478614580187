"""Who held the operator's Lease when, from the API server's audit log, and whether each
replica wrote only then: the soak's "one replica acts" check (pure: no I/O, no clock).

The chaos replicas' client certificates carry the group ``AUDIT_LEASES_GROUP``
(``localcluster/cluster.py``), for which the audit policy logs every write to a Lease with
its bodies (``RequestResponse``): each acquisition, renewal and release is in the log, with the
holder it wrote and when the API server received it. A replica's *tenure* runs from its
acquiring write to its renew deadline (its last renewal received plus the renew deadline, as
``controller/leader/elector.py`` counts it), cut short by its release or by the next holder's
acquisition. Every other write of a replica must fall in one of its tenures (the Kubernetes
docs, "Auditing": ``Event`` fields ``requestReceivedTimestamp``, ``stageTimestamp``,
``requestObject``, ``responseObject``, ``responseStatus``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from monarch_operator.testing.chaos.checks import Problem

# Audited writes: the verbs, and how late (seconds) a write sent before its replica ended (or
# before its tenure ended) may be received (the API server's stamps and our clock readings are
# on one machine).
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
LEADER_SLACK_S = 0.5


@dataclass(frozen=True)
class AuditWrite:
    """One write request of an operator replica as the API server's audit log has it:
    ``at`` epoch seconds it was received, ``user`` the client certificate's name, ``what``
    ``verb resource namespace/name``."""

    at: float
    user: str
    what: str


@dataclass(frozen=True)
class LeaseWrite:
    """One successful write of the Lease: ``at`` epoch seconds the API server received it,
    ``done`` when it answered (the ``ResponseComplete`` stage), ``user`` who wrote it,
    ``holder`` the holder it wrote as a user name (None: released)."""

    at: float
    done: float
    user: str
    holder: str | None


@dataclass(frozen=True)
class Tenure:
    """``user`` held the Lease from ``start`` to ``end`` (epoch seconds); ``why`` it ended."""

    user: str
    start: float
    end: float
    why: str


def _stamp(text: Any) -> float:
    return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


def audit_write(event: dict[str, Any]) -> AuditWrite | None:
    """An ``audit.k8s.io/v1`` Event as an :class:`AuditWrite`; None for reads and Leases
    (the elector's own tries, judged by :func:`lease_write`)."""
    ref = event.get("objectRef") or {}
    if event.get("verb") not in WRITE_VERBS or ref.get("resource") == "leases":
        return None
    resource = str(ref.get("resource", "")) + ("/" + ref["subresource"]
                                               if ref.get("subresource") else "")
    return AuditWrite(_stamp(event["requestReceivedTimestamp"]),
                      str((event.get("user") or {}).get("username")),
                      f"{event['verb']} {resource} {ref.get('namespace', '')}/"
                      f"{ref.get('name', '')}")


def lease_write(event: dict[str, Any], namespace: str, name: str,
                user_prefix: str) -> LeaseWrite | None:
    """An audit Event as a :class:`LeaseWrite` when it is a successful (2xx) create or update
    of Lease ``namespace/name`` with its body logged; None otherwise (other objects, refused
    tries: a 409 from a replica that lost the race, reads).

    Args:
        user_prefix: what makes a holder identity a user name (``chaos-op-``).
    """
    ref = event.get("objectRef") or {}
    if (event.get("verb") not in ("create", "update", "patch") or ref.get("resource") != "leases"
            or ref.get("namespace") != namespace):
        return None
    code = int((event.get("responseStatus") or {}).get("code") or 0)
    body = event.get("responseObject") or event.get("requestObject")
    if not 200 <= code < 300 or not isinstance(body, dict):
        return None
    if (ref.get("name") or (body.get("metadata") or {}).get("name")) != name:
        return None
    identity = (body.get("spec") or {}).get("holderIdentity")
    received = _stamp(event["requestReceivedTimestamp"])
    done = _stamp(event.get("stageTimestamp") or event["requestReceivedTimestamp"])
    return LeaseWrite(received, done, str((event.get("user") or {}).get("username")),
                      user_prefix + identity if identity else None)


def tenures(writes: list[LeaseWrite], renew_deadline: float) -> list[Tenure]:
    """The Lease's holders over time from its writes: an acquisition (a write naming a holder
    other than the current one, or naming one when there is none) starts a tenure; a renewal
    (the holder again, answered before its deadline) moves its deadline to the renewal's
    receipt plus ``renew_deadline``; a renewal answered later extends nothing (the elector has
    lost: it exits, it never leads again); a release (no holder) or another holder's
    acquisition ends it, and so does its deadline.

    Returns:
        The tenures in order of their start, the last one ending at its deadline.
    """
    found: list[Tenure] = []
    holder: str | None = None
    start = deadline = 0.0
    for write in sorted(writes, key=lambda w: w.at):
        if holder is not None and write.holder == holder:
            if write.done <= deadline:
                deadline = write.at + renew_deadline
            continue
        if holder is not None:
            why = ("its renew deadline" if deadline <= write.at else
                   "its release" if write.holder is None else f"{write.holder}'s acquisition")
            found.append(Tenure(holder, start, min(deadline, write.at), why))
        holder = write.holder
        start, deadline = write.at, write.at + renew_deadline
    if holder is not None:
        found.append(Tenure(holder, start, deadline, "its renew deadline"))
    return found


def leader_problems(writes: list[AuditWrite], held: list[Tenure],
                    ends: dict[str, tuple[float, str]],
                    slack: float = LEADER_SLACK_S,
                    resumed: dict[str, float] | None = None) -> list[Problem]:
    """One replica acts at a time: each write of a replica is received within one of its
    tenures (``held``, from :func:`tenures`: no earlier than the acquiring write, at most
    ``slack`` seconds after its end), and at most ``slack`` seconds after the replica ended
    (``ends``: user -> (epoch, why): SIGKILL, SIGSTOP of a partitioned leader, its exit).

    ``resumed``: user -> epoch just before a stopped (SIGSTOP) replica was sent SIGCONT. A write
    received between its stop and then was sent before the stop (a stopped process sends
    nothing; the API server read it late, e.g. while paused itself): it is judged as sent at
    the stop. A write received after the SIGCONT is a write after the replica's end.

    Returns:
        One problem per such write (its user, what and when, and why it may not be).
    """
    problems: list[Problem] = []
    for write in sorted(writes, key=lambda w: w.at):
        seen = f"{write.user}: {write.what} at {_clock_ms(write.at)}"
        end = ends.get(write.user)
        sent = write.at
        if end is not None and write.at > end[0] + slack:
            resume = (resumed or {}).get(write.user)
            if resume is None or write.at >= resume:
                problems.append((f"no write by {write.user} after its {end[1]} at "
                                 f"{_clock_ms(end[0])}", seen))
                continue
            sent = end[0]
        mine = [t for t in held if t.user == write.user]
        if any(t.start <= sent <= t.end + slack for t in mine):
            continue
        if not mine:
            problems.append((f"no write by {write.user}, which never held the Lease", seen))
            continue
        other = next((t for t in held if t.start <= sent <= t.end), None)
        after = [t for t in mine if t.end < sent]
        if other is not None:
            problems.append((f"no write by {write.user} while {other.user} held the Lease",
                             seen))
        elif after:
            problems.append((f"no write by {write.user} after its tenure ended "
                             f"({after[-1].why} at {_clock_ms(after[-1].end)})", seen))
        else:
            problems.append((f"no write by {write.user} before it acquired the Lease "
                             f"({_clock_ms(mine[0].start)})", seen))
    return problems


def _clock_ms(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%H:%M:%S.%f")[:-3]
