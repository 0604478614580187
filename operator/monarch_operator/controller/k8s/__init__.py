"""The one layer that talks to the Kubernetes API.

``ensure`` reads, creates on 404, treats 409 on create as "exists", and refuses to take over an
object that another owner controls. Deletes treat 404 as done. Everything returns plain dicts.

Inside ``with reading_from(view)`` (one pass, one thread), reads of the kinds the watches cache
come from that :class:`.cache.JobView`, and this thread's creates and deletes update it; the
rest (and everything outside such a block) goes to the API server.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.rest import ApiException

from monarch_operator import __version__, constants
from monarch_operator.controller.k8s import cache
from monarch_operator.controller.k8s.cache import JobView

# How the operator's own requests show up in the API server's audit log (kopf's watches say
# "kopf/<version>"). Test of field case C5 counts writes by this agent.
USER_AGENT = f"{constants.MANAGED_BY}/{__version__}"

# (apiVersion, kind) -> (API class, method suffix) of the typed client, and the resource's
# plural (its collection's path, where creates are POSTed).
_KINDS: dict[tuple[str, str], tuple[type, str, str]] = {
    ("v1", "Secret"): (kubernetes.client.CoreV1Api, "namespaced_secret", "secrets"),
    ("v1", "Service"): (kubernetes.client.CoreV1Api, "namespaced_service", "services"),
    ("v1", "ConfigMap"): (kubernetes.client.CoreV1Api, "namespaced_config_map", "configmaps"),
    ("apps/v1", "StatefulSet"): (kubernetes.client.AppsV1Api, "namespaced_stateful_set",
                                 "statefulsets"),
    ("v1", "Pod"): (kubernetes.client.CoreV1Api, "namespaced_pod", "pods"),
    ("networking.k8s.io/v1", "NetworkPolicy"): (kubernetes.client.NetworkingV1Api,
                                               "namespaced_network_policy", "networkpolicies"),
    ("v1", "ServiceAccount"): (kubernetes.client.CoreV1Api, "namespaced_service_account",
                               "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "Role"): (kubernetes.client.RbacAuthorizationV1Api,
                                               "namespaced_role", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (kubernetes.client.RbacAuthorizationV1Api,
                                                      "namespaced_role_binding", "rolebindings"),
}
# Creates sent together (:func:`ensure_together`) go out on these threads, each on its own
# connection of the client's pool.
_CREATE_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                        thread_name_prefix="create")


# The API server's decoding errors name the kind twice before what is wrong ('StatefulSet in
# version "v1" cannot be handled as a StatefulSet: strict decoding error: unknown field ...').
_DECODING_PREFIX = re.compile(r'^\w+ in version "[^"]*" cannot be handled as an? \w+: ')


class RefusedError(RuntimeError):
    """The API server refused to create a child as invalid (HTTP 400/422), or the client could
    not even send it: the same object will never be accepted (field case C12). The message
    leaves out the decoding error's preamble, so that the field it names fits the job's
    MESSAGE column."""

    def __init__(self, kind: str, name: str, detail: str) -> None:
        super().__init__(f"the API server refused {kind} {name}: "
                         f"{_DECODING_PREFIX.sub('', detail)}")
        self.kind = kind


class ForbiddenError(RuntimeError):
    """The API server refused the operator itself (HTTP 403, not a quota): its RBAC lacks a
    verb, or an admission plugin refused what it may not do, such as
    ``OwnerReferencesPermissionEnforcement`` refusing ``blockOwnerDeletion`` to a user without
    ``update`` on ``monarchjobs/finalizers`` (field case C24; kubeflow/trainer#2349). Retrying
    cannot help until an administrator grants the permission."""

    def __init__(self, kind: str, name: str, detail: str) -> None:
        super().__init__(f"the API server refused to let the operator create {kind} {name}: "
                         f"{detail}")
        self.kind = kind


# 403 answers that are not about the operator's permissions: a ResourceQuota without room now
# (``exceeded quota``, may have room later) stays a retry; a Pod Security violation is about the
# user's template (``violates PodSecurity``), refused like an invalid one.
_QUOTA_403 = "exceeded quota"
_POD_SECURITY_403 = "violates PodSecurity"


class NotOwnedError(RuntimeError):
    """A child's name is taken by an object that the job does not control (field case C6)."""


class JobGoneError(RuntimeError):
    """The job of the running pass was deleted (or is being deleted) meanwhile: the pass
    stops; it created nothing more (see :meth:`.cache.JobCache.job_deleted`)."""


_shared_client: kubernetes.client.ApiClient | None = None

# Fault injection for tests of restarts (field case C6), like etcd's failpoints: the operator
# SIGKILLs itself right after creating a child of this kind (e.g. "Service"). Unset in use.
CRASH_AFTER_CREATE_ENV = "MONARCH_OPERATOR_CRASH_AFTER_CREATE"


def load_config() -> None:
    """Load in-cluster credentials, or the kubeconfig (``$KUBECONFIG``) outside a cluster."""
    global _shared_client
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    _shared_client = None
    forget_nodes()


def _client() -> kubernetes.client.ApiClient:
    """One API client for every call: its connection pool is reused (urllib3 is thread-safe),
    and its requests carry :data:`USER_AGENT`."""
    global _shared_client
    if _shared_client is None:
        client = kubernetes.client.ApiClient()
        client.user_agent = USER_AGENT
        _bound_requests(client)
        _shared_client = client
    return _shared_client


# Every request of a pass is bounded (connect, read; seconds): the client sets no timeout, and a
# pooled connection that a middlebox or a paused API server stopped answering would hold the
# pass, and every later pass of its job, for ever (field case C18).
REQUEST_TIMEOUT = (5.0, 15.0)


def _bound_requests(client: kubernetes.client.ApiClient) -> None:
    """Give ``client``'s requests :data:`REQUEST_TIMEOUT` unless a call sets its own; after a
    request timed out, drop every pooled connection (opened before the same outage, they are
    likely dead too), so that the next requests open new ones."""
    request = client.rest_client.request

    def bounded(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        try:
            return request(*args, _request_timeout=_request_timeout or REQUEST_TIMEOUT,
                           **kwargs)
        except (urllib3.exceptions.TimeoutError, urllib3.exceptions.MaxRetryError):
            client.rest_client.pool_manager.clear()
            raise

    client.rest_client.request = bounded


class _PassLocal(threading.local):
    """Per thread: the view of the pass running in it, if any."""

    view: JobView | None = None


_local = _PassLocal()


@contextlib.contextmanager
def reading_from(view: JobView) -> Iterator[JobView]:
    """Within the block (in this thread), cached kinds are read from ``view``."""
    previous = _local.view
    _local.view = view
    try:
        yield view
    finally:
        _local.view = previous


def _view(api_version: str, kind: str) -> JobView | None:
    """The view of this thread's pass, if it caches ``kind``."""
    view = _local.view
    return view if view is not None and view.covers((api_version, kind)) else None


def _api(api_version: str, kind: str) -> tuple[Any, str]:
    api_class, suffix, _ = _KINDS[(api_version, kind)]
    return api_class(_client()), suffix


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
        KeyError: ``desired`` is not of a kind in :data:`_KINDS`.
    """
    api_version, kind = desired["apiVersion"], desired["kind"]
    plural = _KINDS[(api_version, kind)][2]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    client = _client()
    request = client.param_serialize(
        method="POST", resource_path=f"{prefix}/namespaces/{{namespace}}/{plural}",
        path_params={"namespace": desired["metadata"]["namespace"]},
        query_params=[("fieldValidation", "Strict"), *([("dryRun", "All")] if dry_run else [])],
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=desired, auth_settings=["BearerToken"])
    response = client.call_api(*request)
    response.read()
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    created: dict[str, Any] = json.loads(response.data)
    return created


def _to_dict(obj: Any) -> dict[str, Any]:
    result: dict[str, Any] = _client().sanitize_for_serialization(obj)
    return result


def read(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object as a dict, or ``None`` if it does not exist (from the pass's view when it
    caches ``kind``, see :func:`reading_from`)."""
    view = _view(api_version, kind)
    if view is not None and view.key[0] == namespace:
        return view.get((api_version, kind), name)
    return _read_api(api_version, kind, namespace, name)


def _read_api(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    api, suffix = _api(api_version, kind)
    try:
        return _to_dict(getattr(api, f"read_{suffix}")(name, namespace))
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def controller_uid(obj: dict[str, Any]) -> str | None:
    """uid of the object's controller owner reference, if any."""
    return cache.controller_uid(obj)


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
    """:func:`ensure` for objects that do not need each other to be created (the hostfile
    ConfigMap and the launcher pod that mounts it: a kubelet retries a volume whose source is
    not there yet). The creates needed are sent at once, each on its own connection, so that
    the last one exists one round trip after the first, not one per object later.

    Returns:
        ``(observed, created)`` per object, in order.

    Raises:
        What :func:`ensure` raises, for the first object (in order) that failed; the others
        were created or found all the same.
    """
    observed = [read(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"],
                     obj["metadata"]["name"]) for obj in desired]
    missing = [index for index, found in enumerate(observed) if found is None]
    pass_view = _local.view
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
            observed[index], created[index] = _settle(desired[index], reply)
        except Exception as error:
            failures.append(error)
    if failures:
        raise failures[0]
    results = []
    for found, made in zip(observed, created, strict=True):
        assert found is not None
        check_owner(found, owner_uid)
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
            results.append(_settle(obj, reply))
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


def _settle(desired: dict[str, Any], reply: dict[str, Any] | Exception
            ) -> tuple[dict[str, Any], bool]:
    """What a create's ``reply`` (the object created, or the error raised) means for ``desired``:
    ``(observed, created)``; tells the pass's view. Raises as :func:`ensure` does."""
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
        found = _read_api(api_version, kind, namespace, name)
        if found is None:  # deleted between the 409 and the read; next pass retries
            raise reply
        observed = found
    pass_view = _local.view
    if pass_view is not None and not pass_view.created((api_version, kind), observed):
        if created:  # the job went while we created it: nobody else knows of this one
            delete_exact(api_version, kind, namespace, name, str(observed["metadata"]["uid"]))
        raise JobGoneError(f"{kind} {namespace}/{name}: its job was deleted meanwhile")
    return observed, created


def check_owner(observed: dict[str, Any], owner_uid: str) -> None:
    """Raise NotOwnedError unless ``observed``'s controller owner reference is ``owner_uid``."""
    owner = controller_uid(observed)
    if owner != owner_uid:
        metadata = observed.get("metadata", {})
        raise NotOwnedError(
            f"{observed.get('kind', 'object')} {metadata.get('namespace')}/{metadata.get('name')} "
            f"exists but is controlled by uid {owner or '<none>'}, not by this job "
            f"({owner_uid}); waiting for it to be deleted"
        )


def delete(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete with background propagation; returns False if it was already gone (404)."""
    api, suffix = _api(api_version, kind)
    view = _view(api_version, kind)
    try:
        getattr(api, f"delete_{suffix}")(name, namespace, propagation_policy="Background")
        deleted = True
    except ApiException as error:
        if error.status != 404:
            raise
        deleted = False
    if view is not None:
        view.deleted((api_version, kind), name)
    return deleted


def delete_exact(api_version: str, kind: str, namespace: str, name: str, uid: str) -> bool:
    """Delete object ``uid``, a child of a job (background propagation), never a namesake that
    replaced it: the uid is a precondition of the DELETE (``DeleteOptions.preconditions``).
    One typed call per kind, so that the chart's RBAC rules can be derived from this code.
    Returns False when it was gone already (404) or is another object now (409).

    Raises:
        ValueError: ``kind`` is not one the operator creates.
        kubernetes.client.rest.ApiException: any other API error.
    """
    options = kubernetes.client.V1DeleteOptions(
        propagation_policy="Background", preconditions=kubernetes.client.V1Preconditions(uid=uid))
    core = kubernetes.client.CoreV1Api(_client())
    apps = kubernetes.client.AppsV1Api(_client())
    networking = kubernetes.client.NetworkingV1Api(_client())
    rbac = kubernetes.client.RbacAuthorizationV1Api(_client())
    try:
        match (api_version, kind):
            case ("v1", "Pod"):
                core.delete_namespaced_pod(name, namespace, body=options)
            case ("v1", "Secret"):
                core.delete_namespaced_secret(name, namespace, body=options)
            case ("v1", "Service"):
                core.delete_namespaced_service(name, namespace, body=options)
            case ("v1", "ConfigMap"):
                core.delete_namespaced_config_map(name, namespace, body=options)
            case ("apps/v1", "StatefulSet"):
                apps.delete_namespaced_stateful_set(name, namespace, body=options)
            case ("networking.k8s.io/v1", "NetworkPolicy"):
                networking.delete_namespaced_network_policy(name, namespace, body=options)
            case ("v1", "ServiceAccount"):
                core.delete_namespaced_service_account(name, namespace, body=options)
            case ("rbac.authorization.k8s.io/v1", "Role"):
                rbac.delete_namespaced_role(name, namespace, body=options)
            case ("rbac.authorization.k8s.io/v1", "RoleBinding"):
                rbac.delete_namespaced_role_binding(name, namespace, body=options)
            case _:
                raise ValueError(f"{api_version} {kind} is not a kind of child of a job")
    except ApiException as error:
        if error.status in (404, 409):
            return False
        raise
    return True


def delete_if_present(api_version: str, kind: str, namespace: str, name: str) -> bool:
    """Delete unless absent or already being deleted: a pass on a finished job sends no request
    (a DELETE answered 404 is still a write in the audit log, field case C5)."""
    observed = read(api_version, kind, namespace, name)
    if observed is None or observed.get("metadata", {}).get("deletionTimestamp"):
        return False
    return delete(api_version, kind, namespace, name)


def delete_pod(namespace: str, name: str, force: bool = False,
               grace_seconds: int | None = None) -> bool:
    """Delete a pod with its own grace period, ``grace_seconds`` instead (seconds between the
    kubelet's SIGTERM and SIGKILL), or with ``force`` at once (grace period 0, as
    ``kubectl delete pod --force --grace-period=0``: the object goes without waiting for its
    kubelet; only finalizers still hold it). Returns False if it was already gone (404)."""
    try:
        kubernetes.client.CoreV1Api(_client()).delete_namespaced_pod(
            name, namespace, grace_period_seconds=0 if force else grace_seconds)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def label_pod(namespace: str, name: str, labels: dict[str, str | None]) -> bool:
    """Merge-patch the labels of pod ``name``: each value set, each None removed (attach mode's
    rank labels, :mod:`.attachmode`). Returns False if the pod is gone (404).

    Raises:
        ForbiddenError: the operator may not patch pods (403).
    """
    try:
        kubernetes.client.CoreV1Api(_client()).patch_namespaced_pod(
            name, namespace, {"metadata": {"labels": labels}})
    except ApiException as error:
        if error.status == 404:
            return False
        if error.status == 403:
            raise ForbiddenError("Pod", name, api_error_message(error)) from error
        raise
    return True


def stop_pod(pod: dict[str, Any] | None, grace_seconds: int | None = None) -> bool:
    """Delete ``pod`` (as read) with its own grace period (or ``grace_seconds``) unless it is
    absent or already being deleted: a pass that finds it so sends nothing. The pod stays in
    the pass's view: it runs until its grace period ends, and whoever waits for it must still
    see it.

    Returns:
        Whether a delete was sent and the pod existed.
    """
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return False
    return delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"],
                      grace_seconds=grace_seconds)


def list_pods(namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """Pods in ``namespace`` carrying every label of ``labels`` (from the pass's view when
    it caches pods)."""
    view = _view("v1", "Pod")
    if view is not None and view.key[0] == namespace:
        return view.select(("v1", "Pod"), labels)
    selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
    pods = kubernetes.client.CoreV1Api(_client()).list_namespaced_pod(
        namespace, label_selector=selector)
    return [_to_dict(pod) for pod in pods.items]


# A node found Ready is taken as Ready for this long by every pass (a node turns NotReady only
# after the node controller's grace period, 40 s by default), so that many jobs' workers on a
# few nodes cost a few reads, not one per worker per pass. NotReady is never reused: a node
# that came back must not cost a new pod on it its attempt (the pod would be judged lost).
NODE_READY_MEMO_SECONDS = 5.0
_node_memo: dict[str, float] = {}  # node -> when it was last found Ready (monotonic)
_node_memo_lock = threading.Lock()
_nodes_forbidden = False  # a 403 once: this operator may not read nodes (namespaced mode)


def node_is_ready(name: str) -> bool:
    """Whether node ``name`` exists and has condition ``Ready=True`` (a 404 is False): see
    :func:`node_not_ready_since`, whose answer is None exactly then.

    Raises:
        ApiException: any error but 403 and 404.
    """
    return node_not_ready_since(name) is None


# What node_not_ready_since answers for a node that is gone or never reported Ready: lost long
# ago.
NEVER_READY = dt.datetime.min.replace(tzinfo=dt.UTC)


def node_not_ready_since(name: str) -> dt.datetime | None:
    """When node ``name`` stopped being Ready: its ``Ready`` condition's ``lastTransitionTime``
    (aware UTC) while that condition is not ``True``; :data:`NEVER_READY` when the node is gone
    (404) or has no such condition; None while it is Ready.

    None too when the operator may not read nodes (the chart's namespaced mode has no
    ClusterRole): then only the pod's own state can tell, and after the first 403 nodes are
    never asked for again. A Ready answer is reused for :data:`NODE_READY_MEMO_SECONDS`.

    Raises:
        ApiException: any other API error.
    """
    now = time.monotonic()
    with _node_memo_lock:
        if _nodes_forbidden:
            return None
        memo = _node_memo.get(name)
    if memo is not None and now - memo < NODE_READY_MEMO_SECONDS:
        return None
    allowed, node = _read_node(name)
    if not allowed:
        return None
    since: dt.datetime | None = NEVER_READY  # also a node that is gone
    ready = None if node is None else _ready_condition(node)
    if ready is not None:
        since = None if ready.status == "True" else ready.last_transition_time or NEVER_READY
    with _node_memo_lock:
        if since is None:
            _node_memo[name] = now
        else:
            _node_memo.pop(name, None)
        for stale in [node for node, at in _node_memo.items()
                      if now - at >= NODE_READY_MEMO_SECONDS]:
            del _node_memo[stale]
    return since


def node_readiness() -> dict[str, tuple[bool, dt.datetime | None]] | None:
    """Every node's readiness: by node name, whether its ``Ready`` condition is ``True`` and
    that condition's ``lastTransitionTime`` (aware UTC; None when not given). A node without a
    ``Ready`` condition is not Ready. One list request, whatever the number of nodes; nothing
    is memoized (a failed launcher's verdict asks, once per pass while it is pending).

    Returns None when the operator may not read nodes (the chart's namespaced mode); after the
    first 403 nodes are never asked for again.

    Raises:
        ApiException: any other API error.
    """
    with _node_memo_lock:
        if _nodes_forbidden:
            return None
    try:
        nodes = kubernetes.client.CoreV1Api(_client()).list_node()
    except ApiException as error:
        if error.status != 403:
            raise
        _forbid_nodes()
        return None
    readiness: dict[str, tuple[bool, dt.datetime | None]] = {}
    for node in nodes.items:
        ready = _ready_condition(node)
        readiness[node.metadata.name] = (
            (False, None) if ready is None
            else (ready.status == "True", ready.last_transition_time))
    return readiness


def node_cordoned(name: str) -> bool | None:
    """Whether node ``name`` is cordoned (``spec.unschedulable``: ``kubectl drain`` does it
    first), so that a pod evicted from it was drained; None when it cannot be told (the node
    is gone, or the operator may not read nodes: the chart's namespaced mode).

    Raises:
        ApiException: any error but 403 and 404.
    """
    _, node = _read_node(name)
    return None if node is None else bool(node.spec and node.spec.unschedulable)


def _read_node(name: str) -> tuple[bool, Any]:
    """``(allowed, V1Node or None)``: ``(False, None)`` when the operator may not read nodes
    (after the first 403 it never asks again), ``(True, None)`` when the node is gone.

    Raises:
        ApiException: any error but 403 and 404.
    """
    with _node_memo_lock:
        if _nodes_forbidden:
            return False, None
    try:
        return True, kubernetes.client.CoreV1Api(_client()).read_node(name)
    except ApiException as error:
        if error.status == 403:
            _forbid_nodes()
            return False, None
        if error.status != 404:
            raise
        return True, None


def _ready_condition(node: Any) -> Any:
    """The ``Ready`` condition of a ``V1Node`` as read, or None when it has none."""
    conditions = (node.status.conditions if node.status else None) or []
    return next((condition for condition in conditions if condition.type == "Ready"), None)


def _forbid_nodes() -> None:
    global _nodes_forbidden
    with _node_memo_lock:
        _nodes_forbidden = True


# Where each kubelet renews its node's Lease (the node heartbeat).
NODE_LEASE_NAMESPACE = "kube-node-lease"
_leases_forbidden = False  # a 403 once: this operator may not read node Leases


def node_heartbeats() -> dict[str, dt.datetime] | None:
    """When each node's kubelet last renewed its Lease in ``kube-node-lease`` (the node
    heartbeat: every ``nodeLeaseDurationSeconds`` / 4, 10 s by default; see
    https://kubernetes.io/docs/concepts/architecture/leases/#node-heartbeats), by node name,
    as aware UTC datetimes. One list request, whatever the number of nodes.

    Returns None when the operator may not read them (the chart's namespaced mode); after the
    first 403 they are never asked for again.

    Raises:
        ApiException: any other API error.
    """
    global _leases_forbidden
    with _node_memo_lock:
        if _leases_forbidden:
            return None
    try:
        leases = kubernetes.client.CoordinationV1Api(_client()).list_namespaced_lease(
            NODE_LEASE_NAMESPACE)
    except ApiException as error:
        if error.status != 403:
            raise
        with _node_memo_lock:
            _leases_forbidden = True
        return None
    return {lease.metadata.name: lease.spec.renew_time for lease in leases.items
            if lease.spec is not None and lease.spec.renew_time is not None}


def forget_nodes() -> None:
    """Drop what :func:`node_is_ready` and :func:`node_heartbeats` remember (for tests, and
    after credentials change)."""
    global _nodes_forbidden, _leases_forbidden
    with _node_memo_lock:
        _node_memo.clear()
        _nodes_forbidden = False
        _leases_forbidden = False


def pod_log_tail(namespace: str, pod: str, container: str, lines: int) -> str | None:
    """The last ``lines`` lines of a container's log (``kubectl logs --tail``), or None when the
    kubelet cannot serve it (no kubelet API, the pod gone); waits at most 5 s."""
    try:
        text = kubernetes.client.CoreV1Api(_client()).read_namespaced_pod_log(
            pod, namespace, container=container, tail_lines=lines, _request_timeout=5)
    except (ApiException, OSError, ValueError, urllib3.exceptions.HTTPError):
        return None
    return str(text)


def read_monarchjob(namespace: str, name: str) -> dict[str, Any] | None:
    """The MonarchJob as a dict, or ``None`` if it does not exist (the pass's view's copy
    when the pass is this job's, see :func:`reading_from`)."""
    view = _local.view
    if view is not None and view.key == (namespace, name):
        return view.job
    try:
        api = kubernetes.client.CustomObjectsApi(_client())
        job: dict[str, Any] = api.get_namespaced_custom_object(
            constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return job


def delete_monarchjob(namespace: str, name: str) -> bool:
    """Delete the MonarchJob (children follow by garbage collection); False if already gone."""
    try:
        kubernetes.client.CustomObjectsApi(_client()).delete_namespaced_custom_object(
            constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name,
            propagation_policy="Background")
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def list_events(namespace: str, kind: str, name: str, uid: str) -> list[dict[str, Any]]:
    """Events about one object (``involvedObject`` kind, name and uid: a deleted namesake's
    events are not its own). From the pass's view when it caches Events: the operator
    watches only the worker StatefulSets' ``FailedCreate`` Events, the only ones asked for."""
    view = _view("v1", "Event")
    if view is not None and view.key[0] == namespace:
        return [event for event in view.children[("v1", "Event")].values()
                if event.get("involvedObject", {}).get("kind") == kind
                and event["involvedObject"].get("name") == name
                and event["involvedObject"].get("uid") == uid]
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    events = kubernetes.client.CoreV1Api(_client()).list_namespaced_event(
        namespace, field_selector=selector)
    return [event for event in (_to_dict(item) for item in events.items)
            if (event.get("involvedObject") or {}).get("uid") == uid]


def api_error_message(error: ApiException) -> str:
    """The API server's ``Status.message`` when the body is one, else the raw body."""
    try:
        return str(json.loads(error.body or "{}").get("message") or error.body)
    except (ValueError, AttributeError):
        return str(error.body)


def patch_job_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    """Merge-patch the MonarchJob's status subresource with ``status``; returns the job as the
    API server stored it (and tells the pass's view, see :func:`reading_from`).

    Raises:
        JobGoneError: the job does not exist (404).
        kubernetes.client.rest.ApiException: any other API error.
    """
    try:
        job: dict[str, Any] = kubernetes.client.CustomObjectsApi(
            _client()).patch_namespaced_custom_object_status(
            constants.GROUP, constants.VERSION, namespace, constants.PLURAL, name,
            {"status": status})
    except ApiException as error:
        if error.status == 404:  # deleted during the pass; its DELETED event is on its way
            raise JobGoneError(f"MonarchJob {namespace}/{name} was deleted") from error
        raise
    view = _local.view
    if view is not None and view.key == (namespace, name):
        view.status_written(job)
    return job
