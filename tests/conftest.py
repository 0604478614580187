"""Shared fixtures: the local control plane, the operator process, a namespace per test.

The cluster fixtures build the pinned binaries on first use (cached under
~/.cache/monarch-operator). If a binary cannot be built the fixture fails with the build's
error: cluster and end-to-end tests never fall back to a mock API.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator.localcluster.cluster import LocalCluster
from monarch_operator.localcluster.demo import Kubectl, install_crds, start_operator, stop_process
from tests.chart import CHART_NAMESPACE_PREFIX
from tests.parallel import (  # noqa: F401  (hooks: parallel workers, phase table)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_xdist_make_scheduler,
)

# Every namespace but the chart tests' (kopf pattern): those run the chart's own operator.
OPERATOR_NAMESPACES = (f"!{CHART_NAMESPACE_PREFIX}*",)
# The tests' operators renew their watch streams every 10 s instead of 30 (the setting exists for
# this): a broken stream is cut after 20 s and /healthz fails after 30 s, and a quiet window that
# must span renewals (C5) is a third as long. The default is tested in tests/unit.
WATCH_RENEW_SECONDS = 10
OPERATOR_ENV = {"MONARCH_OPERATOR_WATCH_RENEW_SECONDS": str(WATCH_RENEW_SECONDS)}
# On simulated nodes they also force-delete a pod stuck past its grace period (its node lost)
# after 3 s, not 15: the node-loss tests wait that long for each lost pod, and the node agent
# reports a container's end at once. Real kubelets keep the default (one slowed by load may
# take seconds to report an end, and a pod force-deleted meanwhile would leave its processes).
FORCE_DELETE_AFTER_SECONDS = 3


def operator_env(cluster: LocalCluster) -> dict[str, str]:
    """The environment the tests' operators get on ``cluster`` (see above)."""
    if cluster.real_nodes:
        return dict(OPERATOR_ENV)
    return {**OPERATOR_ENV,
            "MONARCH_OPERATOR_FORCE_DELETE_AFTER_SECONDS": str(FORCE_DELETE_AFTER_SECONDS)}


def run_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """Bring ``cluster`` up, yield it, bring it down (the body of a cluster fixture)."""
    cluster.up(progress=lambda message: print(f"[localcluster] {message}", flush=True))
    try:
        yield cluster
    finally:
        cluster.down(quiet=True)


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # stop_with_owner: a test run killed by SIGKILL leaves no cluster running behind it.
    cluster = LocalCluster(tmp_path_factory.mktemp("localcluster"), nodes=3, gpus_per_node=8,
                           stop_with_owner=True)
    yield from run_cluster(cluster)


@pytest.fixture(scope="session")
def kubectl(local_cluster: LocalCluster) -> Kubectl:
    return Kubectl(local_cluster.env())


class OperatorProcess:
    """The operator under test as a process that a test may stop, kill and start again.

    ``start(**env)`` runs it with extra environment (e.g. a crash point for field case C6);
    every test leaves it running with the default environment (``ensure_default``).
    """

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.log_path = cluster.state_dir / "logs" / "operator.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.extra_env: dict[str, str] = {}
        # What "default" means for the tests now (a module's fixture may widen it, e.g. Kueue).
        self.default_env: dict[str, str] = {}

    def start(self, **extra_env: str) -> None:
        self.stop()
        self.extra_env = dict(extra_env)
        self.process = start_operator(self.cluster.state_dir,
                                      {**self.cluster.env(), **operator_env(self.cluster),
                                       **extra_env},
                                      namespaces=OPERATOR_NAMESPACES, stop_with_owner=True)

    def stop(self) -> int | None:
        """SIGTERM (then SIGKILL); returns the exit status, None if it was not running."""
        if self.process is None:
            return None
        stop_process(self.process)
        code, self.process = self.process.returncode, None
        return code

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        code = self.process.wait(timeout)
        self.process = None
        return code

    def ensure_default(self) -> None:
        if (self.process is None or self.process.poll() is not None
                or self.extra_env != self.default_env):
            self.start(**self.default_env)


@pytest.fixture(scope="session")
def operator_process(local_cluster: LocalCluster, kubectl: Kubectl) -> Iterator[OperatorProcess]:
    """The CRDs installed and ``monarch-operator`` running (restartable by tests)."""
    yield from run_operator(local_cluster, kubectl)


def run_operator(local_cluster: LocalCluster, kubectl: Kubectl) -> Iterator[OperatorProcess]:
    """Install the CRDs, start the operator, yield its handle, stop it (a fixture's body)."""
    install_crds(kubectl)
    handle = OperatorProcess(local_cluster)
    handle.start()
    try:
        yield handle
    finally:
        code = handle.stop()
        assert code in (None, 0, -15), handle.log_path.read_text()[-3000:]


@pytest.fixture
def operator(operator_process: OperatorProcess) -> Iterator[Path]:
    """``monarch-operator`` running with its default settings; yields its log path."""
    operator_process.ensure_default()
    yield operator_process.log_path
    operator_process.ensure_default()


@contextlib.contextmanager
def _fresh_namespace(kubectl: Kubectl, prefix: str, *delete_jobs: str) -> Iterator[str]:
    """A namespace ``<prefix><8 hex>`` for the block; afterwards its MonarchJobs are deleted
    with ``delete_jobs`` (kubectl flags; none given: not deleted first), then the namespace."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        if delete_jobs:
            kubectl("delete", "monarchjobs", "--all", "-n", name, *delete_jobs, check=False)
        kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(kubectl: Kubectl, operator: Path) -> Iterator[str]:
    """A fresh namespace; its MonarchJobs are deleted while the operator still runs."""
    with _fresh_namespace(kubectl, "t-", "--wait=true", "--timeout=60s") as name:
        yield name


@pytest.fixture
def bare_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace for objects a test makes itself (no MonarchJob, so no operator)."""
    with _fresh_namespace(kubectl, "t-") as name:
        yield name


@pytest.fixture
def chart_namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace that the shared test operator leaves alone (``chart-*``)."""
    with _fresh_namespace(kubectl, CHART_NAMESPACE_PREFIX, "--wait=false") as name:
        yield name


@pytest.fixture
def helm_env(local_cluster: LocalCluster, tmp_path: Path) -> dict[str, str]:
    """helm's environment: the local cluster's kubeconfig, its cache and config in tmp_path."""
    env = dict(local_cluster.env())
    for kind in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{kind}_HOME"] = str(tmp_path / f"helm-{kind.lower()}")
    return env
