"""A caching DNS resolver stand-in for launcher tests: records that appear late or change.

:class:`FakeResolver` answers ``A`` queries over UDP (RFC 1035) for the names it is given, as a
caching resolver in front of a changing zone would (field case C20; CoreDNS ``cache 30``):

- a record can appear ``appears_after_s`` seconds after its name was first asked for, or change
  its address with :meth:`FakeResolver.set`. The clock starts at the first query, not when the
  server starts: a launcher that starts slowly on a loaded machine still asks before the record
  appears, as a pod asks CoreDNS before its Service's endpoints exist (a clock started with the
  server let a launcher that took over 2 s to start see the record at its first query: CI of
  stop 57);
- every answer is cached per name: "no such name" (NXDOMAIN) for ``negative_ttl_s``, an address
  for ``positive_ttl_s``, counted from the moment it was first given out. Until then the old
  answer is repeated, whatever the zone says now.

Other names get NXDOMAIN (not cached). Point a process at it by bind-mounting a resolv.conf
with ``nameserver <address>`` over ``/etc/resolv.conf`` in a mount namespace of its own
(:func:`resolv_conf_wrapper`); glibc asks port 53, so the server needs root.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

_TYPE_A = 1
_CLASS_IN = 1
_RCODE_NXDOMAIN = 3
_FLAGS_RESPONSE = 0x8180  # QR, RD, RA


@dataclass
class _Cached:
    address: str | None
    until: float


class CachingZone:
    """The names a :class:`FakeResolver` serves, behind a cache; no sockets, no clock of its own.

    Args:
        negative_ttl_s: how long a "no such name" answer is repeated, seconds.
        positive_ttl_s: how long an address answer is repeated, seconds.
    """

    def __init__(self, negative_ttl_s: float = 30.0, positive_ttl_s: float = 30.0) -> None:
        self.negative_ttl_s = negative_ttl_s
        self.positive_ttl_s = positive_ttl_s
        # name -> [(seconds after its first query, address or None)], in the order set
        self._records: dict[str, list[tuple[float, str | None]]] = {}
        self._first_asked: dict[str, float] = {}  # name -> the time of its first query
        self._cache: dict[str, _Cached] = {}
        self._lock = threading.Lock()

    def set(self, name: str, address: str | None, appears_after_s: float = 0.0) -> None:
        """Make ``name`` resolve to ``address`` (None: no such name) from ``appears_after_s``
        seconds after ``name`` was first asked for; until then the zone says what earlier calls
        set (nothing: no such name). Cached answers stand until their TTL is over."""
        with self._lock:
            self._records.setdefault(name.lower().rstrip("."), []).append(
                (appears_after_s, address)
            )

    def knows(self, name: str) -> bool:
        """Whether ``name`` (lower case, no trailing dot) was ever :meth:`set`."""
        with self._lock:
            return name in self._records

    def answer(self, name: str, now: float) -> str | None:
        """The address a caching resolver gives for ``name`` at ``now`` (seconds, monotonic),
        or None for "no such name"; the first call for a name starts that name's clock."""
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and now < cached.until:
                return cached.address
            changes = self._records.get(name)
            if changes is None:
                return None
            elapsed = now - self._first_asked.setdefault(name, now)
            due = [address for after_s, address in changes if after_s <= elapsed]
            address = due[-1] if due else None
            ttl = self.positive_ttl_s if address else self.negative_ttl_s
            self._cache[name] = _Cached(address, now + ttl)
            return address


class FakeResolver:
    """Serves a :class:`CachingZone`'s ``A`` records on ``(address, 53)``; use as a context
    manager.

    Args:
        address: the loopback address to listen on (UDP port 53).
        negative_ttl_s: how long a "no such name" answer is repeated, seconds.
        positive_ttl_s: how long an address answer is repeated, seconds.
    """

    def __init__(
        self, address: str, negative_ttl_s: float = 30.0, positive_ttl_s: float = 30.0
    ) -> None:
        self.address = address
        self.zone = CachingZone(negative_ttl_s, positive_ttl_s)
        self.queries: list[tuple[float, str, str | None]] = []  # (time, name, answer)
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((address, 53))
        self._socket.settimeout(0.2)
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-dns", daemon=True)

    def set(self, name: str, address: str | None, appears_after_s: float = 0.0) -> None:
        """:meth:`CachingZone.set` on this resolver's zone."""
        self.zone.set(name, address, appears_after_s)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, client = self._socket.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = self._reply(query)
            if reply is not None:
                self._socket.sendto(reply, client)

    def _reply(self, query: bytes) -> bytes | None:
        if len(query) < 12:
            return None
        ident = query[:2]
        labels, offset = [], 12
        while offset < len(query) and query[offset]:
            length = query[offset]
            labels.append(query[offset + 1 : offset + 1 + length].decode(errors="replace"))
            offset += 1 + length
        question = query[12 : offset + 5]
        qtype, _ = struct.unpack("!HH", query[offset + 1 : offset + 5])
        name = ".".join(labels).lower()
        address = self.zone.answer(name, time.monotonic()) if qtype == _TYPE_A else None
        known = self.zone.knows(name)
        self.queries.append((time.monotonic() - self._started, name, address))
        if qtype == _TYPE_A and address is not None:
            header = ident + struct.pack("!HHHHH", _FLAGS_RESPONSE, 1, 1, 0, 0)
            answer = b"\xc0\x0c" + struct.pack("!HHIH", _TYPE_A, _CLASS_IN, 1, 4)
            return header + question + answer + socket.inet_aton(address)
        # NXDOMAIN for unknown or absent names; NODATA (no error, no answer) for other types.
        rcode = _RCODE_NXDOMAIN if (qtype == _TYPE_A or not known) else 0
        return ident + struct.pack("!HHHHH", _FLAGS_RESPONSE | rcode, 1, 0, 0, 0) + question

    def __enter__(self) -> FakeResolver:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close()


def resolv_conf_wrapper(nameserver: str, state_dir: Path) -> list[str]:
    """A command prefix that runs the rest in a mount namespace whose ``/etc/resolv.conf``
    names only ``nameserver``: ``[*prefix, program, args...]``. Needs root and ``unshare``."""
    resolv = state_dir / "resolv.conf"
    resolv.write_text(f"nameserver {nameserver}\noptions attempts:1 timeout:1\n")
    return [
        "unshare", "--mount", "--propagation", "private",
        "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv),
    ]  # fmt: skip
