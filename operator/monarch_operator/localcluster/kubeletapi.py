"""The node agent's kubelet API: what ``kubectl logs`` and ``kubectl exec`` reach through the
apiserver.

The apiserver finds a node's kubelet at the node's ``InternalIP`` (127.0.0.1 for every kwok node
here, ``--kubelet-preferred-address-types=InternalIP``) and the port in
``status.daemonEndpoints.kubeletEndpoint.Port`` (kwok's ``--node-port``: this server's port, one
server for all nodes). It connects over TLS, checking this server's certificate against the
cluster CA (``--kubelet-certificate-authority``) and presenting its kubelet client certificate;
this server accepts that client only (``CN=kube-apiserver-kubelet-client``), where a kubelet
would ask the apiserver (SubjectAccessReview) about any client.

Endpoints, as the kubelet's (``pkg/kubelet/server/server.go``):
- ``GET /containerLogs/{namespace}/{pod}/{container}``: the container's output with ``follow``
  (until that container instance ends), ``previous``, ``tailLines`` and ``limitBytes``. The
  agent records output without timestamps, so ``timestamps``, ``sinceSeconds`` and ``sinceTime``
  are refused with a message saying so.
- ``/exec/{namespace}/{pod}[/{uid}]/{container}``: ``podexec.py``, over WebSocket (the node
  declares ``ExtendWebSocketsToKubelet``, so the apiserver forwards kubectl's WebSocket as is).
- ``GET /healthz``.
Anything else (attach, portForward, run, stats, metrics) answers 404 naming what is served.

The server runs on its own thread and event loop inside the agent; it reads the agent's state
only through :class:`Containers`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from aiohttp import web

from monarch_operator.localcluster import podexec
from monarch_operator.localcluster.certs import KUBELET_CLIENT_NAME

log = logging.getLogger("localcluster.kubeletapi")

FOLLOW_POLL_SECONDS = 0.2
READ_CHUNK_BYTES = 64 * 1024
UNRECORDED_LOG_OPTIONS = ("timestamps", "sinceSeconds", "sinceTime")


@dataclass(frozen=True)
class ContainerView:
    """What the kubelet API needs to know about one container of a pod the agent runs.

    Attributes:
        pod_uid: the pod's uid.
        log_path: output of the current (or, between restarts, the last) instance.
        previous_log_path: output of the instance before that (``kubectl logs --previous``).
        pid: main process of the running instance; ``None`` while it does not run.
        env: the environment the agent started that instance with (what an exec gets, as a
            runtime's exec gets the container's process spec); ``None``: read the main
            process's ``/proc/<pid>/environ``.
    """

    pod_uid: str
    log_path: Path
    previous_log_path: Path
    pid: int | None
    env: dict[str, str] | None = None


class Containers(Protocol):
    """The agent, as the kubelet API sees it (called from the server's thread)."""

    def locate(self, namespace: str, pod: str, container: str) -> ContainerView | None:
        """The container of a pod this agent runs, or ``None`` when it runs no such pod."""


def tail_start(file: BinaryIO, lines: int | None, block_size: int = READ_CHUNK_BYTES) -> int:
    """Offset at which the last ``lines`` lines of ``file`` begin (``kubectl logs --tail``).

    A last line without a final newline counts as a line. ``None`` means the whole file (0);
    0 or fewer lines means its end.
    """
    size = file.seek(0, os.SEEK_END)
    if lines is None:
        return 0
    if lines <= 0 or size == 0:
        return size
    file.seek(size - 1)
    search_end = size - 1 if file.read(1) == b"\n" else size
    newlines, position = 0, search_end
    while position > 0:
        step = min(block_size, position)
        position -= step
        file.seek(position)
        block = file.read(step)
        index = len(block)
        while (index := block.rfind(b"\n", 0, index)) >= 0:
            newlines += 1
            if newlines == lines:
                return position + index + 1
    return 0


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() in ("1", "true")


def _count(request: web.Request, name: str) -> int | None:
    """A non-negative integer query parameter, ``None`` when absent; 400 when malformed."""
    value = request.query.get(name)
    if value is None:
        return None
    if not value.isdigit():
        raise web.HTTPBadRequest(text=f"{name}: must be a non-negative integer, got {value!r}")
    return int(value)


class KubeletAPI:
    """The aiohttp application serving the kubelet endpoints for ``containers``."""

    def __init__(self, containers: Containers) -> None:
        self.containers = containers

    def application(self) -> web.Application:
        """The routes, behind the client check."""
        app = web.Application(middlewares=[self._only_the_apiserver])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        for path in ("/exec/{namespace}/{pod}/{container}",
                     "/exec/{namespace}/{pod}/{uid}/{container}"):
            app.router.add_route("GET", path, self._exec)
            app.router.add_route("POST", path, self._exec)
        return app

    @web.middleware
    async def _only_the_apiserver(
            self, request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        names = [value for rdn in (peer or {}).get("subject", ()) for key, value in rdn
                 if key == "commonName"]
        if names != [KUBELET_CLIENT_NAME]:
            raise web.HTTPForbidden(
                text=f"Forbidden (user={names[0] if names else 'system:anonymous'}, "
                     "resource=nodes, subresource=proxy): the local node agent serves "
                     f"{KUBELET_CLIENT_NAME} only")
        try:
            return await handler(request)
        except web.HTTPNotFound as error:
            if request.match_info.route.resource is not None:
                raise
            raise web.HTTPNotFound(
                text=f"{request.path}: not served by the local node agent (it serves "
                     "/containerLogs, /exec and /healthz)") from error

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _view(self, request: web.Request) -> tuple[ContainerView, str]:
        namespace, pod = request.match_info["namespace"], request.match_info["pod"]
        container = request.match_info["container"]
        view = self.containers.locate(namespace, pod, container)
        uid = request.match_info.get("uid")
        if view is None or (uid and uid != view.pod_uid):
            raise web.HTTPNotFound(text=f"pod {namespace}/{pod} is not run by this node agent")
        return view, f'container "{container}" in pod "{pod}"'

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        refused = [name for name in UNRECORDED_LOG_OPTIONS if name in request.query
                   and (name != "timestamps" or _flag(request, name))]
        if refused:
            raise web.HTTPBadRequest(
                text=f"{', '.join(refused)}: the local node agent records container output "
                     "without timestamps (use --tail or --limit-bytes)")
        tail = _count(request, "tailLines")
        if tail is None and request.query.get("tail", "all") != "all":  # the older parameter
            tail = _count(request, "tail")
        limit = _count(request, "limitBytes")
        previous = _flag(request, "previous")
        view, what = self._view(request)
        path = view.previous_log_path if previous else view.log_path
        try:
            file = open(path, "rb")  # noqa: SIM115 (closed below, after streaming)
        except FileNotFoundError:
            raise web.HTTPBadRequest(text=(
                f"previous terminated {what} not found" if previous
                else f"{what} is waiting to start")) from None
        with file:
            file.seek(tail_start(file, tail))
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await response.prepare(request)
            follow = _flag(request, "follow") and not previous and view.pid is not None
            await self._stream(request, response, file, limit, follow, view)
            await response.write_eof()
        return response

    async def _stream(self, request: web.Request, response: web.StreamResponse, file: BinaryIO,
                      limit: int | None, follow: bool, view: ContainerView) -> None:
        """Copy ``file`` to ``response``; with ``follow``, keep copying what the instance
        writes until it ends (its main process is no longer the running one)."""
        remaining = limit if limit is not None else -1
        while remaining != 0:
            chunk = file.read(READ_CHUNK_BYTES if remaining < 0
                              else min(READ_CHUNK_BYTES, remaining))
            if chunk:
                await response.write(chunk)
                remaining -= len(chunk) if remaining > 0 else 0
                continue
            if not follow:
                return
            current = self.containers.locate(request.match_info["namespace"],
                                             request.match_info["pod"],
                                             request.match_info["container"])
            if current is None or current.pid != view.pid:
                follow = False  # the instance ended: copy what it wrote last, then stop
                continue
            await asyncio.sleep(FOLLOW_POLL_SECONDS)

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        view, what = self._view(request)
        if view.pid is None:
            raise web.HTTPNotFound(text=f"{what} is not running")
        return await podexec.serve(request, view.pid, view.env)


def serve_in_thread(containers: Containers, port: int, pki_dir: Path,
                    host: str = "127.0.0.1") -> threading.Thread:
    """Serve the kubelet API on ``host:port`` over TLS from a daemon thread.

    Args:
        pki_dir: holds ``kubelet.crt``/``kubelet.key`` (served) and ``ca.crt`` (client CA).

    Returns:
        the thread, once the server listens.

    Raises:
        OSError: the port could not be bound.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki_dir / "ca.crt"))
    context.load_cert_chain(str(pki_dir / "kubelet.crt"), str(pki_dir / "kubelet.key"))
    context.verify_mode = ssl.CERT_REQUIRED
    started: list[BaseException | None] = []
    ready = threading.Event()

    async def run() -> None:
        runner = web.AppRunner(KubeletAPI(containers).application(), access_log=None,
                               handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port, ssl_context=context).start()
        except BaseException as error:
            started.append(error)
            ready.set()
            raise
        started.append(None)
        ready.set()
        log.info("kubelet API on https://%s:%d", host, port)
        await asyncio.Event().wait()  # serve until the process ends

    def main() -> None:
        try:
            asyncio.run(run())
        except BaseException:  # reported to the caller through `started`, or logged
            if ready.is_set() and started and started[0] is None:
                log.exception("kubelet API stopped")

    thread = threading.Thread(target=main, name="kubelet-api", daemon=True)
    thread.start()
    ready.wait()
    if started[0] is not None:
        raise started[0]
    return thread
