"""The one API client of the operator, the kinds it creates, and the view of the pass running
in this thread (:func:`reading_from`), which the reads, writes and deletes consult.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import urllib3

from monarch_operator import __version__, constants
from monarch_operator.controller.k8s.cache import JobView

# How the operator's own requests show up in the API server's audit log (kopf's watches say
# "kopf/<version>"). Test of field case C5 counts writes by this agent.
USER_AGENT = f"{constants.MANAGED_BY}/{__version__}"

# (apiVersion, kind) -> (API class, method suffix) of the typed client, and the resource's
# plural (its collection's path, where creates are POSTed).
_KINDS: dict[tuple[str, str], tuple[type, str, str]] = {
    ("v1", "Secret"): (kubernetes.client.CoreV1Api, "namespaced_secret", "secrets"),
    ("v1", "Service"): (kubernetes.client.CoreV1Api, "namespaced_service", "services"),
    ("v1", "ConfigMap"): (kubernetes.client.CoreV1Api, "namespaced_config_map", "configmaps"),
    ("apps/v1", "StatefulSet"): (kubernetes.client.AppsV1Api, "namespaced_stateful_set",
                                 "statefulsets"),
    ("v1", "Pod"): (kubernetes.client.CoreV1Api, "namespaced_pod", "pods"),
    ("networking.k8s.io/v1", "NetworkPolicy"): (kubernetes.client.NetworkingV1Api,
                                               "namespaced_network_policy", "networkpolicies"),
    ("v1", "ServiceAccount"): (kubernetes.client.CoreV1Api, "namespaced_service_account",
                               "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "Role"): (kubernetes.client.RbacAuthorizationV1Api,
                                               "namespaced_role", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (kubernetes.client.RbacAuthorizationV1Api,
                                                      "namespaced_role_binding", "rolebindings"),
}


_shared_client: kubernetes.client.ApiClient | None = None


def _client() -> kubernetes.client.ApiClient:
    """One API client for every call: its connection pool is reused (urllib3 is thread-safe),
    and its requests carry :data:`USER_AGENT`."""
    global _shared_client
    if _shared_client is None:
        client = kubernetes.client.ApiClient()
        client.user_agent = USER_AGENT
        _bound_requests(client)
        _shared_client = client
    return _shared_client


# Every request of a pass is bounded (connect, read; seconds): the client sets no timeout, and a
# pooled connection that a middlebox or a paused API server stopped answering would hold the
# pass, and every later pass of its job, for ever (field case C18).
REQUEST_TIMEOUT = (5.0, 15.0)


def _bound_requests(client: kubernetes.client.ApiClient) -> None:
    """Give ``client``'s requests :data:`REQUEST_TIMEOUT` unless a call sets its own; after a
    request timed out, drop every pooled connection (opened before the same outage, they are
    likely dead too), so that the next requests open new ones."""
    request = client.rest_client.request

    def bounded(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        try:
            return request(*args, _request_timeout=_request_timeout or REQUEST_TIMEOUT,
                           **kwargs)
        except (urllib3.exceptions.TimeoutError, urllib3.exceptions.MaxRetryError):
            client.rest_client.pool_manager.clear()
            raise

    client.rest_client.request = bounded


class _PassLocal(threading.local):
    """Per thread: the view of the pass running in it, if any."""

    view: JobView | None = None


_local = _PassLocal()


@contextlib.contextmanager
def reading_from(view: JobView) -> Iterator[JobView]:
    """Within the block (in this thread), cached kinds are read from ``view``."""
    previous = _local.view
    _local.view = view
    try:
        yield view
    finally:
        _local.view = previous


def _view(api_version: str, kind: str) -> JobView | None:
    """The view of this thread's pass, if it caches ``kind``."""
    view = _local.view
    return view if view is not None and view.covers((api_version, kind)) else None


def _api(api_version: str, kind: str) -> tuple[Any, str]:
    api_class, suffix, _ = _KINDS[(api_version, kind)]
    return api_class(_client()), suffix


def _to_dict(obj: Any) -> dict[str, Any]:
    result: dict[str, Any] = _client().sanitize_for_serialization(obj)
    return result
