"""Address checks before Monarch starts: resolution (field case C3), sshd probes, the client
listen address. Uses loopback sockets only."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from monarch_operator.launcher import network
from monarch_operator.launcher.network import (
    NetworkCheckError,
    check_ssh_reachable,
    client_address,
    resolve_hosts,
)


def test_ip_literals_resolve_to_themselves() -> None:
    assert resolve_hosts(["127.0.0.2", "127.0.0.3"]) == {
        "127.0.0.2": "127.0.0.2",
        "127.0.0.3": "127.0.0.3",
    }


def test_name_resolving_to_loopback_next_to_remote_hosts_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Field case C3: host-a's own name resolves to 127.0.1.1 (Debian /etc/hosts).
    table = {"host-a": "127.0.1.1", "host-b": "192.0.2.2"}
    monkeypatch.setattr(network, "resolve_host", lambda name: table[name])

    with pytest.raises(NetworkCheckError, match=r"host-a -> 127\.0\.1\.1"):
        resolve_hosts(["host-a", "host-b"])


def test_unresolvable_name_is_named() -> None:
    with pytest.raises(NetworkCheckError, match="'no-such-host.invalid' does not resolve"):
        resolve_hosts(["no-such-host.invalid"])


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

    check_ssh_reachable({"worker-a": address}, port)


def test_every_unreachable_host_is_named(fake_sshd: tuple[str, int]) -> None:
    address, port = fake_sshd

    with pytest.raises(NetworkCheckError) as caught:
        check_ssh_reachable(
            {"worker-a": address, "worker-b": "127.0.0.9", "worker-c": "127.0.0.10"}, port
        )

    message = str(caught.value)
    assert f"worker-b (127.0.0.9:{port})" in message and "worker-c" in message
    assert "worker-a" not in message


def test_port_that_is_not_sshd_is_reported() -> None:
    with socket.create_server(("127.0.0.6", 0)) as silent:
        port = silent.getsockname()[1]
        with pytest.raises(NetworkCheckError, match="sent no SSH banner"):
            check_ssh_reachable({"worker-a": "127.0.0.6"}, port, timeout_s=0.5)


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
