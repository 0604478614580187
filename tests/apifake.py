"""The API server as the operator's one API client sees it, for unit tests of the k8s layer
(``controller/k8s/client.call``): every request it sends is recorded (method, path, query,
body) and answered by the test's function, through the real ``kubernetes.client.ApiClient``
(its path and query building and its errors), only its HTTP send replaced.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes

HOST = "https://api.test"


@dataclass(frozen=True)
class Request:
    """One request as sent: ``GET``, ``/api/v1/nodes/n1``, the query, the JSON body."""

    method: str
    path: str
    query: dict[str, str]
    body: Any


class _Response:
    """What urllib3's response offers the client: status, reason, data, headers."""

    def __init__(self, status: int, payload: Any) -> None:
        self.status = status
        self.reason = "OK" if status < 300 else "Error"
        self.data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.headers = {"Content-Type": "application/json"}

    def read(self) -> bytes:
        return self.data

    def getheaders(self) -> dict[str, str]:
        return self.headers

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.getheaders().get(name, default)


# answer(request) -> (HTTP status, the reply: a JSON-able value, or bytes as they are)
Answer = Callable[[Request], tuple[int, Any]]


class FakeApi:
    """Records each request in :attr:`requests` and answers it with ``answer``; use
    :attr:`client` as the k8s layer's client (``monkeypatch.setattr(client, "_client",
    lambda: fake.client)``)."""

    def __init__(self, answer: Answer) -> None:
        self.requests: list[Request] = []
        self.answer = answer
        self.client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=HOST))
        self.client.rest_client.request = self._send

    def _send(self, method: str, url: str, headers: Any = None, body: Any = None,
              post_params: Any = None, _request_timeout: Any = None) -> _Response:
        parts = urllib.parse.urlsplit(url)
        request = Request(method, parts.path, dict(urllib.parse.parse_qsl(parts.query)), body)
        self.requests.append(request)
        return _Response(*self.answer(request))
