"""Locate (and on first use build) the pinned control-plane binaries."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).with_name("build-binaries.sh")
NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")


def ensure_binaries() -> Path:
    """Return the directory holding every binary in :data:`NAMES`, building missing ones.

    Binaries are cached under ``~/.cache/monarch-operator/bin/<versions>/`` (or
    ``$MONARCH_OPERATOR_CACHE``); a build from an empty cache takes 10-15 minutes on 2 cores.

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
GPU_PLUGIN_SOURCE = Path(__file__).with_name("node") / "gpuplugin"


def gpu_plugin_name(source: Path = GPU_PLUGIN_SOURCE) -> str:
    """The file name of the fake GPU plugin built from this checkout's source:
    ``fake-gpu-plugin-<hash>``, the hash as ``build-binaries.sh`` takes it (sha256 of go.mod,
    go.sum and the .go files in name order, 12 hex digits).

    The node starts this name, not the ``fake-gpu-plugin`` link: checkouts of other versions
    on the machine share the binary folder and point the link at their own build (a node came
    up with a plugin without the health hook its tests set).
    """
    digest = hashlib.sha256()
    for path in [source / "go.mod", source / "go.sum", *sorted(source.glob("*.go"))]:
        digest.update(path.read_bytes())
    return f"fake-gpu-plugin-{digest.hexdigest()[:12]}"


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
    missing = [name for name in (*NODE_NAMES, gpu_plugin_name())
               if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise RuntimeError(f"build finished but {missing} are missing in {bin_dir}")
    return bin_dir
