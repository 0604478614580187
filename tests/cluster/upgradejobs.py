"""Jobs in every phase for the chart upgrade tests (field case C33), and what an upgrade must
not change of them: launchers and workers that wait for flag files the test creates, a job
held Restarting, a suspended one, a queued one, and their snapshots."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import yaml

from monarch_operator.localcluster.cli import pod_log_path
from tests.chart import NEW_ENV, NEW_LABEL, ROOT
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
from tests.cluster.test_kueue import QUEUE_LABEL

# The worker image's entrypoint as the node agent runs it (its IMAGE_PATHS), here from a shell.
WORKER_ENTRYPOINT = ROOT / "images" / "worker" / "entrypoint.sh"
ROLE_LABEL = "monarch-operator.dev/role"


def reporting_program(flag: Path) -> str:
    """A launcher program that reports a step every 0.3 s until ``flag`` exists."""
    return textwrap.dedent(f"""
        import os, time
        from monarch_operator.job import report
        step = 0
        while not os.path.exists({str(flag)!r}):
            step += 1
            report(step)
            time.sleep(0.3)
        report(step + 1)
        print("done", flush=True)
    """)


def waits_for(flag: Path) -> dict[str, Any]:
    """A launcher that ends (0) once ``flag`` exists."""
    return {"command": ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.2; done"]}


def gated_worker_template(flag: Path, armed: Path | None = None) -> dict[str, Any]:
    """Workers whose sshd (and so readiness) waits for ``flag``; with ``armed``, only the
    worker containers started once ``armed`` exists wait (the first ones start at once)."""
    wait = f"while [ ! -e {flag} ]; do sleep 0.2; done"
    if armed is not None:
        wait = f"if [ -e {armed} ]; then {wait}; fi"
    return {"spec": {"containers": [{"name": "worker", "command": [
        "sh", "-c", f"{wait}; exec {WORKER_ENTRYPOINT}"]}]}}


def queued(name: str, **spec: Any) -> str:
    """A job of 2 workers x 2 GPUs in the LocalQueue ``user-queue``."""
    body = yaml.safe_load(job_manifest(name, workers={"replicas": 2, "gpusPerWorker": 2},
                                       **spec))
    body["metadata"]["labels"] = {QUEUE_LABEL: "user-queue"}
    return yaml.safe_dump(body)


def start_restarting(kubectl: Any, namespace: str, name: str, flags: Path) -> None:
    """Job ``name`` held in Restarting: attempt 1 runs, then its worker 1 is deleted; the
    StatefulSet's new pod waits for ``flags/<name>-gate`` (not Ready), so attempt 1 ends as an
    Infrastructure failure and attempt 2 waits for its workers until the test opens the gate.
    Its launcher ends once ``flags/<name>-done`` exists."""
    armed = flags / f"{name}-armed"
    apply_manifest(kubectl, namespace, job_manifest(
        name, runPolicy={"backoffLimit": 1, "infrastructureBackoffLimit": 2},
        workers={"replicas": 2, "gpusPerWorker": 1,
                 "template": gated_worker_template(flags / f"{name}-gate", armed)},
        launcher=waits_for(flags / f"{name}-done")))
    running_attempt(kubectl, namespace, name, 1)
    armed.touch()
    kubectl("delete", "pod", f"{name}-worker-1", "-n", namespace, "--wait=false")
    wait_until(lambda: job_status(kubectl, namespace, name).get("phase") == "Restarting"
               and only_workers(kubectl, namespace, name), 90, f"{name} Restarting")


def start_suspended(kubectl: Any, namespace: str, name: str, flags: Path) -> None:
    """Job ``name`` Running, then suspended (its pods deleted). Its launcher ends once
    ``flags/<name>-done`` exists."""
    apply_manifest(kubectl, namespace, job_manifest(
        name, launcher=waits_for(flags / f"{name}-done")))
    running_attempt(kubectl, namespace, name, 1)
    set_suspend(kubectl, namespace, name, True)
    wait_phase(kubectl, namespace, name, "Suspended", timeout=60)
    wait_until(lambda: not job_pods(kubectl, namespace, name), 60, f"{name}'s pods gone")


def set_suspend(kubectl: Any, namespace: str, name: str, suspend: bool) -> None:
    kubectl("patch", "monarchjob", name, "-n", namespace, "--type=merge", "-p",
            json.dumps({"spec": {"suspend": suspend}}))


def only_workers(kubectl: Any, namespace: str, name: str) -> bool:
    """Whether the job's pods are its two workers and nothing is being deleted."""
    pods = job_pods(kubectl, namespace, name)
    return len(pods) == 2 and all(
        pod["metadata"]["labels"].get(ROLE_LABEL) == "worker"
        and not pod["metadata"].get("deletionTimestamp") for pod in pods)


def snapshot(kubectl: Any, namespace: str, job: str) -> dict[str, Any]:
    """What an upgrade must not change: the job's pods (uid and restarts per container), its
    worker StatefulSet (uid, generation, pod template; None when it has none), its attempt
    counters, its spec's runPolicy and generation."""
    pods = {pod["metadata"]["name"]: (
        pod["metadata"]["uid"],
        tuple(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", [])),
        pod["metadata"].get("deletionTimestamp"))
        for pod in job_pods(kubectl, namespace, job)}
    worker_set = get_json(kubectl, "statefulset", f"{job}-worker", "-n", namespace)
    body = get_json(kubectl, "monarchjob", job, "-n", namespace)
    status = body.get("status") or {}
    return {
        "pods": pods,
        "statefulset": worker_set and (
            worker_set["metadata"]["uid"], worker_set["metadata"]["generation"],
            json.dumps(worker_set["spec"]["template"], sort_keys=True)),
        "phase": status.get("phase"),
        "attempt": status.get("attempt"),
        "attempts": [(record.get("number"), record.get("class"), record.get("reason"))
                     for record in status.get("attempts", [])],
        "restartCount": status.get("restartCount", 0),
        "failureCounts": status.get("failureCounts", {}),
        "runPolicy": body["spec"].get("runPolicy"),
        "generation": body["metadata"]["generation"],
    }


def operator_pods(kubectl: Any, namespace: str, release: str) -> list[dict[str, Any]]:
    """The release's operator pods that are not being deleted."""
    return [pod for pod in get_json(kubectl, "pods", "-n", namespace, "-l",
                                    f"app.kubernetes.io/instance={release}")["items"]
            if not pod["metadata"].get("deletionTimestamp")]


def leader(kubectl: Any, namespace: str, lease: str) -> str:
    """The pod holding Lease ``lease`` ("" while none)."""
    body = get_json(kubectl, "lease", lease, "-n", namespace) or {}
    return ((body.get("spec") or {}).get("holderIdentity") or "").split("_")[0]


def worker_template(kubectl: Any, namespace: str, job: str) -> tuple[dict, dict]:
    """The worker StatefulSet's pod labels and worker container env."""
    template = get_json(kubectl, "statefulset", f"{job}-worker", "-n", namespace)[
        "spec"]["template"]
    [container] = template["spec"]["containers"]
    return (template["metadata"]["labels"],
            {item["name"]: item.get("value") for item in container.get("env", [])})


def assert_new_defaults(kubectl: Any, namespace: str, job: str) -> None:
    """The job's worker StatefulSet and its pods carry the newer chart's worker defaults."""
    labels, env = worker_template(kubectl, namespace, job)
    assert (labels.get(NEW_LABEL[0]), env.get(NEW_ENV[0])) == (NEW_LABEL[1], NEW_ENV[1]), job
    workers = [pod for pod in job_pods(kubectl, namespace, job)
               if pod["metadata"]["labels"].get(ROLE_LABEL) == "worker"]
    assert workers and all(pod["metadata"]["labels"].get(NEW_LABEL[0]) == NEW_LABEL[1]
                           for pod in workers), job


def step(kubectl: Any, namespace: str, job: str) -> int:
    return int((job_status(kubectl, namespace, job).get("progress") or {}).get("step") or 0)


def ended_once(kubectl: Any, namespace: str, job: str, attempt: int = 1, restarts: int = 0,
               failures: dict[str, int] | None = None) -> dict[str, Any]:
    """Wait for Succeeded; assert the attempt, restarts and failures it ended with."""
    status = wait_phase(kubectl, namespace, job, "Succeeded", timeout=120)
    assert (status.get("attempt"), len(status["attempts"]), status.get("restartCount", 0),
            {key: value for key, value in (status.get("failureCounts") or {}).items() if value},
            ) == (attempt, attempt, restarts, failures or {}), (job, status)
    return status


def report(kubectl: Any, local_cluster: Any, namespace: str, release: str) -> str:
    """The jobs' status, the Workloads and the operator pods' output, for a failure."""
    lines = []
    for job in get_json(kubectl, "monarchjobs", "-n", namespace)["items"]:
        lines.append(f"job {job['metadata']['name']}: {json.dumps(job.get('status'))[:2000]}")
    lines.append(kubectl("get", "pods,workloads", "-n", namespace, "-o", "wide", check=False))
    for pod in get_json(kubectl, "pods", "-n", namespace, "-l",
                        f"app.kubernetes.io/instance={release}")["items"]:
        path = pod_log_path(local_cluster.state_dir, namespace, pod["metadata"]["name"])
        if path is not None:
            lines.append(f"--- {pod['metadata']['name']}\n"
                         f"{path.read_text(errors='replace')[-4000:]}")
    return "\n".join(lines)
