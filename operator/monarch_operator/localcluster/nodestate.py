"""Node loss on the local cluster: one node label takes a node's "kubelet" away.

kwok manages only nodes without ``LABEL_NODE_DOWN`` (``--manage-nodes-with-label-selector``,
``KWOK_NODE_SELECTOR``). Labelling a node makes kwok drop it: it stops renewing the node's
Lease and stops playing Stages for the node and its pods, so nothing heartbeats for the node,
no pod status reaches its pods and nothing deletes its Terminating pods. The node agent stops
serving the node too. The controller-manager's node-lifecycle controller then does what it does
for a node whose kubelet went silent: after ``--node-monitor-grace-period`` the node's ``Ready``
condition becomes ``Unknown`` (reason ``NodeStatusUnknown``), the node is tainted
``node.kubernetes.io/unreachable`` (NoSchedule and NoExecute) and its pods' ``Ready`` condition
turns ``False``. Removing the label brings the node back: kwok holds the Lease again and marks
the node Ready, the agent reports and acts on its pods again.

The label's value says what happened to the node's containers:
- ``crash``: the node is gone with its processes (power loss): the agent SIGKILLs them at once;
  when the node comes back, each container that was running counts as ended with exit code 137
  (``ContainerStatusUnknown``) and the pod's ``restartPolicy`` applies.
- ``partition``: the node is cut off from the API server: its processes keep running (and
  restarting) but nothing is reported, and deletions reach the node only when it comes back.
"""

from __future__ import annotations

from typing import Any

# On a node: the node is down ("crash" or "partition"); absent when the node is up.
LABEL_NODE_DOWN = "localcluster.monarch-operator.dev/node-down"
CRASH = "crash"
PARTITION = "partition"
MODES = (CRASH, PARTITION)
# kwok's --manage-nodes-with-label-selector: every node that is not down. kwok also skips nodes
# without any label (its client-side filter), so nodes of the local cluster carry labels.
KWOK_NODE_SELECTOR = f"!{LABEL_NODE_DOWN}"


def down_mode(node: dict[str, Any]) -> str | None:
    """``"crash"`` or ``"partition"`` for a node that is down, ``None`` for one that is up."""
    return ((node.get("metadata") or {}).get("labels") or {}).get(LABEL_NODE_DOWN)


def condition(node: dict[str, Any], kind: str = "Ready") -> dict[str, Any]:
    """The node's condition of type ``kind`` (``{}`` if it has none)."""
    return next((c for c in (node.get("status") or {}).get("conditions") or []
                 if c.get("type") == kind), {})
