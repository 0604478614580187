"""The write fence: once this replica's leadership is in doubt (its renew deadline passed, it
lost or released the Lease), every write request of the operator is refused in the process,
before it reaches the network (field case C32, issue 34 item 2).

Stopping kopf takes a moment, and a process that was paused (SIGSTOP, a stalled VM, CPU
starvation) resumes its handlers before its elector notices anything; without a fence these
could write after a standby took over. The check is made on each request, on the elector's
clock, so it holds however late the elector's own thread runs.

Two paths carry the operator's writes, and both are wrapped (once per process):

- the Kubernetes client's ``RESTClientObject.request`` (every pass of the reconcile loop);
- kopf's ``kopf._cogs.clients.api.request`` (its annotations, status progress, Events).

Reads (GET, and kopf's watch streams) pass: they change nothing. The elector's own client
(:mod:`.lease`) calls :data:`UNFENCED_REQUEST` directly.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from kubernetes.client import rest

logger = logging.getLogger("monarch_operator.leader")

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The client's request as it was before install(): what the elector's own client calls.
UNFENCED_REQUEST: Callable[..., Any] = rest.RESTClientObject.request


class FencedError(RuntimeError):
    """A write refused because this replica may no longer write (not the leader any more)."""


def _refuse(method: str, url: str) -> FencedError:
    logger.error("leader election: refused %s %s: this replica is not the leader any more",
                 method.upper(), url)
    return FencedError(f"{method.upper()} {url} refused: not the leader (leader election)")


def install(may_write: Callable[[], bool]) -> None:
    """Refuse every write of the operator from now on whenever ``may_write()`` is false.

    ``may_write`` is asked on each write request (e.g. :meth:`.Elector.may_write`); a refused
    request raises :class:`FencedError` in its caller. Installing again replaces the check.
    """
    state = _STATE
    state["may_write"] = may_write
    if state.get("installed"):
        return
    state["installed"] = True

    @functools.wraps(UNFENCED_REQUEST)
    def fenced_request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in WRITE_METHODS and not state["may_write"]():
            raise _refuse(method, url)
        return UNFENCED_REQUEST(self, method, url, *args, **kwargs)

    rest.RESTClientObject.request = fenced_request

    from kopf._cogs.clients import api

    kopf_request = state["kopf_request"] = api.request

    @functools.wraps(kopf_request)
    async def fenced_kopf_request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in WRITE_METHODS and not state["may_write"]():
            raise _refuse(method, url)
        return await kopf_request(method, url, *args, **kwargs)

    api.request = fenced_kopf_request


def uninstall() -> None:
    """Undo :func:`install` (tests: the wrapped functions are process-wide)."""
    if not _STATE.pop("installed", False):
        return
    rest.RESTClientObject.request = UNFENCED_REQUEST
    from kopf._cogs.clients import api

    api.request = _STATE.pop("kopf_request")


_STATE: dict[str, Any] = {}
