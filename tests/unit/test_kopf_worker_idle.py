"""kopf's worker of an object lets go of the last event it handled soon after it
(controller/handlers.configure_queueing): kopf's own watcher and worker, fed one event by a
stand-in watch stream, with the operator's queueing settings and with kopf's defaults."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import watching
from kopf._cogs.structs import references
from kopf._core.reactor import queueing

from monarch_operator.controller import handlers

PODS = references.Resource("", "v1", "pods", namespaced=True)


class RawEvent(dict):
    """A watch event that a weak reference can follow (a plain dict cannot)."""


async def _held_after(settings: kopf.OperatorSettings, seconds: float) -> bool:
    """Whether kopf still holds an event it handled ``seconds`` after handling it (False as soon
    as it lets go, checked every 50 ms)."""
    handled = asyncio.Event()
    # The event looked at, then one of another object: kopf's watcher holds the latest event
    # of its stream until the next comes, which in a busy stream is at once.
    events = [RawEvent(type="ADDED", object={"metadata": {"uid": uid, "name": uid,
                                                          "namespace": "ns"}})
              for uid in ("u2", "u1")]
    ref = weakref.ref(events[-1])

    async def two_events(**_: Any):
        while events:
            yield events.pop()  # nothing but kopf refers to it from here on
        await asyncio.Event().wait()  # the stream stays open, with nothing more to say

    async def processor(raw_event: dict[str, Any], **_: Any) -> None:
        if raw_event["object"]["metadata"]["uid"] == "u2":
            handled.set()

    original = watching.infinite_watch
    watching.infinite_watch = two_events
    try:
        watcher = asyncio.create_task(queueing.watcher(
            namespace="ns", settings=settings, resource=PODS, processor=processor))
        await asyncio.wait_for(handled.wait(), 10)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            gc.collect()
            if ref() is None:
                break
            await asyncio.sleep(0.05)
        held = ref() is not None
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        return held
    finally:
        watching.infinite_watch = original


@pytest.fixture
def plain_kopf(monkeypatch):
    """kopf's own watcher and worker (the operator's process wraps them; not here)."""
    monkeypatch.setattr(queueing, "watcher", queueing.watcher)
    monkeypatch.setattr(queueing, "worker", queueing.worker)


def test_kopf_alone_holds_the_last_event_while_its_worker_idles(plain_kopf):
    """Why the setting exists, on the pinned kopf: its default idle wait (5 s) keeps the
    handled event for seconds (should a kopf release change that, this fails)."""
    assert asyncio.run(_held_after(kopf.OperatorSettings(), 2.0))


def test_the_operators_worker_lets_go_of_the_event_soon_after(plain_kopf):
    settings = kopf.OperatorSettings()
    handlers.configure_queueing(settings)
    assert settings.queueing.idle_timeout == handlers.OBJECT_WORKER_IDLE_SECONDS
    # Well before kopf's default 5 s, with room for a loaded machine.
    assert not asyncio.run(_held_after(settings, 4.0))
