"""Field case C33 (issue 34 item 4): `helm upgrade` of the operator leaves running jobs alone.

The chart runs as its own two pods (leader election) on the node agent, watching this test's
``chart-*`` namespace. Job ``demo`` runs (its program reports steps until the test lets it
end), ``gated`` waits for a worker that is not Ready, and ``queued`` waits in Kueue for the
quota ``demo`` holds. Then the release is upgraded to a newer chart: another appVersion (the
operator image tag), default worker labels and env (``workerDefaults``) that the old one did
not have, and a CRD with one more optional, defaulted spec field, applied first as
docs/install.md says. Across it: no pod of ``demo`` or ``gated`` is deleted or restarted, their
StatefulSets are as they were, no attempt, restart or failure is added, ``queued``'s Workload
is the same object (its place in the queue kept), and the stored jobs, read through the new
schema, reconcile. ``restarting`` is between two attempts (a worker's sshd killed, its
restarted container not Ready) and ``suspended`` has been suspended mid-run: neither gains an
attempt, a restart or a count across the upgrade, and each ends with exactly the attempts it
had coming. A job created after the upgrade, ``queued`` once admitted and ``suspended`` once
resumed get the new defaults (docs/install.md, "Upgrades and running jobs"). All end as they
would have.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from monarch_operator import constants
from monarch_operator.localcluster.cli import pod_log_path
from tests.chart import CHART, NEW_ENV, NEW_FIELD, NEW_LABEL, NEW_VERSION, ROOT, helm, newer_chart
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
from tests.cluster.test_kueue import KUEUE, QUEUE_LABEL, cluster_queue, kueue_objects

pytestmark = pytest.mark.cluster

RELEASE = "mo"
FULLNAME = f"{RELEASE}-monarch-operator"
CRD_FILE = ROOT / "crds" / "monarchjobs.monarch-operator.dev.yaml"
# The jobs whose pods, StatefulSet and counters the upgrade must leave as they were.
DISTURBED = ("demo", "gated", "restarting", "suspended")
# The worker image's entrypoint as the node agent runs it (its IMAGE_PATHS), here from a shell.
WORKER_ENTRYPOINT = ROOT / "images" / "worker" / "entrypoint.sh"


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


def waits_for(flag: Path) -> dict:
    """A launcher that ends (0) once ``flag`` exists."""
    return {"command": ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.2; done"]}


def gated_worker_template(flag: Path) -> dict:
    """Workers whose sshd (and so readiness) waits for ``flag``."""
    script = f"while [ ! -e {flag} ]; do sleep 0.2; done; exec {WORKER_ENTRYPOINT}"
    return {"spec": {"containers": [{"name": "worker", "command": ["sh", "-c", script]}]}}


def restarted_worker_template(markers: Path, flag: Path) -> dict:
    """Workers that start at once the first time and, when their container is restarted,
    wait for ``flag`` before sshd (not Ready until then). ``markers`` is writable by the pods."""
    script = (f'marker={markers}/"$HOSTNAME"; if [ -e "$marker" ]; then '
              f"while [ ! -e {flag} ]; do sleep 0.2; done; fi; "
              f'touch "$marker"; exec {WORKER_ENTRYPOINT}')
    return {"spec": {"containers": [{"name": "worker", "command": ["sh", "-c", script]}]}}


def first_attempt_hangs(flag: Path | None = None) -> dict:
    """A launcher whose first attempt runs until stopped; a later one ends (0) at once, or
    once ``flag`` exists."""
    then = f"while [ ! -e {flag} ]; do sleep 0.2; done" if flag else "true"
    return {"command": ["sh", "-c",
                        f'if [ "$MONARCH_ATTEMPT" = 1 ]; then exec sleep 600; fi; {then}']}


def queued(name: str, **spec) -> str:
    body = yaml.safe_load(job_manifest(name, workers={"replicas": 2, "gpusPerWorker": 2},
                                       **spec))
    body["metadata"]["labels"] = {QUEUE_LABEL: "user-queue"}
    return yaml.safe_dump(body)


def snapshot(kubectl, namespace: str, job: str) -> dict:
    """What an upgrade must not change: the job's pods (uid and restarts per container), its
    worker StatefulSet (uid, generation, pod template), and its attempt counters."""
    pods = {pod["metadata"]["name"]: (
        pod["metadata"]["uid"],
        tuple(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", [])),
        pod["metadata"].get("deletionTimestamp"))
        for pod in job_pods(kubectl, namespace, job)}
    worker_set = get_json(kubectl, "statefulset", f"{job}-worker", "-n", namespace)
    status = job_status(kubectl, namespace, job)
    return {
        "pods": pods,
        "statefulset": worker_set and (
            worker_set["metadata"]["uid"], worker_set["metadata"]["generation"],
            json.dumps(worker_set["spec"]["template"], sort_keys=True)),
        "attempt": status.get("attempt"),
        "attempts": len(status.get("attempts", [])),
        "restartCount": status.get("restartCount", 0),
        "failureCounts": status.get("failureCounts", {}),
    }


def operator_pods(kubectl, namespace: str) -> list[dict]:
    return [pod for pod in get_json(kubectl, "pods", "-n", namespace, "-l",
                                    f"app.kubernetes.io/instance={RELEASE}")["items"]
            if not pod["metadata"].get("deletionTimestamp")]


def leader(kubectl, namespace: str) -> str:
    """The holder of the release's Lease ("" while none)."""
    lease = get_json(kubectl, "lease", FULLNAME, "-n", namespace) or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def worker_template(kubectl, namespace: str, job: str) -> tuple[dict, dict]:
    """The worker StatefulSet's pod labels and worker container env."""
    template = get_json(kubectl, "statefulset", f"{job}-worker", "-n", namespace)[
        "spec"]["template"]
    [container] = template["spec"]["containers"]
    return (template["metadata"]["labels"],
            {item["name"]: item.get("value") for item in container.get("env", [])})


def assert_new_defaults(kubectl, namespace: str, job: str) -> None:
    """The job's worker StatefulSet and its pods carry the newer chart's worker defaults."""
    labels, env = worker_template(kubectl, namespace, job)
    assert (labels.get(NEW_LABEL[0]), env.get(NEW_ENV[0])) == (NEW_LABEL[1], NEW_ENV[1]), job
    workers = [pod for pod in job_pods(kubectl, namespace, job)
               if pod["metadata"]["labels"].get("monarch-operator.dev/role") == "worker"]
    assert workers and all(pod["metadata"]["labels"].get(NEW_LABEL[0]) == NEW_LABEL[1]
                           for pod in workers), job


def step(kubectl, namespace: str, job: str) -> int:
    return int((job_status(kubectl, namespace, job).get("progress") or {}).get("step") or 0)


def report(kubectl, local_cluster, namespace: str) -> str:
    """The jobs' status, the Workloads and the operator pods' output, for a failure."""
    lines = []
    for job in get_json(kubectl, "monarchjobs", "-n", namespace)["items"]:
        lines.append(f"job {job['metadata']['name']}: {json.dumps(job.get('status'))[:2000]}")
    lines.append(kubectl("get", "pods,workloads", "-n", namespace, "-o", "wide", check=False))
    for pod in get_json(kubectl, "pods", "-n", namespace, "-l",
                        f"app.kubernetes.io/instance={RELEASE}")["items"]:
        path = pod_log_path(local_cluster.state_dir, namespace, pod["metadata"]["name"])
        if path is not None:
            lines.append(f"--- {pod['metadata']['name']}\n"
                         f"{path.read_text(errors='replace')[-4000:]}")
    return "\n".join(lines)


@pytest.fixture
def flags():
    """A directory for the files that let the jobs go on: the job's pods run as uid 1000, and
    pytest's own directories are the test user's alone (0700)."""
    path = Path(tempfile.mkdtemp(prefix="c33-flags-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def restore_crd(kubectl):
    """Put the repository's CRD back (without the upgrade's field) after the test."""
    try:
        yield
    finally:
        kubectl("replace", "-f", str(CRD_FILE))


@pytest.fixture
def chart_queue(kueue, kubectl, chart_namespace):
    """A ClusterQueue of 4 GPUs for this namespace only and LocalQueue ``user-queue``.

    The chart in namespaced mode grants no cluster-scoped read, and the operator reads the
    admitted job's ResourceFlavor (cluster-scoped) to put its node labels on the pods: here a
    ClusterRole that may get ResourceFlavors and WorkloadPriorityClasses is bound to the
    release's ServiceAccount, as a cluster admin would have to today (docs/kueue.md)."""
    flavor, cq = f"flavor-{chart_namespace}", f"cq-{chart_namespace}"
    kueue_objects(kubectl, {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                            "metadata": {"name": flavor}},
                  cluster_queue(cq, flavor, chart_namespace, gpus=4),
                  {"apiVersion": KUEUE, "kind": "LocalQueue",
                   "metadata": {"name": "user-queue", "namespace": chart_namespace},
                   "spec": {"clusterQueue": cq}})
    reader = f"{chart_namespace}-kueue-reader"
    kubectl("create", "clusterrole", reader, "--verb=get",
            "--resource=resourceflavors.kueue.x-k8s.io,workloadpriorityclasses.kueue.x-k8s.io")
    kubectl("create", "clusterrolebinding", reader, f"--clusterrole={reader}",
            f"--serviceaccount={chart_namespace}:{FULLNAME}")
    try:
        yield
    finally:
        kubectl("delete", "clusterrolebinding,clusterrole", reader, check=False)
        kubectl("delete", "monarchjobs", "--all", "-n", chart_namespace, "--wait=true",
                "--timeout=60s", check=False)
        kubectl("delete", "localqueues", "--all", "-n", chart_namespace, check=False)
        kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)
        kubectl("delete", "resourceflavor", flavor, "--wait=false", check=False)


def test_c33_helm_upgrade_leaves_jobs_in_every_phase_alone(
        kubectl, helm_env, chart_namespace, chart_queue, restore_crd, tmp_path, local_cluster,
        flags):
    started = time.monotonic()
    namespace = chart_namespace
    scope = ("--set", f"watchNamespaces={{{namespace}}}")
    installed = helm("install", RELEASE, str(CHART), "-n", namespace, *scope, "--wait",
                     "--timeout=120s", env=helm_env)
    assert installed.returncode == 0
    old_pods = {pod["metadata"]["name"] for pod in operator_pods(kubectl, namespace)}
    assert len(old_pods) == 2, old_pods
    wait_until(lambda: leader(kubectl, namespace).split("_")[0] in old_pods, 60,
               "an operator pod holds the Lease")
    try:
        run_c33(kubectl, helm_env, namespace, scope, tmp_path, flags, old_pods)
    except Exception:
        print(report(kubectl, local_cluster, namespace))
        raise
    finally:
        helm("uninstall", RELEASE, "-n", namespace, "--wait", env=helm_env, check=False)
    print(f"C33 wall time {time.monotonic() - started:.1f}s")


def run_c33(kubectl, helm_env, namespace: str, scope: tuple[str, ...], tmp_path: Path,
            flags: Path, old_pods: set[str]) -> None:
    demo_done, gate_open = flags / "demo-done", flags / "gate-open"
    apply_manifest(kubectl, namespace, queued(
        "demo", progress={"reportIntervalSeconds": 1},
        launcher={"command": ["python3", "-c", reporting_program(demo_done)]}))
    markers, restart_gate, resumed_done = (flags / "markers", flags / "restart-gate",
                                           flags / "resumed-done")
    markers.mkdir()
    markers.chmod(0o777)
    apply_manifest(kubectl, namespace, job_manifest(
        "restarting", workers={"replicas": 2, "gpusPerWorker": 1,
                               "template": restarted_worker_template(markers, restart_gate)},
        launcher=first_attempt_hangs()))
    apply_manifest(kubectl, namespace, job_manifest(
        "suspended", launcher=first_attempt_hangs(resumed_done)))
    wait_until(lambda: step(kubectl, namespace, "demo") >= 2, 120, "demo reporting steps")
    apply_manifest(kubectl, namespace, job_manifest(
        "gated", workers={"replicas": 2, "gpusPerWorker": 1,
                          "template": gated_worker_template(gate_open)},
        launcher={"command": ["true"]}))
    queued_done = flags / "queued-done"
    apply_manifest(kubectl, namespace, queued("queued", launcher=waits_for(queued_done)))
    wait_phase(kubectl, namespace, "queued", "Queued", timeout=60)
    wait_until(lambda: len([pod for pod in job_pods(kubectl, namespace, "gated")
                            if pod["status"].get("phase") == "Running"]) == 2, 60,
               "gated's workers running, not Ready")
    assert job_status(kubectl, namespace, "gated")["phase"] in ("Pending", "Starting")
    assert job_status(kubectl, namespace, "demo")["phase"] == "Running"
    between_attempts_and_suspended(kubectl, namespace)
    before = {job: snapshot(kubectl, namespace, job) for job in DISTURBED}
    workload_uid = get_json(kubectl, "workloads", "-n", namespace, "-l",
                            "monarch-operator.dev/job=queued")["items"][0]["metadata"]["uid"]
    demo_labels, demo_env = worker_template(kubectl, namespace, "demo")
    assert NEW_LABEL[0] not in demo_labels and NEW_ENV[0] not in demo_env

    # The upgrade as docs/install.md says: the new chart's CRD first, then the release (its
    # own values, the new chart's defaults: no --reuse-values).
    chart = newer_chart(tmp_path)
    kubectl("apply", "-f", "-", stdin=helm("show", "crds", str(chart), env=helm_env).stdout)
    upgrade_started = time.monotonic()
    helm("upgrade", RELEASE, str(chart), "-n", namespace, *scope, "--wait", "--timeout=180s",
         env=helm_env)
    new_pods = wait_until(lambda: (pods := operator_pods(kubectl, namespace)) and len(pods) == 2
                          and all(pod["spec"]["containers"][0]["image"].endswith(
                              f":{NEW_VERSION}") for pod in pods) and pods, 120,
                          "two operator pods of the new image")
    new_names = {pod["metadata"]["name"] for pod in new_pods}
    assert not new_names & old_pods
    wait_until(lambda: leader(kubectl, namespace).split("_")[0] in new_names, 60,
               "a new operator pod holds the Lease")
    print(f"upgrade and hand-over took {time.monotonic() - upgrade_started:.1f}s")

    # The new leader reconciles: a job created now starts with the new defaults, and demo's
    # steps go on.
    after_upgrade = step(kubectl, namespace, "demo")
    late_done = flags / "late-done"
    apply_manifest(kubectl, namespace, job_manifest("late", launcher=waits_for(late_done)))
    wait_phase(kubectl, namespace, "late", "Running", timeout=90)
    assert_new_defaults(kubectl, namespace, "late")
    late_done.touch()
    wait_phase(kubectl, namespace, "late", "Succeeded", timeout=60)
    wait_until(lambda: step(kubectl, namespace, "demo") > after_upgrade + 2, 60,
               "demo's steps advancing after the upgrade")

    # The stored jobs read through the new schema: the new field defaulted, spec unwritten.
    demo = get_json(kubectl, "monarchjob", "demo", "-n", namespace)
    assert demo["spec"][NEW_FIELD[0]] == NEW_FIELD[1]
    assert demo["metadata"]["generation"] == 1
    after = {job: snapshot(kubectl, namespace, job) for job in DISTURBED}
    assert after == before
    assert [job_status(kubectl, namespace, job)["phase"] for job in ("restarting", "suspended")
            ] == ["Restarting", "Suspended"]
    assert worker_template(kubectl, namespace, "demo") == (demo_labels, demo_env)
    assert job_status(kubectl, namespace, "queued")["phase"] == "Queued"
    assert get_json(kubectl, "workloads", "-n", namespace, "-l",
                    "monarch-operator.dev/job=queued")["items"][0]["metadata"]["uid"] \
        == workload_uid

    # Everything ends as it would have without the upgrade.
    gate_open.touch()
    demo_done.touch()
    restart_gate.touch()
    kubectl("patch", "monarchjob", "suspended", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"suspend": False}}))
    wait_phase(kubectl, namespace, "suspended", "Running", timeout=120)
    assert_new_defaults(kubectl, namespace, "suspended")  # its workers are made on resuming
    resumed_done.touch()
    wait_phase(kubectl, namespace, "queued", "Running", timeout=120)
    # queued's StatefulSet is made after the upgrade: the new defaults apply to it.
    assert_new_defaults(kubectl, namespace, "queued")
    queued_done.touch()
    for job in ("gated", "demo", "queued"):
        status = wait_phase(kubectl, namespace, job, "Succeeded", timeout=120)
        assert (status.get("attempt"), len(status["attempts"]), status.get("restartCount", 0),
                ) == (1, 1, 0), (job, status)
        assert not any((status.get("failureCounts") or {}).values()), (job, status)
    assert job_status(kubectl, namespace, "demo")["progress"]["step"] > after_upgrade
    # The attempts each had coming, and not one more.
    for job, classes, restarts, counts in (
            ("restarting", ["Infrastructure", "Succeeded"], 1, {"infrastructure": 1}),
            ("suspended", ["Suspended", "Succeeded"], 0, {})):
        status = wait_phase(kubectl, namespace, job, "Succeeded", timeout=120)
        assert ([attempt["class"] for attempt in status["attempts"]], status.get("attempt"),
                status.get("restartCount", 0), status.get("failureCounts") or {},
                ) == (classes, 2, restarts, counts), (job, status)


def between_attempts_and_suspended(kubectl, namespace: str) -> None:
    """Stop ``restarting``'s first attempt by killing a worker's sshd (the container restarts
    and waits: the job stays Restarting) and suspend ``suspended`` mid-run; wait until both
    have settled (no pod terminating, nothing left to change before the upgrade)."""
    for job in ("restarting", "suspended"):
        running_attempt(kubectl, namespace, job, 1)
    kubectl("exec", "restarting-worker-1", "-n", namespace, "--", "sh", "-c",
            f'kill "$(cat {constants.SSHD_STATE_DIR}/sshd.pid)"')
    kubectl("patch", "monarchjob", "suspended", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"suspend": True}}))

    def restarting_settled() -> bool:
        pods = job_pods(kubectl, namespace, "restarting")
        restarted = [pod for pod in pods if pod["metadata"]["name"] == "restarting-worker-1"
                     and any(c.get("restartCount", 0) >= 1 and "running" in c.get("state", {})
                             for c in pod["status"].get("containerStatuses", []))]
        workers = [pod for pod in pods
                   if pod["metadata"]["labels"].get("monarch-operator.dev/role") == "worker"]
        # The first attempt's launcher must be gone, not only not yet marked for deletion: on a
        # loaded machine (a fresh one, 2026-12-07) the snapshot before the upgrade had it and
        # the one after did not.
        launchers = [pod for pod in pods
                     if pod["metadata"]["labels"].get("monarch-operator.dev/role") == "launcher"]
        return (job_status(kubectl, namespace, "restarting").get("phase") == "Restarting"
                and len(workers) == 2 and len(restarted) == 1 and not launchers
                and not any(pod["metadata"].get("deletionTimestamp") for pod in pods))
    wait_until(restarting_settled, 90, "restarting between attempts: its launcher gone, "
               "worker-1's restarted container waiting")
    wait_until(lambda: job_status(kubectl, namespace, "suspended").get("phase") == "Suspended"
               and not job_pods(kubectl, namespace, "suspended"), 90, "suspended, no pods")
