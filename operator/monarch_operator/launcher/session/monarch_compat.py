"""Every use of Monarch's private modules (``monarch._src...``, the Rust bindings), in one place.

torchmonarch exports ``SSHJob``, ``SupervisionError`` and the ``ActorError`` internals only from
private modules, which may move in any release. Everything of ours that needs them imports them
from here, and :func:`check_version` says clearly which torchmonarch versions this release was
tested with, so that an upgrade fails in this file with a readable message instead of somewhere
deep in a run.

Importing this module imports Monarch: do it only after the plan and the pre-flight have passed.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

# torchmonarch releases this module was written against (the wrappers below were read in their
# source). Others are refused with a message, unless MONARCH_LAUNCH_ANY_MONARCH=1.
SUPPORTED_VERSIONS = ("0.7.",)
_OVERRIDE_ENV = "MONARCH_LAUNCH_ANY_MONARCH"


class MonarchVersionError(RuntimeError):
    """The installed torchmonarch is not one this release supports; the message says which."""


def check_version() -> str:
    """Return the installed torchmonarch version if it is supported.

    Raises:
        MonarchVersionError: torchmonarch is missing or of an untested version (set
            ``MONARCH_LAUNCH_ANY_MONARCH=1`` to try it anyway).
    """
    import os

    try:
        version = importlib.metadata.version("torchmonarch")
    except importlib.metadata.PackageNotFoundError:
        raise MonarchVersionError(
            "torchmonarch is not installed in this Python; install the version this "
            f"monarch-operator release was tested with ({', '.join(SUPPORTED_VERSIONS)}x)"
        ) from None
    if not version.startswith(SUPPORTED_VERSIONS) and os.environ.get(_OVERRIDE_ENV) != "1":
        raise MonarchVersionError(
            f"torchmonarch {version} is installed but monarch-operator uses private Monarch "
            f"APIs tested only with {', '.join(v + 'x' for v in SUPPORTED_VERSIONS)}; install "
            f"one of those, or set {_OVERRIDE_ENV}=1 to try anyway"
        )
    return version


check_version()

# ruff: noqa: E402 - the version check must run before the private imports below.
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch._src.actor import actor_mesh as _actor_mesh
from monarch._src.job.job import ProcessState, SSHJob, service_proc_addr

ActorError = _actor_mesh.ActorError
ActorMesh = _actor_mesh.ActorMesh

__all__ = [
    "ActorError",
    "ActorMesh",
    "ProcessState",
    "SSHJob",
    "SupervisionError",
    "add_note_to_actor_errors",
    "check_version",
    "service_proc_addr",
]

_NOTED = "__monarch_launch_noted__"


def add_note_to_actor_errors(describe: Callable[[], str | None]) -> None:
    """In this proc, add ``describe()`` as a note to every exception an endpoint raises.

    Monarch wraps an exception raised in an endpoint into ``ActorError`` in the proc that ran
    it, formatting the traceback there (torchmonarch 0.7.0, ``actor_mesh.py``,
    ``ActorError.__init__``). A note added before that formatting travels in the traceback text
    to the controller, so the controller learns which role, rank and host raised. Idempotent.

    Args:
        describe: returns the note (e.g. ``"raised on trainer rank 1 (host h, local rank 1)"``)
            or None to add nothing.
    """
    original = ActorError.__init__
    if getattr(original, _NOTED, False):
        return

    def init(self: Any, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        note = describe()
        if note and note not in getattr(exception, "__notes__", ()):
            exception.add_note(note)
        original(self, exception, *args, **kwargs)

    setattr(init, _NOTED, True)
    ActorError.__init__ = init  # type: ignore[method-assign]
