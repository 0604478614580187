"""TCP ports for the processes that local clusters and tests start on this machine.

A port found free by binding port 0 and closing the socket is free only for that moment, and it
comes from the kernel's ephemeral range, from which every outgoing connection here takes its
local port too: on a busy machine another connection takes it before the process meant to
listen on it starts (CI, 2026-12-07: an operator's liveness port, ``Address already in use``).
So every port handed out here comes from *below* the ephemeral range, from one of two disjoint
ranges, and never twice from one process:

- :data:`SERVICE_PORTS`: the local cluster's etcd, API server, controller manager, scheduler and
  Kueue, and the operators and proxies tests start;
- :data:`TEST_PORTS`: the sshd daemons and Monarch workers of the launcher tests, whose clean-up
  kills what mentions ``:<port>`` (a shared port once killed the other pytest worker's etcd).

Left out: the kubelet's and kube-proxy's ports (10248-10259), Kubernetes' NodePort range
(30000-32767) and the images' fixed ports (sshd 2222, Monarch worker 22222).
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

SERVICE_PORTS = range(22000, 30000)
TEST_PORTS = range(11000, 22000)
FIXED_PORTS = frozenset({22222})
# The smallest range below_ephemeral() cuts a range to.
MIN_CANDIDATES = 1000
ATTEMPTS = 200

_handed: set[int] = set()
_lock = threading.Lock()


def below_ephemeral(ports: range,
                    port_range_file: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")
                    ) -> range:
    """Return ``ports`` cut to end where the kernel's ephemeral range starts, if that is lower
    (at least :data:`MIN_CANDIDATES` ports are kept); ``ports`` unchanged where the file cannot
    be read."""
    try:
        low = int(port_range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return ports
    return range(ports.start, max(ports.start + MIN_CANDIDATES, min(ports.stop, low)))


def can_bind(host: str, port: int) -> bool:
    """Whether a TCP socket can bind ``host:port`` right now (``""``: every address)."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(hosts: tuple[str, ...] = ("127.0.0.1",), ports: range = SERVICE_PORTS) -> int:
    """Return a TCP port from ``ports`` (cut by :func:`below_ephemeral`) that is free on every
    address right now (the wildcard bind fails while any address holds it), so on ``hosts``
    too, is none of :data:`FIXED_PORTS` and was not returned before in this process.

    Raises:
        RuntimeError: :data:`ATTEMPTS` random candidates were each taken.
    """
    candidates = below_ephemeral(ports)
    with _lock:
        for _ in range(ATTEMPTS):
            port = random.randrange(candidates.start, candidates.stop)
            if port in FIXED_PORTS or port in _handed:
                continue
            if can_bind("", port) and all(can_bind(host, port) for host in hosts):
                _handed.add(port)
                return port
    raise RuntimeError(f"no free port on {hosts} in {candidates.start}-{candidates.stop - 1} "
                       f"after {ATTEMPTS} tries")
