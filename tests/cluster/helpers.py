"""Small helpers shared by the cluster tests: waiting for a condition, reading an object."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str,
               interval: float = 0.5) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy.

    Returns:
        That value.

    Raises:
        AssertionError: ``timeout`` seconds passed first; the message names ``what``.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def get_json(kubectl: Callable[..., str], *args: str) -> Any:
    """``kubectl get ARGS -o json`` as a dict, or None when the object does not exist."""
    out = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out) if out else None
