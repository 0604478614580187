"""One verdict per attempt from what really happened, on the real local control plane: the
operator's own deletions never count as failures (field case C19), an exit code is a claim (a
launcher stopped from outside never ends Succeeded, issue 20 item 1), and suspend flipped
quickly leaves no pod and no phantom attempt behind (C22).

Launchers are shell commands that read ``MONARCH_ATTEMPT``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid
from pathlib import Path

import pytest

from tests.cluster.helpers import (
    apply_manifest,
    get_json,
    job_manifest,
    job_pods,
    job_status,
    running_attempt,
    wait_phase,
    wait_until,
)
from tests.cluster.podlog import PodLog
from tests.cluster.test_lost_workers import on_nodes

pytestmark = pytest.mark.cluster
ROLE = "monarch-operator.dev/role"
# Attempt 1 runs until the operator stops it (a lost worker, a suspend); a later attempt runs
# 3 s (longer than the 2 s that assert_attempts_truthful requires of an attempt) and succeeds.
UNTIL_STOPPED_FIRST = 'if [ "$MONARCH_ATTEMPT" = 1 ]; then exec sleep 600; fi; sleep 3'
# How long an attempt runs before the test disturbs it (mid-run, past the 2 s rule).
MID_RUN_SECONDS = 3


def restarting_events(kubectl, namespace: str, name: str) -> int:
    """How many ``Restarting`` Events the job got (aggregated ones counted by their count)."""
    listed = json.loads(kubectl("get", "events", "-n", namespace, "-o", "json", "--field-selector",
                                f"involvedObject.name={name},reason=Restarting"))
    return sum(int(event.get("count") or 1) for event in listed["items"])


def seconds(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def suspend(kubectl, namespace: str, name: str, value: bool) -> None:
    kubectl("patch", "monarchjob", name, "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"suspend": value}}))


def assert_attempts_truthful(status: dict, launchers: list, quick_exit: bool = False) -> None:
    """C19's rules for every job: one launcher pod per attempt, no attempt ended as
    LauncherLost, and none ended within 2 s of its launch; with ``quick_exit`` (a launcher
    that exits at once) none ended before its launcher pod did, with its exit code."""
    records = status["attempts"]
    launched = [record for record in records if record.get("launchTime")]
    assert len(launchers) == len(launched) == len(records), (launchers, records)
    for record in records:
        assert record.get("reason") != "LauncherLost", record
        if not quick_exit:
            assert seconds(record["endTime"]) - seconds(record["launchTime"]) >= 2, record
            continue
        (pod,) = [pod for pod in launchers if pod.attempt == str(record["number"])]
        (container,) = pod.last["status"]["containerStatuses"]
        ended = container["state"]["terminated"]
        assert ended["exitCode"] == record["exitCode"], (record, ended)
        assert seconds(ended["finishedAt"]) <= seconds(record["endTime"]), (record, ended)


def test_c19a_application_failures_count_once_each(kubectl, namespace):
    with PodLog(kubectl, namespace, "c19a") as log:
        apply_manifest(kubectl, namespace, job_manifest(
            "c19a", runPolicy={"backoffLimit": 3}, launcher={"command": [
                "sh", "-c", '[ "$MONARCH_ATTEMPT" -ge 3 ] && exit 0; exit 1']}))
        status = wait_phase(kubectl, namespace, "c19a", "Succeeded", timeout=180)
    assert status["restartCount"] == 2
    assert status.get("failureCounts") == {"application": 2}
    assert [record["class"] for record in status["attempts"]] == [
        "Application", "Application", "Succeeded"]
    assert restarting_events(kubectl, namespace, "c19a") == 2
    assert_attempts_truthful(status, log.pods("launcher"), quick_exit=True)


def test_c19b_a_deleted_worker_is_one_infrastructure_failure(kubectl, namespace):
    with PodLog(kubectl, namespace, "c19b") as log:
        apply_manifest(kubectl, namespace, job_manifest(
            "c19b", runPolicy={"backoffLimit": 0, "infrastructureBackoffLimit": 3},
            launcher={"command": ["sh", "-c", UNTIL_STOPPED_FIRST]}))
        running_attempt(kubectl, namespace, "c19b", 1)
        time.sleep(MID_RUN_SECONDS)
        kubectl("delete", "pod", "c19b-worker-1", "-n", namespace, "--wait=false")
        status = wait_phase(kubectl, namespace, "c19b", "Succeeded", timeout=180)
    assert status["restartCount"] == 1
    assert status.get("failureCounts") == {"infrastructure": 1}
    first, second = status["attempts"]
    assert first["class"] == "Infrastructure" and first["lostWorkers"] == ["c19b-worker-1"]
    assert second["class"] == "Succeeded"
    assert restarting_events(kubectl, namespace, "c19b") == 1
    assert_attempts_truthful(status, log.pods("launcher"))


def test_c19c_suspend_and_resume_is_no_failure(kubectl, namespace):
    with PodLog(kubectl, namespace, "c19c") as log:
        apply_manifest(kubectl, namespace, job_manifest(
            "c19c", launcher={"command": ["sh", "-c", UNTIL_STOPPED_FIRST]}))
        running_attempt(kubectl, namespace, "c19c", 1)
        time.sleep(MID_RUN_SECONDS)
        suspend(kubectl, namespace, "c19c", True)
        # Resumed once the suspension is done: Suspended, and the first launcher gone.
        wait_phase(kubectl, namespace, "c19c", "Suspended", timeout=60)
        wait_until(lambda: not [pod for pod in job_pods(kubectl, namespace, "c19c")
                                if pod["metadata"]["labels"].get(ROLE) == "launcher"], 60,
                   "the suspended attempt's launcher gone")
        suspend(kubectl, namespace, "c19c", False)
        status = wait_phase(kubectl, namespace, "c19c", "Succeeded", timeout=180)
    assert status.get("restartCount", 0) == 0
    assert status.get("failureCounts", {}) == {}
    assert [record["class"] for record in status["attempts"]] == ["Suspended", "Succeeded"]
    assert restarting_events(kubectl, namespace, "c19c") == 0
    assert_attempts_truthful(status, log.pods("launcher"))


def test_a_launcher_deleted_mid_run_is_never_succeeded_whatever_it_exits(kubectl, namespace):
    """An exit code is a claim: the program exits 0 on SIGTERM, but its pod was deleted."""
    apply_manifest(kubectl, namespace, job_manifest(
        "claim", runPolicy={"infrastructureBackoffLimit": 0}, launcher={"command": [
            "sh", "-c", "trap 'echo stopped; exit 0' TERM; sleep 600 & wait"]}))
    running_attempt(kubectl, namespace, "claim", 1)
    time.sleep(2)  # the trap is set
    kubectl("delete", "pod", "claim-launcher", "-n", namespace, "--wait=false")
    status = wait_until(lambda: (found := job_status(kubectl, namespace, "claim")).get(
        "phase") in ("Failed", "Succeeded") and found, 90, "claim finished")
    (record,) = status["attempts"]
    assert status["phase"] == "Failed", status
    assert record["class"] == "Infrastructure", record
    assert "claim-launcher" in record["message"] and "deleted" in record["message"], record
    assert record["exitCode"] == 0, record  # recorded, not believed
    wait_until(lambda: not [pod for pod in job_pods(kubectl, namespace, "claim")
                            if pod["metadata"]["labels"].get(ROLE) == "worker"],
               60, "the failed job's workers released")


def flip_suspend(kubectl, namespace: str, name: str, flips: int, gap: float) -> float:
    """Flip ``spec.suspend`` ``flips`` times ``gap`` seconds apart, starting from true; returns
    ``time.monotonic()`` of the last patch."""
    value, last = True, time.monotonic()
    for index in range(flips):
        value = not value
        time.sleep(max(0.0, last + gap - time.monotonic()) if index else 0.0)
        last = time.monotonic()
        suspend(kubectl, namespace, name, value)
    return last


def assert_nothing_left_suspended(kubectl, namespace: str, name: str, pods: PodLog,
                                  since: float) -> dict:
    """C22's state 20 s after the last ``true``: no pod, StatefulSet or hostfile, Suspended,
    no count spent; every worker pod gone within its grace period + 15 s of ``since``."""
    status = wait_until(lambda: (found := job_status(kubectl, namespace, name)).get(
        "phase") == "Suspended" and found, max(1.0, since + 20 - time.monotonic()),
        f"{name} Suspended")
    time.sleep(max(0.0, since + 20 - time.monotonic()))
    assert not job_pods(kubectl, namespace, name), [
        pod["metadata"]["name"] for pod in job_pods(kubectl, namespace, name)]
    assert get_json(kubectl, "statefulset", f"{name}-worker", "-n", namespace) is None
    assert get_json(kubectl, "configmap", f"{name}-hostfile", "-n", namespace) is None
    status = job_status(kubectl, namespace, name)
    assert status["phase"] == "Suspended", status
    assert status.get("restartCount", 0) == 0 and status.get("failureCounts", {}) == {}, status
    for pod in pods.pods("worker"):
        assert pod.gone_at is not None, f"{pod.name} still there"
        assert pod.gone_at - max(since, pod.first_seen) <= pod.grace_seconds + 15, pod
    return status


def assert_launch_times_are_real(status: dict, pods: PodLog) -> None:
    """No ``attempts[]`` entry has a ``launchTime`` unless its launcher pod was created."""
    launched = {pod.attempt for pod in pods.pods("launcher")}
    for record in status.get("attempts") or []:
        if record.get("launchTime"):
            assert str(record["number"]) in launched, (record, launched)


def finish_after_resume(kubectl, namespace: str, name: str, pods: PodLog,
                        sets: PodLog) -> dict:
    """Set ``suspend: false``; the job Succeeds with one StatefulSet and one launcher."""
    sets_before = len(sets.pods())
    launchers_before = len(pods.pods("launcher"))
    suspend(kubectl, namespace, name, False)
    status = wait_phase(kubectl, namespace, name, "Succeeded", timeout=120)
    assert len(sets.pods()) - sets_before == 1, sets.pods()
    new_launchers = pods.pods("launcher")[launchers_before:]
    assert [pod.attempt for pod in new_launchers] == [str(status["attempt"])], new_launchers
    assert status.get("restartCount", 0) == 0 and status.get("failureCounts", {}) == {}, status
    assert_launch_times_are_real(status, pods)
    return status


def test_c22_suspend_flipped_quickly_leaves_nothing_behind(kubectl, namespace):
    with PodLog(kubectl, namespace, "c22") as pods, \
            PodLog(kubectl, namespace, "c22", kind="statefulsets") as sets:
        apply_manifest(kubectl, namespace, job_manifest(
            "c22", suspend=True, launcher={"command": ["sh", "-c", "sleep 3"]}))
        wait_phase(kubectl, namespace, "c22", "Suspended", timeout=60)
        last_true = flip_suspend(kubectl, namespace, "c22", 10, 0.3)
        status = assert_nothing_left_suspended(kubectl, namespace, "c22", pods, last_true)
        assert_launch_times_are_real(status, pods)
        status = finish_after_resume(kubectl, namespace, "c22", pods, sets)
    assert status["attempts"][-1]["class"] == "Succeeded"


def test_c22_suspended_the_moment_the_launcher_appears(kubectl, namespace):
    with PodLog(kubectl, namespace, "c22l") as pods, \
            PodLog(kubectl, namespace, "c22l", kind="statefulsets") as sets:
        apply_manifest(kubectl, namespace, job_manifest(
            "c22l", launcher={"command": ["sh", "-c", "sleep 3"]}))
        wait_until(lambda: pods.pods("launcher"), 90, "a launcher pod", interval=0.05)
        suspend(kubectl, namespace, "c22l", True)
        suspended_at = time.monotonic()
        status = assert_nothing_left_suspended(kubectl, namespace, "c22l", pods, suspended_at)
        assert_launch_times_are_real(status, pods)
        assert [record.get("class") for record in status["attempts"]] == ["Suspended", None]
        status = finish_after_resume(kubectl, namespace, "c22l", pods, sets)
    assert [record["class"] for record in status["attempts"]] == ["Suspended", "Succeeded"]


@pytest.fixture
def triggers():
    """A directory every pod's process can read (the pods are local processes on this
    machine), for a test to tell a container when to end."""
    path = Path(f"/tmp/verdicts-trigger-{uuid.uuid4().hex[:8]}")
    path.mkdir(mode=0o777)
    os.chmod(path, 0o777)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def test_a_worker_lost_before_the_launcher_failed_wins_though_reported_after(
        kubectl, namespace, local_cluster, triggers):
    """Issue 20 item 1: worker 1's container ends, then the launcher fails because of it; the
    worker's node reports late (its kubelet cut off for a moment), so the watch delivers the
    launcher's failure first. The attempt is still Infrastructure, as the timestamps say."""
    worker_node, launcher_node = "kwok-gpu-2", "kwok-gpu-0"
    # A side container of each worker that ends when its trigger file appears (once).
    side = {"name": "side", "image": "busybox", "command": ["sh", "-c",
            f'while [ ! -e {triggers}/"$HOSTNAME" ]; do sleep 0.1; done; '
            f'rm -f {triggers}/"$HOSTNAME"; exit 3']}
    launcher_script = (f'[ "$MONARCH_ATTEMPT" -ge 2 ] && exit 0; '
                       f'while [ ! -e {triggers}/launcher ]; do sleep 0.1; done; '
                       'echo "worker 1 gone" >&2; exit 1')
    apply_manifest(kubectl, namespace, job_manifest(
        "order", runPolicy={"backoffLimit": 0, "infrastructureBackoffLimit": 1},
        workers={"replicas": 2, "gpusPerWorker": 1, "template": {"spec": {
            "containers": [side], **on_nodes("In", [worker_node])}}},
        launcher={"command": ["sh", "-c", launcher_script],
                  "template": {"spec": on_nodes("In", [launcher_node])}}))
    running_attempt(kubectl, namespace, "order", 1)

    local_cluster.node_down(worker_node, mode="partition")
    try:
        (triggers / "order-worker-1").touch()  # ends now; its node reports nothing yet
        time.sleep(1.5)
        (triggers / "launcher").touch()
        wait_until(lambda: (get_json(kubectl, "pod", "order-launcher", "-n", namespace)
                            or {}).get("status", {}).get("phase") == "Failed", 30,
                   "the launcher's failure reported", interval=0.1)
        failed_seen = time.monotonic()
    finally:
        local_cluster.node_up(worker_node)
    reported = wait_until(lambda: [c for c in ((get_json(kubectl, "pod", "order-worker-1", "-n",
                                                          namespace) or {}).get("status") or {})
                                   .get("containerStatuses") or [] if c.get("restartCount")
                                   or "terminated" in (c.get("state") or {})], 30,
                          "worker 1's end reported", interval=0.1) and time.monotonic()
    print(f"worker 1's end reported {reported - failed_seen:.1f}s after the launcher's failure")
    status = wait_until(lambda: (found := job_status(kubectl, namespace, "order")).get(
        "phase") in ("Succeeded", "Failed") and found, 120, "order finished")

    first, second = status["attempts"]
    assert (first["class"], first["reason"], first["lostWorkers"]) == (
        "Infrastructure", "WorkerRestarted", ["order-worker-1"]), first
    assert first["exitCode"] == 1, first
    assert second["class"] == "Succeeded"
    assert status.get("failureCounts") == {"infrastructure": 1}


# Field case C21's script: every rank says what it sees; attempt 1 (no restart yet) fails,
# once every rank has written what it saw (the launcher stops the other ranks at the first
# failure: a rank slower to start, on a loaded machine, would never have written it).
RESUME_PY = """\
import glob, os, sys, time
seen = {key: os.environ.get(key) for key in ("RANK", "TORCHELASTIC_RESTART_COUNT",
                                             "TORCHELASTIC_MAX_RESTARTS", "MONARCH_ATTEMPT")}
print(" ".join(f"{key}={value}" for key, value in seen.items()), flush=True)
here = os.path.dirname(os.path.abspath(__file__))
attempt = seen["MONARCH_ATTEMPT"]
with open(os.path.join(here, f"attempt-{attempt}-rank-{seen['RANK']}"), "w") as out:
    out.write(repr(seen))
deadline = time.monotonic() + 60
while (len(glob.glob(os.path.join(here, f"attempt-{attempt}-rank-*"))) < 4
       and time.monotonic() < deadline):
    time.sleep(0.1)
sys.exit(1 if seen["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
"""
REPO_OPERATOR = Path(__file__).resolve().parents[2] / "operator"


def test_c21_restart_variables_on_every_rank(kubectl, namespace, triggers):
    """C21 with spec.spmd: attempt 1's ranks see 0 and fail; attempt 2's four ranks see a
    restart count of 1 and MONARCH_ATTEMPT=2, and the job Succeeds."""
    script = triggers / "resume.py"
    script.write_text(RESUME_PY)
    script.chmod(0o644)
    apply_manifest(kubectl, namespace, job_manifest(
        "c21", workers={"replicas": 2, "gpusPerWorker": 2},
        spmd={"script": str(script), "nprocPerNode": 2}, runPolicy={"backoffLimit": 1},
        # This tree's launcher, not the one installed in the environment the pods run from.
        launcher={"env": [{"name": "PYTHONPATH", "value": str(REPO_OPERATOR)}]}))
    status = wait_until(lambda: (found := job_status(kubectl, namespace, "c21")).get(
        "phase") in ("Succeeded", "Failed") and found, 240, "c21 finished")

    seen = {path.name: eval(path.read_text())  # noqa: S307 (our own repr of a dict of str)
            for path in triggers.glob("attempt-*")}
    assert sorted(seen) == [f"attempt-{attempt}-rank-{rank}" for attempt in (1, 2)
                            for rank in range(4)], (seen, status)
    for name, values in seen.items():
        attempt = name.split("-")[1]
        assert values == {"RANK": name.rsplit("-", 1)[1], "MONARCH_ATTEMPT": attempt,
                          "TORCHELASTIC_RESTART_COUNT": str(int(attempt) - 1),
                          "TORCHELASTIC_MAX_RESTARTS": "4"}, (name, values)
    assert status["phase"] == "Succeeded", status
    assert status["restartCount"] == 1
    assert [(record["class"], record.get("exitCode")) for record in status["attempts"]] == [
        ("Application", 1), ("Succeeded", 0)]


# Attempt 1 runs until stopped; attempt 2 fails its pre-flight on the second host of the
# hostfile, as monarch-launch words it (kwok's pods have no cluster DNS whose cache could lag:
# the line is the launcher's, the judgment the operator's); attempt 3 succeeds.
C20_LAUNCHER = r"""
case "$MONARCH_ATTEMPT" in
1) exec sleep 600 ;;
2) host=$(sed -n 2p "$MONARCH_HOSTFILE" | cut -d ' ' -f 1)
   echo "monarch-launch: failed: pre-flight failed on 1 of 2 hosts after 30.0s: $host" \
        "(10.244.9.9): DNSNotResolvable: [Errno -2] Name or service not known" >&2
   exit 1 ;;
esac
"""


def test_c20_preflight_failure_on_a_recreated_worker_is_not_an_application_failure(
        kubectl, namespace):
    apply_manifest(kubectl, namespace, job_manifest(
        "c20", runPolicy={"backoffLimit": 0, "infrastructureBackoffLimit": 2},
        launcher={"command": ["sh", "-c", C20_LAUNCHER]}))
    running_attempt(kubectl, namespace, "c20", 1)
    kubectl("delete", "pod", "c20-worker-1", "-n", namespace, "--wait=false")
    status = wait_until(lambda: (found := job_status(kubectl, namespace, "c20")).get(
        "phase") in ("Succeeded", "Failed") and found, 180, "c20 finished")

    assert [record["class"] for record in status["attempts"]] == [
        "Infrastructure", "Infrastructure", "Succeeded"], status["attempts"]
    second = status["attempts"][1]
    assert second["reason"] == "WorkerUnreachable", second
    assert "recreated worker c20-worker-1 (DNSNotResolvable)" in second["message"], second
    assert status["failureCounts"] == {"infrastructure": 2}, "the application count stays 0"
    assert status["phase"] == "Succeeded"
