"""A TCP proxy between a client and the API server that a test can disturb (field case C18):
reset every connection, or stop forwarding while keeping connections open (a middlebox that
silently drops flows), and forward again.

One thread accepts; each connection has one thread per direction. ``stall()`` freezes every
connection open then or opened until ``forward()``; frozen connections stay frozen for good
(open, never forwarded again), as flows a middlebox dropped do.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading


class TcpProxy:
    """``with TcpProxy(target_port) as proxy:`` listens on ``127.0.0.1:proxy.port``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._connections: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._stalled = False
        self._closed = False
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._closed:  # accepted as close() ran: never forwarded
                client.close()
                return
            frozen = threading.Event()
            with self._lock:
                self.accepted += 1
                if self._stalled:
                    frozen.set()  # accepted, kept open, never forwarded
                    self._connections.append((client, client, frozen))
                    continue
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                closed = self._closed
                if self._stalled:  # stall() came while this connection was being made
                    frozen.set()
                if not closed:
                    self._connections.append((client, server, frozen))
            if closed:  # close() ran while this connection was being made: reset_all missed it
                client.close()
                server.close()
                return
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink, frozen),
                                 daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, frozen: threading.Event) -> None:
        try:
            while not frozen.is_set():
                ready, _, _ = select.select([source], [], [], 0.2)
                if not ready or frozen.is_set():
                    continue
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        if not frozen.is_set():
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def reset_all(self) -> int:
        """Reset (RST) every open connection, both sides; returns how many."""
        with self._lock:
            connections, self._connections = self._connections, []
        for client, server, frozen in connections:
            frozen.set()
            for sock in {client, server}:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                    struct.pack("ii", 1, 0))
                    sock.close()
        return len(connections)

    def stall(self) -> int:
        """Stop forwarding on every open connection and on new ones until :meth:`forward`
        (connections stay open); returns how many open connections were frozen."""
        with self._lock:
            self._stalled = True
            for _, _, frozen in self._connections:
                frozen.set()
            return len(self._connections)

    def forward(self) -> None:
        """Forward new connections again (those frozen stay frozen)."""
        with self._lock:
            self._stalled = False

    def close(self) -> None:
        """Stop listening (new connections are refused) and reset every open connection.

        Closing the listening socket alone does not stop it listening while the accepting
        thread is blocked in ``accept()`` on it: that call keeps the kernel's socket, which goes
        on completing handshakes. ``shutdown()`` wakes the call and stops the listening first.
        """
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.reset_all()
