"""A GPU that goes bad mid-run on the real nodes (issue 35 item 1, field case C34).

The real nodes' fake GPU plugin reports a device of the node of ``c34-worker-1`` Unhealthy
(its test hook, sent on ListAndWatch as NVIDIA's plugin does after a critical Xid); the kubelet,
with the ResourceHealthStatus gate, shows it in the pod's ``allocatedResourcesStatus``. The
first attempt's launcher sleeps; the operator ends that attempt as Infrastructure/GPUUnhealthy
naming node, pod and device, recreates only that worker (the kubelet never allocates the bad
device again), and the second attempt runs the built-in Monarch job to Succeeded without
spending the application budget. Then the same rank error with no device reported Unhealthy:
a real rank (``monarch-torchrun``) prints PyTorch's uncorrectable-ECC line and exits 1; the
attempt is Infrastructure from the message (GPUHardwareError), naming host and rank, and every
worker keeps its pod.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from monarch_operator.localcluster.demo import SAMPLE, launcher_log
from tests.cluster.helpers import PodWatch, get_json, running_attempt, wait_phase, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

SLEEP_FIRST = ('if [ "$MONARCH_ATTEMPT" = 1 ]; then exec sleep 600; fi; '
               'exec monarch-launch --steps 1')
TIMEOUT = 420


def c34_job() -> str:
    """The sample's image on 2 workers of 2 GPUs (trainer on one, ref on the other)."""
    body = yaml.safe_load(SAMPLE.read_text())
    body["metadata"]["name"] = "c34"
    body["spec"]["workers"] = {"replicas": 2, "gpusPerWorker": 2,
                               "template": {"spec": {"terminationGracePeriodSeconds": 5}}}
    body["spec"]["meshes"] = {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}
    body["spec"]["launcher"] = {"command": ["sh", "-c", SLEEP_FIRST]}
    body["spec"]["runPolicy"] = {"backoffLimit": 0, "infrastructureBackoffLimit": 2}
    return yaml.safe_dump(body)


def gpus_of(pod: dict[str, Any]) -> dict[str, str]:
    """``{device id: health}`` of the pod's worker container, as its kubelet reports them."""
    found = {}
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        for status in container.get("allocatedResourcesStatus") or []:
            if status.get("name") == "nvidia.com/gpu":
                found.update({r["resourceID"]: r["health"] for r in status.get("resources") or []})
    return found


def test_c34_a_gpu_marked_unhealthy_mid_run_moves_its_worker_and_the_job_succeeds(
        kubectl, namespace, local_cluster):
    with PodWatch(kubectl, namespace, "c34") as watch:
        kubectl("apply", "-n", namespace, "-f", "-", stdin=c34_job())
        running_attempt(kubectl, namespace, "c34", 1)
        pod = get_json(kubectl, "pod", "c34-worker-1", "-n", namespace)
        node = pod["spec"]["nodeName"]
        held = wait_until(lambda: gpus_of(get_json(kubectl, "pod", "c34-worker-1", "-n",
                                                   namespace)), 30, "allocatedResourcesStatus")
        assert set(held.values()) == {"Healthy"} and len(held) == 2, held
        bad = "1" if "1" in held else sorted(held)[-1]
        local_cluster.set_unhealthy_gpus(node, [bad])
        try:
            second = running_attempt(kubectl, namespace, "c34", 2)
            moved = get_json(kubectl, "pod", "c34-worker-1", "-n", namespace)
            allocatable = get_json(kubectl, "node", node)["status"]["allocatable"]
            status = wait_phase(kubectl, namespace, "c34", "Succeeded", timeout=TIMEOUT)
        finally:
            local_cluster.set_unhealthy_gpus(node, [])
    log = launcher_log(kubectl, local_cluster.state_dir, namespace, "c34")
    first, last = status["attempts"][0], status["attempts"][-1]
    assert (first["class"], first["reason"]) == ("Infrastructure", "GPUUnhealthy"), first
    assert f"nvidia.com/gpu device {bad} of pod c34-worker-1 on node {node} Unhealthy" in (
        first["message"]), first
    assert first["lostWorkers"] == ["c34-worker-1"], first
    assert last["class"] == "Succeeded" and len(status["attempts"]) == 2, (status, log[-3000:])
    assert "application" not in status.get("failureCounts", {}), status["failureCounts"]
    # Only the worker holding the bad device was recreated, never onto that device.
    seen = watch.pods_seen()
    assert (seen["c34-worker-1"], seen["c34-worker-0"]) == (2, 1), watch.uids
    assert second["attempt"] == 2
    assert not (moved["spec"]["nodeName"] == node and bad in gpus_of(moved)), moved["status"]
    assert allocatable["nvidia.com/gpu"] == "3", allocatable
    assert "monarch-launch: succeeded" in log, log[-3000:]


ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
# Attempt 1: rank 1 (on c34m-worker-1) prints the ECC line and exits 1; attempt 2 all ranks
# exit 0. $MONARCH_ATTEMPT is the launcher's, expanded before the ranks start.
RANK_FAILS_FIRST = (
    'exec monarch-torchrun --nproc-per-node 1 --no-python sh -c "'
    'if [ \\$RANK = 1 ] && [ $MONARCH_ATTEMPT = 1 ]; then echo \'' + ECC + '\' >&2; exit 1; fi; '
    'echo rank \\$RANK ok"')


def test_c34_the_same_rank_error_without_device_health_is_infrastructure_from_the_message(
        kubectl, namespace, local_cluster):
    body = yaml.safe_load(c34_job())
    body["metadata"]["name"] = "c34m"
    body["spec"]["launcher"] = {"command": ["sh", "-c", RANK_FAILS_FIRST]}
    with PodWatch(kubectl, namespace, "c34m") as watch:
        kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
        status = wait_phase(kubectl, namespace, "c34m", "Succeeded", timeout=TIMEOUT)
    log = launcher_log(kubectl, local_cluster.state_dir, namespace, "c34m")
    first, last = status["attempts"][0], status["attempts"][-1]
    assert (first["class"], first["reason"]) == ("Infrastructure", "GPUHardwareError"), first
    assert first["rank"] == 1 and first["host"].startswith("c34m-worker-1"), first
    assert first["message"].startswith("hardware error (ECCUncorrectable) on host c34m-worker-1"), (
        first)
    assert ECC in first["message"], first
    assert last["class"] == "Succeeded" and len(status["attempts"]) == 2, (status, log[-3000:])
    assert "application" not in status.get("failureCounts", {}), status["failureCounts"]
    seen = watch.pods_seen()  # which device is to blame is not known: every worker is kept
    assert (seen["c34m-worker-0"], seen["c34m-worker-1"]) == (1, 1), watch.uids
