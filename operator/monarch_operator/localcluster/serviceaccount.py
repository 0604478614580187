"""A pod's way to the API server, as the kubelet gives it: the ``KUBERNETES_SERVICE_*``
variables and projected service-account tokens, requested and refreshed.

The API server's ServiceAccount admission adds the ``kube-api-access-<suffix>`` projected
volume (a ``serviceAccountToken``, the ``kube-root-ca.crt`` ConfigMap's ``ca.crt``, the
namespace) at ``/var/run/secrets/kubernetes.io/serviceaccount`` to every container unless
``automountServiceAccountToken: false``; KCM publishes ``kube-root-ca.crt`` in every namespace
from its ``--root-ca-file``. ``volumes.py`` writes that volume; the token comes from here.

Tokens come from the TokenRequest API (``serviceaccounts/<name>/token``), bound to the pod (a
token stops working once its pod is gone), with the source's ``audience`` and
``expirationSeconds`` (default 3600). Like the kubelet's token manager
(pkg/kubelet/token/token_manager.go) the agent requests a new token once 80% of its lifetime
has passed or it is 24 hours old, and replaces the file atomically.

Without cluster DNS or kube-proxy the ``kubernetes`` Service's ClusterIP leads nowhere, so the
variables name the API server's real loopback address: ``KUBERNETES_SERVICE_HOST=127.0.0.1``
and its port (the serving certificate is valid for 127.0.0.1, signed by the CA in ``ca.crt``).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Where ServiceAccount admission mounts the kube-api-access volume in every container.
MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_EXPIRATION_SECONDS = 3600  # serviceAccountToken.expirationSeconds default
MAX_TOKEN_AGE_SECONDS = 24 * 3600  # token_manager.go maxTTL
REFRESH_FRACTION = 0.8  # refresh once 80% of the TTL has passed (token_manager.go)
RETRY_SECONDS = 10.0  # after a failed renewal

log = logging.getLogger("localcluster.serviceaccount")


def api_server_env(server_url: str) -> dict[str, str]:
    """The kubelet's API server variables for ``server_url`` (``https://127.0.0.1:PORT``):
    ``KUBERNETES_SERVICE_HOST``, ``KUBERNETES_SERVICE_PORT``, ``KUBERNETES_SERVICE_PORT_HTTPS``.

    Raises:
        ValueError: the URL has no host or port.
    """
    parsed = urllib.parse.urlsplit(server_url)
    if not parsed.hostname or not parsed.port:
        raise ValueError(f"API server URL {server_url!r} has no host and port")
    port = str(parsed.port)
    return {"KUBERNETES_SERVICE_HOST": parsed.hostname, "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port}


def token_request(pod: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """The TokenRequest body for a projected ``serviceAccountToken`` source of ``pod``: its
    audience (the API server's own when unset), lifetime, bound to the pod."""
    spec: dict[str, Any] = {
        "expirationSeconds": int(source.get("expirationSeconds") or DEFAULT_EXPIRATION_SECONDS),
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                           "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
    }
    if source.get("audience"):
        spec["audiences"] = [source["audience"]]
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def refresh_at(expires_at: float, expiration_seconds: int) -> float:
    """When the kubelet renews a token expiring at ``expires_at`` (seconds since the epoch):
    after 80% of its lifetime, or when it is 24 hours old, whichever is first."""
    issued_at = expires_at - expiration_seconds
    return min(expires_at - expiration_seconds * (1 - REFRESH_FRACTION),
               issued_at + MAX_TOKEN_AGE_SECONDS)


@dataclass
class _Token:
    source: dict[str, Any]
    path: Path
    due: float  # when to refresh (seconds since the epoch)


@dataclass
class PodTokens:
    """The projected service-account tokens of one pod: writes them and renews them.

    Args:
        core: a ``kubernetes.client.CoreV1Api`` allowed to create ``serviceaccounts/token``.
        pod: the pod (name, namespace, uid, ``serviceAccountName``).
    """

    core: Any
    pod: dict[str, Any]
    tokens: list[_Token] = field(default_factory=list)

    def write(self, source: dict[str, Any], path: Path, mode: int, owner: int | None) -> None:
        """Request a token for ``source`` and write it to ``path`` with ``mode``, owned by
        ``owner`` (uid; ``None``: root); remember it for ``refresh``.

        Raises:
            kubernetes.client.rest.ApiException: the TokenRequest failed (e.g. 404 for a
                missing ServiceAccount).
        """
        token, due = self._request(source)
        _replace(path, token, mode, owner, None)
        self.tokens.append(_Token(source=source, path=path, due=due))

    def refresh(self, now: float) -> int:
        """Renew every token whose refresh time has come; returns how many were renewed.
        Each file keeps its owner, group and mode (what the fsGroup pass gave it). A failed
        request is logged and tried again ``RETRY_SECONDS`` later (the old token still works
        until it expires)."""
        renewed = 0
        for entry in self.tokens:
            if now < entry.due:
                continue
            try:
                token, entry.due = self._request(entry.source)
            except Exception as error:  # the API may be briefly away; the pod keeps running
                log.warning("%s/%s: renewing the token at %s failed: %s",
                            self.pod["metadata"]["namespace"], self.pod["metadata"]["name"],
                            entry.path, error)
                entry.due = now + RETRY_SECONDS
                continue
            stat = entry.path.stat()
            _replace(entry.path, token, stat.st_mode & 0o7777, stat.st_uid, stat.st_gid)
            renewed += 1
        return renewed

    def _request(self, source: dict[str, Any]) -> tuple[bytes, float]:
        meta = self.pod["metadata"]
        account = self.pod["spec"].get("serviceAccountName") or "default"
        response = self.core.create_namespaced_service_account_token(
            account, meta["namespace"], token_request(self.pod, source))
        expires = response.status.expiration_timestamp
        if isinstance(expires, str):
            expires = dt.datetime.fromisoformat(expires.replace("Z", "+00:00"))
        lifetime = int(source.get("expirationSeconds") or DEFAULT_EXPIRATION_SECONDS)
        return response.status.token.encode(), refresh_at(expires.timestamp(), lifetime)


def _replace(path: Path, content: bytes, mode: int, owner: int | None, group: int | None) -> None:
    """Write ``content`` to ``path`` atomically (a reader sees the old or the new token)."""
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.write(fd, content)
        os.fchmod(fd, mode)
        if owner is not None or group is not None:
            os.fchown(fd, -1 if owner is None else owner, -1 if group is None else group)
    finally:
        os.close(fd)
    os.replace(partial, path)
