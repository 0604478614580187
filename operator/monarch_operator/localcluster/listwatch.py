"""A list-then-watch cache of one collection, for the node agent (a kubelet's pod informer).

The node agent used to LIST every pod and every node each half second: about four requests a
second per simulated cluster, each a consistent read (an etcd round trip), the whole pod list
encoded by the API server and decoded into typed models by the agent, whether anything had
changed or not. Idle, that was 2 of a cluster's 4.8 CPU-s a minute (the API server 1.0, etcd
0.5, the agent 0.5; docs/development.md), and it grew with every pod a test had. A kubelet
watches instead (client-go's reflector: LIST once, WATCH from its resourceVersion, LIST again
when the watch says 410 Gone); :class:`ListWatch` does the same in a thread, keeps the objects
as plain dicts decoded from the JSON (never typed models) and sets an event on every change, so
the agent's loop wakes at once instead of at its next tick.

See https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes
for the list/watch contract (resourceVersion, bookmarks, 410 Gone).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)

# The server ends each watch after this many seconds (it sends a bookmark about once a minute
# before that); the client gives up on a connection silent for WATCH_READ_LIMIT_S.
WATCH_SECONDS = 240
WATCH_READ_LIMIT_S = WATCH_SECONDS + 60
# After a failed LIST or a broken watch, wait this long before listing again, seconds.
RETRY_S = 0.5

Lister = Callable[..., Any]


class ListWatch:
    """The objects of one collection, kept current by a list and a watch in a daemon thread.

    Args:
        lister: a ``kubernetes.client`` list function of the collection, e.g.
            ``CoreV1Api.list_pod_for_all_namespaces``; called with ``_preload_content=False``
            (raw JSON, no typed models) and, for the watch, ``watch=True``.
        changed: set after every change to the objects (and after each LIST).
        name: for the log and the thread's name.

    :meth:`start` lists once before it returns (raises what that LIST raises), so the first
    :meth:`objects` is complete; later LIST or watch failures are logged and retried every
    ``RETRY_S`` seconds, the objects kept as last seen meanwhile.
    """

    def __init__(self, lister: Lister, changed: threading.Event, name: str) -> None:
        self._lister = lister
        self._changed = changed
        self._name = name
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}
        self._version = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"listwatch-{name}", daemon=True)

    def start(self) -> None:
        """LIST once (raising the client's error if that fails), then watch in the thread;
        nothing once it has started (so a caller may call it before every read)."""
        if self._thread.is_alive():
            return
        self._relist()
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end after its current watch (it is a daemon: nothing waits)."""
        self._stop.set()

    def objects(self) -> list[dict[str, Any]]:
        """The collection's objects as last seen, as dicts; the same dict objects until an
        event replaces them, never changed in place (callers must not change them either)."""
        with self._lock:
            return list(self._objects.values())

    def _relist(self) -> None:
        response = self._lister(_preload_content=False)
        document = json.loads(response.data)
        objects = {item["metadata"]["uid"]: item for item in document.get("items") or []}
        with self._lock:
            self._objects = objects
            self._version = document["metadata"]["resourceVersion"]
        self._changed.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except Exception:  # noqa: BLE001 - the API server restarted, a test cut it off, ...
                log.warning("%s: watch failed; listing again in %.1f s", self._name, RETRY_S,
                            exc_info=True)
                self._relist_until_done()

    def _relist_until_done(self) -> None:
        while not self._stop.is_set():
            time.sleep(RETRY_S)
            try:
                self._relist()
                return
            except Exception:  # noqa: BLE001 - retried until the API server answers
                log.warning("%s: list failed", self._name, exc_info=True)

    def _watch(self) -> None:
        """One watch from the current resourceVersion, to its end; LIST again on 410 Gone."""
        response = self._lister(
            watch=True, resource_version=self._version, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS, _preload_content=False,
            _request_timeout=(10, WATCH_READ_LIMIT_S))
        try:
            for line in iter_resp_lines(response):
                if self._stop.is_set():
                    return
                if line.strip() and self._apply(json.loads(line)):
                    self._relist()
                    return
        finally:
            response.release_conn()

    def _apply(self, event: dict[str, Any]) -> bool:
        """Apply one watch event; True when the watch is too old and the caller must LIST."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                return True
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._objects[obj["metadata"]["uid"]] = obj
            elif kind == "DELETED":
                self._objects.pop(obj["metadata"]["uid"], None)
            if version:
                self._version = version
        if kind != "BOOKMARK":
            self._changed.set()
        return False
