"""A job's end of life on the real local control plane: deadlines, TTL, cleanup policy, a
terminal job that stays terminal, and which spec changes are refused at admission."""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster.helpers import get_json, job_manifest, wait_until
from tests.cluster.test_operator_watches import children, phase

pytestmark = pytest.mark.cluster

LONG_LAUNCHER = {"command": ["sh", "-c", "sleep 600"]}


def finished(kubectl, namespace: str, name: str, wanted: str = "") -> dict:
    def done():
        job = get_json(kubectl, "monarchjob", name, "-n", namespace)
        status_phase = (job or {}).get("status", {}).get("phase")
        return job if status_phase in ((wanted,) if wanted else ("Succeeded", "Failed")) else None
    return wait_until(done, 120, f"{name} {wanted or 'finished'}")


def condition(job: dict, condition_type: str) -> dict:
    return next(c for c in job["status"]["conditions"] if c["type"] == condition_type)


def apply(kubectl, namespace: str, manifest: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "apply", "-n", namespace, "-f", "-"], input=manifest,
                          capture_output=True, text=True, env=kubectl.env)


def test_active_deadline_fails_the_job_and_releases_everything(kubectl, namespace):
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
        "slow", launcher=LONG_LAUNCHER, activeDeadlineSeconds=20))
    wait_until(lambda: phase(kubectl, namespace, "slow") == "Running", 90, "Running")
    job = finished(kubectl, namespace, "slow", "Failed")
    failed = condition(job, "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert "spec.activeDeadlineSeconds (20s)" in failed["message"]
    assert condition(job, "Running")["status"] == "False", "a failed job is not Running"
    wait_until(lambda: not kubectl.json("pods", "-n", namespace)["items"], 60,
               "launcher and worker pods gone")
    assert get_json(kubectl, "pod", "slow-launcher", "-n", namespace) is None
    assert get_json(kubectl, "statefulset", "slow-worker", "-n", namespace) is None
    job = wait_until(lambda: (j := get_json(kubectl, "monarchjob", "slow", "-n", namespace))
                     and j["status"]["readyWorkers"] == "0/2" and j, 30, "READY 0/2")
    posted = {e["reason"]: e["message"] for e in kubectl.json(
        "events", "-n", namespace, "--field-selector", "involvedObject.name=slow")["items"]}
    for reason in ("WaitingForWorkers", "LauncherStarted", "DeadlineExceeded"):
        assert reason in posted, posted
    # One Event per step: the launcher's says the workers were ready, the ending's what it
    # released (no separate AllWorkersReady, LauncherDeleted, WorkersReleased Events).
    assert "all 2 workers ready" in posted["LauncherStarted"], posted
    assert posted["DeadlineExceeded"].endswith("launcher pod deleted; worker pods deleted"), posted
    assert not {"AllWorkersReady", "LauncherDeleted", "WorkersReleased"} & set(posted), posted


def test_ttl_after_finished_deletes_the_job(kubectl, namespace):
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
        "brief", launcher={"command": ["sh", "-c", "exit 0"]}, ttlSecondsAfterFinished=3))
    wait_until(lambda: phase(kubectl, namespace, "brief") == "Succeeded", 120, "Succeeded")
    wait_until(lambda: get_json(kubectl, "monarchjob", "brief", "-n", namespace) is None, 60,
               "job deleted by its TTL")
    wait_until(lambda: not any(children(kubectl, namespace, "brief").values()), 60,
               "children garbage-collected")


def test_cleanup_policy_keep_all_and_delete_all(kubectl, namespace):
    for name, policy in [("keep", "KeepAll"), ("wipe", "DeleteAll")]:
        kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
            name, launcher={"command": ["sh", "-c", "exit 0"]}, cleanupPolicy=policy))
    finished(kubectl, namespace, "keep", "Succeeded")
    finished(kubectl, namespace, "wipe", "Succeeded")
    wait_until(lambda: not any(children(kubectl, namespace, "wipe").values()), 60,
               "every child of the DeleteAll job deleted")
    assert get_json(kubectl, "monarchjob", "wipe", "-n", namespace)["status"]["phase"] == (
        "Succeeded"), "the job and its status stay"
    kept = {kind: sorted(item["metadata"]["name"] for item in items)
            for kind, items in children(kubectl, namespace, "keep").items()}
    assert kept == {"secrets": ["keep-ssh"], "services": ["keep-worker"],
                    "statefulsets": ["keep-worker"],
                    "configmaps": ["keep-hostfile", "keep-progress"],
                    "launcher pods": ["keep-launcher"]}, kept
    job = get_json(kubectl, "monarchjob", "keep", "-n", namespace)
    assert job["status"]["readyWorkers"] == "2/2", "KeepAll: the workers are still Ready"


def test_terminal_job_stays_terminal_when_children_are_deleted(kubectl, namespace):
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
        "done", launcher={"command": ["sh", "-c", "exit 3"]}))
    job = finished(kubectl, namespace, "done", "Failed")
    wait_until(lambda: get_json(kubectl, "statefulset", "done-worker", "-n", namespace) is None,
               30, "workers released")
    kubectl("delete", "pod,configmap,secret,service", "-n", namespace, "-l",
            "monarch-operator.dev/job=done,monarch-operator.dev/role!=worker", "--wait=true")
    # Level-based passes follow the deletions (watch events on the launcher pod).
    wait_until(lambda: not kubectl.json("pods", "-n", namespace)["items"], 60, "pods gone")
    after = get_json(kubectl, "monarchjob", "done", "-n", namespace)
    assert not any(children(kubectl, namespace, "done").values()), "nothing recreated"
    assert after["status"]["phase"] == "Failed"
    assert after["status"]["launcher"] == job["status"]["launcher"]
    assert condition(after, "Failed") == condition(job, "Failed")
    assert after["status"]["startTime"] == job["status"]["startTime"]
    assert after["status"]["readyWorkers"] == "0/2", "READY counts the workers ready now"


def test_spec_changes_refused_at_admission_naming_the_field(kubectl, namespace):
    base = {"launcher": {"command": ["sh", "-c", "exit 3"]}}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest("fixed", **base))
    for change, field in [
        ({"image": "other:1"}, "spec.image"),
        ({"workers": {"replicas": 3, "gpusPerWorker": 1}}, "spec.workers"),
        ({"launcher": {"command": ["sh", "-c", "exit 0"]}}, "spec.launcher"),
        ({"meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1}, "colocate": True}},
         "spec.meshes"),
        ({"spmd": {"script": "train.py"}, "launcher": {}}, "spec.spmd"),
    ]:
        result = apply(kubectl, namespace, job_manifest("fixed", **{**base, **change}))
        assert result.returncode != 0, f"{change} was accepted"
        assert f"{field} cannot" in result.stderr, result.stderr
    for change in [{"activeDeadlineSeconds": 3600}, {"ttlSecondsAfterFinished": 600},
                   {"cleanupPolicy": "KeepAll"}, {"startupTimeoutSeconds": 300}]:
        result = apply(kubectl, namespace, job_manifest("fixed", **{**base, **change}))
        assert result.returncode == 0, result.stderr
    finished(kubectl, namespace, "fixed", "Failed")
    # A finished job re-applied with another program is refused, not silently "configured".
    result = apply(kubectl, namespace, job_manifest(
        "fixed", launcher={"command": ["sh", "-c", "exit 0"]}, cleanupPolicy="KeepAll",
        startupTimeoutSeconds=300))
    assert result.returncode != 0 and "spec.launcher cannot" in result.stderr, result.stderr
    job = get_json(kubectl, "monarchjob", "fixed", "-n", namespace)
    assert job["spec"]["launcher"]["command"] == base["launcher"]["command"]


def test_template_refused_by_the_api_server_fails_the_job_naming_the_field(kubectl, namespace,
                                                                            operator):
    """C12: the StatefulSet built from the template is invalid: Failed at once, field named."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
        "refused", workers={"replicas": 2, "gpusPerWorker": 1,
                            "template": {"spec": {"restartPolicy": "Never"}}}))
    job = finished(kubectl, namespace, "refused", "Failed")
    failed = condition(job, "Failed")
    assert failed["reason"] == "TemplateRefused"
    assert failed["message"].startswith("spec.workers.template: the API server refused "
                                        "StatefulSet refused-worker"), failed["message"]
    assert "restartPolicy" in failed["message"]
    assert "Traceback" not in operator.read_text(errors="replace")


def test_crash_looping_init_container_fails_fast(kubectl, namespace):
    """C13: an init container that crash-loops fails the job without waiting out the
    600 s startup timeout, naming the container."""
    init = {"name": "prep", "image": "ghcr.io/monarch-operator/worker:0.1.0",
            "command": ["sh", "-c", "exit 1"]}
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
        "initloop", workers={"replicas": 1, "gpusPerWorker": 2,
                             "template": {"spec": {"initContainers": [init]}}},
        meshes={"trainer": {"hosts": 1}, "ref": {"hosts": 1}, "colocate": True},
        startupTimeoutSeconds=600))
    job = finished(kubectl, namespace, "initloop", "Failed")
    failed = condition(job, "Failed")
    assert failed["reason"] == "WorkerCannotStart", failed
    assert ("initloop-worker-0 (Init:CrashLoopBackOff: init container prep exited 1)"
            in failed["message"]), failed["message"]


def test_waiting_says_why_from_failed_create_events(kubectl, namespace):
    """A pod the StatefulSet cannot create (no such ServiceAccount): WorkersReady says so with
    the controller's FailedCreate message, and the job keeps waiting (it can heal)."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=job_manifest(
        "nosa", workers={"replicas": 2, "gpusPerWorker": 1,
                         "template": {"spec": {"serviceAccountName": "nosuch"}}}))

    def waiting_message():
        job = get_json(kubectl, "monarchjob", "nosa", "-n", namespace)
        for item in (job or {}).get("status", {}).get("conditions", []):
            if item["type"] == "WorkersReady" and "FailedCreate" in item["message"]:
                return item
        return None

    ready = wait_until(waiting_message, 60, "WorkersReady naming FailedCreate")
    assert ready["reason"] == "WaitingForWorkers"
    assert "nosuch" in ready["message"], ready["message"]
    assert phase(kubectl, namespace, "nosa") == "Starting"
    kubectl("create", "serviceaccount", "nosuch", "-n", namespace)
    wait_until(lambda: (j := get_json(kubectl, "monarchjob", "nosa", "-n", namespace))
               and j["status"].get("readyWorkers") == "2/2", 120, "workers Ready once it heals")
