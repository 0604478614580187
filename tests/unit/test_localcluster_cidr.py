"""The local cluster's pod CIDR can move for parallel clusters, but never leaves 127.0.0.0/8."""

import importlib

import pytest

from monarch_operator.localcluster import cluster


def test_pod_cidr_outside_loopback_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("MONARCH_LOCALCLUSTER_POD_CIDR", "10.0.0.0/24")
    reloaded = importlib.reload(cluster)
    try:
        with pytest.raises(ValueError, match="127.0.0.0/8"):
            reloaded.LocalCluster(tmp_path)
    finally:
        monkeypatch.delenv("MONARCH_LOCALCLUSTER_POD_CIDR")
        importlib.reload(cluster)


def test_pod_cidr_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_LOCALCLUSTER_POD_CIDR", "127.101.0.0/16")
    try:
        assert importlib.reload(cluster).POD_CIDR == "127.101.0.0/16"
    finally:
        monkeypatch.delenv("MONARCH_LOCALCLUSTER_POD_CIDR")
        assert importlib.reload(cluster).POD_CIDR == "127.100.0.0/16"
