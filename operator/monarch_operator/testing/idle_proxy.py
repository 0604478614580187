"""A TCP forwarder that behaves like a NAT or firewall with an idle timeout, for ssh tests.

:class:`IdleTimeoutProxy` listens on one address and forwards every connection to a target;
a connection that carried no byte in either direction for ``idle_s`` seconds is cut (both sides
closed), as a middlebox forgets an idle flow. ssh keepalives (``ServerAliveInterval``) keep a
quiet session alive through it; without them a rank that prints nothing for longer loses its
session.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from types import TracebackType

# How often each connection checks its idle time, seconds.
_TICK_S = 0.2


class IdleTimeoutProxy:
    """Forwards ``listen`` to ``target`` (``(host, port)`` each); cuts flows idle ``idle_s``.

    Use as a context manager; :attr:`cut` counts the connections cut for idleness.
    """

    def __init__(
        self, listen: tuple[str, int], target: tuple[str, int], idle_s: float
    ) -> None:
        self.listen = listen
        self.target = target
        self.idle_s = idle_s
        self.cut = 0
        self._server = socket.create_server(listen, reuse_port=False)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> IdleTimeoutProxy:
        thread = threading.Thread(target=self._accept, name="idle-proxy", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._server.close()
        for thread in self._threads:
            thread.join(timeout=2)

    def _accept(self) -> None:
        self._server.settimeout(_TICK_S)
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._forward, args=(client,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        peers = {client: upstream, upstream: client}
        last = time.monotonic()
        with selectors.DefaultSelector() as selector, client, upstream:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                if time.monotonic() - last >= self.idle_s:
                    self.cut += 1
                    return
                for key, _ in selector.select(_TICK_S):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        data = sock.recv(65536)
                        if data:
                            peers[sock].sendall(data)
                    except OSError:
                        data = b""
                    if not data:
                        return
                    last = time.monotonic()
