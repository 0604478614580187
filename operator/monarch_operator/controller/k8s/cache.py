"""What the watches saw, in memory: each job and its children, so that a pass reads them from
here and not from the API server (the informer and lister of client-go's controllers,
kubernetes/client-go ``tools/cache``).

kopf's indexes hold the objects: :mod:`.handlers` registers one ``@kopf.index`` per watched kind.
kopf lists every indexed kind before it runs any other handler, so after a restart the cache is
complete before the first pass; and it drops an object on its DELETED event. On kopf's event
loop, :meth:`JobCache.view` copies one job's entries into a :class:`JobView`, which the pass (in a
worker thread) reads and updates through the k8s layer; the indexes themselves are only ever read
on the loop that writes them.

Watch events lag behind our own writes: an object this process just created may not be indexed
yet, and one it deleted may still be. Expectations bridge the gap, as client-go's
``ControllerExpectations`` do (kubernetes/kubernetes ``pkg/controller/controller_utils.go``):
what a pass created or deleted is remembered until the watch shows it, or for
:data:`EXPECTATION_SECONDS` at most. A create that still races is answered 409, which
:func:`.writes.ensure` takes as "exists": the cache saves reads, it never decides that an object
is created twice.

A job deleted while a pass of it runs: the pass still holds the job in its view, and the
watch's DELETED event comes while it creates children. :meth:`JobCache.job_deleted` marks the
job's uid gone, so that the pass creates nothing more (:func:`.writes.ensure` asks
:meth:`JobView.job_gone` first, and deletes what a create that raced the deletion made), and
returns every child known of it, for the operator to delete at once: garbage collection would
too, but only once it knows the job's kind (up to ~40 s after the CRD is installed: the
garbage collector rediscovers resources every 30 s) and only while the controller manager keeps
up.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from monarch_operator.controller.k8s.slim import slim
from monarch_operator.controller.state.ownership import controller_uid, owned_by_another_job

JobKey = tuple[str, str]  # (namespace, name)
Kind = tuple[str, str]  # (apiVersion, kind), as in a manifest
Body = dict[str, Any]
# One index per kind: (namespace, job name) -> the objects labelled with that job (kopf's Index
# maps a key to a Store, an iterable of the values the index handler returned).
Index = Mapping[JobKey, Iterable[Body]]

# How long an expectation outlives its write when no watch event confirms it (client-go's
# ExpectationsTimeout is 5 minutes; our watches confirm within a second or two).
EXPECTATION_SECONDS = 60.0
# How long a deleted job's uid is remembered as gone: longer than any pass of it can still run.
GONE_SECONDS = 600.0
# How long a job deleted with orphan propagation is remembered as such when its DELETED event
# does not come (the garbage collector orphans its children first, which may take a while).
ORPHANING_SECONDS = 86400.0


@dataclass
class _Expectation:
    """A write of ours the watch has not shown yet: ``body`` created, or ``uid`` deleted."""

    body: Body | None
    uid: str
    at: float


def _uid(body: Mapping[str, Any] | None) -> str:
    return str(((body or {}).get("metadata") or {}).get("uid") or "")


def _resource_version(body: Mapping[str, Any] | None) -> int | None:
    """``metadata.resourceVersion`` as a number (etcd's revision), None if absent or not one.

    The API conventions call it opaque; it is compared here only to tell which of two copies
    of the same object is newer, and any copy that is not a number is taken as unknown."""
    try:
        return int(((body or {}).get("metadata") or {}).get("resourceVersion"))
    except (TypeError, ValueError):
        return None


class JobCache:
    """The indexes of the watched kinds, plus the expectations of this process's own writes.

    Args:
        job_kind: the ``(apiVersion, kind)`` of the jobs themselves (their index is keyed by
            the job's own namespace and name).
        clock: monotonic seconds (a parameter for tests).

    ``view``, ``attach`` and ``is_own_write`` run on the event loop; the ``expect_*`` and
    ``status_written`` methods may run in any thread.
    """

    def __init__(self, job_kind: Kind, clock: Callable[[], float] = time.monotonic) -> None:
        self.job_kind = job_kind
        self._clock = clock
        self._indexes: dict[Kind, Index] = {}
        self._lock = threading.Lock()
        self._expected: dict[JobKey, dict[tuple[Kind, str], _Expectation]] = {}
        self._written: dict[JobKey, Body] = {}  # the job as our last status patch returned it
        self._own_versions: dict[JobKey, str] = {}
        self._gone: dict[str, float] = {}  # uid of a deleted (or deleting) job -> when seen
        self._orphaning: dict[str, float] = {}  # ... deleted with propagation "Orphan"

    def attach(self, kind: Kind, index: Index) -> None:
        """Read ``kind`` from ``index`` from now on."""
        self._indexes[kind] = index

    def covers(self, kind: Kind) -> bool:
        """Whether objects of ``kind`` are cached (else a pass reads them from the API)."""
        return kind in self._indexes

    def view(self, key: JobKey) -> JobView:
        """One job and its children as known now: the indexes, corrected by the expectations.

        The job is the newer of the indexed one and the one our last status patch returned
        (by resourceVersion), deep-copied (the pass edits its status); ``None`` when the job
        is not (or no longer) indexed. Children are indexed by the job's name label; one that
        another MonarchJob controls (an earlier job of that name, its children still going) is
        left out of every kind (:func:`.ownership.owned_by_another_job`).
        """
        job = self._job(key)
        job_uid = _uid(job)
        children: dict[Kind, dict[str, Body]] = {}
        for kind, index in self._indexes.items():
            if kind != self.job_kind:
                children[kind] = {body["metadata"]["name"]: body for body in index.get(key, ())
                                  if not owned_by_another_job(body, job_uid)}
        self._apply_expectations(key, children)
        return JobView(key, job, children, self)

    def peek(self, key: JobKey, kind: Kind) -> list[Body]:
        """The indexed objects of ``kind`` under ``key`` (the job itself for :attr:`job_kind`),
        not copied and without expectations: to be read at once, on the event loop, never
        changed."""
        return list(self._indexes.get(kind, {}).get(key, ()))

    def _job(self, key: JobKey) -> Body | None:
        indexed = next(iter(self._indexes.get(self.job_kind, {}).get(key, ())), None)
        if indexed is None:
            return None
        with self._lock:
            written = self._written.get(key)
            indexed_version, written_version = (_resource_version(indexed),
                                                _resource_version(written))
            if written is not None and (
                    _uid(written) != _uid(indexed) or indexed_version is None
                    or written_version is None or indexed_version >= written_version):
                del self._written[key]  # the watch caught up (or it is another job now)
                written = None
        return copy.deepcopy(written if written is not None else indexed)

    def _apply_expectations(self, key: JobKey, children: dict[Kind, dict[str, Body]]) -> None:
        now = self._clock()
        with self._lock:
            expected = self._expected.get(key, {})
            for (kind, name), expectation in list(expected.items()):
                seen = children.get(kind, {}).get(name)
                confirmed = (_uid(seen) == expectation.uid if expectation.body is not None
                             else seen is None or _uid(seen) != expectation.uid)
                if confirmed or now - expectation.at > EXPECTATION_SECONDS:
                    del expected[(kind, name)]
                elif expectation.body is not None:
                    children.setdefault(kind, {})[name] = expectation.body
                else:
                    children.get(kind, {}).pop(name, None)
            if not expected:
                self._expected.pop(key, None)

    def expect_created(self, key: JobKey, kind: Kind, body: Body,
                       job_uid: str | None = None) -> bool:
        """This process created ``body`` (a child of job ``job_uid``): show it until the watch
        does. Returns False, remembering nothing, when that job is gone
        (:meth:`job_deleted` came first: the creator deletes ``body`` itself).

        What is kept is ``body`` as the watch's copy would be cached (:func:`.slim.slim`): the
        API server's reply to a create is the whole object with its ``managedFields``, and a
        burst of new jobs holds hundreds of them until the watch catches up."""
        kept = slim(kind, body)
        with self._lock:
            if job_uid and job_uid in self._gone:
                return False
            self._expected.setdefault(key, {})[(kind, body["metadata"]["name"])] = (
                _Expectation(kept, _uid(body), self._clock()))
            return True

    def expect_deleted(self, key: JobKey, kind: Kind, name: str, uid: str) -> None:
        """This process deleted object ``uid``: hide it until the watch drops it."""
        with self._lock:
            self._expected.setdefault(key, {})[(kind, name)] = _Expectation(
                None, uid, self._clock())

    def status_written(self, key: JobKey, body: Body, generation_seen: int) -> None:
        """Our status patch returned ``body``; the pass had reconciled ``generation_seen``.

        The next view starts from it until the watch delivers it, and its own watch event
        wakes nobody when the pass saw the spec it carries (a spec edited meanwhile has a
        higher generation, and its event still wakes the job). It is kept slimmed as the
        watch's copy is (no ``managedFields``: every status patch adds to them)."""
        kept = slim(self.job_kind, body)
        with self._lock:
            self._written[key] = kept
            generation = (body.get("metadata") or {}).get("generation")
            version = (body.get("metadata") or {}).get("resourceVersion")
            if generation == generation_seen and version:
                self._own_versions[key] = str(version)
            else:
                self._own_versions.pop(key, None)

    def is_own_write(self, key: JobKey, resource_version: str | None) -> bool:
        """Whether a watch event of the job with ``resource_version`` is our last status patch
        of a spec the pass had seen (nothing to do then)."""
        with self._lock:
            return resource_version is not None and self._own_versions.get(key) == str(
                resource_version)

    def forget(self, key: JobKey) -> None:
        """The job is gone: drop what was remembered of its writes."""
        with self._lock:
            self._expected.pop(key, None)
            self._written.pop(key, None)
            self._own_versions.pop(key, None)

    def mark_gone(self, job_uid: str, orphaning: bool = False) -> None:
        """Job ``job_uid`` is deleted or being deleted: a pass of it creates nothing more
        (:meth:`is_gone`). ``orphaning``: it is being deleted with propagation ``Orphan``
        (``kubectl delete --cascade=orphan``: the ``orphan`` finalizer), so its children are to
        stay (:meth:`job_deleted` then names none). Any thread."""
        if not job_uid:
            return
        now = self._clock()
        with self._lock:
            self._gone[job_uid] = now
            for uid in [uid for uid, at in self._gone.items() if now - at > GONE_SECONDS]:
                del self._gone[uid]
            if orphaning:
                self._orphaning[job_uid] = now
            for uid in [uid for uid, at in self._orphaning.items()
                        if now - at > ORPHANING_SECONDS]:
                del self._orphaning[uid]

    def is_gone(self, job_uid: str | None) -> bool:
        """Whether job ``job_uid`` was deleted (or is being deleted). Any thread."""
        with self._lock:
            return bool(job_uid) and job_uid in self._gone

    def job_deleted(self, key: JobKey, job_uid: str) -> list[tuple[Kind, Body]]:
        """The watch saw job ``job_uid`` (at ``key``) deleted: mark it gone, drop what was
        remembered of its writes, and return every child known under ``key``: the indexed
        ones and those a pass created that the watch has not shown yet. On the event loop.

        Which of them are the deleted job's own is :func:`leftover_children`'s to say (a job
        of the same name created since may own some). None for a job deleted with orphan
        propagation (:meth:`mark_gone`): the garbage collector has just taken the job's owner
        references off its children, though the cache may not show that yet."""
        self.mark_gone(job_uid)
        with self._lock:
            orphaned = self._orphaning.pop(job_uid, None) is not None
        known: dict[tuple[Kind, str, str], tuple[Kind, Body]] = {}
        for kind, index in self._indexes.items():
            if kind != self.job_kind:
                for body in index.get(key, ()):
                    known[(kind, body["metadata"]["name"], _uid(body))] = (kind, body)
        with self._lock:
            for (kind, name), expectation in self._expected.pop(key, {}).items():
                if expectation.body is not None:
                    known[(kind, name, expectation.uid)] = (kind, expectation.body)
            self._written.pop(key, None)
            self._own_versions.pop(key, None)
        return [] if orphaned else list(known.values())


def leftover_children(job_uid: str, known: Iterable[tuple[Kind, Body]]
                      ) -> list[tuple[Kind, Body]]:
    """Of the children ``known`` of a deleted job, those to delete: controlled by ``job_uid``
    and not already being deleted. Pods of its StatefulSet or launcher Job are not among them:
    deleting their owner deletes them (garbage collection of built-in kinds is prompt; it is
    the job's own kind the collector may not know yet)."""
    return [(kind, body) for kind, body in known
            if job_uid and controller_uid(body) == job_uid
            and not (body.get("metadata") or {}).get("deletionTimestamp")]


@dataclass
class JobView:
    """One job and its children for one pass: ``children[kind][name]``, updated by the pass's
    own writes (:mod:`.writes` and :mod:`.deletes` call :meth:`created` and :meth:`deleted`)."""

    key: JobKey
    job: Body | None
    children: dict[Kind, dict[str, Body]] = field(default_factory=dict)
    cache: JobCache | None = None

    def covers(self, kind: Kind) -> bool:
        """Whether ``kind`` is read from here (else from the API)."""
        return kind in self.children

    def get(self, kind: Kind, name: str) -> Body | None:
        """The child ``name`` of ``kind``, or None when it does not exist."""
        return self.children.get(kind, {}).get(name)

    def select(self, kind: Kind, labels: Mapping[str, str]) -> list[Body]:
        """Children of ``kind`` carrying every label of ``labels`` (a label selector)."""
        return [body for body in self.children.get(kind, {}).values()
                if all(((body.get("metadata") or {}).get("labels") or {}).get(label) == value
                       for label, value in labels.items())]

    def created(self, kind: Kind, body: Body) -> bool:
        """The pass created (or found, after a 409) ``body``. Returns False when the job has
        been deleted meanwhile (:meth:`JobCache.job_deleted`): nothing is remembered then, and
        an object the pass created is the pass's to delete."""
        if self.cache is None:
            if kind in self.children:
                self.children[kind][body["metadata"]["name"]] = body
            return True
        if kind not in self.children:
            return not self.job_gone()
        if not self.cache.expect_created(self.key, kind, body, self.job_uid):
            return False
        self.children[kind][body["metadata"]["name"]] = body
        return True

    @property
    def job_uid(self) -> str | None:
        """The uid of the view's job (None without one)."""
        return _uid(self.job) or None

    def job_gone(self) -> bool:
        """Whether the job was deleted (or is being deleted) since the view was taken."""
        return self.cache is not None and self.cache.is_gone(self.job_uid)

    def deleted(self, kind: Kind, name: str) -> None:
        """The pass deleted child ``name``."""
        if kind in self.children:
            gone = self.children[kind].pop(name, None)
            if self.cache is not None and gone is not None:
                self.cache.expect_deleted(self.key, kind, name, _uid(gone))

    def status_written(self, body: Body) -> None:
        """The pass patched the job's status; the patch returned ``body``."""
        if self.cache is not None and self.job is not None:
            generation = int((self.job.get("metadata") or {}).get("generation") or 0)
            self.cache.status_written(self.key, body, generation)
