"""The peer in ``operator_scale.py``: Kubeflow's MPI Operator, built from the Go module proxy.

``ensure_mpi_operator()`` downloads the module at exactly ``MPI_OPERATOR_VERSION`` (``go mod
download -json``; ``go install ...@v0.8.2`` fails on the proxy's version list), builds
``./cmd/mpi-operator`` inside a writable copy and caches the binary and the CRD
(``manifests/base/kubeflow.org_mpijobs.yaml``) in ``~/.cache/monarch-operator/bin/
mpi-operator-<version>/``, like the control-plane binaries. ``mpijob()`` writes an MPIJob
(``kubeflow.org/v2beta1``) of the benchmark's shape, ``command()`` the operator's command line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

MPI_OPERATOR_MODULE = "github.com/kubeflow/mpi-operator"
MPI_OPERATOR_VERSION = "v0.8.2"
# The MPI Operator always serves its leader-election health check here (no flag; all interfaces).
HEALTH_PORT = 8080
# Defaults of its -kube-api-qps and -kube-api-burst flags (cmd/mpi-operator/app/options), and of
# -controller-queue-rate-limit and -controller-queue-burst (its work queue's token bucket).
DEFAULT_QPS, DEFAULT_BURST = 5, 10
DEFAULT_QUEUE_RATE, DEFAULT_QUEUE_BURST = 10, 100


def cache_dir() -> Path:
    """``$MONARCH_OPERATOR_CACHE`` or ``~/.cache/monarch-operator`` (shared with the cluster)."""
    return Path(os.environ.get("MONARCH_OPERATOR_CACHE", Path.home() / ".cache/monarch-operator"))


def ensure_mpi_operator(progress: Any = print) -> tuple[Path, Path]:
    """Build the MPI Operator once; returns ``(binary, crd_yaml)``.

    Raises:
        RuntimeError: ``go mod download`` or ``go build`` failed; the message ends with the
            command's own output.
    """
    target = cache_dir() / "bin" / f"mpi-operator-{MPI_OPERATOR_VERSION}"
    binary, crd = target / "mpi-operator", target / "kubeflow.org_mpijobs.yaml"
    if binary.exists() and crd.exists():
        return binary, crd
    progress(f"building {MPI_OPERATOR_MODULE}@{MPI_OPERATOR_VERSION} (first time: minutes)")
    module = json.loads(_run(["go", "mod", "download", "-json",
                              f"{MPI_OPERATOR_MODULE}@{MPI_OPERATOR_VERSION}"], Path.cwd()))
    source = cache_dir() / "build" / f"mpi-operator-{MPI_OPERATOR_VERSION}"
    if not (source / "go.mod").exists():
        # The module cache is read-only; go build wants to write nothing there, but a copy
        # keeps the cache pristine and lets a failed build be retried from the same place.
        shutil.copytree(module["Dir"], source, dirs_exist_ok=True)
        for path in (source, *source.rglob("*")):
            path.chmod(path.stat().st_mode | 0o200)
    target.mkdir(parents=True, exist_ok=True)
    _run(["go", "build", "-o", str(binary), "./cmd/mpi-operator"], source)
    shutil.copyfile(source / "manifests/base/kubeflow.org_mpijobs.yaml", crd)
    return binary, crd


def _run(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (exit {result.returncode}):\n"
                           f"{(result.stderr or result.stdout)[-3000:]}")
    return result.stdout


def command(binary: Path, kubeconfig: Path, namespace: str, qps: int, burst: int,
            queue_rate: int, queue_burst: int) -> list[str]:
    """The out-of-cluster command line: watch ``namespace`` only, hold its leader lease there
    (``-lock-namespace``), client rate limit ``qps``/``burst``, work-queue rate limit
    ``queue_rate``/``queue_burst`` (items per second); no metrics port."""
    return [str(binary), f"-kubeConfig={kubeconfig}", f"-namespace={namespace}",
            f"-lock-namespace={namespace}", f"-kube-api-qps={qps}", f"-kube-api-burst={burst}",
            f"-controller-queue-rate-limit={queue_rate}",
            f"-controller-queue-burst={queue_burst}", "-monitoring-port=0"]


def mpijob(name: str, workers: int, worker_metadata: dict[str, Any],
           launcher_metadata: dict[str, Any], image: str, gpu_resource: str) -> dict[str, Any]:
    """An MPIJob with ``workers`` one-GPU workers whose launcher is created once every worker
    is Ready (``launcherCreationPolicy: WaitForWorkersReady``); running workers are deleted when
    the job finishes (``cleanPodPolicy: Running``, explicit). Containers have explicit commands.
    """
    return {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": 1,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": {
                    "metadata": launcher_metadata,
                    "spec": {"containers": [{"name": "launcher", "image": image,
                                             "command": ["mpirun", "-n", str(workers), "true"]}]},
                }},
                "Worker": {"replicas": workers, "template": {
                    "metadata": worker_metadata,
                    "spec": {"containers": [{"name": "worker", "image": image,
                                             "command": ["/usr/sbin/sshd", "-De"],
                                             "resources": {"limits": {gpu_resource: "1"}}}]},
                }},
            },
        },
    }
