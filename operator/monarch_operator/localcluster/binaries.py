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


def ensure_helm() -> Path:
    """Return the path of the pinned ``helm`` client (v3, built from the Go module proxy).

    Built once by ``build-binaries.sh helm`` into ``~/.cache/monarch-operator/bin/helm-<version>/``
    (or under ``$MONARCH_OPERATOR_CACHE``): about 2 minutes from an empty Go module cache.

    Raises:
        RuntimeError: the build failed; the message names the script, the Go output precedes it.
    """
    result = subprocess.run(["bash", str(BUILD_SCRIPT), "helm"], stdout=subprocess.PIPE,
                            stderr=None, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"building helm failed (exit {result.returncode}); see the Go output "
                           f"above. Script: {BUILD_SCRIPT} helm")
    helm = Path(result.stdout.strip().splitlines()[-1]) / "helm"
    if not os.access(helm, os.X_OK):
        raise RuntimeError(f"build finished but {helm} is missing")
    return helm


NODE_NAMES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr", "coredns",
              "kube-router", "fake-gpu-plugin")


def ensure_node_binaries() -> Path:
    """Return the directory holding what a real node runs (:data:`NODE_NAMES`), building
    missing ones: kubelet and kube-proxy (the control plane's Kubernetes version), containerd
    2.x, CoreDNS, kube-router (its NetworkPolicy firewall) and our fake GPU device plugin
    (``localcluster/node/gpuplugin``).

    Built once by ``build-binaries.sh node`` into ``~/.cache/monarch-operator/bin/node-<versions>/``
    (or under ``$MONARCH_OPERATOR_CACHE``): about 10 minutes on 2 cores from an empty cache.

    Raises:
        RuntimeError: the build failed (the Go output precedes it) or left a binary missing.
    """
    result = subprocess.run(["bash", str(BUILD_SCRIPT), "node"], stdout=subprocess.PIPE,
                            stderr=None, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"building the node binaries failed (exit {result.returncode}); see "
                           f"the Go output above. Script: {BUILD_SCRIPT} node")
    bin_dir = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in NODE_NAMES if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise RuntimeError(f"build finished but {missing} are missing in {bin_dir}")
    return bin_dir
