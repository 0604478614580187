"""End-to-end tests run on real nodes: a local control plane whose two nodes run the upstream
kubelet, containerd with runc, kube-proxy, the CNI bridge and CoreDNS, with the worker,
operator and example images built from ``images/`` and ``examples/`` (issue 19).

The fixtures of ``tests/conftest.py`` are registered again here, so that in this folder
``kubectl``, ``operator``, ``namespace`` ... use this cluster; the kwok cluster of the other
cluster tests is a different fixture and may run at the same time. One cluster with real nodes
runs on a machine at a time (fixed addresses): run e2e tests in one pytest process.

The cluster, its kubectl and its operator are package fixtures: they go as soon as the last
test of this folder is done, not at the end of the session, so that the pytest worker that ran
this folder runs its other modules without a real-node cluster idling beside them (about 25
minutes of a two-worker run).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl
from tests.conftest import (  # noqa: F401  (fixtures re-registered for this cluster)
    OperatorProcess,
    chart_namespace,
    helm_env,
    namespace,
    operator,
    run_cluster,
    run_operator,
)
from tests.parallel import renice, unnice

REAL_NODES = 2
GPUS_PER_NODE = 4
# Every image an end-to-end test runs: the sample job's, the chart's operator, the examples'.
IMAGES = ("worker", "operator", "examples")


@pytest.fixture(scope="package")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    unnice()  # the longest chain of a parallel run (tests/parallel.py)
    cluster = LocalCluster(tmp_path_factory.mktemp("realcluster"), real_nodes=REAL_NODES,
                           gpus_per_node=GPUS_PER_NODE, images=IMAGES, stop_with_owner=True)
    try:
        yield from run_cluster(cluster)
    finally:
        renice()


@pytest.fixture(scope="package")
def kubectl(local_cluster: LocalCluster) -> Kubectl:
    return Kubectl(local_cluster.env())


@pytest.fixture(scope="package")
def operator_process(local_cluster: LocalCluster, kubectl: Kubectl) -> Iterator[OperatorProcess]:
    """The CRDs installed and ``monarch-operator`` running on the real-node cluster."""
    yield from run_operator(local_cluster, kubectl)
