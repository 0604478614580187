"""One reconcile pass of one job as the watch engine runs it (in a worker thread).

Takes the job and its children from the watches' cache (:mod:`.cache`; from the API server when
no view is given), runs :func:`.reconcile.reconcile`, turns
errors into status or a back-off, and says when the job needs its next pass without a watch
event (:mod:`.deadlines`). Posting the events is left to the caller, on kopf's event loop.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

from monarch_operator.controller.engine import jobmetrics, metrics, reconcile
from monarch_operator.controller.engine.progress import ProgressWrites
from monarch_operator.controller.k8s import cache, client, deletes, errors, reads, writes
from monarch_operator.controller.k8s.cache import JobView
from monarch_operator.controller.spec.rules import InvalidSpecError
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import deadlines
from monarch_operator.controller.state import status as st

logger = logging.getLogger("monarch_operator")

# Back-off after an API error or a bug: doubles from the first to the last, per job.
ERROR_BACKOFF_FIRST_SECONDS = 2.0
ERROR_BACKOFF_MAX_SECONDS = 120.0
# A pass that asked to be retried (a child name taken by a foreign object): its delay doubles
# with each blocked pass in a row, up to this.
BLOCKED_RETRY_MAX_SECONDS = 300.0


@dataclass
class PassReport:
    """What the caller needs after a pass: the job (to post events on), the events, and the
    seconds until the next pass without a watch event (``None``: none), and the job's phase
    after the pass (``None``: the job is gone, or the pass failed before it knew)."""

    body: dict[str, Any] | None
    events: list[reconcile.Event] = field(default_factory=list)
    next_pass_seconds: float | None = None
    phase: str | None = None
    status: dict[str, Any] | None = None


class PassRunner:
    """Runs passes; remembers, per job, how many passes failed in a row (for the back-off)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._failures: dict[tuple[str, str], int] = {}
        self._blocked: dict[tuple[str, str], int] = {}
        self._progress = ProgressWrites()

    def run(self, namespace: str, name: str, view: JobView | None = None) -> PassReport:
        """One pass of ``namespace/name``; never raises (errors are logged and retried).

        ``view``: the job and its children as the watches saw them (taken on the event loop
        just before); without it, everything is read from the API server.
        """
        key = (namespace, name)
        started = time.monotonic()
        try:
            with client.reading_from(view) if view is not None else contextlib.nullcontext():
                report = self._run(namespace, name)
        except errors.JobGoneError as error:
            # Deleted while the pass ran: not an error, nothing to retry (the DELETED event
            # deletes what the pass had created, see cache.JobCache.job_deleted).
            metrics.record_pass(metrics.RESULT_OK, time.monotonic() - started)
            metrics.JOB_PHASES.set(key, None)
            jobmetrics.JOBS.forget(key)
            self._forget(key)
            logger.info("%s/%s: pass stopped: %s", namespace, name, error)
            return PassReport(None)
        except ApiException as error:
            metrics.record_pass(metrics.RESULT_API_ERROR, time.monotonic() - started,
                                error.status)
            report = PassReport(None, next_pass_seconds=self._backoff(key))
            logger.warning("%s/%s: API error %s %s (next try in %.0fs): %s", namespace, name,
                           error.status, error.reason, report.next_pass_seconds,
                           errors.api_error_message(error))
            return report
        except Exception:
            metrics.record_pass(metrics.RESULT_ERROR, time.monotonic() - started)
            report = PassReport(None, next_pass_seconds=self._backoff(key))
            logger.exception("%s/%s: reconcile failed (next try in %.0fs)", namespace, name,
                             report.next_pass_seconds)
            return report
        metrics.record_pass(metrics.RESULT_OK, time.monotonic() - started)
        metrics.JOB_PHASES.set(key, report.phase)
        if report.phase is None:
            jobmetrics.JOBS.forget(key)
        else:
            jobmetrics.JOBS.observe(key, report.status or {"phase": report.phase})
        self._failures.pop(key, None)
        return report

    def _run(self, namespace: str, name: str) -> PassReport:
        body = reads.read_monarchjob(namespace, name)
        if body is None or body.get("metadata", {}).get("deletionTimestamp"):
            # Gone or going: its children are deleted (garbage collection, and the operator on
            # the job's DELETED event); nothing of ours blocks it.
            self._forget((namespace, name))
            return PassReport(None)
        now = dt.datetime.now(dt.UTC)
        try:
            outcome = reconcile.reconcile(
                body, self.settings, now,
                functools.partial(self._progress.hold_seconds, (namespace, name), now))
        except InvalidSpecError as error:
            return PassReport(body, _fail_invalid(body, str(error), now), phase=st.PHASE_FAILED)
        for event in outcome.events:
            logger.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
        job = JobSpec.from_body(body)
        delays = [delay for delay in (
            deadlines.seconds_until_next_deadline(job, outcome.status, now),
            self._retry_delay((namespace, name), outcome.retry_after), outcome.wake_after,
            outcome.write_deferred_seconds) if delay is not None]
        if outcome.status_written:
            self._progress.written((namespace, name), now)
        return PassReport(body, outcome.events, min(delays) if delays else None,
                          phase=None if outcome.deleted else outcome.status.get("phase"),
                          status=None if outcome.deleted else outcome.status)

    def _forget(self, key: tuple[str, str]) -> None:
        """What is remembered of a job that is gone."""
        self._failures.pop(key, None)
        self._blocked.pop(key, None)
        self._progress.forget(key)

    def _retry_delay(self, key: tuple[str, str], first: float | None) -> float | None:
        if first is None:
            self._blocked.pop(key, None)
            return None
        blocked = self._blocked.get(key, 0)
        self._blocked[key] = blocked + 1
        return float(min(first * 2**blocked, BLOCKED_RETRY_MAX_SECONDS))

    def _backoff(self, key: tuple[str, str]) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        return float(min(ERROR_BACKOFF_FIRST_SECONDS * 2**failures, ERROR_BACKOFF_MAX_SECONDS))


def delete_leftovers(namespace: str, name: str, job_uid: str,
                     known: list[tuple[tuple[str, str], dict[str, Any]]]) -> int:
    """Delete the children of deleted job ``job_uid`` (``namespace/name``) among ``known``
    (:meth:`.cache.JobCache.job_deleted`): those it controls and that are not being deleted
    yet, each by uid (a job of the same name created since keeps its own). Garbage collection
    would delete them too, but late when it does not know the job's kind yet, and a pass that
    raced the deletion may have created some just now. Never raises: errors are logged (the
    garbage collector is still there). Returns how many were deleted."""
    deleted = []
    for (api_version, kind), body in cache.leftover_children(job_uid, known):
        metadata = body["metadata"]
        try:
            if deletes.delete_exact(api_version, kind, namespace, metadata["name"],
                                str(metadata.get("uid"))):
                deleted.append(f"{kind} {metadata['name']}")
        except ApiException as error:
            logger.warning("%s/%s: deleting %s %s of the deleted job failed (left to garbage "
                           "collection): %s %s", namespace, name, kind, metadata["name"],
                           error.status, errors.api_error_message(error))
        except ValueError as error:  # a kind the operator does not delete
            logger.warning("%s/%s: %s (left to garbage collection)", namespace, name, error)
    if deleted:
        logger.info("%s/%s: job deleted; deleted its %s", namespace, name, ", ".join(deleted))
    return len(deleted)


def _fail_invalid(body: dict[str, Any], message: str, now: dt.datetime) -> list[reconcile.Event]:
    """Mark the job Failed (InvalidSpec) once; an event only when the status changes."""
    status = dict(body.get("status") or {})
    generation = int(body.get("metadata", {}).get("generation", 1))
    new_status = st.set_condition(status, st.FAILED, True, st.REASON_INVALID_SPEC, message,
                                  generation, st.format_time(now))
    new_status["phase"] = st.summarize_phase(new_status)
    new_status["message"] = st.summarize_message(new_status)
    new_status["observedGeneration"] = generation
    if new_status == status:
        return []
    metadata = body["metadata"]
    writes.patch_job_status(metadata.get("namespace", "default"), metadata["name"], new_status)
    return [reconcile.Event("Warning", st.REASON_INVALID_SPEC, message)]
