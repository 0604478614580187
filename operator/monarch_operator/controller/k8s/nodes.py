"""Nodes, as the verdicts and the gate need them: whether one is Ready (memoized briefly), since
when it is not, whether it is cordoned, and when each kubelet last renewed its Lease. A
namespaced operator may not read nodes: after the first 403 they are never asked for again.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

from kubernetes.client.rest import ApiException

from monarch_operator.controller.k8s import client
from monarch_operator.controller.state import timestamps

# A node found Ready is taken as Ready for this long by every pass (a node turns NotReady only
# after the node controller's grace period, 40 s by default), so that many jobs' workers on a
# few nodes cost a few reads, not one per worker per pass. NotReady is never reused: a node
# that came back must not cost a new pod on it its attempt (the pod would be judged lost).
NODE_READY_MEMO_SECONDS = 5.0
_node_memo: dict[str, float] = {}  # node -> when it was last found Ready (monotonic)
_node_memo_lock = threading.Lock()
_nodes_forbidden = False  # a 403 once: this operator may not read nodes (namespaced mode)


def node_is_ready(name: str) -> bool:
    """Whether node ``name`` exists and has condition ``Ready=True`` (a 404 is False): see
    :func:`node_not_ready_since`, whose answer is None exactly then.

    Raises:
        ApiException: any error but 403 and 404.
    """
    return node_not_ready_since(name) is None


# What node_not_ready_since answers for a node that is gone or never reported Ready: lost long
# ago.
NEVER_READY = dt.datetime.min.replace(tzinfo=dt.UTC)


def node_not_ready_since(name: str) -> dt.datetime | None:
    """When node ``name`` stopped being Ready: its ``Ready`` condition's ``lastTransitionTime``
    (aware UTC) while that condition is not ``True``; :data:`NEVER_READY` when the node is gone
    (404) or has no such condition; None while it is Ready.

    None too when the operator may not read nodes (the chart's namespaced mode has no
    ClusterRole): then only the pod's own state can tell, and after the first 403 nodes are
    never asked for again. A Ready answer is reused for :data:`NODE_READY_MEMO_SECONDS`.

    Raises:
        ApiException: any other API error.
    """
    now = time.monotonic()
    with _node_memo_lock:
        if _nodes_forbidden:
            return None
        memo = _node_memo.get(name)
    if memo is not None and now - memo < NODE_READY_MEMO_SECONDS:
        return None
    allowed, node = _read_node(name)
    if not allowed:
        return None
    since: dt.datetime | None = NEVER_READY  # also a node that is gone
    ready = None if node is None else _ready_condition(node)
    if ready is not None:
        since = None if ready.get("status") == "True" else _moment(ready) or NEVER_READY
    with _node_memo_lock:
        if since is None:
            _node_memo[name] = now
        else:
            _node_memo.pop(name, None)
        for stale in [node for node, at in _node_memo.items()
                      if now - at >= NODE_READY_MEMO_SECONDS]:
            del _node_memo[stale]
    return since


def node_readiness() -> dict[str, tuple[bool, dt.datetime | None]] | None:
    """Every node's readiness: by node name, whether its ``Ready`` condition is ``True`` and
    that condition's ``lastTransitionTime`` (aware UTC; None when not given). A node without a
    ``Ready`` condition is not Ready. One list request, whatever the number of nodes; nothing
    is memoized (a failed launcher's verdict asks, once per pass while it is pending).

    Returns None when the operator may not read nodes (the chart's namespaced mode); after the
    first 403 nodes are never asked for again.

    Raises:
        ApiException: any other API error.
    """
    with _node_memo_lock:
        if _nodes_forbidden:
            return None
    try:
        nodes = client.call("list", "v1", "nodes")["items"]
    except ApiException as error:
        if error.status != 403:
            raise
        _forbid_nodes()
        return None
    readiness: dict[str, tuple[bool, dt.datetime | None]] = {}
    for node in nodes:
        ready = _ready_condition(node)
        readiness[node["metadata"]["name"]] = (
            (False, None) if ready is None
            else (ready.get("status") == "True", _moment(ready)))
    return readiness


def node_cordoned(name: str) -> bool | None:
    """Whether node ``name`` is cordoned (``spec.unschedulable``: ``kubectl drain`` does it
    first), so that a pod evicted from it was drained; None when it cannot be told (the node
    is gone, or the operator may not read nodes: the chart's namespaced mode).

    Raises:
        ApiException: any error but 403 and 404.
    """
    _, node = _read_node(name)
    return None if node is None else bool((node.get("spec") or {}).get("unschedulable"))


def _read_node(name: str) -> tuple[bool, dict[str, Any] | None]:
    """``(allowed, the Node as read or None)``: ``(False, None)`` when the operator may not
    read nodes (after the first 403 it never asks again), ``(True, None)`` when the node is gone.

    Raises:
        ApiException: any error but 403 and 404.
    """
    with _node_memo_lock:
        if _nodes_forbidden:
            return False, None
    try:
        return True, client.call("get", "v1", "nodes", name=name)
    except ApiException as error:
        if error.status == 403:
            _forbid_nodes()
            return False, None
        if error.status != 404:
            raise
        return True, None


def _ready_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    """The ``Ready`` condition of a Node as read, or None when it has none."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return next((condition for condition in conditions if condition.get("type") == "Ready"),
                None)


def _moment(condition: dict[str, Any], field: str = "lastTransitionTime") -> dt.datetime | None:
    """``condition[field]`` (an RFC 3339 time as the API writes it) as an aware UTC datetime;
    None when it is not given."""
    text = condition.get(field)
    return None if not text else timestamps.parse(text)


def _forbid_nodes() -> None:
    global _nodes_forbidden
    with _node_memo_lock:
        _nodes_forbidden = True


# Where each kubelet renews its node's Lease (the node heartbeat).
NODE_LEASE_NAMESPACE = "kube-node-lease"
_leases_forbidden = False  # a 403 once: this operator may not read node Leases


def node_heartbeats() -> dict[str, dt.datetime] | None:
    """When each node's kubelet last renewed its Lease in ``kube-node-lease`` (the node
    heartbeat: every ``nodeLeaseDurationSeconds`` / 4, 10 s by default; see
    https://kubernetes.io/docs/concepts/architecture/leases/#node-heartbeats), by node name,
    as aware UTC datetimes. One list request, whatever the number of nodes.

    Returns None when the operator may not read them (the chart's namespaced mode); after the
    first 403 they are never asked for again.

    Raises:
        ApiException: any other API error.
    """
    global _leases_forbidden
    with _node_memo_lock:
        if _leases_forbidden:
            return None
    try:
        leases = client.call("list", "coordination.k8s.io/v1", "leases", NODE_LEASE_NAMESPACE)
    except ApiException as error:
        if error.status != 403:
            raise
        with _node_memo_lock:
            _leases_forbidden = True
        return None
    beats = {}
    for lease in leases["items"]:
        renewed = _moment(lease.get("spec") or {}, "renewTime")
        if renewed is not None:
            beats[lease["metadata"]["name"]] = renewed
    return beats


def forget_nodes() -> None:
    """Drop what :func:`node_is_ready` and :func:`node_heartbeats` remember (for tests, and
    after credentials change)."""
    global _nodes_forbidden, _leases_forbidden
    with _node_memo_lock:
        _node_memo.clear()
        _nodes_forbidden = False
        _leases_forbidden = False
