"""No handler waits forever for the index of a namespace that is gone (seen in CI: an operator
restarted while a test namespace was being deleted never handled another job).

kopf calls no handler until every index is filled (``operator_indexed``, a set of toggles, all
on). Each watcher of an indexed kind, one per kind and namespace, holds a toggle off until its
first list is done, and each object's first event holds one until the object is indexed. When
a watched namespace goes (deleted, or no longer matching ``--namespace`` patterns) kopf stops
its watchers and their object workers, and with kopf 1.45.2 a watcher stopped before its first
list ended, or a worker stopped before its first event was processed, leaves its toggle off for
good: from then on no handler of any job in any namespace runs, while ``/healthz`` still
answers, because every stream works.

:func:`install` wraps kopf's ``queueing.watcher`` and ``queueing.worker`` (looked up by name
at each call by kopf's orchestration and watcher) so that when either ends, however it ends,
the toggle it was given is dropped: a toggle that had done its job is already gone (dropping
it again does nothing), one that had not must not hold every other job back. kopf is pinned in
pyproject.toml; a unit test checks that both functions still take these arguments and that a
namespace stopped before its first list no longer blocks the operator.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger("monarch_operator")


async def _drop(operator_indexed: Any, toggle: Any, what: str) -> None:
    """Drop ``toggle`` from ``operator_indexed`` unless already dropped (shielded: the task
    that ends may be being cancelled)."""
    if operator_indexed is None or toggle is None or toggle not in operator_indexed:
        return
    logger.info("index readiness: %s ended before it was indexed; it holds no handler back",
                what)
    await asyncio.shield(operator_indexed.drop_toggle(toggle))


def install() -> None:
    """Wrap kopf's watcher and object worker as the module says (once per process; later
    calls do nothing)."""
    from kopf._core.reactor import queueing

    if getattr(queueing.watcher, "_drops_toggles", False):
        return
    watcher, worker = queueing.watcher, queueing.worker

    async def dropping_watcher(**kwargs: Any) -> None:
        try:
            await watcher(**kwargs)
        finally:
            await _drop(kwargs.get("operator_indexed"), kwargs.get("resource_indexed"),
                        f"the watcher of {kwargs.get('resource')} in "
                        f"{kwargs.get('namespace') or 'the cluster'}")

    async def dropping_worker(**kwargs: Any) -> None:
        try:
            await worker(**kwargs)
        finally:
            await _drop(kwargs.get("operator_indexed"), kwargs.get("resource_indexed"),
                        f"the worker of {kwargs.get('key')}")

    dropping_watcher._drops_toggles = True  # type: ignore[attr-defined]
    queueing.watcher = dropping_watcher  # type: ignore[assignment]
    queueing.worker = dropping_worker  # type: ignore[assignment]
