"""Ports the launcher tests hand out (testing/loopback_sshd.free_port) never equal a port the
kernel gives another process here: a test's clean-up kills what mentions ":<port>", and once
killed the other pytest worker's etcd and API server, whose port it shared (CI, 2026-12-05)."""

from __future__ import annotations

import socket
from pathlib import Path

from monarch_operator.testing import loopback_sshd

HOSTS = ("127.0.0.2", "127.0.0.3")


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_ports_come_from_below_the_kernels_ephemeral_range() -> None:
    ports = {loopback_sshd.free_port(HOSTS) for _ in range(50)}

    assert all(11000 <= port < min(30000, ephemeral_low()) for port in ports), sorted(ports)
    assert 22222 not in ports


def test_a_port_bound_to_port_zero_is_never_a_test_port() -> None:
    # What etcd, the API server and Kueue do: the kernel picks from the ephemeral range.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        assert taken.getsockname()[1] not in loopback_sshd._test_ports()


def test_a_port_held_on_another_address_is_skipped(monkeypatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        picks = iter([busy, 22222, 12345])
        monkeypatch.setattr(loopback_sshd, "_test_ports", lambda: range(busy, busy + 1))
        monkeypatch.setattr(loopback_sshd.random, "randrange", lambda start, stop: next(picks))

        assert loopback_sshd.free_port(HOSTS) == 12345
