"""Writes: ``ensure`` (read, create on 404, 409 on create is "exists", never take over an object
another owner controls), creates sent together, a server-side dry run, pod labels, and the
MonarchJob's status patch. Every create tells the pass's view.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
from typing import Any

from kubernetes.client.rest import ApiException

from monarch_operator import constants
from monarch_operator.controller.k8s import client, deletes, reads
from monarch_operator.controller.k8s.errors import (
    ForbiddenError,
    JobGoneError,
    NotOwnedError,
    RefusedError,
    api_error_message,
)

# Creates sent together (:func:`ensure_together`) go out on these threads, each on its own
# connection of the client's pool.
_CREATE_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                        thread_name_prefix="create")


# 403 answers that are not about the operator's permissions: a ResourceQuota without room now
# (``exceeded quota``, may have room later) stays a retry; a Pod Security violation is about the
# user's template (``violates PodSecurity``), refused like an invalid one.
_QUOTA_403 = "exceeded quota"
_POD_SECURITY_403 = "violates PodSecurity"


# Fault injection for tests of restarts (field case C6), like etcd's failpoints: the operator
# SIGKILLs itself right after creating a child of this kind (e.g. "Service"). Unset in use.
CRASH_AFTER_CREATE_ENV = "MONARCH_OPERATOR_CRASH_AFTER_CREATE"


def _post(desired: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    """Create ``desired`` (POST to its kind's collection in its namespace); returns the object
    as the API server stored it (with ``dry_run``, as it would have: validated and admitted,
    nothing stored; ``dryRun=All``).

    JSON in and JSON out, past the typed client's models: checking a pod against them and
    building them from the reply cost the operator more CPU than the rest of the pass that
    starts a launcher. What the models checked, the API server checks itself: an unknown field
    is refused naming it (``fieldValidation=Strict``, as ``kubectl`` sends; Kubernetes docs,
    "API Concepts": field validation), never dropped.

    Raises:
        kubernetes.client.rest.ApiException: the API server's answer was not a success.
        KeyError: ``desired`` is not of a kind in :data:`.client._KINDS`.
    """
    api_version, kind = desired["apiVersion"], desired["kind"]
    created: dict[str, Any] = client.call(
        "create", api_version, client.plural(api_version, kind), desired["metadata"]["namespace"],
        query=(("fieldValidation", "Strict"), *((("dryRun", "All"),) if dry_run else ())),
        body=desired)
    return created


def ensure(desired: dict[str, Any], owner_uid: str) -> tuple[dict[str, Any], bool]:
    """Make sure ``desired`` exists; never overwrite an existing object.

    Returns:
        ``(observed, created)``: the object as the API holds it, and whether this call made it.

    Raises:
        NotOwnedError: an object of that name exists but its controller is not ``owner_uid``
            (e.g. a leftover of a deleted job of the same name that GC has not removed yet).
        RefusedError: the API server refused to create it as invalid (400/422, or a Pod
            Security violation), or it could not even be sent.
        ForbiddenError: the API server refused the operator the create (403, not a quota).
        JobGoneError: in a pass (:func:`reading_from`), the job was deleted: nothing is
            created, and an object whose create raced the deletion is deleted again.
        kubernetes.client.rest.ApiException: any other API error.
    """
    (result,) = ensure_together(desired, owner_uid=owner_uid)
    return result


def ensure_together(*desired: dict[str, Any], owner_uid: str) -> list[tuple[dict[str, Any],
                                                                          bool]]:
    """:func:`ensure` for objects the last of which mounts the others (the hostfile ConfigMap,
    then the launcher pod that mounts it). Every object but the last is read or created at once
    (each create on its own connection); the last is created only once each of them is the
    job's own, one round trip later. A kubelet mounts a ConfigMap by name: a launcher created
    beside a hostfile an earlier job of the same name still held (garbage collection had not
    removed it yet) ran on that job's hosts and addresses, and with a resolver still answering
    the old pods' addresses its pre-flight passed the name check and timed out on an address
    nobody had any more (a clean-clone CI run, tests/e2e/test_same_name_again.py).

    Returns:
        ``(observed, created)`` per object, in order.

    Raises:
        What :func:`ensure` raises, for the first object (in order) that failed or that the
        job does not control; the last object is then not created. Objects created before
        stay known to the pass's view.
    """
    *mounted, last = desired
    results = _ensure_at_once(mounted, owner_uid) if mounted else []
    for found, _ in results:
        check_owner(found, owner_uid)
    results += _ensure_at_once([last], owner_uid)
    check_owner(results[-1][0], owner_uid)
    return results


def _ensure_at_once(desired: list[dict[str, Any]], owner_uid: str
                    ) -> list[tuple[dict[str, Any], bool]]:
    """Read each of ``desired`` from the pass's view and create the missing ones at once, all
    but the last on other threads. Returns ``(observed, created)`` per object; raises what
    :func:`ensure` raises for the first that failed (the others created all the same), but
    not for an object another owner controls (the caller checks)."""
    observed = [reads.read(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"],
                     obj["metadata"]["name"]) for obj in desired]
    missing = [index for index, found in enumerate(observed) if found is None]
    pass_view = client._local.view
    if missing and pass_view is not None and pass_view.job_gone():
        metadata = desired[missing[0]]["metadata"]
        raise JobGoneError(f"not creating {desired[missing[0]]['kind']} {metadata['namespace']}/"
                           f"{metadata['name']}: its job was deleted")
    # All but the last on other threads, the last on this one; each reply or error is kept.
    sent = [_CREATE_THREADS.submit(_attempt, desired[index]) for index in missing[:-1]]
    last = [_attempt(desired[index]) for index in missing[-1:]]
    replies = [future.result() for future in sent] + last
    created = [False] * len(desired)
    failures: list[Exception] = []
    for index, reply in zip(missing, replies, strict=True):
        try:
            observed[index], created[index] = _settle(desired[index], reply, owner_uid)
        except Exception as error:
            failures.append(error)
    if failures:
        raise failures[0]
    results = []
    for found, made in zip(observed, created, strict=True):
        assert found is not None
        results.append((found, made))
    return results


def create_all(*desired: dict[str, Any], owner_uid: str) -> list[tuple[dict[str, Any], bool]]:
    """Create every object of ``desired`` at once, without reading first (for kinds the pass's
    view does not cache, whose read would be a request each); one that exists already (409) is
    read and must be controlled by ``owner_uid``.

    Returns:
        ``(observed, created)`` per object, in order.

    Raises:
        What :func:`ensure` raises, for the first object (in order) that failed.
    """
    sent = [_CREATE_THREADS.submit(_attempt, obj) for obj in desired[:-1]]
    replies = [future.result() for future in sent] + [_attempt(obj) for obj in desired[-1:]]
    results: list[tuple[dict[str, Any], bool]] = []
    failures: list[Exception] = []
    for obj, reply in zip(desired, replies, strict=True):
        try:
            results.append(_settle(obj, reply, owner_uid))
        except Exception as error:
            failures.append(error)
    if failures:
        raise failures[0]
    for found, _ in results:
        check_owner(found, owner_uid)
    return results


def check_creatable(desired: dict[str, Any]) -> None:
    """Ask the API server whether it would create ``desired`` now, creating nothing (a
    server-side dry run: validation and admission, field case C12). For an object made only
    later (the launcher pod, once every worker is Ready) whose template a user wrote.

    Raises:
        RefusedError: it would be refused as invalid (400/422, Pod Security), naming the field.
        ForbiddenError: the operator may not create it (403, not a quota).
        kubernetes.client.rest.ApiException: any other error but a quota's 403 (no
            room now, which may change by then) and 409 (the name is taken now).
    """
    try:
        _post(desired, dry_run=True)
    except (ValueError, TypeError, ApiException) as error:
        refusal = _refusal(desired, error)
        if refusal is not None:
            raise refusal from error
        if not isinstance(error, ApiException) or error.status not in (403, 409):
            raise  # 403 here: a quota without room now, which may change by then


def _refusal(desired: dict[str, Any], error: Exception) -> RefusedError | ForbiddenError | None:
    """The lasting refusal a create's ``error`` means, else None (a retry may succeed):
    RefusedError when the API server refused the object as invalid (400/422), for a Pod
    Security violation (403), or when it could not even be sent; ForbiddenError for any other
    403 but a full quota (the operator's own permissions, C24)."""
    kind, name = desired["kind"], desired["metadata"]["name"]
    if isinstance(error, (ValueError, TypeError)):
        return RefusedError(kind, name, str(error))
    if not isinstance(error, ApiException):
        return None
    if error.status in (400, 422):
        return RefusedError(kind, name, api_error_message(error))
    if error.status == 403:
        detail = api_error_message(error)
        if _POD_SECURITY_403 in detail:
            return RefusedError(kind, name, detail)
        if _QUOTA_403 not in detail:
            return ForbiddenError(kind, name, detail)
    return None


def _attempt(desired: dict[str, Any]) -> dict[str, Any] | Exception:
    """:func:`_post`, its error returned rather than raised (for :func:`_settle`)."""
    try:
        return _post(desired)
    except Exception as error:
        return error


def _settle(desired: dict[str, Any], reply: dict[str, Any] | Exception, owner_uid: str
            ) -> tuple[dict[str, Any], bool]:
    """What a create's ``reply`` (the object created, or the error raised) means for ``desired``:
    ``(observed, created)``; tells the pass's view of an object the job controls. Raises as
    :func:`ensure` does.

    An object in the way that the job does not control (409, then read) is not told to the
    view: the watches select the job's label and would never confirm it, so the view would
    answer every later pass with it for :data:`.cache.EXPECTATION_SECONDS` after it was
    deleted (a job blocked by a foreign Secret went on a minute after it went, not at the next
    look, ``engine/reconcile.NOT_OWNED_RETRY_SECONDS``)."""
    api_version, kind = desired["apiVersion"], desired["kind"]
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    created = not isinstance(reply, Exception)
    refusal = None if isinstance(reply, dict) else _refusal(desired, reply)
    if isinstance(reply, dict):
        observed = reply
        if os.environ.get(CRASH_AFTER_CREATE_ENV) == kind:
            os.kill(os.getpid(), signal.SIGKILL)
    elif refusal is not None:
        raise refusal from reply
    elif not isinstance(reply, ApiException) or reply.status != 409:
        raise reply
    else:
        # Exists, though the cache did not show it yet: the API server says what it is.
        found = reads._read_api(api_version, kind, namespace, name)
        if found is None:  # deleted between the 409 and the read; next pass retries
            raise reply
        observed = found
        if reads.controller_uid(found) != owner_uid:
            return observed, False  # not ours: the caller's check_owner says so
    pass_view = client._local.view
    if pass_view is not None and not pass_view.created((api_version, kind), observed):
        if created:  # the job went while we created it: nobody else knows of this one
            deletes.delete_exact(api_version, kind, namespace, name,
                                 str(observed["metadata"]["uid"]))
        raise JobGoneError(f"{kind} {namespace}/{name}: its job was deleted meanwhile")
    return observed, created


def check_owner(observed: dict[str, Any], owner_uid: str) -> None:
    """Raise NotOwnedError unless ``observed``'s controller owner reference is ``owner_uid``."""
    owner = reads.controller_uid(observed)
    if owner != owner_uid:
        metadata = observed.get("metadata", {})
        raise NotOwnedError(
            f"{observed.get('kind', 'object')} {metadata.get('namespace')}/{metadata.get('name')} "
            f"exists but is controlled by uid {owner or '<none>'}, not by this job "
            f"({owner_uid}); waiting for it to be deleted"
        )


def label_pod(namespace: str, name: str, labels: dict[str, str | None]) -> bool:
    """Merge-patch the labels of pod ``name``: each value set, each None removed (attach mode's
    rank labels, :mod:`.attachmode`). Returns False if the pod is gone (404).

    Raises:
        ForbiddenError: the operator may not patch pods (403).
    """
    try:
        client.call("patch", "v1", "pods", namespace, name,
                    body={"metadata": {"labels": labels}})
    except ApiException as error:
        if error.status == 404:
            return False
        if error.status == 403:
            raise ForbiddenError("Pod", name, api_error_message(error)) from error
        raise
    return True


def patch_job_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """Merge-patch the MonarchJob's status subresource with ``status``; returns the job as the
    API server stored it (and tells the pass's view, see :func:`reading_from`).

    Raises:
        JobGoneError: the job does not exist (404).
        kubernetes.client.rest.ApiException: any other API error.
    """
    try:
        job: dict[str, Any] = client.call("patch", constants.API_VERSION, constants.PLURAL,
                                          namespace, name, subresource="status",
                                          body={"status": status})
    except ApiException as error:
        if error.status == 404:  # deleted during the pass; its DELETED event is on its way
            raise JobGoneError(f"MonarchJob {namespace}/{name} was deleted") from error
        raise
    view = client._local.view
    if view is not None and view.key == (namespace, name):
        view.status_written(job)
    return job
