"""Thin kopf handlers: watch events on a job or on its children wake that job's pass.

No timers and no change-detection handlers: kopf then adds no finalizer to our jobs (deletion
of a job or of its namespace never waits for the operator, field case C14) and writes no
bookkeeping annotations (no writes while nothing changes, C5). :mod:`.wakeups` runs one pass
at a time per job and wakes it at its next deadline. One ``@kopf.index`` per watched kind keeps
what the watches saw (:mod:`.cache`): a pass reads the job and its children from there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

import kopf

from monarch_operator import constants, names
from monarch_operator.controller import k8s
from monarch_operator.controller.builders.progress import ROLE_PROGRESS
from monarch_operator.controller.engine import (
    indexready,
    jobmetrics,
    metrics,
    passes,
    wakeups,
    watchhealth,
)
from monarch_operator.controller.k8s import cache, slim
from monarch_operator.controller.kueue import watch as kueue_watch
from monarch_operator.controller.launch import checkpoints
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import lastseen, observe

SETTINGS = Settings.from_env()
RUNNER = passes.PassRunner(SETTINGS)
CACHE = cache.JobCache((f"{constants.GROUP}/{constants.VERSION}", constants.KIND))
# Passes run in threads (the API client blocks); with the cache a pass mostly computes and writes,
# so a few more threads than cores keep writes of many jobs in flight at once.
_PASS_THREAD_COUNT = 8
_PASS_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=_PASS_THREAD_COUNT,
                                                      thread_name_prefix="pass")
# Seconds an object's kopf worker waits idle for its next event before it ends (kopf's
# settings.queueing.idle_timeout, default 5): see configure_queueing().
OBJECT_WORKER_IDLE_SECONDS = 0.5
logger = logging.getLogger("monarch_operator")
_RESOURCE = (constants.GROUP, constants.VERSION, constants.PLURAL)
# Children whose changes matter to a job's status: its pods (workers and launcher) and the
# worker StatefulSet. Watched only with our managed-by label (server-side selector), so the
# operator never streams other workloads' pods.
_CHILDREN = (("", "v1", "pods"), ("apps", "v1", "statefulsets"))
# Children that change only when we write them: watched for the cache alone (no wake-ups).
_OWN_CHILDREN = (("", "v1", "secrets"), ("", "v1", "services"), ("", "v1", "configmaps"),
                 *((("networking.k8s.io", "v1", "networkpolicies"),)
                   if SETTINGS.network_policy else ()))
_KINDS = {"pods": "Pod", "statefulsets": "StatefulSet", "secrets": "Secret",
          "services": "Service", "configmaps": "ConfigMap", "networkpolicies": "NetworkPolicy",
          "events": "Event"}
_CHILD_SELECTOR = f"app.kubernetes.io/managed-by={constants.MANAGED_BY},{constants.LABEL_JOB}"
# A StatefulSet that cannot create its pods changes nothing we watch; its FailedCreate Events
# (selected server-side) wake the job so that it says why, or fails when the pod is invalid.
_EVENTS = ("", "v1", "events")
_CREATE_FAILURE_SELECTOR = "involvedObject.kind=StatefulSet,reason=FailedCreate"


def _index_id(plural: str) -> str:
    return f"cache_{plural}"


def _api_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


async def _run_pass(key: wakeups.JobKey) -> float | None:
    view = CACHE.view(key)  # on the loop that writes the indexes
    report = await asyncio.get_running_loop().run_in_executor(
        _PASS_THREADS, RUNNER.run, *key, view)
    for event in report.events:
        if report.body is not None:
            kopf.event(report.body, type=event.type, reason=event.reason, message=event.message)
    return report.next_pass_seconds


def _holds_every_worker(key: wakeups.JobKey) -> bool:
    """Whether every worker of the job is Ready in the cache: it holds all its GPUs (about to
    launch, running or ending), so its pass goes before those of jobs still starting."""
    job = next(iter(CACHE.peek(key, CACHE.job_kind)), None)
    spec = (job or {}).get("spec") or {}
    groups = spec.get("workerGroups") or [
        {"name": names.LEGACY_GROUP, "replicas": (spec.get("workers") or {}).get("replicas")}]
    if not all(isinstance(group, dict) and isinstance(group.get("replicas"), int)
               for group in groups):
        return False
    wanted = [names.group_pod(key[1], str(group.get("name")), ordinal)
              for group in groups for ordinal in range(group["replicas"])]
    workers = [pod for pod in CACHE.peek(key, ("v1", "Pod"))
               if pod["metadata"].get("labels", {}).get(constants.LABEL_ROLE)
               == constants.ROLE_WORKER]
    return bool(wanted) and len(observe.ready_worker_names(wanted, workers)) == len(wanted)


# As many passes at once as threads: a pass takes its view when a thread is free to run it, not
# when it was woken (a view taken earlier and queued behind busy threads was seconds old, and
# the pass after it ran again for what it had missed). While many jobs start, a job whose
# workers are all Ready waited seconds behind the first passes of new jobs (200 at once in
# bench/operator_scale.py); it goes first: its GPUs idle until its launcher starts.
WAKEUPS = wakeups.Wakeups(_run_pass, concurrency=_PASS_THREAD_COUNT,
                          urgent=_holds_every_worker)


class _NoDiffBase(kopf.DiffBaseStorage):
    """No essence, none stored: kopf builds one (a deep copy of the whole object) on every
    event for change-detection handlers, and we have none (only event and index handlers).
    A ``@kopf.on.create/update`` handler added later needs a real one (kopf docs,
    "Configuration": persistence)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
    """Load API credentials; keep kopf's own bookkeeping quiet and off our objects; read the
    cache's indexes (kopf passes them to every handler, named by their ids)."""
    k8s.load_config()
    CACHE.attach(CACHE.job_kind, kwargs[_index_id(constants.PLURAL)])
    for group, version, plural in (*_CHILDREN, *_OWN_CHILDREN, _EVENTS):
        CACHE.attach((_api_version(group, version), _KINDS[plural]), kwargs[_index_id(plural)])
    # Only warnings become Kubernetes Events; per-pass INFO logs would flood `kubectl describe`.
    settings.posting.level = logging.WARNING
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    for group, version, plural in (*_CHILDREN, *_OWN_CHILDREN):
        settings.watching.label_selectors[group, version, plural] = _CHILD_SELECTOR
    settings.watching.field_selectors[_EVENTS] = _CREATE_FAILURE_SELECTOR
    kueue_watch.configure(settings, _CHILD_SELECTOR)
    # Every watch request bounded; streams that die or go silent re-established, named in the
    # log, and /healthz failing while one cannot be (field case C18).
    watchhealth.configure(settings, watchhealth.WatchTimes(SETTINGS.watch_renew_seconds))
    watchhealth.install()
    # A namespace that goes before kopf indexed it never holds every handler back.
    indexready.install()
    configure_queueing(settings)
    # Nothing of kopf's is stored on jobs (no change-detection handlers); its progress would be
    # kept in our own prefix in case a handler that needs it is added.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=f"{constants.GROUP}"
    )
    settings.persistence.diffbase_storage = _NoDiffBase()


def configure_queueing(settings: kopf.OperatorSettings) -> None:
    """Let kopf's worker of an object end after :data:`OBJECT_WORKER_IDLE_SECONDS` without an
    event (kopf's ``settings.queueing.idle_timeout``, default 5 s; kopf docs, "Configuration").

    A worker keeps the last event it handled (the whole object as the watch sent it,
    ``managedFields`` and all) while it waits for the next. With kopf's 5 s, a burst of 200
    new jobs held one per object that changed in the last 5 s: 24 MiB of the operator's 85 MiB
    heap at its peak (memray, docs/performance.md, "Operator weight, round 2"). A new event
    after the worker ended starts a new one (a task; the events of one object still run one
    at a time and in order).
    """
    settings.queueing.idle_timeout = OBJECT_WORKER_IDLE_SECONDS


def _cached(body: kopf.Body) -> dict[str, Any]:
    """The object as the cache keeps it: only the fields a pass reads (:mod:`.k8s.slim`;
    never ``metadata.managedFields``, often half of an object's size)."""
    return slim.slim((str(body.get("apiVersion")), str(body.get("kind"))), body)


async def _index_job(namespace: str, name: str, body: kopf.Body, **_: Any) -> Any:
    """Cache the job under its own (namespace, name)."""
    return {(namespace, name): _cached(body)}


async def _index_child(namespace: str, labels: dict[str, str], body: kopf.Body,
                       **_: Any) -> Any:
    """Cache a child under its job's (namespace, name), from the job label."""
    return {(namespace, labels[constants.LABEL_JOB]): _cached(body)}


async def _index_create_failure(namespace: str, body: kopf.Body, **_: Any) -> Any:
    """Cache a worker StatefulSet's FailedCreate Event under its job (what a pass reads to say
    why worker pods do not exist), only the fields it reads."""
    involved = dict(body.get("involvedObject") or {})
    statefulset = str(involved.get("name") or "")
    if not statefulset.endswith(names.WORKER_SUFFIX):
        return None
    kept = {key: body.get(key) for key in ("reason", "message", "lastTimestamp", "eventTime")}
    kept["metadata"] = {"name": body.get("metadata", {}).get("name")}
    kept["involvedObject"] = {key: involved.get(key) for key in ("kind", "name", "uid")}
    return {(namespace, statefulset.removesuffix(names.WORKER_SUFFIX)): kept}


kopf.index(*_RESOURCE, id=_index_id(constants.PLURAL))(_index_job)
kopf.index(*_EVENTS, id=_index_id(_EVENTS[2]))(_index_create_failure)
for _group, _version, _plural in (*_CHILDREN, *_OWN_CHILDREN):
    kopf.index(_group, _version, _plural, id=_index_id(_plural),
               labels={constants.LABEL_JOB: kopf.PRESENT})(_index_child)


@kopf.on.event(*_RESOURCE)
async def on_job_event(type: str | None, namespace: str, name: str, meta: kopf.Meta,
                       **_: Any) -> None:
    """The job appeared (or was listed at start-up), changed, or was deleted; our own status
    patch of a spec the pass had seen wakes nobody (the pass that wrote it was complete)."""
    key = (namespace, name)
    uid = str(meta.get("uid") or "")
    if type == "DELETED":
        WAKEUPS.forget(key)
        checkpoints.forget(namespace, name)
        lastseen.forget(namespace, name)
        metrics.JOB_PHASES.set(key, None)
        jobmetrics.JOBS.forget(key)
        # A pass that raced the deletion stops creating; what it and earlier passes created
        # goes now, not when garbage collection gets to it.
        known = CACHE.job_deleted(key, uid)
        await asyncio.get_running_loop().run_in_executor(
            _PASS_THREADS, passes.delete_leftovers, namespace, name, uid, known)
        return
    if meta.get("deletionTimestamp"):  # passes create nothing more; children stay if orphaned
        CACHE.mark_gone(uid, orphaning="orphan" in (meta.get("finalizers") or []))
    if CACHE.is_own_write(key, meta.get("resourceVersion")):
        return
    WAKEUPS.wake(key)


@kopf.on.event(*_CHILDREN[0], labels={constants.LABEL_JOB: kopf.PRESENT})
@kopf.on.event(*_CHILDREN[1], labels={constants.LABEL_JOB: kopf.PRESENT})
async def on_child_event(namespace: str, labels: dict[str, str], body: kopf.Body,
                         **_: Any) -> None:
    """A child of a job changed: wake its job (found by the job label; a pass of a job that
    does not exist does nothing). A launcher pod's state is remembered, in case it is gone
    before the pass (:mod:`.lastseen`; one that names a checkpoint also by
    :func:`.checkpoints.remember`)."""
    job_name = labels[constants.LABEL_JOB]
    if labels.get(constants.LABEL_ROLE) == constants.ROLE_LAUNCHER:
        pod = _cached(body)
        checkpoints.remember(namespace, job_name, pod)
        lastseen.remember(namespace, job_name, pod)
    WAKEUPS.wake((namespace, job_name))


@kopf.on.event("", "v1", "configmaps", labels={constants.LABEL_JOB: kopf.PRESENT,
                                                constants.LABEL_ROLE: ROLE_PROGRESS})
async def on_progress_report(namespace: str, labels: dict[str, str], **_: Any) -> None:
    """The launcher wrote the program's progress (the job's ``<job>-progress`` ConfigMap):
    wake its job, whose pass copies it to ``status.progress`` (:mod:`.reported`)."""
    WAKEUPS.wake((namespace, labels[constants.LABEL_JOB]))


@kopf.on.event(*_EVENTS)
async def on_create_failure(namespace: str, body: kopf.Body, **_: Any) -> None:
    """The StatefulSet controller could not create a pod: wake the job owning that set."""
    statefulset = str((body.get("involvedObject") or {}).get("name") or "")
    if statefulset.endswith(names.WORKER_SUFFIX):
        WAKEUPS.wake((namespace, statefulset.removesuffix(names.WORKER_SUFFIX)))


kueue_watch.register(WAKEUPS.wake)
