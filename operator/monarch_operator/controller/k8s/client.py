"""The one API client of the operator, the kinds it creates, and the view of the pass running
in this thread (:func:`reading_from`), which the reads, writes and deletes consult.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import urllib3

from monarch_operator import __version__, apirequest, constants
from monarch_operator.controller.k8s.cache import JobView

# How the operator's own requests show up in the API server's audit log (kopf's watches say
# "kopf/<version>"). Test of field case C5 counts writes by this agent.
USER_AGENT = f"{constants.MANAGED_BY}/{__version__}"

# (apiVersion, kind) -> the resource's plural (its collection's path) of each kind the operator
# creates.
_KINDS: dict[tuple[str, str], str] = {
    ("v1", "Secret"): "secrets",
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("v1", "Pod"): "pods",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
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


def plural(api_version: str, kind: str) -> str:
    """The resource (plural) of a kind the operator creates, e.g. ``statefulsets``.

    Raises:
        KeyError: not a kind in :data:`_KINDS`.
    """
    return _KINDS[(api_version, kind)]


# HTTP method and Content-Type of each RBAC verb this layer sends.
_METHODS = {"get": "GET", "list": "GET", "create": "POST", "update": "PUT",
            "patch": "PATCH", "delete": "DELETE"}
_MERGE_PATCH = "application/merge-patch+json"


def call(verb: str, api_version: str, resource: str, namespace: str | None = None,
         name: str | None = None, *, subresource: str = "",
         query: tuple[tuple[str, Any], ...] = (), body: Any = None,
         timeout: float | None = None, text: bool = False) -> Any:
    """One request to the API server, JSON in and JSON out, past the typed client's classes
    (importing them cost the operator about 30 MiB and 1 s of CPU at start, and building
    their models from each reply more CPU than the pass that asked; kubernetes-client/python's
    ``ApiClient.call_api`` is what sends it).

    ``verb`` is the RBAC verb (``get``, ``list``, ``create``, ``update``, ``patch``: a JSON
    merge patch, ``delete``), so that the chart's rules can be read from the call sites
    (tests/unit/test_chart_rbac.py); the path is the API's own:
    ``/api/v1`` or ``/apis/<group>/<version>``, then ``namespaces/<namespace>`` when given, the
    ``resource``, the ``name`` and the ``subresource`` (``status``, ``log``).

    Returns:
        The reply as decoded JSON (the object, or the list with its ``items``), or with
        ``text`` the reply's text (a container's log).

    Raises:
        kubernetes.client.rest.ApiException: the API server's answer was not a success (its
            ``status`` the HTTP status).
        urllib3.exceptions.HTTPError: the request could not be sent or timed out (``timeout``
            seconds, else :data:`REQUEST_TIMEOUT`); the pool's connections are dropped then.
    """
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = "/".join(part for part in (
        prefix, f"namespaces/{namespace}" if namespace else "", resource, name or "",
        subresource) if part)
    headers = {"Accept": "*/*" if text else "application/json"}
    if body is not None:
        headers["Content-Type"] = _MERGE_PATCH if verb == "patch" else "application/json"
    data = apirequest.send(_client(), _METHODS[verb], path, query=query, headers=headers,
                           body=body, timeout=timeout)
    if text:
        return data.decode("utf-8", errors="replace")
    return json.loads(data)
