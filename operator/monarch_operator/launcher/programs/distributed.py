"""Each role a torch.distributed group (issue 23 item 2): what ``init_process_group`` needs.

When a :class:`launcher.programs.job.Job` is entered, every proc of a role gets, in its own
environment (``os.environ`` of the proc, which every actor spawned on it sees), the variables
``torch.distributed.init_process_group()`` reads with ``init_method="env://"``, for a group of
that role alone:

- ``RANK``, ``WORLD_SIZE``: the rank within the role (host-major, as ``job.ranks[role]``) and
  the role's number of procs; ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``: the same on the proc's host;
- ``MASTER_ADDR``: the address the launcher reached the role's first host at (the one the
  pre-flight resolved, so every host of the role reaches it too); ``MASTER_PORT``: a TCP port
  that was free on that host when the job was entered, chosen anew for every job (so for every
  attempt) and never the same as another role's on the same host;
- ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``: the network interface that holds the
  proc's host address, unless already set (a worker pod's or node's own setting wins), so gloo
  and NCCL talk over the network the launcher chose rather than what the host name resolves
  to (which can be loopback).

So inside an actor ``torch.distributed.init_process_group("gloo")`` (or ``"nccl"``) forms the
role's group, and DDP or FSDP on it just works; :func:`init_process_group` does the same with
the backend chosen for the proc (NCCL when it sees a GPU, else gloo).

Imports the standard library only (it runs in every role proc; torch only inside
:func:`init_process_group`).
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from monarch_operator.launcher.session import waiting

# ioctl requests of Linux's netdevice(7): an interface's IPv4 address and netmask.
_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B
# The variables that name the interface gloo and NCCL use for their sockets.
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# The variables env:// rendezvous reads (and what this module sets, with the interface ones).
GROUP_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                   "MASTER_PORT")
# How many free-port probes may return a port already given to another role before giving up.
_PORT_TRIES = 20


@dataclass(frozen=True)
class RoleGroup:
    """The torch.distributed group of one role.

    Attributes:
        role: the role's name (``trainer``, ``ref``).
        master_addr: IPv4 address of the role's first host (rank 0 runs there).
        master_port: the TCP port of the group's store on that host.
        world_size: the role's number of procs (ranks).
        local_world_size: procs of the role on each host.
    """

    role: str
    master_addr: str
    master_port: int
    world_size: int
    local_world_size: int


def group_environment(
    group: RoleGroup,
    rank: int,
    local_rank: int,
    interface: str | None,
    base: Mapping[str, str],
) -> dict[str, str]:
    """The variables one proc of ``group`` gets (see the module doc).

    Args:
        group: the role's group.
        rank: the proc's rank within the role; ``local_rank``: within its host.
        interface: the network interface holding the proc's host address, or None (then no
            interface variable is set).
        base: the proc's environment now: an interface variable it already has is kept.

    Returns:
        Only the variables to set, as strings; ``base`` is not changed.
    """
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(group.world_size),
        "LOCAL_WORLD_SIZE": str(group.local_world_size),
        "MASTER_ADDR": group.master_addr,
        "MASTER_PORT": str(group.master_port),
    }
    if interface:
        env.update({name: interface for name in INTERFACE_VARIABLES if not base.get(name)})
    return env


def _interface_addresses() -> list[tuple[str, ipaddress.IPv4Interface]]:
    """(name, address/netmask) of every interface of this host with an IPv4 address."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                address = socket.inet_ntoa(fcntl.ioctl(probe, _SIOCGIFADDR, request)[20:24])
                netmask = socket.inet_ntoa(fcntl.ioctl(probe, _SIOCGIFNETMASK, request)[20:24])
            except OSError:  # no IPv4 address on this interface
                continue
            found.append((name, ipaddress.IPv4Interface(f"{address}/{netmask}")))
    return found


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that holds IPv4 ``address`` (e.g. ``eth0``;
    ``lo`` for any 127.x address): the one with that address, else the one whose network
    contains it; None when no interface does (or ``address`` is not IPv4)."""
    try:
        wanted = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    interfaces = _interface_addresses()
    for name, interface in interfaces:
        if interface.ip == wanted:
            return name
    for name, interface in interfaces:
        if wanted in interface.network:
            return name
    return None


def free_port(address: str, avoid: Collection[int] = ()) -> int:
    """A TCP port free on this host's ``address`` now, and free for a bind to every address,
    not one of ``avoid``: a ``MASTER_PORT``.

    torch.distributed's TCPStore listens on all of the host's addresses, not on ``address``
    alone; a port the kernel hands out for ``address`` may be held on another one (e.g. by a
    process on 127.0.0.1), and the store then fails with EADDRINUSE (seen on a loaded CI
    machine, where an etcd held 127.0.0.1:52555 and rank 0 of 127.0.0.2 was given 52555).

    Raises:
        OSError: ``address`` is not this host's, or no such port was found.
    """
    for _ in range(_PORT_TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
            port = int(probe.getsockname()[1])
        if port not in avoid and _free_on_every_address(port):
            return port
    raise OSError(f"no free port on {address} outside {sorted(avoid)}")


def _free_on_every_address(port: int) -> bool:
    """Whether ``port`` can be bound on the IPv4 wildcard, and on the IPv6 one where this host
    has IPv6 (TCPStore tries IPv6 first)."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, wildcard in families:
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host
            continue
        with probe:
            try:
                probe.bind((wildcard, port))
            except OSError as error:
                if family == socket.AF_INET6 and error.errno == errno.EADDRNOTAVAIL:
                    continue  # IPv6 off in this namespace
                return False
    return True


def form_role_groups(
    probes: Mapping[str, Any],
    role_addresses: Mapping[str, Sequence[str]],
    local_world_sizes: Mapping[str, int],
    world_sizes: Mapping[str, int],
    timeout_s: float,
) -> dict[str, RoleGroup]:
    """Choose each role's ``MASTER_ADDR`` and ``MASTER_PORT`` and set every proc's variables.

    Runs in the controller (the job calls it once the ranks are identified).

    Args:
        probes: each role's :class:`launcher.programs.rankside.RankProbe` mesh.
        role_addresses: each role's host addresses, by host index.
        local_world_sizes, world_sizes: procs per host and in all, per role.
        timeout_s: limit for each call into the procs, seconds.

    Returns:
        ``{role: RoleGroup}``.

    Raises:
        Exception: what Monarch raises when a call fails or times out.
    """
    groups: dict[str, RoleGroup] = {}
    taken: dict[str, set[int]] = {}
    for role, probe in probes.items():
        addresses = tuple(role_addresses[role])
        master = addresses[0]
        first = probe.slice(hosts=0, gpus=0)
        port = waiting.get(first.free_port.call_one(master, tuple(taken.get(master, ()))),
                           timeout_s)
        taken.setdefault(master, set()).add(port)
        group = RoleGroup(role, master, port, world_sizes[role], local_world_sizes[role])
        waiting.get(probe.join_group.call(group, addresses), timeout_s)
        groups[role] = group
    return groups


def default_backend() -> str:
    """``"nccl"`` when this proc sees a CUDA device, else ``"gloo"``."""
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"


def init_process_group(backend: str | None = None, timeout_s: float | None = None,
                       **options: Any) -> None:
    """Join this proc's role group: ``torch.distributed.init_process_group`` with env://.

    Call it inside an actor of a role proc (in ``__init__`` or an endpoint that every rank of
    the role runs); the role's group becomes the proc's default group, so DDP, FSDP and the
    collectives of ``torch.distributed`` work on it. A second call in the same proc does
    nothing. With NCCL the proc's device is set to ``LOCAL_RANK`` first (the role's GPUs are
    its ``CUDA_VISIBLE_DEVICES``).

    Args:
        backend: ``"gloo"``, ``"nccl"``, ...; None: :func:`default_backend`.
        timeout_s: limit for the rendezvous and each collective, seconds (None: torch's).
        options: passed on to ``torch.distributed.init_process_group``.

    Raises:
        RuntimeError: this process is not a role proc of an entered job (no ``MASTER_ADDR``
            or ``RANK``).
        Exception: what torch raises when the group cannot form (e.g. a timeout).
    """
    missing = [name for name in GROUP_VARIABLES if not os.environ.get(name)]
    if missing:
        raise RuntimeError(
            f"init_process_group: {', '.join(missing)} unset: call it in an actor of a role "
            "proc of an entered monarch_operator.job.Job")
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = backend or default_backend()
    if "nccl" in backend and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    if timeout_s is not None:
        options["timeout"] = timedelta(seconds=timeout_s)
    dist.init_process_group(backend=backend, init_method="env://", **options)
