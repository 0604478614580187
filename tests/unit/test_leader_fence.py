"""The write fence's second check, on each try just before the write is sent
(controller/leader/fence.py): a leadership that ends after the write was asked for, while
the client connects or between its retries, stops the write before it reaches the API server
(short chaos soak, CI 2026-12-04: a replica resumed from SIGSTOP sent a write whose only check
had passed before the pause). The last check is on the wire, on each write of the request's bytes to the socket: aiohttp
sends the headers with the body from a task of its own, after its ``send`` returned (short
chaos soak, CI 2026-12-07: a ``create events`` of kopf's poster reached the API server 19 s
after its replica's SIGSTOP). A real HTTP server on the loopback counts what reaches it."""

from __future__ import annotations

import asyncio
import gc
import http.server
import logging
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import aiohttp
import kopf
import kubernetes
import pytest

from monarch_operator.controller.leader import fence


class Counting(http.server.BaseHTTPRequestHandler):
    """Answers every request (the first ``failures`` with 503) and records its method."""

    seen: list[str]
    failures: int

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(self.command)
        code = 503 if len(self.seen) <= self.failures else 200
        body = b'{"kind": "Status", "code": %d}' % code if code != 200 else b"{}"
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[str], type[Counting]]]:
    handler = type("Handler", (Counting,), {"seen": [], "failures": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen, handler
    server.shutdown()
    server.server_close()
    fence.uninstall()


def leader_for(checks: int) -> list[int]:
    """Install a fence that allows the first ``checks`` checks of a write, then refuses;
    returns the count of checks made so far (one element)."""
    made = [0]

    def may_write() -> bool:
        made[0] += 1
        return made[0] <= checks

    fence.install(may_write)
    return made


def test_a_write_allowed_when_asked_but_not_when_sent_never_reaches_the_server(api_server,
                                                                             caplog):
    url, seen, _ = api_server
    made = leader_for(1)  # the check when asked passes; leadership ends while it connects
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(
        kubernetes.client.Configuration(host=url)))
    with pytest.raises(fence.FencedError):
        api.create_namespaced_config_map("ns", {"metadata": {"name": "x"}}, _request_timeout=5)
    assert seen == [] and made[0] == 2
    assert "refused POST" in caplog.text and "before sending" in caplog.text
    # Reads are never checked; writes of a leader pass both checks.
    api.read_namespaced_config_map("x", "ns", _request_timeout=5)
    fence.install(lambda: True)
    api.create_namespaced_config_map("ns", {"metadata": {"name": "x"}}, _request_timeout=5)
    assert seen == ["GET", "POST"]


def kopf_patch(url: str) -> None:
    """kopf's own write path (its request with retries), with a plain aiohttp session."""
    from kopf._cogs.clients import api as kopf_api

    async def patch() -> None:
        async with aiohttp.ClientSession() as session:
            context = SimpleNamespace(session=session, server=url,
                                      add_response=lambda response: None)
            settings = kopf.OperatorSettings()
            settings.networking.error_backoffs = [0.01, 0.01]
            response = await kopf_api.request("patch", "/api/v1/namespaces/ns/pods/x",
                                              payload={}, settings=settings, context=context,
                                              logger=logging.getLogger("test"))
            response.close()  # kopf's own context closes the responses it tracks

    asyncio.run(patch())


def test_kopf_s_retry_of_a_write_is_checked_again_before_it_is_sent(api_server):
    url, seen, handler = api_server
    handler.failures = 1  # the first try gets a 503; kopf retries after its backoff
    leader_for(3)  # asked and first try (sent, on the wire): leader; the retry: not any more
    with pytest.raises(fence.FencedError):
        kopf_patch(url)
    gc.collect()  # a connection the refused try left open would warn here
    assert seen == ["PATCH"]
    fence.install(lambda: True)
    kopf_patch(url)  # the 503 again is no longer due: one more try, answered 200
    assert seen == ["PATCH", "PATCH"]
    gc.collect()  # a connection left open would warn here, in this test, not in a later one


def test_a_write_allowed_until_its_bytes_go_out_is_refused_on_the_wire(api_server, caplog):
    url, seen, _ = api_server
    made = leader_for(2)  # asked, and before sending: leader; its bytes: not any more
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(
        kubernetes.client.Configuration(host=url)))
    with pytest.raises(fence.FencedError):
        api.create_namespaced_config_map("ns", {"metadata": {"name": "x"}}, _request_timeout=5)
    assert seen == [] and made[0] == 3
    assert "refused POST" in caplog.text and "on the wire" in caplog.text


def test_kopf_s_write_sent_by_aiohttp_s_own_task_is_checked_on_the_wire(api_server, caplog):
    url, seen, _ = api_server
    made = leader_for(2)  # asked, and in aiohttp's send: leader; when its task writes: not
    with pytest.raises(fence.FencedError):
        kopf_patch(url)  # the refused bytes fail the try; kopf's retry is refused before sending
    gc.collect()
    assert seen == [] and made[0] >= 3
    assert "refused PATCH" in caplog.text and "on the wire" in caplog.text
    fence.install(lambda: True)
    kopf_patch(url)
    assert seen == ["PATCH"]
    gc.collect()


def test_the_elector_s_lease_writes_pass_the_wire_check(api_server, monkeypatch):
    from monarch_operator.controller.leader.lease import KubernetesLeaseApi

    url, seen, _ = api_server
    fence.install(lambda: False)
    monkeypatch.setattr(kubernetes.client.Configuration, "get_default_copy",
                        lambda: kubernetes.client.Configuration(host=url))
    lease_api = KubernetesLeaseApi("ns", "monarch-operator")
    try:
        lease_api.create("me", 15, timeout=5)
    except fence.FencedError:
        pytest.fail("the fence refused the elector's own Lease write")
    except Exception:  # noqa: BLE001 (the fake server's {} is no Lease: reached it)
        pass
    assert seen == ["POST"]
    lease_api.close()
