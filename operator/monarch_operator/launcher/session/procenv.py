"""Runs inside every Monarch proc before any actor: sets the proc's environment variables.

Passed to ``HostMesh.spawn_procs(bootstrap=...)`` with :func:`functools.partial`, so it must stay
importable on the workers and cheap: standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def set_environment(variables: Mapping[str, str]) -> None:
    """Set ``variables`` in ``os.environ`` of the calling proc (e.g. its CUDA_VISIBLE_DEVICES).

    Runs before the role's actor class is unpickled, so before torch initialises CUDA.
    """
    os.environ.update(variables)
