"""One request to the Kubernetes API as JSON, through the Kubernetes client's ``ApiClient``
(its credentials, connection pool and errors) without its typed API classes, whose import
costs about 1 s of CPU and 30 MiB. Shared by the operator's API layer
(``controller/k8s/client.call``) and the launcher's progress writes
(``launcher/configmapwriter``). Imports nothing of ``kubernetes`` until a request is sent.
"""

from __future__ import annotations

from typing import Any


def send(api_client: Any, method: str, path: str, *, query: tuple[tuple[str, Any], ...] = (),
         headers: dict[str, str] | None = None, body: Any = None,
         timeout: float | None = None) -> bytes:
    """Send ``method`` ``path`` (``/api/v1/...``, the query apart) with ``body`` as JSON
    through ``api_client`` (a ``kubernetes.client.ApiClient``); ``timeout`` in seconds (None:
    the client's own).

    Returns:
        The reply's bytes.

    Raises:
        kubernetes.client.rest.ApiException: the answer was not a success (its ``status`` the
            HTTP status).
        urllib3.exceptions.HTTPError: the request could not be sent or timed out.
    """
    from kubernetes.client.rest import ApiException

    request = api_client.param_serialize(
        method=method, resource_path=path, query_params=list(query),
        header_params=headers or {}, body=body, auth_settings=["BearerToken"])
    response = api_client.call_api(*request, _request_timeout=timeout)
    response.read()
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    data: bytes = response.data
    return data
