"""The tests' TCP proxy (tests/cluster/tcpproxy.py) stops listening when closed: a closed proxy
stands for an unreachable API server (the MultiKueue worker-loss test), and one whose accepting
thread kept the listening socket open went on accepting connections after ``close()``."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.cluster.tcpproxy import TcpProxy


def test_a_closed_proxy_refuses_new_connections():
    with socket.create_server(("127.0.0.1", 0)) as target:
        proxy = TcpProxy(target.getsockname()[1])
        port = proxy.port
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # listening before close()
        proxy.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_close_ends_the_accepting_thread():
    with socket.create_server(("127.0.0.1", 0)) as target:
        before = set(threading.enumerate())
        proxy = TcpProxy(target.getsockname()[1])
        accepting = [thread for thread in threading.enumerate() if thread not in before]
        proxy.close()
        for thread in accepting:
            thread.join(timeout=5)
        assert not [thread for thread in accepting if thread.is_alive()]
