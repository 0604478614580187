"""The variables of a role's torch.distributed group (launcher.programs.distributed), pure parts."""

from __future__ import annotations

import socket

import pytest

from monarch_operator.launcher.programs.distributed import (
    RoleGroup,
    free_port,
    group_environment,
    init_process_group,
    interface_of,
)

GROUP = RoleGroup("trainer", "10.244.1.5", 29411, world_size=8, local_world_size=4)


def test_a_proc_gets_its_rank_within_the_role_and_the_roles_master() -> None:
    env = group_environment(GROUP, rank=5, local_rank=1, interface="eth0", base={})

    assert env == {
        "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.244.1.5", "MASTER_PORT": "29411",
        "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0",
    }


def test_an_interface_set_by_the_node_is_kept() -> None:
    env = group_environment(GROUP, 0, 0, "eth0", base={"NCCL_SOCKET_IFNAME": "ib0"})

    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and "NCCL_SOCKET_IFNAME" not in env
    assert "GLOO_SOCKET_IFNAME" not in group_environment(GROUP, 0, 0, None, base={})


def test_loopback_addresses_are_on_the_loopback_interface() -> None:
    assert interface_of("127.0.0.1") is not None
    assert interface_of("127.0.0.3") == interface_of("127.0.0.1")
    assert interface_of("not-an-address") is None
    assert interface_of("203.0.113.77") is None  # TEST-NET-3: on no interface here


def test_free_port_avoids_the_ports_it_is_told_to() -> None:
    first = free_port("127.0.0.1")
    second = free_port("127.0.0.1", avoid={first})

    assert second != first
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", second))  # still free


def test_init_process_group_outside_a_role_proc_says_what_is_missing(monkeypatch) -> None:
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)

    with pytest.raises(RuntimeError, match="RANK.*unset: call it in an actor of a role proc"):
        init_process_group()


def test_a_master_port_held_on_another_address_is_not_given(monkeypatch) -> None:
    # TCPStore listens on every address: a port free on 127.0.0.2 but held on 127.0.0.1 (an
    # etcd, in the CI run of 2026-12-05) failed rank 0 with EADDRINUSE.
    from monarch_operator.launcher.programs import distributed

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        assert not distributed._free_on_every_address(busy)
        real_socket = socket.socket
        offered = iter([busy])

        class FirstOffersTheHeldPort(real_socket):
            def getsockname(self):  # noqa: ANN202
                name = super().getsockname()
                return (name[0], next(offered, name[1]))

        monkeypatch.setattr(distributed.socket, "socket", FirstOffersTheHeldPort)
        port = free_port("127.0.0.2")

    assert port != busy
    assert distributed._free_on_every_address(port)
