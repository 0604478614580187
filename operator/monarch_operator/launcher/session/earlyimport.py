"""Monarch imported while the pre-flight runs (issue 36 item 2).

The launcher needs Monarch only once its hosts passed the pre-flight, and importing it (its Rust
extension, the actor and job modules) takes 0.5-1.3 s of CPU, while the pre-flight spends about
a second waiting on ssh. :func:`start` begins the import in a thread of its own before the
pre-flight; :func:`finish` (called before the first Monarch use, by
:func:`.lifecycle.install_fault_hook`) waits for it. The apply -> first step timeline in
docs/performance.md shows the two steps one after the other before this.

Monarch reads its settings from the environment when its extension loads, so :func:`start` sets
them first: the supervision poll and the bounded log file (:func:`.environment.bound_monarch_log`).
An import that fails in the thread is left to the caller: the module is not in ``sys.modules``,
the caller imports it again and gets the error itself.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence

from monarch_operator.launcher.session.environment import bound_monarch_log

# How often Monarch checks that procs are alive: a worker dying mid-run is then seen within
# about a second instead of at a call timeout (measured: 8.4 s -> 0.35 s for an exiting proc).
SUPERVISION_POLL = "500ms"
SUPERVISION_POLL_ENV = "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"
# What every launch imports after the pre-flight (lifecycle.started_job and the fault hook).
MONARCH_MODULES = ("monarch.actor", "monarch.config",
                   "monarch_operator.launcher.session.sshjob")

_started: list[threading.Thread] = []


def monarch_environment() -> None:
    """Set Monarch's environment for this process and what it starts (idempotent); call it
    before Monarch's first import."""
    os.environ.setdefault(SUPERVISION_POLL_ENV, SUPERVISION_POLL)
    bound_monarch_log(os.environ)


def start(extra: Sequence[str] = ()) -> None:
    """Start importing :data:`MONARCH_MODULES` and ``extra`` (module names) in a thread; at most
    one such thread per process (a second call does nothing). Returns at once.

    The thread is not a daemon: a launcher that ends early (a failed pre-flight) waits for the
    import to finish (at most the import's own time) rather than tearing down an interpreter
    with an extension half loaded.
    """
    if _started:
        return
    monarch_environment()
    names = [*MONARCH_MODULES, *extra]

    def load() -> None:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 (left to the caller, which imports it again)
                return

    thread = threading.Thread(target=load, name="monarch-import")
    _started.append(thread)
    thread.start()


def finish() -> None:
    """Wait for :func:`start`'s import (no-op when none was started); then set Monarch's
    environment in case :func:`start` was not called."""
    for thread in _started:
        thread.join()
    monarch_environment()
