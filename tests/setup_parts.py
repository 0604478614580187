"""The set-up that runs beside the tests: which of its parts have ended.

``scripts/test.sh`` starts ``scripts/setup.sh --images`` with ``MONARCH_SETUP_STATE`` set to a
folder and starts pytest once the ``venv`` part is done; the set-up writes ``NAME.done`` or
``NAME.failed`` there as each part ends (its seconds inside) and ``all.done`` or ``all.failed``
at its end. Without that variable (pytest run by hand, after a set-up) every part counts as
ended. The scheduler (``tests/parallel.py``) gives a test folder its units once the parts it
needs have ended; a test that needs a part and is not scheduled by folder waits with
:func:`wait_for`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

STATE_ENV = "MONARCH_SETUP_STATE"
# Every part of scripts/setup.sh --images, in the order it prints them.
PARTS = ("venv", "control-plane", "node", "helm", "kueue", "scanners", "images", "coredns-image")
POLL_SECONDS = 2.0
PROGRESS_SECONDS = 60.0


def state_dir() -> Path | None:
    """The folder the running set-up writes its parts' ends to, or None when there is none."""
    value = os.environ.get(STATE_ENV)
    return Path(value) if value else None


def ended(part: str, state: Path | None = None) -> bool:
    """Whether set-up part ``part`` (one of :data:`PARTS`) has ended, done or failed: true when
    no set-up runs beside the tests, or when the whole set-up has ended (a part it never
    started, such as the images after a failed venv, ends with it).

    Raises:
        ValueError: ``part`` is not a part of the set-up.
    """
    if part not in PARTS:
        raise ValueError(f"not a set-up part: {part!r} (the parts: {', '.join(PARTS)})")
    state = state if state is not None else state_dir()
    if state is None or not state.is_dir():
        return True
    return any((state / name).exists() for name in
               (f"{part}.done", f"{part}.failed", "all.done", "all.failed"))


def wait_for(part: str, timeout: float = 3600.0,
             progress: Callable[[str], None] = print) -> None:
    """Block until set-up part ``part`` has ended (see :func:`ended`), with a progress line
    a minute; the test that needs the part then finds it, or fails on its absence itself.

    Raises:
        TimeoutError: the part has not ended within ``timeout`` seconds.
    """
    start = time.monotonic()
    said = start
    while not ended(part):
        now = time.monotonic()
        if now - start > timeout:
            raise TimeoutError(f"set-up part {part!r} has not ended after {timeout:.0f} s "
                               f"(the set-up's log: {state_dir()}/setup.log)")
        if now - said >= PROGRESS_SECONDS:
            progress(f"[setup] waiting for the set-up part {part!r} ({now - start:.0f} s)")
            said = now
        time.sleep(POLL_SECONDS)


def outcomes(state: Path | None = None) -> dict[str, tuple[str, float]]:
    """Each part that has ended, and the whole set-up (``"all"``) once it has: ``{name:
    ("done" | "failed", seconds)}``, empty without a set-up beside the tests."""
    state = state if state is not None else state_dir()
    found: dict[str, tuple[str, float]] = {}
    if state is None or not state.is_dir():
        return found
    for name in (*PARTS, "all"):
        for outcome in ("done", "failed"):
            path = state / f"{name}.{outcome}"
            if path.exists():
                try:
                    seconds = float(path.read_text().strip() or 0)
                except (OSError, ValueError):
                    seconds = 0.0
                found[name] = (outcome, seconds)
    return found
