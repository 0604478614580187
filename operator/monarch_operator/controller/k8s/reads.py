"""Reads: an object, the pods of a selector, an object's Events, a container's log tail, the
MonarchJob. From the pass's view when it caches the kind (:func:`.client.reading_from`), else
from the API server; a missing object is ``None``.
"""

from __future__ import annotations

from typing import Any

import urllib3
from kubernetes.client.rest import ApiException

from monarch_operator import constants
from monarch_operator.controller.k8s import cache, client


def read(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object as a dict, or ``None`` if it does not exist (from the pass's view when it
    caches ``kind``, see :func:`reading_from`)."""
    view = client._view(api_version, kind)
    if view is not None and view.key[0] == namespace:
        return view.get((api_version, kind), name)
    return _read_api(api_version, kind, namespace, name)


def _read_api(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.call("get", api_version,
                                            client.plural(api_version, kind), namespace, name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


def controller_uid(obj: dict[str, Any]) -> str | None:
    """uid of the object's controller owner reference, if any."""
    return cache.controller_uid(obj)


def list_pods(namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """Pods in ``namespace`` carrying every label of ``labels`` (from the pass's view when
    it caches pods)."""
    view = client._view("v1", "Pod")
    if view is not None and view.key[0] == namespace:
        return view.select(("v1", "Pod"), labels)
    selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
    pods: list[dict[str, Any]] = client.call("list", "v1", "pods", namespace,
                                             query=(("labelSelector", selector),))["items"]
    return pods


def pod_log_tail(namespace: str, pod: str, container: str, lines: int) -> str | None:
    """The last ``lines`` lines of a container's log (``kubectl logs --tail``), or None when the
    kubelet cannot serve it (no kubelet API, the pod gone); waits at most 5 s."""
    try:
        text = client.call("get", "v1", "pods", namespace, pod, subresource="log",
                           query=(("container", container), ("tailLines", lines)), timeout=5,
                           text=True)
    except (ApiException, OSError, ValueError, urllib3.exceptions.HTTPError):
        return None
    return str(text)


def read_monarchjob(namespace: str, name: str) -> dict[str, Any] | None:
    """The MonarchJob as a dict, or ``None`` if it does not exist (the pass's view's copy
    when the pass is this job's, see :func:`reading_from`)."""
    view = client._local.view
    if view is not None and view.key == (namespace, name):
        return view.job
    try:
        job: dict[str, Any] = client.call("get", constants.API_VERSION, constants.PLURAL,
                                          namespace, name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return job


def list_events(namespace: str, kind: str, name: str, uid: str) -> list[dict[str, Any]]:
    """Events about one object (``involvedObject`` kind, name and uid: a deleted namesake's
    events are not its own). From the pass's view when it caches Events: the operator
    watches only the worker StatefulSets' ``FailedCreate`` Events, the only ones asked for."""
    view = client._view("v1", "Event")
    if view is not None and view.key[0] == namespace:
        return [event for event in view.children[("v1", "Event")].values()
                if event.get("involvedObject", {}).get("kind") == kind
                and event["involvedObject"].get("name") == name
                and event["involvedObject"].get("uid") == uid]
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    events = client.call("list", "v1", "events", namespace, query=(("fieldSelector", selector),))
    return [event for event in events["items"]
            if (event.get("involvedObject") or {}).get("uid") == uid]
