"""One cluster with real nodes per machine: a second one refuses at once naming the first (and
how to wait), or waits for it to go when asked to (``$MONARCH_LOCALCLUSTER_WAIT_S``). The host
network is not touched here: what ``prepare_host`` does after the claim is replaced."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from monarch_operator.localcluster.node import network
from monarch_operator.localcluster.node import node as nodemod
from monarch_operator.localcluster.node import nodes


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run_dir = tmp_path / "run"
    monkeypatch.setattr(network, "RUN_DIR", run_dir)
    monkeypatch.setattr(nodes, "OWNER", run_dir / "owner.json")
    monkeypatch.setattr(nodes, "CLAIM_LOCK", tmp_path / "real-nodes.lock")
    monkeypatch.setattr(nodemod, "teardown_all", lambda: [])
    monkeypatch.setattr(nodemod, "host_state", lambda: {})
    monkeypatch.setattr(network, "host_up", lambda addresses: None)
    monkeypatch.setattr(network, "node_up", lambda address, others: None)
    return run_dir


def real_nodes(state_dir: Path) -> nodes.RealNodes:
    state_dir.mkdir(parents=True, exist_ok=True)
    return nodes.RealNodes(state_dir, 2, 4, state_dir / "bin", state_dir / "images")


def held_by_another(run_dir: Path, other: Path) -> subprocess.Popen[bytes]:
    """A live process recorded as the holder of another cluster's real nodes."""
    holder = subprocess.Popen(["sleep", "60"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "owner.json").write_text(json.dumps({"state_dir": str(other),
                                                    "pid": holder.pid}))
    return holder


def test_a_second_cluster_refuses_at_once_naming_the_first(host, tmp_path):
    holder = held_by_another(host, tmp_path / "first")
    try:
        with pytest.raises(RuntimeError, match=f"already runs .*{tmp_path / 'first'}.*"
                                               f"{nodes.WAIT_ENV}"):
            real_nodes(tmp_path / "second").prepare_host(print)
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((host / "owner.json").read_text())["state_dir"] == str(tmp_path / "first")


def test_a_second_cluster_asked_to_wait_takes_over_once_the_first_is_gone(host, tmp_path):
    holder = held_by_another(host, tmp_path / "first")
    notes: list[str] = []
    threading.Timer(3, lambda: (holder.kill(), holder.wait())).start()
    started = time.monotonic()
    real_nodes(tmp_path / "second").prepare_host(notes.append, wait_s=30)
    holder.wait()
    assert time.monotonic() - started >= 2.5
    assert any("waiting for the cluster with real nodes" in note for note in notes), notes
    claim = json.loads((host / "owner.json").read_text())
    assert claim["state_dir"] == str(tmp_path / "second")
    assert nodes.owner() is not None  # this process holds it until a node's holder does



def test_a_cluster_without_real_nodes_never_tears_down_the_machines(tmp_path, monkeypatch):
    """``down`` of a kwok cluster must not remove real nodes another cluster is starting
    (seen: a kwok test cluster's ``up``, which begins with ``down``, removed the bridge under
    a real-node cluster whose API server was starting)."""
    from monarch_operator.localcluster import cluster as cluster_mod

    calls: list[Path] = []
    monkeypatch.setattr(nodes, "stop_unless_owned_by_another",
                        lambda state_dir: calls.append(state_dir) or [])
    cluster_mod.LocalCluster(tmp_path / "kwok", nodes=1).down(quiet=True)
    assert calls == []
    cluster_mod.LocalCluster(tmp_path / "real", real_nodes=2).down(quiet=True)
    assert calls == [(tmp_path / "real").resolve()]


def test_a_refusal_comes_before_anything_is_built(host, tmp_path, monkeypatch):
    """LocalCluster.up checks the claim before it builds binaries and images (minutes, and
    6 GB of disk, spent for nothing otherwise), and says how to wait rather than only to stop
    someone else's cluster; asked to wait, or with no other holder, it goes on."""
    from monarch_operator.localcluster import cluster as cluster_mod

    built: list[str] = []
    monkeypatch.setattr(cluster_mod, "ensure_binaries", lambda: built.append("binaries"))
    monkeypatch.delenv(nodes.WAIT_ENV, raising=False)
    holder = held_by_another(host, tmp_path / "first")
    try:
        local = cluster_mod.LocalCluster(tmp_path / "second", real_nodes=2)
        with pytest.raises(RuntimeError) as refused:
            local.up(progress=lambda line: None)
        assert built == [], "refused after building"
        message = str(refused.value)
        assert str(tmp_path / "first") in message and f"pid {holder.pid}" in message
        assert "someone else's" in message and f"{nodes.WAIT_ENV}=SECONDS" in message
        nodes.check_unclaimed(tmp_path / "second", wait_s=60)  # asked to wait: later
        nodes.check_unclaimed(tmp_path / "first", wait_s=0)  # its own cluster again
    finally:
        holder.kill()
        holder.wait()
    nodes.check_unclaimed(tmp_path / "second", wait_s=0)  # the holder is gone
