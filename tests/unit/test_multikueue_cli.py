"""``monarch-localcluster multikueue up|down|status`` wired to the library, with the clusters,
Kueue, the operator and kubectl faked: which flags reach the worker, what a second ``up``
starts again and what it leaves, what is connected and applied where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from monarch_operator.localcluster import cli, multikueue, multikueue_pair


class FakeCluster:
    """A LocalCluster that records what was asked of it."""

    made: list[FakeCluster] = []
    downs: list[Path] = []

    def __init__(self, state_dir: Path, nodes: int = 3, gpus_per_node: int = 8,
                 node_agent: bool = True, real_nodes: int = 0,
                 images: tuple[str, ...] = ("worker",), **_: Any) -> None:
        self.state_dir = Path(state_dir)
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.nodes, self.gpus_per_node, self.real_nodes = nodes, gpus_per_node, real_nodes
        self.node_agent, self.images = node_agent, images
        self.calls: list[str] = []
        self.running = self.operator = None
        FakeCluster.made.append(self)

    def up(self, progress: Any) -> None:
        self.calls.append("up")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig.write_text(json.dumps(
            {"clusters": [{"cluster": {"server": f"https://127.0.0.1:{6443 + len(self.made)}"}}]}))
        progress("up")

    def down(self, quiet: bool = False) -> None:
        self.calls.append("down")
        FakeCluster.downs.append(self.state_dir)

    def is_running(self) -> bool:
        return bool(self.running)

    def operator_pid(self) -> int | None:
        return self.operator

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}


class FakeKubectl:
    log: list[tuple[str, tuple[str, ...], Any]] = []

    def __init__(self, env: dict[str, str]) -> None:
        self.config = env["KUBECONFIG"]

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        FakeKubectl.log.append((self.config, args, json.loads(stdin) if stdin else None))
        return ""


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    FakeCluster.made, FakeCluster.downs, FakeKubectl.log = [], [], []
    seen: dict[str, Any] = {"kueue": [], "operator": [], "connect": [], "order": [],
                            "running_kueue": set()}

    class FakeKueue:
        def __init__(self, state_dir: Path, kubeconfig: Path, kubectl: Any, **kwargs: Any):
            self.log_path = Path(state_dir) / "logs" / "kueue.log"
            seen["kueue"].append((Path(state_dir), kwargs))

        def up(self) -> None:
            seen["order"].append("kueue")

    def start_operator(state_dir: Path, env: dict[str, str], namespaces: tuple[str, ...] = (),
                       stop_with_owner: bool = False) -> str:
        seen["order"].append("operator")
        seen["operator"].append((Path(state_dir), env, namespaces))
        return "process"

    monkeypatch.setattr(cli, "LocalCluster", FakeCluster)
    monkeypatch.setattr(multikueue_pair, "LocalCluster", FakeCluster)
    monkeypatch.setattr(multikueue_pair, "Kubectl", FakeKubectl)
    monkeypatch.setattr(multikueue_pair, "install_crds",
                        lambda kubectl: seen["order"].append("crds"))
    monkeypatch.setattr(multikueue_pair, "start_operator", start_operator)
    monkeypatch.setattr(multikueue_pair.kueue_mod, "KueueProcess", FakeKueue)
    monkeypatch.setattr(multikueue_pair.kueue_mod, "running_pid",
                        lambda state_dir: 4242 if Path(state_dir) in seen["running_kueue"]
                        else None)
    monkeypatch.setattr(multikueue_pair.multikueue, "connect",
                        lambda *args, **kwargs: seen["connect"].append(args))
    monkeypatch.setattr(multikueue_pair, "worker_active",
                        lambda kubectl, name="worker": {"status": "True", "reason": "Active"})
    return seen


def test_up_starts_the_worker_with_the_up_flags_and_a_manager_without_nodes(
        fakes, tmp_path, capsys):
    code = cli.main(["--dir", str(tmp_path), "multikueue", "up", "--nodes", "2",
                     "--gpus-per-node", "4", "--namespace", "team-b"])
    assert code == 0
    worker, manager = (c for c in FakeCluster.made if c.calls == ["up"])
    assert (worker.state_dir, worker.nodes, worker.gpus_per_node) == (tmp_path, 2, 4)
    assert (manager.state_dir, manager.nodes, manager.node_agent) == (
        tmp_path / "manager", 0, False)
    # CRD, then Kueue, then the operator, on each side.
    assert fakes["order"] == ["crds", "kueue", "operator"] * 2
    [(worker_dir, worker_kueue), (manager_dir, manager_kueue)] = fakes["kueue"]
    assert worker_kueue["multikueue"] is None
    assert manager_kueue["multikueue"]["externalFrameworks"] == [
        {"name": "MonarchJob.v1alpha1.monarch-operator.dev"}]
    assert manager_kueue["feature_gates"] == multikueue.MANAGER_FEATURE_GATES
    assert all(env["MONARCH_OPERATOR_KUEUE"] == "true" for _, env, _ in fakes["operator"])
    [(_, _, server, ca, name)] = fakes["connect"]
    assert server == json.loads(worker.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    assert (ca, name) == (tmp_path / "pki" / "ca.crt", "worker")

    applied = {(config, item["kind"]): item for config, args, body in FakeKubectl.log
               if body for item in body["items"]}
    worker_cq = applied[(str(worker.kubeconfig), "ClusterQueue")]
    manager_cq = applied[(str(manager.kubeconfig), "ClusterQueue")]
    assert "admissionChecksStrategy" not in worker_cq["spec"]
    assert manager_cq["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": multikueue.ADMISSION_CHECK}]}
    gpu = worker_cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": 8}
    for config in (worker.kubeconfig, manager.kubeconfig):
        queue = applied[(str(config), "LocalQueue")]
        assert queue["metadata"] == {"name": "user-queue", "namespace": "team-b"}

    out = capsys.readouterr().out
    assert f"manager kubeconfig: {manager.kubeconfig}" in out
    assert f"worker kubeconfig:  {worker.kubeconfig}" in out
    assert (f"kubectl --kubeconfig {manager.kubeconfig} apply -n team-b -f "
            f"{multikueue_pair.SAMPLE}") in out
    assert multikueue_pair.SAMPLE.exists()
    assert "[multikueue] manager: MultiKueueCluster worker Active" in out


def test_a_second_up_starts_nothing_that_runs_and_applies_the_rest_again(fakes, tmp_path,
                                                                        monkeypatch):
    fakes["running_kueue"] |= {tmp_path, tmp_path / "manager"}
    monkeypatch.setattr(FakeCluster, "operator_pid", lambda self: 77)
    assert cli.main(["--dir", str(tmp_path), "multikueue", "up"]) == 0
    assert fakes["kueue"] == [] and fakes["operator"] == []
    assert fakes["order"] == ["crds", "crds"]  # applied again, harmless
    assert len(fakes["connect"]) == 1  # a fresh token, the worker's current address and CA


def test_up_with_real_nodes_passes_them_to_the_worker(fakes, tmp_path):
    assert cli.main(["--dir", str(tmp_path), "multikueue", "up", "--real-nodes", "2",
                     "--images", "worker,examples"]) == 0
    worker = FakeCluster.made[0]
    assert (worker.real_nodes, worker.images) == (2, ("worker", "examples"))


def test_a_failed_up_exits_1_with_the_reason(fakes, tmp_path, monkeypatch, capsys):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise TimeoutError("MultiKueueCluster worker not Active after 60s: BadConfig: x")

    monkeypatch.setattr(multikueue_pair, "wait_worker_active", refuse)
    assert cli.main(["--dir", str(tmp_path), "multikueue", "up"]) == 1
    assert "not Active after 60s: BadConfig" in capsys.readouterr().err


def test_down_stops_the_manager_then_the_worker(fakes, tmp_path, capsys):
    assert cli.main(["--dir", str(tmp_path), "multikueue", "down"]) == 0
    assert FakeCluster.downs == [tmp_path / "manager", tmp_path]
    assert capsys.readouterr().out.splitlines() == [
        f"[multikueue] manager: stopped ({tmp_path / 'manager'})",
        f"[multikueue] worker: stopped ({tmp_path})"]


def test_status_is_0_only_when_both_sides_run_everything(fakes, tmp_path, monkeypatch, capsys):
    assert cli.main(["--dir", str(tmp_path), "multikueue", "status"]) == 1
    assert "worker:  not running" in capsys.readouterr().out
    monkeypatch.setattr(FakeCluster, "is_running", lambda self: True)
    monkeypatch.setattr(FakeCluster, "operator_pid", lambda self: 77)
    fakes["running_kueue"] |= {tmp_path}
    assert cli.main(["--dir", str(tmp_path), "multikueue", "status"]) == 1  # manager's Kueue
    assert "kueue            not running" in capsys.readouterr().out
    fakes["running_kueue"] |= {tmp_path / "manager"}
    assert cli.main(["--dir", str(tmp_path), "multikueue", "status"]) == 0
    assert "MultiKueueCluster worker: Active=True (Active)" in capsys.readouterr().out


def test_the_sample_is_dispatched_through_the_queue_the_pair_makes():
    import yaml

    sample = yaml.safe_load(multikueue_pair.SAMPLE.read_text())
    assert sample["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"
    assert sample["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == multikueue_pair.LOCAL_QUEUE


def test_kueue_running_pid_is_only_this_clusters_kueue(tmp_path):
    import subprocess
    import sys
    import time
    from pathlib import Path

    from monarch_operator.localcluster import kueue

    config = tmp_path / "kueue" / "config.yaml"
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                f"--config={config}"])
    try:
        # Until the child has exec'd, its command line is still pytest's (no --config): wait.
        cmdline = Path(f"/proc/{process.pid}/cmdline")
        deadline = time.monotonic() + 10
        while str(config) not in cmdline.read_bytes().decode(errors="replace"):
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.05)
        (tmp_path / kueue.PID_FILE).write_text(f"{process.pid}\n")
        assert kueue.running_pid(tmp_path) == process.pid
        other = tmp_path / "other"
        other.mkdir()
        (other / kueue.PID_FILE).write_text(f"{process.pid}\n")  # a reused pid: not its Kueue
        assert kueue.running_pid(other) is None
    finally:
        process.kill()
        process.wait()
    assert kueue.running_pid(tmp_path) is None
    assert kueue.running_pid(tmp_path / "none") is None
