"""The one layer that talks to the Kubernetes API, one module per concern.

- :mod:`.client`: the one API client (bounded requests, our user agent), the kinds it knows, and
  the pass's view (``with reading_from(view)``: in one pass, one thread, reads of the kinds the
  watches cache come from that :class:`.cache.JobView`, and this thread's creates and deletes
  update it; the rest, and everything outside such a block, goes to the API server).
- :mod:`.errors`: what the layer raises (refused, forbidden, not owned, the job gone).
- :mod:`.reads`: objects, pods, events, logs, the MonarchJob.
- :mod:`.writes`: ``ensure`` reads, creates on 404, treats 409 on create as "exists", and
  refuses to take over an object that another owner controls; labels, the job's status.
- :mod:`.deletes`: deletes treat 404 as done.
- :mod:`.nodes`: node readiness, cordons and heartbeats, memoized.
- :mod:`.cache`: what the watches saw (kopf's indexes), read by a pass through its view.

Everything returns plain dicts. Here: loading the credentials.
"""

from __future__ import annotations

import kubernetes

from monarch_operator.controller.k8s import client, nodes


def load_config() -> None:
    """Load in-cluster credentials, or the kubeconfig (``$KUBECONFIG``) outside a cluster."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    client._shared_client = None
    nodes.forget_nodes()
