"""Plain-socket building blocks the launcher needs before it starts Monarch.

- :func:`resolve_host` turns a hostfile name into the IPv4 address its worker binds and
  advertises.
- :func:`probe_sshd` checks that an SSH server answers on a host, with its banner.
- :func:`client_address` picks the address the launcher's own Monarch client listens on; the
  workers dial back to it.

The per-host pre-flight that combines them (retries, the loopback rule of field case C3, the
ssh login) lives in :mod:`launcher.session.preflight`.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

# The client listens on an ephemeral port unless --client-address pins one.
_EPHEMERAL = 0


class NetworkCheckError(RuntimeError):
    """A host name does not resolve, or no usable client address exists; the message says why."""


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def resolve_host(name: str) -> str:
    """Return the first IPv4 address of ``name`` (an IPv4 literal is returned unchanged).

    Raises:
        NetworkCheckError: the name does not resolve to an IPv4 address. IPv6 is not supported
            yet, because SSHJob writes worker addresses as ``tcp://<host>:<port>`` unbracketed.
    """
    try:
        infos = socket.getaddrinfo(name, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise NetworkCheckError(
            f"host {name!r} does not resolve to an IPv4 address: {error}"
        ) from None
    return str(infos[0][4][0])


def probe_sshd(address: str, port: int, timeout_s: float) -> str | None:
    """Return None if an SSH server answers on ``address:port``, else the reason it does not."""
    try:
        connection = socket.create_connection((address, port), timeout=timeout_s)
    except OSError as error:
        return str(error) or type(error).__name__
    with connection:
        try:
            banner = connection.recv(64)
        except OSError as error:
            return f"port {port} accepts connections, but sent no SSH banner ({error})"
    if not banner.startswith(b"SSH-"):
        return f"port {port} answered, but not with an SSH banner: {banner[:20]!r}"
    return None


def _routed_source_address(destination: str) -> str:
    """Return the local address the kernel would use to send to ``destination``.

    A UDP ``connect`` sends no packet; it only selects a route and a source address.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((destination, 9))
        return str(probe.getsockname()[0])


def client_address(worker_addresses: Iterable[str]) -> str:
    """Choose the Monarch client's listen address, ``tcp://<ip>:0``, that workers can dial.

    Rules, in order: all workers on loopback -> ``tcp://127.0.0.1:0``; the launcher's hostname
    resolves to a non-loopback IPv4 -> that; otherwise the source address of the route to the
    first worker. Monarch's own default (hostname resolution) panics when the hostname resolves
    only to loopback, so the launcher always configures this explicitly.

    Raises:
        NetworkCheckError: remote workers, but the only address found is loopback.
    """
    workers = list(worker_addresses)
    if all(_is_loopback(address) for address in workers):
        return f"tcp://127.0.0.1:{_EPHEMERAL}"
    try:
        own = resolve_host(socket.gethostname())
    except NetworkCheckError:
        own = "127.0.0.1"
    if not _is_loopback(own):
        return f"tcp://{own}:{_EPHEMERAL}"
    routed = _routed_source_address(workers[0])
    if _is_loopback(routed):
        raise NetworkCheckError(
            f"workers are remote (first: {workers[0]}) but this launcher only has loopback "
            f"address {routed}; pass --client-address tcp://<routable ip>:0"
        )
    return f"tcp://{routed}:{_EPHEMERAL}"
