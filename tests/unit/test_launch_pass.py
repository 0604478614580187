"""The pass that starts a launcher, over a cache view and without a cluster (creates and the
status patch are recorded): the hostfile ConfigMap and the launcher pod are created together, and
a launcher whose hostfile create failed gets its hostfile from the next pass; a launcher
template is tried (a dry run) before the workers start.

The objects in the view are what the builders make, as the API server would return them (a uid,
owner references); tests/cluster runs the same passes against a real control plane.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from monarch_operator import constants, names
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.networkpolicy import build_network_policy
from monarch_operator.controller.builders.progress import build_progress_configmap
from monarch_operator.controller.builders.service import build_worker_service
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.engine import passes
from monarch_operator.controller.k8s import cache, nodes, reads, writes
from monarch_operator.controller.k8s import deletes as k8s_deletes
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import status as st

JOB_KIND = (f"{constants.GROUP}/{constants.VERSION}", constants.KIND)
KINDS = [("v1", "Pod"), ("v1", "Secret"), ("v1", "Service"), ("v1", "ConfigMap"),
         ("apps/v1", "StatefulSet"), ("networking.k8s.io/v1", "NetworkPolicy"),
         ("v1", "Event")]
NAMESPACE, NAME, JOB_UID, SET_UID = "team-a", "demo", "job-uid", "set-uid"
REPLICAS = 2


def job_body(status: dict[str, Any] | None = None,
             launcher: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": JOB_KIND[0], "kind": JOB_KIND[1],
            "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": JOB_UID, "generation": 1,
                         "resourceVersion": "10"},
            "spec": {"image": "img:1", "workers": {"replicas": REPLICAS, "gpusPerWorker": 1},
                     "meshes": {"trainer": {"hosts": REPLICAS}}, "launcher": launcher or {}},
            "status": status or {}}


def stored(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    """``obj`` as the API server returns it: with a uid and a resourceVersion."""
    return {**obj, "metadata": {**obj["metadata"], "uid": uid, "resourceVersion": "1"}}


def ready_worker(ordinal: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": names.worker_pod(NAME, ordinal), "namespace": NAMESPACE,
                         "uid": f"w{ordinal}", "resourceVersion": "1",
                         "labels": {constants.LABEL_JOB: NAME,
                                    constants.LABEL_ROLE: constants.ROLE_WORKER},
                         "ownerReferences": [{"uid": SET_UID, "controller": True}]},
            "spec": {"nodeName": f"node-{ordinal}"},
            "status": {"phase": "Running", "podIP": f"127.100.0.{ordinal + 1}",
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def make_view(settings: Settings, status: dict[str, Any] | None = None,
              extra_pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
              launcher: dict[str, Any] | None = None, workers: bool = True,
              worker_pods: list[dict[str, Any]] | None = None,
              body: dict[str, Any] | None = None,
              progress: bool | None = None,
              extra_configmaps: list[dict[str, Any]] = ()  # type: ignore[assignment]
              ) -> cache.JobView:
    """A view of a job whose Secret, Service and policy exist, and (``workers``) its
    StatefulSet and Ready workers (``worker_pods`` instead of those, when given), all built
    from ``body`` (default :func:`job_body`); its progress ConfigMap when ``progress`` (by
    default with the StatefulSet: both come with the first pass); ``extra_configmaps`` indexed
    under the job too."""
    body = body or job_body(status, launcher)
    job = JobSpec.from_body(body)
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": names.ssh_secret(NAME), "namespace": NAMESPACE,
                           "labels": {constants.LABEL_JOB: NAME},
                           "ownerReferences": [{"uid": JOB_UID, "controller": True}]}}
    children = {
        ("v1", "Pod"): (worker_pods if worker_pods is not None else
                        [ready_worker(i) for i in range(REPLICAS) if workers]) + list(extra_pods),
        ("v1", "Secret"): [stored(secret, "s1")],
        ("v1", "Service"): [stored(build_worker_service(job), "svc1")],
        ("apps/v1", "StatefulSet"): [stored(build_worker_statefulset(job, settings), SET_UID)
                                     ] if workers else [],
        ("networking.k8s.io/v1", "NetworkPolicy"): [stored(build_network_policy(job), "np1")],
        ("v1", "ConfigMap"): [stored(build_progress_configmap(job), "cm-progress")
                              ] if (workers if progress is None else progress) else []
                             + list(extra_configmaps),
    }
    job_cache = cache.JobCache(JOB_KIND)
    job_cache.attach(JOB_KIND, {(NAMESPACE, NAME): [body]})
    for kind in KINDS:
        job_cache.attach(kind, {(NAMESPACE, NAME): children.get(kind, [])})
    return job_cache.view((NAMESPACE, NAME))


@pytest.fixture()
def api(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Records the creates (``kind name``) and status patches a pass sends."""
    sent: dict[str, list[Any]] = {"creates": [], "status": []}

    def post(desired: dict[str, Any]) -> dict[str, Any]:
        sent["creates"].append(f"{desired['kind']} {desired['metadata']['name']}")
        return stored(desired, f"uid-{desired['metadata']['name']}")

    def patch_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        sent["status"].append(status)
        return job_body(status)

    monkeypatch.setattr(writes, "_post", post)
    monkeypatch.setattr(writes, "patch_job_status", patch_status)
    monkeypatch.setattr(nodes, "node_not_ready_since", lambda node: None)
    return sent


def run_pass(settings: Settings, view: cache.JobView) -> passes.PassReport:
    return passes.PassRunner(settings).run(NAMESPACE, NAME, view)


def test_every_worker_ready_creates_the_hostfile_and_launcher_in_one_pass(api):
    settings = Settings.from_env()
    report = run_pass(settings, make_view(settings))
    assert sorted(api["creates"]) == [f"ConfigMap {names.hostfile_configmap(NAME)}",
                                      f"Pod {names.launcher_pod(NAME, 1)}"]
    [status] = api["status"]
    assert st.is_true(status, st.RUNNING), status
    assert status["attempts"][-1]["launcherPod"] == names.launcher_pod(NAME, 1)
    assert st.REASON_LAUNCHER_STARTED in [event.reason for event in report.events]


def running_status(settings: Settings) -> dict[str, Any]:
    """The status the launching pass above wrote."""
    sent: dict[str, list[Any]] = {"creates": [], "status": []}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writes, "_post", lambda desired: stored(desired, "x"))
        patch.setattr(writes, "patch_job_status",
                      lambda namespace, name, status: sent["status"].append(status) or {})
        patch.setattr(nodes, "node_not_ready_since", lambda node: None)
        run_pass(settings, make_view(settings))
    return sent["status"][-1]


def launcher_pod(settings: Settings, **metadata: Any) -> dict[str, Any]:
    pod = stored(build_launcher_pod(JobSpec.from_body(job_body()), settings, 1), "l1")
    pod["metadata"].update(metadata)
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return pod


def test_a_running_launcher_without_its_hostfile_gets_it_back(api):
    """The two creates went together and only the pod's succeeded: the next pass creates
    the hostfile (the same one: worker FQDNs by ordinal) and nothing else."""
    settings = Settings.from_env()
    status = running_status(settings)
    run_pass(settings, make_view(settings, status, [launcher_pod(settings)]))
    assert api["creates"] == [f"ConfigMap {names.hostfile_configmap(NAME)}"]


def test_a_launcher_being_deleted_gets_no_hostfile(api):
    settings = Settings.from_env()
    status = running_status(settings)
    stopping = launcher_pod(settings, deletionTimestamp=dt.datetime(
        2026, 11, 30, tzinfo=dt.UTC).isoformat())
    run_pass(settings, make_view(settings, status, [stopping]))
    assert api["creates"] == []


TYPO = {"template": {"spec": {"containers": [{"name": "launcher", "imagePullPolicyy": "Always"}]}}}
REFUSED = ('Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown '
           'field "spec.containers[0].imagePullPolicyy"')


# What the first pass of a worker set creates first, at once (its order varies): the launcher's
# ServiceAccount and what lets it write the job's progress ConfigMap (builders/progress.py).
PROGRESS_ACCESS = [("ConfigMap", False), ("Role", False), ("RoleBinding", False),
                   ("ServiceAccount", False)]


def after_progress_access(creates: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """``creates`` after the progress access objects, which must come first."""
    assert sorted(creates[:len(PROGRESS_ACCESS)]) == PROGRESS_ACCESS, creates
    return creates[len(PROGRESS_ACCESS):]


@pytest.fixture()
def dry_runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Records ``(kind, dry_run)`` per create; a dry run of a pod whose template has the typo
    above is refused as the API server refuses it (400, strict field validation)."""
    sent: dict[str, Any] = {"creates": [], "status": []}

    def post(desired: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        sent["creates"].append((desired["kind"], dry_run))
        spec = desired.get("spec") or {}
        containers = (spec.get("template") or desired).get("spec", {}).get("containers", [])
        if any("imagePullPolicyy" in container for container in containers):
            error = ApiException(status=400, reason="Bad Request")
            error.body = json.dumps({"kind": "Status", "message": REFUSED})
            raise error
        return stored(desired, f"uid-{desired['metadata']['name']}")

    monkeypatch.setattr(writes, "_post", post)
    monkeypatch.setattr(writes, "patch_job_status", lambda namespace, name, status: (
        sent["status"].append(status) or job_body(status)))
    return sent


def test_a_launcher_template_kubernetes_refuses_fails_the_job_before_any_worker(dry_runs):
    """Field case C12: the launcher pod is made only once every worker is Ready; its template
    is tried (a dry run) before the workers' StatefulSet exists, and the job fails at once."""
    settings = Settings.from_env()
    run_pass(settings, make_view(settings, launcher=TYPO, workers=False))
    # No StatefulSet: no worker holds a GPU.
    assert after_progress_access(dry_runs["creates"]) == [("Pod", True)]
    [status] = dry_runs["status"]
    [failed] = [c for c in status["conditions"] if c["type"] == st.FAILED]
    assert failed["reason"] == st.REASON_TEMPLATE_REFUSED
    # The decoding error's preamble (the kind, twice) is left out: the field fits MESSAGE.
    assert failed["message"] == (f"spec.launcher: the API server refused Pod "
                                 f"{names.launcher_pod(NAME, 1)}: strict decoding error: unknown "
                                 'field "spec.containers[0].imagePullPolicyy"')


def test_a_launcher_template_is_tried_once_before_the_workers_start(dry_runs):
    settings = Settings.from_env()
    fine = {"template": {"spec": {"containers": [{"name": "launcher", "workingDir": "/w"}]}}}
    run_pass(settings, make_view(settings, launcher=fine, workers=False))
    assert after_progress_access(dry_runs["creates"]) == [("Pod", True), ("StatefulSet", False)]
    dry_runs["creates"].clear()
    run_pass(settings, make_view(settings, launcher=fine))  # the set exists: no second try
    assert ("Pod", True) not in dry_runs["creates"]


def test_without_a_launcher_template_nothing_is_tried(dry_runs):
    """What the operator builds alone from the checked spec needs no dry run."""
    settings = Settings.from_env()
    run_pass(settings, make_view(settings, workers=False))
    assert after_progress_access(dry_runs["creates"]) == [("StatefulSet", False)]


def test_the_attempt_records_the_image_digests_that_ran(api):
    """Issue 23 item 3: an attempt's fingerprint: the workers' image digests as their pods
    report them at its launch (two differing: mixed images), then its launcher's."""
    settings = Settings.from_env()
    digests = ["docker.io/x/worker@sha256:aaa", "docker.io/x/worker@sha256:bbb"]
    workers = []
    for ordinal, digest in zip(range(REPLICAS), digests, strict=True):
        pod = ready_worker(ordinal)
        pod["status"]["containerStatuses"] = [{"name": "worker", "imageID": digest,
                                               "restartCount": 0, "state": {"running": {}}}]
        workers.append(pod)
    run_pass(settings, make_view(settings, worker_pods=workers))
    launched = api["status"][-1]
    assert launched["attempts"][-1]["workerImages"] == digests
    assert "launcherImage" not in launched["attempts"][-1]
    launcher = launcher_pod(settings)
    launcher["status"]["containerStatuses"] = [{"name": "launcher", "restartCount": 0,
                                                "imageID": "docker.io/x/launcher@sha256:ccc",
                                                "state": {"running": {}}}]
    run_pass(settings, make_view(settings, launched, [launcher], worker_pods=workers))
    assert api["status"][-1]["attempts"][-1]["launcherImage"] == \
        "docker.io/x/launcher@sha256:ccc"


LAUNCHED = "2026-12-02T04:17:05Z"


def unrecorded_launch(settings: Settings, worker_created: str) -> tuple[dict, list[dict]]:
    """Attempt 1's launcher pod, created at LAUNCHED and since exited 0, whose launch the
    pass that created it never wrote (the operator was killed in between): the status still
    holds an older worker snapshot (worker 1 then had another uid). Worker 1 was created at
    ``worker_created``. Returns (status, pods)."""
    status = running_status(settings)
    record = {key: value for key, value in status["attempts"][-1].items()
              if key not in ("launchTime", "launcherPod")}
    status["attempts"] = [*status["attempts"][:-1], record]
    status["attemptWorkers"] = [{"name": names.worker_pod(NAME, 0), "uid": "w0",
                                 "restartCount": 0},
                                {"name": names.worker_pod(NAME, 1), "uid": "w1-before",
                                 "restartCount": 0}]
    launcher = launcher_pod(settings, creationTimestamp=LAUNCHED)
    launcher["status"] = {"phase": "Succeeded", "containerStatuses": [{
        "name": "launcher", "restartCount": 0, "state": {"terminated": {
            "exitCode": 0, "reason": "Completed", "startedAt": "2026-12-02T04:17:06Z",
            "finishedAt": "2026-12-02T04:17:10Z"}}}]}
    workers = [ready_worker(0), ready_worker(1)]
    workers[0]["metadata"]["creationTimestamp"] = "2026-12-02T04:15:00Z"
    workers[1]["metadata"]["creationTimestamp"] = worker_created
    return status, [*workers, launcher]


@pytest.fixture()
def deletes(api, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The deletions a pass sends that ends an attempt (recorded, not sent)."""
    sent: list[str] = []
    monkeypatch.setattr(k8s_deletes, "delete_if_present",
                        lambda api_version, kind, namespace, name, **_: sent.append(
                            f"{kind} {name}") or True)
    monkeypatch.setattr(k8s_deletes, "stop_pod", lambda pod: bool(pod) and not sent.append(
        f"Pod {pod['metadata']['name']}"))
    monkeypatch.setattr(k8s_deletes, "delete_pod", lambda namespace, name, uid, **_: sent.append(
        f"Pod {name}") or True)
    monkeypatch.setattr(reads, "pod_log_tail", lambda *args, **kwargs: None)
    return sent


def test_a_launch_never_recorded_is_adopted_with_the_workers_it_started_on(api, deletes):
    """Chaos soak (seed 1, c023): worker 1 was replaced, the next attempt's launcher created,
    the operator killed before it wrote the launch. The next operator records the launch from
    the pod (its creation) and the workers as they were then: the attempt ends Succeeded, not
    as a worker lost mid-run."""
    settings = Settings.from_env()
    status, pods = unrecorded_launch(settings, worker_created="2026-12-02T04:17:01Z")
    run_pass(settings, make_view(settings, status, worker_pods=pods))
    final = api["status"][-1]
    record = final["attempts"][-1]
    assert (record["class"], record["launchTime"]) == ("Succeeded", LAUNCHED), record
    assert st.is_true(final, st.SUCCEEDED), final["conditions"]


def test_a_worker_replaced_after_an_unrecorded_launch_is_still_lost(api, deletes):
    settings = Settings.from_env()
    status, pods = unrecorded_launch(settings, worker_created="2026-12-02T04:17:08Z")
    run_pass(settings, make_view(settings, status, worker_pods=pods))
    record = api["status"][-1]["attempts"][0]
    assert (record["class"], record["reason"]) == ("Infrastructure", st.REASON_WORKER_EVICTED)
    assert "deleted and recreated" in record["message"], record


def test_a_job_created_again_under_its_name_never_takes_the_old_jobs_launcher(api):
    """Field case (a clean-clone CI run, test_multikueue): MultiKueue deleted the worker's
    copy of a suspended job and created it again within a second of the resume; the new job's
    first pass found the old job's launcher pod (same name and labels, still running, being
    deleted), took it for its own attempt 1 and judged it by that pod's exit (143: Failed).
    A pod another MonarchJob controls is not in the view: the new job creates its own (and,
    while the old pod holds the name, waits for it to go)."""
    settings = Settings.from_env()
    old = launcher_pod(settings)
    old["metadata"]["ownerReferences"] = [
        {**ref, "uid": "uid-of-the-deleted-job"} for ref in old["metadata"]["ownerReferences"]]
    run_pass(settings, make_view(settings, None, [old]))
    assert f"Pod {names.launcher_pod(NAME, 1)}" in api["creates"], api["creates"]
    [status] = api["status"]
    assert status["attempts"][-1]["launcherPod"] == names.launcher_pod(NAME, 1)
    assert lastseen_of_old_job_is_ignored(old)


def test_a_job_created_again_under_its_name_never_takes_the_old_jobs_configmaps(api):
    """The same story for the ConfigMaps an earlier job of the name left (GC deletes them after
    it): its progress ConfigMap would have given the new job its steps and checkpoint, and,
    being in the view, kept the pass from creating the new launcher's ServiceAccount and the
    right to write its own progress. Every child another MonarchJob controls is left out."""
    settings = Settings.from_env()
    old = build_progress_configmap(JobSpec.from_body(job_body()))
    old["metadata"]["ownerReferences"] = [
        {**ref, "uid": "uid-of-the-deleted-job"} for ref in old["metadata"]["ownerReferences"]]
    old["data"] = {constants.PROGRESS_REPORT_KEY: json.dumps(
        {"step": 40, "totalSteps": 100, "attempt": 2, "checkpoint": "/ckpt/old/step-40"})}
    view = make_view(settings, None, progress=False, extra_configmaps=[stored(old, "cm-old")])
    assert names.progress_configmap(NAME) not in view.children[("v1", "ConfigMap")]
    run_pass(settings, view)
    assert f"ConfigMap {names.progress_configmap(NAME)}" in api["creates"], api["creates"]
    assert f"ServiceAccount {names.launcher_account(NAME)}" in api["creates"], api["creates"]
    [status] = api["status"]
    assert "progress" not in status and "lastCheckpoint" not in status, status


def lastseen_of_old_job_is_ignored(old: dict[str, Any]) -> bool:
    """The pod watch's memory of a launcher (kept by job name) never answers for another job."""
    from monarch_operator.controller.state import lastseen

    lastseen.remember(NAMESPACE, NAME, old)
    try:
        ignored = (lastseen.launcher(NAMESPACE, NAME, 1, JOB_UID) is None
                   and lastseen.launcher(NAMESPACE, NAME, 1, "uid-of-the-deleted-job") == old)
        # The old job's later attempt never holds back the new job's first launcher.
        later = {**old, "metadata": {**old["metadata"], "labels": {
            **old["metadata"]["labels"], constants.LABEL_ATTEMPT: "3"}}}
        ours = {**old, "metadata": {**old["metadata"], "ownerReferences": [
            {**ref, "uid": JOB_UID} for ref in old["metadata"]["ownerReferences"]]}}
        lastseen.remember(NAMESPACE, NAME, later)
        lastseen.remember(NAMESPACE, NAME, ours)
        return ignored and lastseen.launcher(NAMESPACE, NAME, 1, JOB_UID) == ours
    finally:
        lastseen.forget(NAMESPACE, NAME)
