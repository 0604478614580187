"""Ports handed out here (localcluster/ports.py) come from below the kernel's ephemeral range,
from which every outgoing connection takes its port: a port found by binding port 0 was taken by
another process before an operator bound it (CI, 2026-12-07). The launcher tests' ports and the
local clusters' never meet: a launcher test's clean-up kills what mentions ":<port>", and once
killed the other pytest worker's etcd and API server, whose port it shared (CI, 2026-12-05)."""

from __future__ import annotations

import socket
from pathlib import Path

from monarch_operator.localcluster import ports
from monarch_operator.localcluster.cluster import free_port as cluster_port
from monarch_operator.testing import loopback_sshd

HOSTS = ("127.0.0.2", "127.0.0.3")


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_test_ports_come_from_below_the_kernels_ephemeral_range() -> None:
    picked = {loopback_sshd.free_port(HOSTS) for _ in range(50)}

    assert all(11000 <= port < min(22000, ephemeral_low()) for port in picked), sorted(picked)
    assert 22222 not in picked


def test_cluster_ports_are_below_the_ephemeral_range_apart_from_test_ports_never_twice() -> None:
    picked = [cluster_port() for _ in range(200)]

    assert all(22000 <= port < min(30000, ephemeral_low()) for port in picked), sorted(picked)
    assert 22222 not in picked
    assert len(set(picked)) == len(picked), "a port was handed out twice"


def test_a_port_bound_to_port_zero_is_never_a_handed_out_port() -> None:
    # What every outgoing connection and every bind to port 0 gets: the kernel's pick.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
    assert port not in ports.below_ephemeral(ports.TEST_PORTS)
    assert port not in ports.below_ephemeral(ports.SERVICE_PORTS)


def test_a_port_held_on_another_address_is_skipped(monkeypatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        picks = iter([busy, 22222, 12345])
        monkeypatch.setattr(ports, "below_ephemeral", lambda candidates: range(busy, busy + 1))
        monkeypatch.setattr(ports.random, "randrange", lambda start, stop: next(picks))

        assert loopback_sshd.free_port(HOSTS) == 12345


def test_a_short_ephemeral_start_cuts_the_range_but_keeps_a_thousand(tmp_path) -> None:
    port_range = tmp_path / "ip_local_port_range"
    port_range.write_text("25000\t60999\n")
    assert ports.below_ephemeral(ports.SERVICE_PORTS, port_range) == range(22000, 25000)
    port_range.write_text("22100\t60999\n")
    assert ports.below_ephemeral(ports.SERVICE_PORTS, port_range) == range(22000, 23000)
    assert ports.below_ephemeral(ports.SERVICE_PORTS, tmp_path / "absent") == ports.SERVICE_PORTS
