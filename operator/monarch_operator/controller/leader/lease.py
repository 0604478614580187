"""The Lease record and the three calls the elector makes on it (``coordination.k8s.io/v1``
Leases: read, create, replace), each bounded by a timeout, through an API client of its own.

The elector's client is kept apart from the operator's: the write fence
(:mod:`.fence`) refuses the operator's writes once leadership is in doubt, but never the
elector's own renewals and release. Bodies are plain JSON so that ``renewTime`` is written as
the API server's MicroTime wants it (RFC 3339 with exactly six fractional digits).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass
from typing import Any, Protocol

GROUP_VERSION = "coordination.k8s.io/v1"


class LeaseConflict(Exception):
    """The Lease changed since it was read (409), or was created meanwhile: someone else wrote
    it first."""


@dataclass(frozen=True)
class LeaseRecord:
    """What the elector reads from a Lease: ``holder`` ``None`` or ``""`` means released;
    ``duration`` in seconds; ``resource_version`` makes a replace conditional."""

    holder: str | None
    duration: float
    transitions: int
    resource_version: str
    acquire_time: str | None = None
    renew_time: str | None = None


class LeaseApi(Protocol):
    """The Lease calls (a fake in the unit tests). ``timeout`` bounds each call (seconds).

    ``read`` returns ``None`` when there is no Lease; ``create`` and ``replace`` return the
    record written (with its new resourceVersion) and raise :class:`LeaseConflict` when
    someone else wrote first; any other failure raises (a timeout, a refused connection, 5xx).
    """

    def read(self, timeout: float) -> LeaseRecord | None: ...

    def create(self, holder: str, duration: float, timeout: float) -> LeaseRecord: ...

    def replace(self, previous: LeaseRecord, holder: str | None, duration: float,
                transitions: int, acquired: bool, timeout: float) -> LeaseRecord: ...


class WatchingLeaseApi(LeaseApi, Protocol):
    """A :class:`LeaseApi` that can also wait for the Lease's next change: a standby then sees
    each renewal when it happens, not at its next read (:meth:`.Elector.acquire`)."""

    def watch_change(self, resource_version: str, timeout: float) -> LeaseRecord | None: ...


def micro_time(moment: dt.datetime | None = None) -> str:
    """``2026-12-04T17:55:00.000000Z``: a MicroTime as the API server parses it (UTC)."""
    moment = moment or dt.datetime.now(dt.UTC)
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_of(lease: dict[str, Any]) -> LeaseRecord:
    """A Lease object (JSON) -> its :class:`LeaseRecord`."""
    spec = lease.get("spec") or {}
    return LeaseRecord(holder=spec.get("holderIdentity") or None,
                       duration=float(spec.get("leaseDurationSeconds") or 0),
                       transitions=int(spec.get("leaseTransitions") or 0),
                       resource_version=str(lease["metadata"].get("resourceVersion", "")),
                       acquire_time=spec.get("acquireTime"), renew_time=spec.get("renewTime"))


def lease_body(namespace: str, name: str, holder: str | None, duration: float,
               transitions: int, acquire_time: str | None, resource_version: str | None,
               now: str | None = None) -> dict[str, Any]:
    """The Lease object to create or replace (``resource_version`` makes a replace
    conditional: the API server answers 409 when the Lease changed since)."""
    now = now or micro_time()
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": GROUP_VERSION, "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": holder or "",
                     "leaseDurationSeconds": max(1, round(duration)),
                     "acquireTime": acquire_time or now, "renewTime": now,
                     "leaseTransitions": transitions}}


class KubernetesLeaseApi:
    """:class:`LeaseApi` on the API server, through the Kubernetes client's
    ``CoordinationV1Api`` with an API client of its own (loaded from the same credentials as the
    operator's: in-cluster, else ``$KUBECONFIG``).

    Each request carries a total timeout (``_request_timeout``) and is never retried by urllib3:
    the elector decides what to do next, against its own deadline.
    """

    def __init__(self, namespace: str, name: str) -> None:
        import kubernetes

        from monarch_operator.controller.leader import fence

        self.namespace, self.name = namespace, name
        configuration = kubernetes.client.Configuration.get_default_copy()
        configuration.retries = 0  # one try per call: a retry would outlast the deadline
        client = kubernetes.client.ApiClient(configuration)
        client.user_agent = "monarch-operator-leader-election"
        # The fence never refuses the elector's own requests.
        client.rest_client.request = functools.partial(fence.UNFENCED_REQUEST, client.rest_client)
        self._api = kubernetes.client.CoordinationV1Api(client)
        self._client = client

    def _reply(self, response: Any) -> LeaseRecord:
        return record_of(json.loads(response.data))

    def read(self, timeout: float) -> LeaseRecord | None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=timeout)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return self._reply(response)

    def create(self, holder: str, duration: float, timeout: float) -> LeaseRecord:
        from kubernetes.client.exceptions import ApiException

        body = lease_body(self.namespace, self.name, holder, duration, 0, None, None)
        try:
            response = self._api.create_namespaced_lease(
                self.namespace, body, _preload_content=False, _request_timeout=timeout)
        except ApiException as error:
            if error.status == 409:
                raise LeaseConflict(f"Lease {self.namespace}/{self.name} created meanwhile") \
                    from error
            raise
        return self._reply(response)

    def replace(self, previous: LeaseRecord, holder: str | None, duration: float,
                transitions: int, acquired: bool, timeout: float) -> LeaseRecord:
        from kubernetes.client.exceptions import ApiException

        body = lease_body(self.namespace, self.name, holder, duration, transitions,
                          None if acquired else previous.acquire_time, previous.resource_version)
        try:
            response = self._api.replace_namespaced_lease(
                self.name, self.namespace, body, _preload_content=False,
                _request_timeout=timeout)
        except ApiException as error:
            if error.status == 409:
                raise LeaseConflict(f"Lease {self.namespace}/{self.name} changed since "
                                    f"resourceVersion {previous.resource_version}") from error
            raise
        return self._reply(response)

    def watch_change(self, resource_version: str, timeout: float) -> LeaseRecord | None:
        """Wait up to ``timeout`` seconds for the Lease to change after ``resource_version``
        (one watch request, ended by the API server after the whole seconds of ``timeout``,
        bounded by the client a second later).

        Returns:
            The Lease as the first change left it, or ``None``: no change in time, the Lease
            deleted, or the watch could not start from that version (410: read it anew).

        Raises:
            The API client's errors (a timeout, a refused connection).
        """
        from kubernetes import watch

        stream = watch.Watch()
        try:
            for event in stream.stream(
                    self._api.list_namespaced_lease, self.namespace,
                    field_selector=f"metadata.name={self.name}",
                    resource_version=resource_version, timeout_seconds=max(1, int(timeout)),
                    _request_timeout=timeout + 1):
                if event["type"] in ("ADDED", "MODIFIED"):
                    return record_of(event["raw_object"])
                return None  # DELETED, or an ERROR (410 Gone)
        finally:
            stream.stop()
        return None

    def close(self) -> None:
        """Close the client's connection pool."""
        self._client.close()
