"""Shared fixtures: the local control plane, the operator process, a namespace per test.

The cluster fixtures build the pinned binaries on first use (cached under
~/.cache/monarch-operator). If a binary cannot be built the fixture fails with the build's
error: cluster and end-to-end tests never fall back to a mock API.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl, install_crds, start_operator, stop_process


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("localcluster"), nodes=3, gpus_per_node=8)
    cluster.up(progress=lambda message: print(f"[localcluster] {message}", flush=True))
    try:
        yield cluster
    finally:
        cluster.down(quiet=True)


@pytest.fixture(scope="session")
def kubectl(local_cluster: LocalCluster) -> Kubectl:
    return Kubectl(local_cluster.env())


@pytest.fixture(scope="session")
def operator(local_cluster: LocalCluster, kubectl: Kubectl) -> Iterator[Path]:
    """The CRDs installed and ``monarch-operator`` running; yields its log path."""
    install_crds(kubectl)
    process = start_operator(local_cluster.state_dir, local_cluster.env())
    log_path = local_cluster.state_dir / "logs" / "operator.log"
    try:
        yield log_path
    finally:
        stop_process(process)
    assert process.returncode in (0, -15), log_path.read_text()[-3000:]


@pytest.fixture
def namespace(kubectl: Kubectl, operator: Path) -> Iterator[str]:
    """A fresh namespace; its MonarchJobs are deleted while the operator still runs."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl("delete", "monarchjobs", "--all", "-n", name, "--wait=true", "--timeout=60s",
                check=False)
        kubectl("delete", "namespace", name, "--wait=false", check=False)
