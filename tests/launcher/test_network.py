"""Plain-socket checks before Monarch starts: name resolution, sshd probes, the client listen
address. Uses loopback sockets only; the per-host pre-flight built on them is tested in
test_preflight.py."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from monarch_operator.launcher.session import network
from monarch_operator.launcher.session.network import (
    NetworkCheckError,
    client_address,
    probe_sshd,
    resolve_host,
)


def test_ip_literal_resolves_to_itself() -> None:
    assert resolve_host("127.0.0.2") == "127.0.0.2"


def test_localhost_resolves_to_ipv4_loopback() -> None:
    assert resolve_host("localhost").startswith("127.")


def test_unresolvable_name_is_named() -> None:
    with pytest.raises(NetworkCheckError, match="'no-such-host.invalid' does not resolve"):
        resolve_host("no-such-host.invalid")


@pytest.fixture
def fake_sshd() -> Iterator[tuple[str, int]]:
    """A listener on 127.0.0.5 that greets like sshd, once per connection."""
    server = socket.create_server(("127.0.0.5", 0))
    server.settimeout(0.05)  # so that the loop notices `stop` promptly
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.sendall(b"SSH-2.0-OpenSSH_9.2p1 test\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield "127.0.0.5", server.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    server.close()


def test_reachable_sshd_passes(fake_sshd: tuple[str, int]) -> None:
    address, port = fake_sshd

    assert probe_sshd(address, port, timeout_s=3.0) is None


def test_nothing_listening_is_reported_with_the_socket_error() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.9", 0))
        port = closed.getsockname()[1]  # bound but not listening: connect is refused

        reason = probe_sshd("127.0.0.9", port, timeout_s=3.0)

    assert reason is not None and "refused" in reason.lower()


def test_port_that_is_not_sshd_is_reported() -> None:
    with socket.create_server(("127.0.0.6", 0)) as silent:
        port = silent.getsockname()[1]

        reason = probe_sshd("127.0.0.6", port, timeout_s=0.5)

    assert reason is not None and reason.startswith(f"port {port} accepts connections")
    assert "sent no SSH banner" in reason


def test_port_answering_another_protocol_is_reported() -> None:
    with socket.create_server(("127.0.0.7", 0)) as server:
        port = server.getsockname()[1]

        def greet() -> None:
            connection, _ = server.accept()
            with connection:
                connection.sendall(b"HTTP/1.1 400 Bad Request\r\n")

        thread = threading.Thread(target=greet, daemon=True)
        thread.start()
        reason = probe_sshd("127.0.0.7", port, timeout_s=3.0)
        thread.join(timeout=5)

    assert reason == f"port {port} answered, but not with an SSH banner: b'HTTP/1.1 400 Bad Req'"


def test_all_loopback_workers_use_a_loopback_client() -> None:
    assert client_address(["127.0.0.2", "127.0.0.3"]) == "tcp://127.0.0.1:0"


def test_remote_workers_get_the_hostname_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(network, "resolve_host", lambda name: "192.0.2.13")

    assert client_address(["192.0.2.14"]) == "tcp://192.0.2.13:0"


def test_loopback_hostname_falls_back_to_the_route(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(network, "resolve_host", lambda name: "127.0.1.1")
    monkeypatch.setattr(network, "_routed_source_address", lambda destination: "192.0.2.13")

    assert client_address(["192.0.2.14"]) == "tcp://192.0.2.13:0"


def test_remote_workers_but_only_loopback_here_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(network, "resolve_host", lambda name: "127.0.1.1")
    monkeypatch.setattr(network, "_routed_source_address", lambda destination: "127.0.0.1")

    with pytest.raises(NetworkCheckError, match="--client-address"):
        client_address(["192.0.2.14"])
