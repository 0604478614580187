"""Fixtures of the cluster tests only (the cluster itself and the operator: tests/conftest.py;
Kueue here)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl
from monarch_operator.localcluster.kueue import KueueProcess
from tests.conftest import OperatorProcess


@pytest.fixture(scope="session")
def core(local_cluster: LocalCluster) -> Iterator[kubernetes.client.CoreV1Api]:
    """The core API of the local cluster through the typed client (closed at the end)."""
    api = kubernetes.config.new_client_from_config(str(local_cluster.kubeconfig))
    try:
        yield kubernetes.client.CoreV1Api(api)
    finally:
        api.close()


@pytest.fixture
def scripts(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A folder for one test's scripts that the pods (local processes of other users) can
    read: ``/tmp/<test module>-<8 hex>``, deleted with what is in it after the test."""
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    path = Path(f"/tmp/{module}-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def kueue(local_cluster: LocalCluster, kubectl: Kubectl,
          operator_process: OperatorProcess) -> Iterator[KueueProcess]:
    """Kueue (:data:`~monarch_operator.localcluster.kueue.KUEUE_VERSION`, built from the Go
    module proxy on first use) running against the local cluster for one test module, with
    MonarchJob as an external framework and ``waitForPodsReady`` at
    :data:`KUEUE_PODS_READY_TIMEOUT_SECONDS`. Its webhooks go when the module ends (they would
    refuse every pod without it); its CRDs stay."""
    process = KueueProcess(local_cluster.state_dir, local_cluster.kubeconfig, kubectl,
                           pods_ready_timeout_seconds=KUEUE_PODS_READY_TIMEOUT_SECONDS,
                           stop_with_owner=True)
    try:
        process.up()
        # The operator watches Workloads from its start; a running one may have started
        # before Kueue's CRDs existed.
        operator_process.default_env = {"MONARCH_OPERATOR_KUEUE": "true"}
        operator_process.start(**operator_process.default_env)
        yield process
    finally:
        operator_process.default_env = {}
        process.down()


# Kueue evicts an admitted job whose PodsReady is not True by then (the tests' kwok pods are
# Ready within seconds).
KUEUE_PODS_READY_TIMEOUT_SECONDS = 60
