"""A worker whose device turned Unhealthy (issue 35 item 1, field case C34): read from the pod's
``allocatedResourcesStatus`` (KEP-4680), the attempt ends as Infrastructure with reason
GPUUnhealthy naming node, pod and device; that worker's pod is recreated, the others are kept,
the Application budget is untouched. And a failed launcher whose output names a hardware fault:
Infrastructure, GPUHardwareError, naming host and rank."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from monarch_operator import hwerrors
from monarch_operator.controller.judge import endings, hardware
from monarch_operator.controller.release import release
from monarch_operator.controller.spec import policy
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import attempts, devicehealth, observe
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Pass


def worker(name: str, uid: str, node: str, health: dict[str, str] | None = None,
           gate: bool = True) -> dict[str, Any]:
    """A worker pod holding GPUs ``health`` ({device id: Healthy/Unhealthy/Unknown}) as the
    kubelet reports them with the ResourceHealthStatus gate (none without it)."""
    container: dict[str, Any] = {"name": "worker", "ready": True, "restartCount": 0,
                                 "state": {"running": {"startedAt": "2026-12-04T10:00:00Z"}}}
    if gate and health:
        container["allocatedResourcesStatus"] = [{"name": "nvidia.com/gpu", "resources": [
            {"resourceID": device, "health": value} for device, value in health.items()]}]
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid},
            "spec": {"nodeName": node},
            "status": {"phase": "Running", "containerStatuses": [container]}}


def test_an_unhealthy_device_is_named_with_its_pod_and_node() -> None:
    pod = worker("demo-worker-1", "u1", "node-1", {"0": "Healthy", "1": "Unhealthy"})
    assert devicehealth.unhealthy_devices(pod) == [devicehealth.UnhealthyDevice(
        "demo-worker-1", "node-1", "worker", "nvidia.com/gpu", "1")]
    assert devicehealth.unhealthy_devices(pod)[0].describe() == (
        "nvidia.com/gpu device 1 of pod demo-worker-1 on node node-1 Unhealthy")


@pytest.mark.parametrize("health", [{"0": "Healthy", "1": "Healthy"},
                                    {"0": "Unknown", "1": "Healthy"},  # the plugin went away
                                    {}])
def test_healthy_or_unknown_devices_are_no_fault(health: dict[str, str]) -> None:
    assert devicehealth.unhealthy_devices(worker("w", "u", "n", health)) == []


def test_without_the_gate_the_field_is_absent_and_nothing_is_found() -> None:
    pod = worker("w", "u", "n", {"1": "Unhealthy"}, gate=False)
    assert "allocatedResourcesStatus" not in pod["status"]["containerStatuses"][0]
    assert devicehealth.unhealthy_devices(pod) == []


def test_init_containers_and_pod_level_claims_are_read_with_the_kubelets_message() -> None:
    pod = worker("w", "u", "n")
    pod["status"]["initContainerStatuses"] = [{"name": "setup", "allocatedResourcesStatus": [
        {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-3f2a", "health":
                                                  "Unhealthy"}]}]}]
    pod["status"]["allocatedResourcesStatus"] = [{"name": "claim:gpu/req", "resources": [
        {"resourceID": "gpu.nvidia.com/pool/gpu-1", "health": "Unhealthy",
         "message": "critical XID 79  reported by NVML"}]}]
    found = devicehealth.unhealthy_devices(pod)
    assert [(d.container, d.resource, d.device, d.message) for d in found] == [
        ("setup", "nvidia.com/gpu", "GPU-3f2a", ""),
        ("", "claim:gpu/req", "gpu.nvidia.com/pool/gpu-1", "critical XID 79 reported by NVML")]
    assert found[1].describe().endswith("Unhealthy: critical XID 79 reported by NVML")


def test_only_the_attempts_own_pods_count_not_a_replacement() -> None:
    snapshot = [{"name": "demo-worker-0", "uid": "a"}, {"name": "demo-worker-1", "uid": "b"}]
    pods = [worker("demo-worker-0", "a", "node-0", {"0": "Healthy", "1": "Healthy"}),
            worker("demo-worker-1", "b", "node-1", {"0": "Healthy", "1": "Unhealthy"})]
    assert [d.pod for d in devicehealth.attempt_unhealthy(snapshot, pods)] == ["demo-worker-1"]
    pods[1]["metadata"]["uid"] = "c"  # recreated since: it never held that device
    assert devicehealth.attempt_unhealthy(snapshot, pods) == []


def test_each_pod_is_lost_once_and_marked_to_be_recreated() -> None:
    devices = [devicehealth.UnhealthyDevice("demo-worker-1", "node-1", "worker", "nvidia.com/gpu",
                                            device) for device in ("0", "1")]
    pods = [{"metadata": {"name": "demo-worker-0", "uid": "u0"}},
            {"metadata": {"name": "demo-worker-1", "uid": "u1"}}]
    assert hardware.unhealthy_workers(devices, pods) == [attempts.LostWorker(
        "demo-worker-1", "nvidia.com/gpu device 0, 1 Unhealthy on node node-1", node_lost=True,
        uid="u1")]


def job(**run_policy: Any) -> JobSpec:
    return JobSpec.from_body({
        "metadata": {"name": "demo", "namespace": "team-a", "uid": "j", "generation": 1},
        "spec": {"image": "img:1", "workers": {"replicas": 2, "gpusPerWorker": 2},
                 "meshes": {"trainer": {"hosts": 2}, "ref": {"hosts": 1}, "colocate": True},
                 "runPolicy": {"backoffLimit": 0, "infrastructureBackoffLimit": 3,
                               **run_policy}}})


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """The API calls an ended attempt makes, recorded instead of sent."""
    calls: dict[str, list[Any]] = {"deleted": [], "stopped": [], "logs": []}
    monkeypatch.setattr(endings.deletes, "delete_pod",
                        lambda namespace, name, uid, **_: calls["deleted"].append(name) or True)
    monkeypatch.setattr(endings.deletes, "stop_pod",
                        lambda pod, *_: calls["stopped"].append(pod) or False)
    monkeypatch.setattr(endings.deletes, "delete_if_present", lambda *_: True)
    monkeypatch.setattr(release, "launcher_pod", lambda *_: None)
    monkeypatch.setattr(endings.reads, "pod_log_tail", lambda *_: None)
    return calls


def running_pass(spec: JobSpec) -> Pass:
    status = attempts.begin({}, 1, "2026-12-04T10:00:00Z")
    status["attemptWorkers"] = [{"name": "demo-worker-0", "uid": "a", "restartCount": 0},
                                {"name": "demo-worker-1", "uid": "b", "restartCount": 0}]
    return Pass(job=spec, status=status, now=dt.datetime(2026, 12, 4, 10, 5, tzinfo=dt.UTC))


def c34_pods(device_1: str) -> list[dict[str, Any]]:
    return [worker("demo-worker-0", "a", "node-0", {"0": "Healthy", "1": "Healthy"}),
            worker("demo-worker-1", "b", "node-1", {"0": "Healthy", "1": device_1})]


def test_c34_a_device_turning_unhealthy_mid_run_ends_the_attempt_and_replaces_only_its_worker(
        api: dict[str, list[Any]]) -> None:
    state = running_pass(job())
    ended, restarted = hardware.end_if_unhealthy(state, c34_pods("Unhealthy"),
                                                 observe.LauncherOutcome(finished=False), [])
    assert (ended, restarted) == (True, policy.INFRASTRUCTURE)
    record = state.status["attempts"][0]
    assert (record["class"], record["reason"]) == (policy.INFRASTRUCTURE,
                                                   st.REASON_GPU_UNHEALTHY)
    assert record["message"].startswith(
        "nvidia.com/gpu device 1 of pod demo-worker-1 on node node-1 Unhealthy; pod "
        "demo-worker-1 recreated")
    assert record["lostWorkers"] == ["demo-worker-1"]
    # Only demo-worker-1 is to be recreated (demo-worker-0 keeps its pod), by the pass after
    # this one's status write: its Unhealthy device is what the verdict rests on.
    assert record["recreatedWorkers"] == [{"name": "demo-worker-1", "uid": "b"}]
    assert api["deleted"] == []
    assert state.status["failureCounts"] == {"infrastructure": 1}  # no Application budget
    assert state.status["attempt"] == 2


def test_c34_healthy_devices_end_nothing(api: dict[str, list[Any]]) -> None:
    state = running_pass(job())
    assert hardware.end_if_unhealthy(state, c34_pods("Healthy"),
                                     observe.LauncherOutcome(finished=False), []) == (False, None)
    assert "class" not in state.status["attempts"][0] and api["deleted"] == []


def test_a_failed_launchers_words_follow_the_device(api: dict[str, list[Any]]) -> None:
    state = running_pass(job())
    outcome = observe.LauncherOutcome(True, False, 1, "trainer rank 2 (host demo-worker-1, "
                                      "local rank 0): exited with code 1")
    hardware.end_if_unhealthy(state, c34_pods("Unhealthy"), outcome, [])
    record = state.status["attempts"][0]
    assert record["reason"] == st.REASON_GPU_UNHEALTHY
    assert record["message"].endswith("; launcher exited with code 1: trainer rank 2 (host "
                                      "demo-worker-1, local rank 0): exited with code 1")
    assert (record["rank"], record["host"], record["exitCode"]) == (2, "demo-worker-1", 1)


ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def test_the_launchers_mark_names_host_and_rank() -> None:
    message = ("trainer rank 2 (host demo-worker-1, local rank 0): exited with code 1 "
               + hwerrors.marker("demo-worker-1", hwerrors.HardwareLine("ECCUncorrectable", ECC)))
    fault = hardware.hardware_fault(message, "", hwerrors.DEFAULT_PATTERNS)
    assert fault is not None
    assert fault.describe() == (f"hardware error (ECCUncorrectable) on host demo-worker-1 "
                                f"(trainer rank 2): {ECC}")


def test_a_line_in_the_launchers_log_is_found_without_a_mark() -> None:
    log = f"step 1/3 loss=1.49\n{ECC}\nmonarch-launch: torn down (+12.0s)\n"
    message = "rank 1 of 2 (host w-1, local rank 1) exited with code 1"
    fault = hardware.hardware_fault(message, log, hwerrors.DEFAULT_PATTERNS)
    assert fault is not None and (fault.host, fault.rank, fault.role) == ("w-1", 1, "")
    assert hardware.hardware_fault(message, "step 1/3 loss=1.49", hwerrors.DEFAULT_PATTERNS) is None
    own = hwerrors.from_spec({"patterns": ["loss=1\\.49"], "replaceDefaults": True})
    assert hardware.hardware_fault(message, log, own) is not None


def test_c34_without_device_health_the_message_still_makes_it_infrastructure(
        api: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    state = running_pass(job())
    log = f"trainer rank 2/4 host=demo-worker-1 ...\n{ECC}\n"
    monkeypatch.setattr(hardware.reads, "pod_log_tail",
                        lambda *args: api["logs"].append(args) or log)
    outcome = observe.LauncherOutcome(True, False, 1, "trainer rank 2 (host demo-worker-1, "
                                      "local rank 0): exited with code 1")
    launcher = {"metadata": {"name": "demo-launcher-1", "namespace": "team-a"}}
    assert hardware.end_if_unhealthy(state, c34_pods("Healthy"), outcome, [launcher]) == (
        False, None)
    ended, restarted = hardware.end_if_hardware_error(state, outcome, [launcher])
    assert (ended, restarted) == (True, policy.INFRASTRUCTURE)
    record = state.status["attempts"][0]
    assert (record["reason"], record["rank"], record["host"]) == (
        st.REASON_GPU_HARDWARE_ERROR, 2, "demo-worker-1")
    assert record["message"].startswith(
        f"hardware error (ECCUncorrectable) on host demo-worker-1 (trainer rank 2): {ECC}")
    assert api["deleted"] == []  # which device is not known: every worker keeps its pod
    assert state.status["failureCounts"] == {"infrastructure": 1}
    assert api["logs"][0][1:] == ("demo-launcher-1", "launcher", hardware.HARDWARE_SCAN_LINES)


def test_a_programs_own_failure_is_left_to_the_exit_code(
        api: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    state = running_pass(job())
    monkeypatch.setattr(hardware.reads, "pod_log_tail",
                        lambda *_: "ValueError: boom at step 2\n")
    outcome = observe.LauncherOutcome(True, False, 1, "trainer rank 0 (host demo-worker-0, "
                                      "local rank 0): raised ValueError: boom at step 2")
    launcher = {"metadata": {"name": "demo-launcher-1", "namespace": "team-a"}}
    assert hardware.end_if_hardware_error(state, outcome, [launcher]) == (False, None)
    assert "class" not in state.status["attempts"][0]


def launcher_pod(finished_at: str | None, exit_code: int = 1, message: str = "") -> dict:
    state: dict[str, Any] = ({"terminated": {"exitCode": exit_code, "finishedAt": finished_at,
                                             "message": message, "reason": "Error"}}
                             if finished_at else {"running": {}})
    return {"metadata": {"name": "demo-launcher-1", "namespace": "team-a", "uid": "l"},
            "spec": {"nodeName": "node-0"},
            "status": {"phase": "Failed" if finished_at else "Running",
                       "containerStatuses": [{"name": "launcher", "state": state}]}}


@pytest.fixture
def nodes_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node Ready, heartbeating, not cordoned."""
    from monarch_operator.controller.judge import judging

    far = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    monkeypatch.setattr(judging.k8s_nodes, "node_not_ready_since", lambda node: None)
    monkeypatch.setattr(judging.k8s_nodes, "node_readiness",
                        lambda: {"node-0": (True, None), "node-1": (True, None)})
    monkeypatch.setattr(judging.k8s_nodes, "node_heartbeats",
                        lambda: {"node-0": far, "node-1": far})
    monkeypatch.setattr(judging.k8s_nodes, "node_cordoned", lambda node: False)


@pytest.mark.parametrize("finished_at", [None, "2026-12-04T10:04:00Z"])
def test_the_judge_ends_a_running_or_failed_attempt_on_an_unhealthy_device(
        api: dict[str, list[Any]], nodes_fine: None, finished_at: str | None) -> None:
    from monarch_operator.controller.judge import judging

    state = running_pass(job())
    launcher = launcher_pod(finished_at, message="trainer rank 2 (host demo-worker-1, local "
                                                 "rank 0): exited with code 1")
    restarted = judging.judge_launcher(state, launcher, observe.launcher_outcome(launcher),
                                       c34_pods("Unhealthy"), state.status["attempts"][0])
    assert restarted == policy.INFRASTRUCTURE
    assert state.status["attempts"][0]["reason"] == st.REASON_GPU_UNHEALTHY
    assert state.status["attempts"][0]["recreatedWorkers"] == [
        {"name": "demo-worker-1", "uid": "b"}]
    assert api["deleted"] == []


def test_the_judge_leaves_a_programs_failure_to_the_exit_code(
        api: dict[str, list[Any]], nodes_fine: None) -> None:
    from monarch_operator.controller.judge import judging

    state = running_pass(job())
    launcher = launcher_pod("2026-12-04T10:04:00Z", message="trainer rank 0 (host "
                            "demo-worker-0, local rank 0): raised ValueError: boom")
    restarted = judging.judge_launcher(state, launcher, observe.launcher_outcome(launcher),
                                       c34_pods("Healthy"), state.status["attempts"][0])
    assert restarted is None  # backoffLimit 0: the job failed
    record = state.status["attempts"][0]
    assert (record["class"], record["reason"]) == (policy.APPLICATION, st.REASON_LAUNCHER_FAILED)
    assert api["deleted"] == []
