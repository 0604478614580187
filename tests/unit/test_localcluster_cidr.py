"""The local cluster's pod CIDR can move for parallel clusters, but never leaves 127.0.0.0/8."""

import pytest

from monarch_operator.localcluster import cluster


def test_pod_cidr_outside_loopback_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("MONARCH_LOCALCLUSTER_POD_CIDR", "10.0.0.0/24")
    with pytest.raises(ValueError, match="127.0.0.0/8"):
        cluster.LocalCluster(tmp_path)


def test_pod_cidr_follows_the_environment_when_the_cluster_is_made(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # Read at construction, not at import: a pytest-xdist worker sets its range after the
    # module was imported (tests/conftest.py), and its kwok must hand out pod IPs from it.
    monkeypatch.setenv("MONARCH_LOCALCLUSTER_POD_CIDR", "127.101.0.0/16")
    moved = cluster.LocalCluster(tmp_path / "moved")
    assert moved.pod_cidr == "127.101.0.0/16"
    assert "--cidr=127.101.0.0/16" in moved._kwok_args(tmp_path, {"kwok": 1, "kubelet": 2})
    monkeypatch.delenv("MONARCH_LOCALCLUSTER_POD_CIDR")
    assert cluster.LocalCluster(tmp_path / "default").pod_cidr == "127.100.0.0/16"
