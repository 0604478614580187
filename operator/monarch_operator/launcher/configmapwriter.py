"""The launcher's writes of its program's progress to the job's ``<job>-progress`` ConfigMap
(:mod:`.progress` decides what and when), and what a refused write means: a launcher whose
job is being deleted ends at once (issue 32 item 6), one whose ServiceAccount may not write is
told what to check.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from monarch_operator import apirequest, constants
from monarch_operator.launcher import stopsignal


class ConfigMapWriter:
    """Writes a report to the job's progress ConfigMap with the launcher pod's own
    ServiceAccount token (in-cluster configuration of the Kubernetes client); a failure is
    said once per kind on stderr, never raised.

    A 403 or 404 after a write went through means the job is being deleted: its ConfigMap,
    Role and RoleBinding are the job's own and go with it (or, with ``cleanupPolicy:
    DeleteAll``, once it finished). Nothing the launcher still does can reach the job then,
    so ``on_job_gone(status)`` is called (once) instead of saying that the ServiceAccount may
    be wrong, which it is not.
    """

    def __init__(self, namespace: str, name: str,
                 on_job_gone: Callable[[int], None] | None = None) -> None:
        self._namespace, self._name = namespace, name
        self._on_job_gone = on_job_gone
        self._api: Any = None
        self._said: set[str] = set()
        self._written = False  # a write went through: its ConfigMap and RBAC existed

    def _client(self) -> Any:
        if self._api is None:
            self._api = _ConfigMaps()
        return self._api

    def __call__(self, text: str) -> None:
        self.write_key(constants.PROGRESS_REPORT_KEY, text)

    def write_key(self, key: str, text: str) -> None:
        """Set one key of the ConfigMap (the progress report, or the ranks' last stack dump,
        :data:`constants.STACKS_DUMP_KEY`); a failure is said once, never raised."""
        try:
            self._client().patch_namespaced_config_map(
                self._name, self._namespace, {"data": {key: text}}, _request_timeout=10)
            self._written = True
        except Exception as error:  # noqa: BLE001 - progress never fails the run
            status = getattr(error, "status", None)
            if self._gone(status):
                return
            why = (f"HTTP {status}: {getattr(error, 'reason', '')}" if status
                   else f"{type(error).__name__}: {error}")
            if status == 403:
                why += (" (the launcher's ServiceAccount may not write it: does "
                        "spec.launcher.template set serviceAccountName or "
                        "automountServiceAccountToken: false?)")
            if why not in self._said:
                self._said.add(why)
                print(f"monarch-launch: progress not written to ConfigMap {self._namespace}/"
                      f"{self._name}: {why}", file=sys.stderr, flush=True)


    def end_if_job_gone(self) -> None:
        """Call ``on_job_gone`` if the job is being deleted, as its ConfigMap tells: gone
        (404), or refused after a write went through (403); for a launcher stopped from
        outside, before it waits for its workers (:func:`.session.lifecycle.started_job`).
        Any other answer, or none, decides nothing."""
        try:
            self._client().read_namespaced_config_map(self._name, self._namespace,
                                                      _request_timeout=5)
        except Exception as error:  # noqa: BLE001 - never fails the launcher's end
            self._gone(getattr(error, "status", None), unwritten_404=True)

    def _gone(self, status: Any, unwritten_404: bool = False) -> bool:
        """Whether answer ``status`` says the job is being deleted; ``on_job_gone`` is called
        (once) then. A 404 before any write (``unwritten_404``: a read) counts too: the
        operator creates the ConfigMap before the launcher pod."""
        gone = status in (403, 404) and (self._written or (unwritten_404 and status == 404))
        if not gone or self._on_job_gone is None:
            return False
        end, self._on_job_gone = self._on_job_gone, None
        end(int(status))
        return True


class _ConfigMaps:
    """The two ConfigMap calls the launcher makes, as JSON requests through the Kubernetes
    client's ``ApiClient`` with the pod's in-cluster credentials; named as the typed
    ``CoreV1Api``'s methods, whose import (0.5-0.7 s of CPU, its hundreds of model classes) the
    launcher does not need on its way to the first step."""

    def __init__(self) -> None:
        import kubernetes  # the launcher image has it (monarch-operator[launcher])

        kubernetes.config.load_incluster_config()
        self._client = kubernetes.client.ApiClient()

    def _send(self, method: str, name: str, namespace: str, body: Any,
              timeout: float) -> bytes:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        return apirequest.send(self._client, method,
                               f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                               headers=headers, body=body, timeout=timeout)

    def patch_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any],
                                    _request_timeout: float) -> None:
        """Merge-patch ConfigMap ``namespace/name`` with ``body``.

        Raises:
            kubernetes.client.rest.ApiException: the answer was not a success (``status``).
        """
        self._send("PATCH", name, namespace, body, _request_timeout)

    def read_namespaced_config_map(self, name: str, namespace: str,
                                   _request_timeout: float) -> bytes:
        """ConfigMap ``namespace/name`` as the API's JSON bytes.

        Raises:
            kubernetes.client.rest.ApiException: the answer was not a success (``status``).
        """
        return self._send("GET", name, namespace, None, _request_timeout)


def end_with_job(namespace: str, name: str,
                 exit_now: Callable[[int], None] = os._exit) -> Callable[[int], None]:
    """What the launcher does once its job is being deleted (:class:`ConfigMapWriter`): say
    so in one line and end at once, as a stop would (``128 + SIGTERM``), without a teardown:
    the job's workers are being deleted with it, so stopping the ranks one by one would only
    wait for hosts that are going (the pod's grace period, then SIGKILL), and nothing is left
    to report to. The ssh sessions end with the launcher (their parent-death signal) and the
    workers' guards stop what the ranks left."""
    def gone(status: int) -> None:
        print(f"monarch-launch: the MonarchJob is being deleted (its progress ConfigMap "
              f"{namespace}/{name} answers HTTP {status}); ending now", file=sys.stderr,
              flush=True)
        exit_now(stopsignal.SIGNAL_BASE + signal.SIGTERM)
    return gone
