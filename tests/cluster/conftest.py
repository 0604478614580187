"""Fixtures of the cluster tests only (the cluster itself and the operator: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes
import pytest

from monarch_operator.localcluster.cluster import LocalCluster


@pytest.fixture(scope="session")
def core(local_cluster: LocalCluster) -> Iterator[kubernetes.client.CoreV1Api]:
    """The core API of the local cluster through the typed client (closed at the end)."""
    api = kubernetes.config.new_client_from_config(str(local_cluster.kubeconfig))
    try:
        yield kubernetes.client.CoreV1Api(api)
    finally:
        api.close()
