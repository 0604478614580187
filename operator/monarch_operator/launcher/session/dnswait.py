"""Wait until each host's name resolves to the address it is expected to have, and stays so.

A host recreated under the same name (a MonarchJob worker pod after an infrastructure restart)
gets a new address, but a resolver may still answer with the old one, or with "no such name",
until its cache expires (CoreDNS ``cache 30``; field case C20, kubernetes #71308, coredns
#2434). Whoever knows the current addresses tells the launcher: ``--host-address NAME=IP``
(repeatable), or a file of ``NAME IP`` lines (``--host-addresses FILE``, env
``MONARCH_HOST_ADDRESSES``, which a MonarchJob's launcher pod gets: the hostfile ConfigMap's
``addresses`` key, the worker pods' IPs when the attempt's launcher was made; read by
:func:`host_address_lines`). :func:`wait_for_addresses` then
resolves every such name about once a second, before any ssh connection is made. A name whose
first answer is already the expected address is taken at once: no resolver has shown an old
record, and the normal path (fresh pods, kept pods) waits for nothing. A name that first
resolves elsewhere, or not at all, is a cache to distrust: it must then give the expected
address without a break for ``stable_s`` seconds (``--dns-stable``, default one cache
lifetime, 30 s). A name that does not resolve, or resolves elsewhere, is
waited for until ``wait_s`` (``--host-wait``) or ``stable_s``, whichever is longer, passed
without progress (a name that started or stopped matching, or became stable), and then named in
a :class:`~launcher.session.preflight.PreflightError` with reason ``DNSNotResolvable`` or
``DNSStale``. At least ``stable_s``: the pod has the expected address now, so any other answer
is a cached one, and a cache gives it up within one lifetime. Waiting only ``wait_s`` (5 s by
default) failed a MonarchJob deleted and applied again under its name: its new worker's name
still resolved to the deleted job's pod from CoreDNS's cache (``DNSStale`` after 5.0 s, in
attempt 1, 2026-12-06).

Hosts without an expected address are left to the pre-flight.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from monarch_operator.launcher.session.network import NetworkCheckError, resolve_host
from monarch_operator.launcher.session.preflight import (
    DNS_NOT_RESOLVABLE,
    DNS_STALE,
    HostCheck,
    PreflightError,
)

# How long an expected address must be seen without a break, seconds (CoreDNS cache 30).
DEFAULT_STABLE_S = 30.0
# Seconds between lookups of a name that is not stable yet.
POLL_S = 1.0


class HostAddressError(ValueError):
    """A ``--host-address`` item is malformed; the message names the item and the rule."""


def parse_host_addresses(items: Iterable[str], hosts: Iterable[str]) -> dict[str, str]:
    """Parse ``NAME=IP`` items (each item may also hold several, comma-separated).

    Args:
        items: the ``--host-address`` values and the ``MONARCH_HOST_ADDRESSES`` value.
        hosts: the host names of the run (hostfile, ``--hosts``, Slurm).

    Returns:
        ``{name: IPv4 address}``.

    Raises:
        HostAddressError: an item without ``=``, an address that is not an IPv4 literal, a
            name that is not one of ``hosts``, or one name given two different addresses.
    """
    known = set(hosts)
    found: dict[str, str] = {}
    for item in items:
        for part in filter(None, (piece.strip() for piece in item.split(","))):
            name, sep, address = (text.strip() for text in part.partition("="))
            if not sep or not name or not address:
                raise HostAddressError(f"--host-address {part!r}: expected NAME=IP")
            try:
                ipaddress.IPv4Address(address)
            except ValueError:
                raise HostAddressError(
                    f"--host-address {part!r}: {address!r} is not an IPv4 address"
                ) from None
            if name not in known:
                raise HostAddressError(
                    f"--host-address {part!r}: {name!r} is not one of the run's hosts"
                )
            if found.setdefault(name, address) != address:
                raise HostAddressError(
                    f"--host-address: {name!r} given two addresses, {found[name]} and {address}"
                )
    return found


def host_address_lines(text: str, source: str) -> list[str]:
    """Turn a file of ``NAME IP`` lines into ``NAME=IP`` items for :func:`parse_host_addresses`.

    Blank lines and ``#`` comments (whole-line or trailing) are skipped.

    Args:
        text: the file's content.
        source: the file's name, for errors.

    Raises:
        HostAddressError: a line that is not exactly two words, naming the file and line.
    """
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise HostAddressError(f"{source}:{number}: expected 'NAME IP', got {line.strip()!r}")
        items.append(f"{words[0]}={words[1]}")
    return items


@dataclass
class _Watch:
    expected: str
    seen: str | None = None  # the last answer, or None when the name did not resolve
    detail: str = ""
    matching_since: float | None = None
    # Every answer so far was the expected address: nothing to distrust, stable at once.
    clean: bool = True


def wait_for_addresses(
    expected: Mapping[str, str],
    stable_s: float = DEFAULT_STABLE_S,
    wait_s: float = 0.0,
    resolve: Callable[[str], str] = resolve_host,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: Callable[[int, int], None] | None = None,
    on_mismatch: Callable[[str, str | None, str], None] | None = None,
) -> None:
    """Return once every name in ``expected`` resolves to its address: at once when its first
    answer was that address, else after ``stable_s`` seconds of that answer without a break.

    Args:
        expected: ``{host name: IPv4 address it has now}``.
        stable_s: how long each name must keep resolving to that address, seconds; 0 = once.
        wait_s: how long a name that does not match is waited for after the last progress,
            seconds; never less than ``stable_s`` (a cached answer lasts up to one lifetime).
        resolve: name -> address (:func:`launcher.session.network.resolve_host`), raising
            :class:`~launcher.session.network.NetworkCheckError`.
        clock, sleep: time (tests pass fakes).
        on_progress: called with ``(stable names, total)`` when that count changes.
        on_mismatch: called once per name, at its first answer that is not its address, with
            ``(name, that answer or None when it did not resolve, the expected address)``.

    Raises:
        PreflightError: naming every name that does not match (``DNSNotResolvable`` or
            ``DNSStale``, with what it resolved to) once ``max(wait_s, stable_s)`` passed
            without progress.
    """
    patience = max(wait_s, stable_s)
    watches = {name: _Watch(address) for name, address in expected.items()}
    started = progressed = clock()
    stable = 0
    while True:
        now = clock()
        for name, watch in watches.items():
            if _is_stable(watch, now, stable_s):
                continue
            try:
                watch.seen, watch.detail = resolve(name), ""
            except NetworkCheckError as error:
                watch.seen, watch.detail = None, str(error)
            if watch.seen != watch.expected:
                if watch.clean and on_mismatch is not None:
                    on_mismatch(name, watch.seen, watch.expected)
                watch.clean = False
                if watch.matching_since is not None:
                    progressed = now  # it flipped back: its wait starts again from here
                watch.matching_since = None
            elif watch.matching_since is None:
                watch.matching_since = progressed = now
        now = clock()
        count = sum(_is_stable(watch, now, stable_s) for watch in watches.values())
        if count != stable:
            stable, progressed = count, now
            if on_progress is not None:
                on_progress(count, len(watches))
        if count == len(watches):
            return
        failing = {name: w for name, w in watches.items() if w.matching_since is None}
        if failing and now - progressed >= patience:
            checks = [_failure(name, watch) for name, watch in failing.items()]
            ready = {n: w.expected for n, w in watches.items() if _is_stable(w, now, stable_s)}
            raise PreflightError(checks, len(watches), now - started, ready, patience)
        sleep(POLL_S)


def _is_stable(watch: _Watch, now: float, stable_s: float) -> bool:
    return watch.matching_since is not None and (
        watch.clean or now - watch.matching_since >= stable_s)


def _failure(name: str, watch: _Watch) -> HostCheck:
    if watch.seen is None:
        return HostCheck(name, None, DNS_NOT_RESOLVABLE, watch.detail)
    return HostCheck(
        name,
        watch.seen,
        DNS_STALE,
        f"resolves to {watch.seen}, not to {watch.expected}, the address the host has now "
        "(a resolver still caches the old record)",
    )
