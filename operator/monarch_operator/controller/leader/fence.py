"""The write fence: once this replica's leadership is in doubt (its renew deadline passed, it
lost or released the Lease), every write request of the operator is refused in the process,
before it reaches the network (field case C32, issue 34 item 2).

Stopping kopf takes a moment, and a process that was paused (SIGSTOP, a stalled VM, CPU
starvation) resumes its handlers before its elector notices anything; without a fence these
could write after a standby took over. The check is made on each request, on the elector's
clock, so it holds however late the elector's own thread runs.

Two paths carry the operator's writes, and both are wrapped (once per process):

- the Kubernetes client's ``RESTClientObject.request`` (every pass of the reconcile loop);
- kopf's ``kopf._cogs.clients.api.request`` (its annotations, status progress, Events).

A write is checked when it is asked for, again on each try before the request is built
(urllib3's ``HTTPConnection.request``, aiohttp's ``ClientRequest.send``: after the connection
and its TLS handshake, which on a loaded machine take long enough for a pause to fall in
between, and on each retry the clients make on their own: kopf retries a write for up to a
minute after a timeout or a 5xx), and last on the wire: on each write of its bytes to the
socket (``http.client``'s ``send`` under urllib3; aiohttp's ``StreamWriter._write`` and
``_writelines``, pinned aiohttp 3.14.5). aiohttp's ``send`` only buffers the headers: they go
out with the body from a task of their own, one or more turns of the event loop later, and
every task of the operator may run in between. A pause can then only fall in the few Python
statements between the last check and the socket's ``send``. The checks past the first apply
only to writes that went through one of the two wrapped paths (a context variable marks them,
and a task started for a request inherits it), so the elector's own client (:mod:`.lease`),
which calls :data:`UNFENCED_REQUEST` directly, is never refused. Reads (GET, and kopf's watch
streams) pass: they change nothing. Short chaos soaks in CI: 2026-12-04, a replica resumed
15 s after its SIGSTOP sent a ``create statefulsets`` whose only check had passed before the
pause; 2026-12-07, one resumed 19 s after it sent a ``create events`` (kopf's poster) whose
check in ``send`` had passed and whose bytes had not yet gone out.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable
from typing import Any

from kubernetes.client import rest

logger = logging.getLogger("monarch_operator.leader")

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The client's request as it was before install(): what the elector's own client calls.
UNFENCED_REQUEST: Callable[..., Any] = rest.RESTClientObject.request
# ``(method, url)`` while one of the operator's fenced requests is under way (in its thread or
# task, and tasks started from it): the later checks apply to those requests only.
_FENCED_WRITE: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "fenced_write", default=None)


class FencedError(RuntimeError):
    """A write refused because this replica may no longer write (not the leader any more)."""


def _refuse(method: str, url: str, stage: str) -> FencedError:
    logger.error("leader election: refused %s %s %s: this replica is not the leader any more",
                 method.upper(), url, stage)
    return FencedError(f"{method.upper()} {url} refused: not the leader (leader election)")


def install(may_write: Callable[[], bool]) -> None:
    """Refuse every write of the operator from now on whenever ``may_write()`` is false.

    ``may_write`` is asked when a write is asked for and again on each of its tries before
    its first byte is sent (e.g. :meth:`.Elector.may_write`); a refused request raises
    :class:`FencedError` in its caller (urllib3 and aiohttp close the connection it had).
    Installing again replaces the check.
    """
    state = _STATE
    state["may_write"] = may_write
    if state.get("installed"):
        return
    state["installed"] = True

    def check(method: str, url: str, stage: str = "when asked") -> None:
        if method.upper() in WRITE_METHODS and not state["may_write"]():
            raise _refuse(method, url, stage)

    @functools.wraps(UNFENCED_REQUEST)
    def fenced_request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        check(method, url)
        token = _FENCED_WRITE.set((method, url))
        try:
            return UNFENCED_REQUEST(self, method, url, *args, **kwargs)
        finally:
            _FENCED_WRITE.reset(token)

    rest.RESTClientObject.request = fenced_request

    from kopf._cogs.clients import api

    kopf_request = state["kopf_request"] = api.request

    @functools.wraps(kopf_request)
    async def fenced_kopf_request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        check(method, url)
        token = _FENCED_WRITE.set((method, url))
        try:
            return await kopf_request(method, url, *args, **kwargs)
        finally:
            _FENCED_WRITE.reset(token)

    api.request = fenced_kopf_request
    _install_wire_checks(check)


def _install_wire_checks(check: Callable[[str, str, str], None]) -> None:
    """The later checks of a fenced write: on each try before it is sent, and on each write of
    its bytes to the socket."""
    import aiohttp
    from aiohttp import http_writer
    from urllib3 import connection

    def on_the_wire() -> None:
        fenced = _FENCED_WRITE.get()
        if fenced is not None:
            check(fenced[0], fenced[1], "on the wire")

    urllib3_send = _STATE["urllib3_send"] = connection.HTTPConnection.request

    @functools.wraps(urllib3_send)
    def checked_urllib3_send(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if _FENCED_WRITE.get() is not None:
            check(method, url, "before sending")
        return urllib3_send(self, method, url, *args, **kwargs)

    connection.HTTPConnection.request = checked_urllib3_send  # type: ignore[method-assign]

    socket_send = _STATE["socket_send"] = connection.HTTPConnection.send

    @functools.wraps(socket_send)
    def checked_socket_send(self: Any, data: Any) -> Any:
        on_the_wire()
        return socket_send(self, data)

    connection.HTTPConnection.send = checked_socket_send  # type: ignore[method-assign]

    aiohttp_send = _STATE["aiohttp_send"] = aiohttp.ClientRequest.send

    @functools.wraps(aiohttp_send)
    async def checked_aiohttp_send(self: Any, conn: Any) -> Any:
        if _FENCED_WRITE.get() is not None:
            check(str(self.method), str(self.url), "before sending")
        return await aiohttp_send(self, conn)

    aiohttp.ClientRequest.send = checked_aiohttp_send  # type: ignore[method-assign]

    writer = http_writer.StreamWriter
    writer_write = _STATE["writer_write"] = writer._write
    writer_writelines = _STATE["writer_writelines"] = writer._writelines

    @functools.wraps(writer_write)
    def checked_write(self: Any, chunk: Any) -> None:
        on_the_wire()
        writer_write(self, chunk)

    @functools.wraps(writer_writelines)
    def checked_writelines(self: Any, chunks: Any) -> None:
        on_the_wire()
        writer_writelines(self, chunks)

    writer._write = checked_write  # type: ignore[method-assign]
    writer._writelines = checked_writelines  # type: ignore[method-assign]


def uninstall() -> None:
    """Undo :func:`install` (tests: the wrapped functions are process-wide)."""
    if not _STATE.pop("installed", False):
        return
    rest.RESTClientObject.request = UNFENCED_REQUEST
    import aiohttp
    from aiohttp import http_writer
    from kopf._cogs.clients import api
    from urllib3 import connection

    api.request = _STATE.pop("kopf_request")
    connection.HTTPConnection.request = _STATE.pop("urllib3_send")  # type: ignore[method-assign]
    connection.HTTPConnection.send = _STATE.pop("socket_send")  # type: ignore[method-assign]
    aiohttp.ClientRequest.send = _STATE.pop("aiohttp_send")  # type: ignore[method-assign]
    http_writer.StreamWriter._write = _STATE.pop("writer_write")  # type: ignore[method-assign]
    http_writer.StreamWriter._writelines = (  # type: ignore[method-assign]
        _STATE.pop("writer_writelines"))


_STATE: dict[str, Any] = {}
