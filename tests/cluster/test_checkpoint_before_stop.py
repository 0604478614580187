"""Checkpoint before a stop on the local control plane (issue 21 item 4): a running job with
``runPolicy.checkpointGracePeriodSeconds`` is suspended; its launcher is told first (SIGTERM
with that grace period) while the workers stay, its program saves its state and names it; the
workers go once it ended; on resume the next attempt starts from that checkpoint."""

from __future__ import annotations

import pytest

from tests.cluster.helpers import (
    CHECKPOINTING_PROGRAM,
    LABEL_JOB,
    apply_manifest,
    get_json,
    job_manifest,
    job_status,
    running_attempt,
    wait_phase,
    wait_ready_for_a_stop,
    wait_until,
)

pytestmark = pytest.mark.cluster



def test_suspend_lets_the_program_checkpoint_and_the_next_attempt_resumes(kubectl, namespace):
    apply_manifest(kubectl, namespace, job_manifest(
        "ckpt", runPolicy={"checkpointGracePeriodSeconds": 30},
        launcher={"command": ["python3", "-c", CHECKPOINTING_PROGRAM]}))
    running_attempt(kubectl, namespace, "ckpt", 1)
    wait_ready_for_a_stop(kubectl, namespace, "ckpt-launcher")
    kubectl("patch", "monarchjob", "ckpt", "-n", namespace, "--type=merge",
            "-p", '{"spec": {"suspend": true}}')

    def launcher_terminating() -> dict | None:
        pod = get_json(kubectl, "pod", "ckpt-launcher", "-n", namespace)
        return pod if pod and pod["metadata"].get("deletionTimestamp") else None

    launcher = wait_until(launcher_terminating, 30, "the launcher asked to stop")
    assert launcher["metadata"]["deletionGracePeriodSeconds"] == 30
    workers = get_json(kubectl, "pods", "-n", namespace, "-l",
                       f"{LABEL_JOB}=ckpt,monarch-operator.dev/role=worker")["items"]
    assert len(workers) == 2 and not any(pod["metadata"].get("deletionTimestamp")
                                         for pod in workers), "workers kept while it saves"
    status = wait_phase(kubectl, namespace, "ckpt", "Suspended", timeout=60)
    status = wait_until(lambda: (s := job_status(kubectl, namespace, "ckpt")).get(
        "lastCheckpoint") and s, 60, "the checkpoint recorded")
    where = status["lastCheckpoint"]["location"]
    assert where.startswith("/ckpt/ckpt-demo/step-") and status["lastCheckpoint"]["attempt"] == 1
    assert status["attempts"][0]["class"] == "Suspended"
    assert status["attempts"][0]["checkpoint"] == where
    wait_until(lambda: not get_json(kubectl, "pods", "-n", namespace, "-l",
                                    f"{LABEL_JOB}=ckpt")["items"], 90, "every pod gone")

    kubectl("patch", "monarchjob", "ckpt", "-n", namespace, "--type=merge",
            "-p", '{"spec": {"suspend": false}}')
    done = wait_phase(kubectl, namespace, "ckpt", "Succeeded", timeout=120)
    assert done["attempt"] == 2, done
    log = kubectl("logs", "ckpt-launcher-2", "-n", namespace)
    assert f"resumed from {where}" in log, log
