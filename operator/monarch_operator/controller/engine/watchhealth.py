"""Watch streams that die or go silent are noticed and re-established (field case C18; kopf
#996, #762, #787: an operator that stays up but hears nothing any more).

A watch request that the API server or a middlebox stops answering, while its connection stays
open, gives no error: kopf would wait on it until its inactivity timeout. So:

- every watch request is bounded: the API server ends it after :data:`RENEW_SECONDS`
  (``timeoutSeconds``), and kopf re-watches from the stream's last resourceVersion (one cheap
  request, no new list); a request still open :data:`STALL_SECONDS` after it began is cut by
  the client and the stream re-established; kopf's other requests are bounded too;
- each stream is *working* while it delivers: an event, a bookmark, or the API server's own end
  of the request; the log says when a stream broke and when it was re-established, naming it;
- a ``@kopf.on.probe`` fails ``/healthz`` (``--liveness``) while a stream has not worked for
  :data:`UNHEALTHY_AFTER_SECONDS` (all three follow from the renewal period,
  ``MONARCH_OPERATOR_WATCH_RENEW_SECONDS``: :class:`WatchTimes`), so that the kubelet
  restarts an operator that cannot get its streams back (a watcher task that died for good
  counts too).

kopf offers no hook on its streams, so :func:`install` wraps two of its functions
(``kopf._cogs.clients.watching.infinite_watch``, one per stream, and
``kopf._cogs.clients.api.stream``, one per watch request); kopf is pinned in pyproject.toml and a
unit test checks that both still exist with the arguments used here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import kopf

logger = logging.getLogger("monarch_operator")

# The API server ends each watch request after this long (a cacher sends a bookmark just
# before): a working stream shows it works at least this often. Whole seconds: kopf sends it
# as the request's timeoutSeconds, which the API server parses as an integer. The default of
# Settings.watch_renew_seconds; the times below follow from it (:class:`WatchTimes`).
RENEW_SECONDS = 30
# A watch request open this long past its renewal (no end from the server) is cut: its
# connection is dead.
STALL_MARGIN_SECONDS = 10.0
# TCP connect, and every other request of kopf (lists, Events): bounded as well.
CONNECT_SECONDS = 10.0
REQUEST_SECONDS = 60.0


@dataclass(frozen=True)
class WatchTimes:
    """The watch times that follow from the renewal period ``renew`` (seconds).

    ``stall``: a request open this long is cut; ``inactivity``: kopf's own reconnection of a
    stream that delivered nothing this long (a backstop only); ``unhealthy_after``: ``/healthz``
    fails while a stream has not worked this long, well over two renewals of a working stream
    (70 s at the default 30: under the 2 minutes C18 allows with kopf's 10 s cache of probe
    results).
    """

    renew: int = RENEW_SECONDS

    @property
    def stall(self) -> float:
        return self.renew + STALL_MARGIN_SECONDS

    @property
    def inactivity(self) -> float:
        return self.stall + STALL_MARGIN_SECONDS

    @property
    def unhealthy_after(self) -> float:
        return 2 * self.renew + STALL_MARGIN_SECONDS


DEFAULT_TIMES = WatchTimes()
STALL_SECONDS = DEFAULT_TIMES.stall
INACTIVITY_SECONDS = DEFAULT_TIMES.inactivity
UNHEALTHY_AFTER_SECONDS = DEFAULT_TIMES.unhealthy_after


@dataclass
class _Stream:
    started: float
    alive: float  # last time it worked (its start counts)
    broken_since: float | None = None  # the request that ended in an error, when
    error: str = ""
    dead: bool = False  # its watcher ended with an error: kopf does not start it again


class StreamHealth:
    """Which watch streams work; thread-safe (the probe may read it from another thread)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 unhealthy_after: float = UNHEALTHY_AFTER_SECONDS) -> None:
        self._clock = clock
        # Seconds without working that make a stream not working (:meth:`not_working`).
        self.unhealthy_after = unhealthy_after
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}

    def started(self, name: str) -> None:
        """Stream ``name`` (e.g. ``pods in 'team-a'``) was started by kopf."""
        now = self._clock()
        with self._lock:
            self._streams[name] = _Stream(started=now, alive=now)

    def stopped(self, name: str) -> None:
        """kopf stopped the stream on purpose (its namespace went, the operator stops)."""
        with self._lock:
            self._streams.pop(name, None)

    def died(self, name: str, error: BaseException) -> None:
        """The stream's watcher ended with ``error``: kopf does not start it again."""
        logger.error("watch stream %s ended for good: %r", name, error)
        with self._lock:
            stream = self._streams.setdefault(name, _Stream(self._clock(), self._clock()))
            stream.dead, stream.error = True, repr(error)

    def alive(self, name: str) -> None:
        """The stream delivered (an event, a bookmark, the server's end of a request)."""
        now = self._clock()
        with self._lock:
            stream = self._streams.setdefault(name, _Stream(started=now, alive=now))
            silent, stream.alive = now - stream.alive, now
            broken_since, stream.broken_since = stream.broken_since, None
        if broken_since is not None:
            logger.info("watch stream %s re-established, %.0fs after it last worked", name,
                        silent)

    def broke(self, name: str, error: BaseException) -> None:
        """A request of the stream ended in ``error`` (reset, cut for silence, refused)."""
        now = self._clock()
        with self._lock:
            stream = self._streams.setdefault(name, _Stream(started=now, alive=now))
            first = stream.broken_since is None
            if first:
                stream.broken_since = now
            stream.error = repr(error)
        if first:
            logger.warning("watch stream %s broke (%r); re-establishing it", name, error)

    def not_working(self, limit: float | None = None) -> dict[str, str]:
        """``{stream: why}`` of the streams that have not worked for ``limit`` seconds
        (:attr:`unhealthy_after` when None), or whose watcher died."""
        limit = self.unhealthy_after if limit is None else limit
        now = self._clock()
        with self._lock:
            return {name: (f"ended for good: {stream.error}" if stream.dead else
                           f"no event, bookmark or end of request for {now - stream.alive:.0f}s"
                           + (f" (last error {stream.error})" if stream.error else ""))
                    for name, stream in sorted(self._streams.items())
                    if stream.dead or now - stream.alive >= limit}

    def seconds_since_working(self) -> dict[str, float]:
        """Seconds since each stream last worked (for ``/healthz``'s answer)."""
        now = self._clock()
        with self._lock:
            return {name: round(now - stream.alive, 1)
                    for name, stream in sorted(self._streams.items())}


HEALTH = StreamHealth()


def stream_name(resource: Any, namespace: str | None) -> str:
    """``pods in 'team-a'``, ``monarchjobs.monarch-operator.dev cluster-wide``."""
    group = f".{resource.group}" if resource.group else ""
    where = f"in {namespace!r}" if namespace is not None else "cluster-wide"
    return f"{resource.plural}{group} {where}"


def configure(settings: kopf.OperatorSettings, times: WatchTimes = DEFAULT_TIMES,
              health: StreamHealth | None = None) -> None:
    """Bound kopf's watch requests and its other requests (see the module docstring) by
    ``times``, and make ``health`` (the process's :data:`HEALTH` when None) judge streams by
    them."""
    settings.watching.server_timeout = times.renew
    settings.watching.client_timeout = times.stall
    settings.watching.connect_timeout = CONNECT_SECONDS
    settings.watching.inactivity_timeout = times.inactivity
    (HEALTH if health is None else health).unhealthy_after = times.unhealthy_after
    settings.networking.request_timeout = REQUEST_SECONDS
    settings.networking.connect_timeout = CONNECT_SECONDS


def install(health: StreamHealth = HEALTH) -> None:
    """Wrap kopf's per-stream and per-request watch functions so that ``health`` learns what
    each stream does (once per process; later calls do nothing)."""
    from kopf._cogs.clients import api, watching

    if getattr(api.stream, "_observed", False):
        return
    streams: dict[str, str] = {}  # URL path of a stream's requests -> its name
    request_stream = api.stream
    infinite_watch = watching.infinite_watch

    async def observed_infinite_watch(**kwargs: Any) -> AsyncIterator[Any]:
        name = stream_name(kwargs["resource"], kwargs.get("namespace"))
        streams[urlsplit(kwargs["resource"].get_url(namespace=kwargs.get("namespace"))).path] = name
        health.started(name)
        try:
            async with contextlib.aclosing(infinite_watch(**kwargs)) as events:
                async for item in events:
                    yield item
        except (asyncio.CancelledError, GeneratorExit):
            health.stopped(name)
            raise
        except Exception as error:
            health.died(name, error)
            raise
        health.stopped(name)

    async def observed_stream(url: str, **kwargs: Any) -> AsyncIterator[Any]:
        name = streams.get(urlsplit(url).path) if "watch=true" in url else None
        if name is None:
            async with contextlib.aclosing(request_stream(url, **kwargs)) as lines:
                async for item in lines:
                    yield item
            return
        try:
            async with contextlib.aclosing(request_stream(url, **kwargs)) as lines:
                async for item in lines:
                    health.alive(name)
                    yield item
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as error:
            health.broke(name, error)
            raise
        health.alive(name)  # the API server ended the request: the stream works

    observed_stream._observed = True  # type: ignore[attr-defined]
    api.stream = observed_stream
    watching.infinite_watch = observed_infinite_watch


@kopf.on.probe(id="watch_streams")
def watch_streams(**_: Any) -> dict[str, float]:
    """``/healthz``: seconds since each watch stream last worked; fails (HTTP 500) while one
    has not worked for :data:`UNHEALTHY_AFTER_SECONDS` or died.

    Raises:
        kopf.PermanentError: naming each such stream and why.
    """
    broken = HEALTH.not_working()
    if broken:
        raise kopf.PermanentError("watch streams not working: " + "; ".join(
            f"{name}: {why}" for name, why in broken.items()))
    return HEALTH.seconds_since_working()
