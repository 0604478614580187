"""Node Leases that kwok stopped renewing: the node agent renews them, as kwok's holder.

kwok renews each simulated node's Lease (``kube-node-lease/<node>``) every
``NODE_LEASE_SECONDS / 4`` (2.5 s); the node-lifecycle controller and the operator's
"launcher ended, did its node heartbeat?" check read it. kwok v0.8.0 can stop: in a CI run of
2026-12-07 (stop 64) a test flipped kwok-gpu-2's node-down label five times in 26 s, and from
then on kwok never renewed the Leases of kwok-gpu-0 and kwok-gpu-1 again, and tried kwok-gpu-2's
with a stale copy (284 conflicts in 12 minutes). The two nodes then lived on kwok's node status
patches alone (about every 21 s against a 20 s grace period), flapped NotReady, and a later
test's attempt was judged Infrastructure ("node kwok-gpu-1 NotReady").

So the agent checks, every ``CHECK_EVERY_S``, the Lease of each node that is up (no
``nodestate.LABEL_NODE_DOWN``): one last renewed more than ``STALE_AFTER_S`` ago is renewed by
the agent, keeping kwok's holder identity (kwok manages only nodes whose Lease it holds), with
the Lease's resourceVersion (a write that meets kwok's own is refused with 409, and the next
check looks again). Nodes that are down are never renewed: their silence is what the node loss
tests simulate. A healthy kwok renews well within ``STALE_AFTER_S``, so the agent writes nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes.client.rest import ApiException

log = logging.getLogger("localcluster.leasekeeper")

NODE_LEASE_NAMESPACE = "kube-node-lease"
# Half of kwok's Lease duration (cluster.NODE_LEASE_SECONDS = 10 s; kwok renews every 2.5 s):
# two renewals missed. Well under the controller-manager's 20 s grace period.
STALE_AFTER_S = 5.0
CHECK_EVERY_S = 2.5
# Each read and write (a paused API server must not hold up the agent's sync).
REQUEST_TIMEOUT_S = 2.0


def stale_for(renew_time: dt.datetime | None, now: float) -> float | None:
    """Seconds since ``renew_time`` (a Lease's ``spec.renewTime``) at epoch ``now``; None when
    the Lease was never renewed (not ours to start)."""
    if renew_time is None:
        return None
    return now - renew_time.timestamp()


class LeaseKeeper:
    """Renews the stale Leases of nodes that are up (see the module doc).

    Args:
        leases: a ``kubernetes.client.CoordinationV1Api`` (``read_namespaced_lease``,
            ``replace_namespaced_lease``).
        clock: epoch seconds (tests pass their own).
    """

    def __init__(self, leases: Any, clock: Callable[[], float] = time.time) -> None:
        self.leases = leases
        self.clock = clock
        self._checked_at = float("-inf")
        self._kept: set[str] = set()  # nodes whose Lease the agent renews now (logged once)

    def keep(self, up_nodes: Iterable[str]) -> list[str]:
        """Renew the Lease of each of ``up_nodes`` last renewed more than ``STALE_AFTER_S``
        ago; at most once every ``CHECK_EVERY_S`` seconds. Returns the nodes renewed. API
        errors are logged and skipped (the next check tries again)."""
        now = self.clock()
        if now - self._checked_at < CHECK_EVERY_S:
            return []
        self._checked_at = now
        renewed = []
        for name in up_nodes:
            try:
                if self._keep_one(name, now):
                    renewed.append(name)
            except ApiException as error:
                if error.status not in (404, 409):
                    log.warning("node %s: Lease not renewed: %s %s", name, error.status,
                                error.reason)
            except OSError as error:  # urllib3's timeouts and refused connections
                log.warning("node %s: Lease not renewed: %s", name, error)
        return renewed

    def _keep_one(self, name: str, now: float) -> bool:
        lease = self.leases.read_namespaced_lease(name, NODE_LEASE_NAMESPACE,
                                                  _request_timeout=REQUEST_TIMEOUT_S)
        age = stale_for(lease.spec.renew_time, now)
        if age is None or not lease.spec.holder_identity or age <= STALE_AFTER_S:
            if name in self._kept and age is not None and age <= STALE_AFTER_S:
                self._kept.discard(name)
                log.info("node %s: its Lease is renewed again by %s", name,
                         lease.spec.holder_identity)
            return False
        if name not in self._kept:
            self._kept.add(name)
            log.warning("node %s: Lease last renewed %.1fs ago by %s (kwok stopped renewing "
                        "it); the agent renews it while the node is up", name, age,
                        lease.spec.holder_identity)
        lease.spec.renew_time = dt.datetime.fromtimestamp(now, dt.UTC)
        self.leases.replace_namespaced_lease(name, NODE_LEASE_NAMESPACE, lease,
                                             _request_timeout=REQUEST_TIMEOUT_S)
        return True
