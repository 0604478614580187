"""The gate of an attempt: the job's key Secret, Service, NetworkPolicy and worker
StatefulSet, then every worker Ready, or why not (the scheduler's and kubelet's reasons), failing
fast on what cannot heal and at the startup timeout."""

from __future__ import annotations

import datetime as dt
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.builders.launcher import build_launcher_pod
from monarch_operator.controller.builders.networkpolicy import build_network_policy
from monarch_operator.controller.builders.progress import (
    build_launcher_account,
    build_progress_binding,
    build_progress_configmap,
    build_progress_role,
)
from monarch_operator.controller.builders.secret import build_ssh_secret
from monarch_operator.controller.builders.service import build_worker_service
from monarch_operator.controller.builders.sshkeys import generate_job_keys
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.judge import endings
from monarch_operator.controller.k8s import deletes, nodes, reads, writes
from monarch_operator.controller.release import release
from monarch_operator.controller.spec import attachmode, policy
from monarch_operator.controller.spec.groups import WorkerGroup
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import attempts, deadlines, observe
from monarch_operator.controller.state import status as st
from monarch_operator.controller.state.passstate import Pass, short

# A starting worker's node is read only after the worker has been scheduled this long without
# becoming Ready (see _lost_node): reading the node of every starting worker at every pass was
# 15 node reads per job while 200 jobs started at once (bench/operator_scale.py).
NODE_CHECK_AFTER_SECONDS = 15.0


def _ensure_progress_access(job: JobSpec) -> None:
    """The launcher's ServiceAccount and what lets it write the job's progress ConfigMap
    (builders/progress.py), before any launcher pod is created or checked: its ServiceAccount
    must exist then. The ConfigMap is cached, the others are not: it is created last, and
    while it is in the pass's view nothing is sent (also for a job an older operator version
    started, which has none of them yet: found by the chaos soak, its restart refused)."""
    if reads.read("v1", "ConfigMap", job.namespace, names.progress_configmap(job.name)):
        return
    writes.create_all(build_launcher_account(job), build_progress_role(job),
                   build_progress_binding(job), owner_uid=job.uid)
    writes.create_all(build_progress_configmap(job), owner_uid=job.uid)


def _worker_set(job: JobSpec, settings: Settings, group: WorkerGroup) -> dict[str, Any]:
    """The group's StatefulSet as the pass's view holds it (its owner checked), created when
    missing. The desired one (the user's pod template merged with ours) is built only then:
    building it at every pass of every job was 3 % of the operator's CPU while 200 jobs
    started (docs/performance.md), to compare a name."""
    found = reads.read("apps/v1", "StatefulSet", job.namespace,
                       names.group_set(job.name, group.name))
    if found is not None:
        writes.check_owner(found, job.uid)
        return found
    return writes.ensure(build_worker_statefulset(job, settings, group), job.uid)[0]


def ensure_workers(state: Pass, settings: Settings) -> list[dict[str, Any]]:
    """Secret, a Service and a StatefulSet per worker group; the gate (every worker of every
    group Ready) or the startup timeout.

    Returns the worker pods of the current StatefulSets (pods of a deleted one are left out).
    """
    job = state.job
    secret = reads.read("v1", "Secret", job.namespace, names.ssh_secret(job.name))
    if secret is None:
        keys = generate_job_keys(job.namespace, job.name)
        writes.ensure(build_ssh_secret(job, settings, keys), job.uid)
    else:  # exists: keep its key bytes (retries must not rotate keys), but check the owner
        writes.check_owner(secret, job.uid)
    for group in job.groups:
        writes.ensure(build_worker_service(job, group), job.uid)
    if settings.network_policy:  # before any pod exists, so no pod is ever open to others
        writes.ensure(build_network_policy(job), job.uid)
    _ensure_progress_access(job)
    if job.launcher_template and reads.read("apps/v1", "StatefulSet", job.namespace,
                                          names.group_set(job.name, job.groups[0].name)) is None:
        # A launcher template Kubernetes refuses fails the job now, before any worker holds a
        # GPU, rather than once every worker is Ready (C12): one dry run per worker set.
        writes.check_creatable(build_launcher_pod(job, settings, int(state.status["attempt"])))
    worker_sets = [_worker_set(job, settings, group) for group in job.groups]
    pods = _worker_pods(state, worker_sets)
    if job.attach:
        _publish_meshes(state, pods)
    wanted = job.worker_pod_names()
    ready = observe.ready_worker_names(wanted, pods)
    total = job.worker_count
    state.status["readyWorkers"] = f"{len(ready)}/{total}"
    if len(ready) == total:
        state.condition(st.WORKERS_READY, True, st.REASON_ALL_WORKERS_READY,
                        f"{total} of {total} workers "
                        f"{'run the Monarch worker loop' if job.attach else 'accept SSH'}")
        return pods
    not_ready = [name for name in wanted if name not in ready]
    if st.is_true(state.status, st.RUNNING):
        return pods  # launched: a lost worker is judged with the attempt (lost_workers)
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    reasons = {name: observe.why_not_ready(by_name.get(name)) for name in not_ready}
    previous = int(state.status["attempt"]) - 1
    for (name, _), lost_by in attempts.recreated_workers(state.status).items():
        if lost_by == previous and name in reasons and name not in by_name:
            reasons[name] = f"lost by attempt {lost_by}: its pod is deleted, to be recreated"
    for name in not_ready:
        node = _lost_node(state, by_name.get(name))
        if node:  # Kubernetes would wait 300 s to evict it; the gate would wait with it
            deletes.delete_pod(job.namespace, name, by_name[name]["metadata"]["uid"])
            reasons[name] = f"its node {node} is NotReady: deleted, to be recreated elsewhere"
    for group, worker_set in zip(job.groups, worker_sets, strict=True):
        missing = [name for name in not_ready if name not in by_name
                   and name.startswith(names.group_set(job.name, group.name) + "-")]
        if not missing:
            continue
        failure = observe.create_failure(reads.list_events(
            job.namespace, "StatefulSet", worker_set["metadata"]["name"],
            worker_set["metadata"]["uid"]))
        if failure and observe.is_invalid_object_message(failure):
            field = ("spec.workers.template" if not group.labelled else
                     f"spec.workerGroups {group.name!r} (template, or spec.workers.template)")
            endings.fail(state, st.REASON_TEMPLATE_REFUSED, f"{field}: the "
                         f"StatefulSet cannot create worker pods: {failure}")
            return pods
        if failure:
            reasons.update({name: f"not created: FailedCreate: {failure}" for name in missing})
    for name in not_ready:
        problem = observe.unrecoverable_problem(by_name[name]) if name in by_name else None
        if problem:  # waiting out spec.startupTimeoutSeconds would not help
            endings.fail(state, st.REASON_WORKER_CANNOT_START,
                         f"{name} ({problem}) can never become Ready")
            return pods
    described = [f"{name} ({reasons[name]})" for name in not_ready]
    state.condition(st.WORKERS_READY, False, st.REASON_WAITING_FOR_WORKERS,
                    f"{len(ready)}/{total} workers ready; waiting for {short(described)}")
    record = attempts.current(state.status) or {}
    started = deadlines.parse_time(record.get("startTime") or state.status["startTime"])
    if (state.now - started).total_seconds() > job.startup_timeout_seconds:
        message = (f"workers not ready after {job.startup_timeout_seconds}s "
                   f"(spec.startupTimeoutSeconds): {short(described)}")
        endings.end_attempt(state, policy.STARTUP, st.REASON_STARTUP_TIMEOUT, message)
    return pods


def _publish_meshes(state: Pass, pods: list[dict[str, Any]]) -> None:
    """Attach mode: each worker pod gets its rank labels before the launcher exists (Monarch's
    ``KubernetesJob`` in it finds the role meshes by them), also a pod recreated since; the
    role meshes go to ``status.meshes``."""
    job = state.job
    for name, labels in attachmode.label_changes(job, pods).items():
        writes.label_pod(job.namespace, name, labels)
    state.status["meshes"] = attachmode.published_meshes(job)


def _lost_node(state: Pass, pod: dict[str, Any] | None) -> str | None:
    """The node of a not-Ready worker ``pod`` not yet being deleted, when that node is not Ready
    (lost: crashed or partitioned), else None. Such a pod never becomes Ready where it is; the
    StatefulSet recreates it on another node once it is deleted (and force-deleted by
    :func:`.release.let_go_of_stuck` if its node never confirms).

    The node is read only once the pod has waited :data:`NODE_CHECK_AFTER_SECONDS` since it
    was scheduled (a pass is asked for then): no node is declared NotReady sooner after
    losing contact, and most workers are Ready by then."""
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return None
    waited = _seconds_since_scheduled(pod, state.now)
    if waited is not None and waited < NODE_CHECK_AFTER_SECONDS:
        state.wake_in(NODE_CHECK_AFTER_SECONDS - waited)
        return None
    return node if not nodes.node_is_ready(node) else None


def _seconds_since_scheduled(pod: dict[str, Any], now: dt.datetime) -> float | None:
    """Seconds since the pod's ``PodScheduled`` condition turned True (else since it was
    created); None when neither time can be read."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    scheduled = next((c.get("lastTransitionTime") for c in conditions
                      if c.get("type") == "PodScheduled" and c.get("status") == "True"), None)
    since = scheduled or pod["metadata"].get("creationTimestamp")
    try:
        return (now - deadlines.parse_time(str(since))).total_seconds() if since else None
    except ValueError:
        return None


def _worker_pods(state: Pass, worker_sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worker pods controlled by one of ``worker_sets``: after a suspend or a recreated
    StatefulSet, the
    old one's pods may linger until garbage collection and must not pass the gate. Any worker
    pod stuck terminating (its node lost) is force-deleted in time: the StatefulSet recreates a
    pod only once its namesake is gone. A pod an ended attempt marked to be recreated is left
    out (and deleted once that mark is stored: :func:`.release.recreate_lost_workers`)."""
    job = state.job
    pods = release.let_go_of_stuck(state, reads.list_pods(job.namespace, {
               constants.LABEL_JOB: job.name, constants.LABEL_ROLE: constants.ROLE_WORKER}))
    pods = release.recreate_lost_workers(state, pods)
    set_uids = {worker_set.get("metadata", {}).get("uid") for worker_set in worker_sets}
    return [pod for pod in pods if reads.controller_uid(pod) in set_uids | {None}]
