"""Locate (and on first use build) the pinned control-plane binaries."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).with_name("build-binaries.sh")
NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")


def ensure_binaries() -> Path:
    """Return the directory holding every binary in :data:`NAMES`, building missing ones.

    Binaries are cached under ``~/.cache/monarch-operator/bin/<versions>/`` (or
    ``$MONARCH_OPERATOR_CACHE``); a build from an empty cache takes 10-25 minutes on 2 cores.

    Raises:
        RuntimeError: the build failed; the message carries the end of the Go output.
    """
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=None, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"building the control-plane binaries failed (exit {result.returncode}); "
                           f"see the Go output above. Script: {BUILD_SCRIPT}")
    bin_dir = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in NAMES if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise RuntimeError(f"build finished but {missing} are missing in {bin_dir}")
    return bin_dir
