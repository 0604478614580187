"""A namespace that goes before kopf indexed it holds no handler back
(controller/engine/indexready.py): kopf's own orchestration (``spawn_missing_watchers``, then
``terminate_redundancies`` as when the namespace is deleted) with a watch whose first list
never ends, as when the namespace goes while its list is in flight."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import watching
from kopf._cogs.structs import references
from kopf._core.reactor import orchestration, queueing

from monarch_operator.controller.engine import indexready

PODS = references.Resource("", "v1", "pods", namespaced=True)


async def _never_listed(**_: Any):
    await asyncio.Event().wait()  # the first list is still in flight when the namespace goes
    yield  # pragma: no cover


async def _namespace_gone_before_its_list() -> tuple[bool, bool]:
    """(indexed before the namespace went, indexed after): kopf's orchestration, one indexed
    kind in namespaces ``a`` and ``b``; ``b`` goes while ``a`` and ``b`` have not listed."""
    operator_paused = aiotoggles.ToggleSet(any)
    ensemble = orchestration.Ensemble(
        operator_indexed=aiotoggles.ToggleSet(all), operator_paused=operator_paused,
        peering_missing=await operator_paused.make_toggle(name="peering"))

    async def processor(**_: Any) -> None:
        return None

    await orchestration.spawn_missing_watchers(
        processor=processor, settings=kopf.OperatorSettings(), indexed_resources={PODS},
        watched_resources={PODS}, watched_namespaces={"a", "b"}, ensemble=ensemble)
    await asyncio.sleep(0.05)
    before = ensemble.operator_indexed.is_on()
    await orchestration.terminate_redundancies(remaining_resources={PODS},
                                               remaining_namespaces={"a"}, ensemble=ensemble)
    # Namespace "a" finishes its first list: now nothing should hold the handlers back.
    [toggle] = [toggle for toggle in ensemble.operator_indexed if "@a" in (toggle.name or "")]
    await ensemble.operator_indexed.drop_toggle(toggle)
    after = ensemble.operator_indexed.is_on()
    await orchestration.terminate_redundancies(remaining_resources=set(),
                                               remaining_namespaces=set(), ensemble=ensemble)
    return before, after


@pytest.fixture
def kopf_reactor(monkeypatch):
    """kopf's queueing functions restored after the test (install() replaces them)."""
    monkeypatch.setattr(watching, "infinite_watch", _never_listed)
    monkeypatch.setattr(queueing, "watcher", queueing.watcher)
    monkeypatch.setattr(queueing, "worker", queueing.worker)


def test_kopf_alone_blocks_every_handler_for_good(kopf_reactor):
    """The fault this module works around, on the pinned kopf: should a kopf release fix it,
    this fails, and indexready can go."""
    before, after = asyncio.run(_namespace_gone_before_its_list())
    assert (before, after) == (False, False)


def test_with_install_the_gone_namespace_holds_nothing_back(kopf_reactor):
    indexready.install()
    before, after = asyncio.run(_namespace_gone_before_its_list())
    assert (before, after) == (False, True)


def test_install_wraps_the_functions_kopf_calls_by_name():
    """kopf looks both up at each call, with these keyword arguments (kopf is pinned)."""
    for function in (queueing.watcher, queueing.worker):
        assert {"operator_indexed", "resource_indexed"} <= set(
            inspect.signature(inspect.unwrap(function)).parameters)
    assert "queueing.watcher(" in inspect.getsource(orchestration.spawn_missing_watchers)
    assert "coro=worker(" in inspect.getsource(queueing.watcher)
