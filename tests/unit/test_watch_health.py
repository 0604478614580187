"""Watch streams that die or go silent are noticed (field case C18), without a cluster: the
health of each stream from what its requests do, the log naming what broke and what came
back, ``/healthz``'s probe, and the kopf functions the operator wraps."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import api, watching
from kopf._cogs.structs import references

from monarch_operator.controller.engine import watchhealth
from monarch_operator.controller.spec.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


PODS = references.Resource(group="", version="v1", plural="pods", namespaced=True)
JOBS = references.Resource(group="monarch-operator.dev", version="v1alpha1",
                           plural="monarchjobs", namespaced=True)


def test_stream_names_say_the_kind_and_where():
    assert watchhealth.stream_name(PODS, "team-a") == "pods in 'team-a'"
    assert watchhealth.stream_name(JOBS, None) == "monarchjobs.monarch-operator.dev cluster-wide"


def test_a_stream_renewed_by_the_server_stays_healthy_a_silent_one_does_not(caplog):
    clock = Clock()
    health = watchhealth.StreamHealth(clock)
    health.started("pods in 'a'")
    health.started("secrets in 'a'")
    for _ in range(5):  # the API server ends each request after RENEW_SECONDS
        clock.now += watchhealth.RENEW_SECONDS
        health.alive("pods in 'a'")
    assert health.not_working() == {
        "secrets in 'a'": f"no event, bookmark or end of request for "
                          f"{5 * watchhealth.RENEW_SECONDS:.0f}s"}
    assert health.seconds_since_working() == {"pods in 'a'": 0.0, "secrets in 'a'": 150.0}


def test_the_log_names_what_broke_and_when_it_came_back(caplog):
    clock = Clock()
    health = watchhealth.StreamHealth(clock)
    health.started("pods in 'a'")
    with caplog.at_level(logging.INFO, logger="monarch_operator"):
        health.broke("pods in 'a'", ConnectionResetError("reset by peer"))
        clock.now += 5
        health.broke("pods in 'a'", TimeoutError())  # retried: said once
        clock.now += 20
        assert "pods in 'a'" in health.not_working(limit=20)
        health.alive("pods in 'a'")
    assert [record.getMessage() for record in caplog.records] == [
        "watch stream pods in 'a' broke (ConnectionResetError('reset by peer')); "
        "re-establishing it",
        "watch stream pods in 'a' re-established, 25s after it last worked"]
    assert health.not_working(limit=20) == {}


def test_a_watcher_that_died_is_unhealthy_at_once_one_stopped_is_forgotten():
    clock = Clock()
    health = watchhealth.StreamHealth(clock)
    health.started("pods in 'a'")
    health.started("pods in 'gone'")
    health.stopped("pods in 'gone'")  # its namespace was deleted
    health.died("pods in 'a'", RuntimeError("Error in the watch-stream: 500"))
    assert health.not_working() == {
        "pods in 'a'": "ended for good: RuntimeError('Error in the watch-stream: 500')"}


def test_probe_fails_naming_the_streams(monkeypatch):
    clock = Clock()
    health = watchhealth.StreamHealth(clock)
    monkeypatch.setattr(watchhealth, "HEALTH", health)
    health.started("pods in 'a'")
    assert watchhealth.watch_streams() == {"pods in 'a'": 0.0}
    clock.now += watchhealth.UNHEALTHY_AFTER_SECONDS
    with pytest.raises(kopf.PermanentError, match="watch streams not working: pods in 'a': "
                                                  "no event, bookmark or end of request for 70s"):
        watchhealth.watch_streams()


def test_the_wrapped_kopf_functions_still_exist_as_used():
    """kopf is pinned; the wrappers depend on these names and keyword arguments."""
    assert {"resource", "namespace", "settings"} <= set(
        inspect.signature(watching.infinite_watch).parameters)
    assert list(inspect.signature(api.stream).parameters)[0] == "url"
    assert "api.stream(" in inspect.getsource(watching.watch_objs)
    assert "watching.infinite_watch(" in inspect.getsource(
        __import__("kopf._core.reactor.queueing", fromlist=["watcher"]).watcher)


def test_configure_bounds_every_request():
    settings = kopf.OperatorSettings()
    watchhealth.configure(settings)
    assert settings.watching.server_timeout == watchhealth.RENEW_SECONDS
    assert str(settings.watching.server_timeout).isdigit(), "timeoutSeconds is an integer"
    assert settings.watching.client_timeout == watchhealth.STALL_SECONDS
    assert settings.watching.server_timeout < settings.watching.client_timeout
    assert settings.networking.request_timeout == watchhealth.REQUEST_SECONDS
    # Two renewals of a working stream fit well within the unhealthy limit.
    assert 2 * watchhealth.RENEW_SECONDS < watchhealth.UNHEALTHY_AFTER_SECONDS <= 120 - 10


def test_install_follows_each_request_of_each_stream(monkeypatch):
    """Requests of a stream that end normally (the server's timeout) or deliver keep it
    working; a reset request breaks it; a non-watch request is left alone."""
    clock = Clock()
    health = watchhealth.StreamHealth(clock)
    outcomes: list[Any] = [["e1", "e2"], [], ConnectionResetError("reset"), ["e3"]]
    seen: list[str] = []

    async def fake_stream(url: str, **_: Any):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        for item in outcome:
            clock.now += 1
            yield item

    async def fake_infinite_watch(*, settings: Any, resource: Any, namespace: Any,
                                  **_: Any):
        url = resource.get_url(namespace=namespace, params={"watch": "true"})
        while outcomes:
            try:
                async for item in api.stream(url=url, settings=settings):
                    yield item
            except ConnectionResetError:
                assert "pods in 'a'" in health.not_working(limit=0)
                seen.append("reset")

    monkeypatch.setattr(api, "stream", fake_stream)
    monkeypatch.setattr(watching, "infinite_watch", fake_infinite_watch)
    watchhealth.install(health)

    async def consume() -> list[str]:
        async for item in watching.infinite_watch(settings=None, resource=PODS,
                                                  namespace="a"):
            seen.append(item)
        return seen

    assert asyncio.run(consume()) == ["e1", "e2", "reset", "e3"]
    assert health.seconds_since_working() == {}  # the stream ended: forgotten


def test_every_request_of_a_pass_is_bounded():
    """A pooled connection that stopped answering must not hold a pass for ever (C18)."""
    from types import SimpleNamespace

    import urllib3

    from monarch_operator.controller.k8s import client as k8s_client

    sent: list[Any] = []
    cleared: list[bool] = []

    def request(*args: Any, **kwargs: Any) -> None:
        sent.append(kwargs["_request_timeout"])
        if args[1] == "/dead":
            raise urllib3.exceptions.ReadTimeoutError(None, "/dead", "Read timed out.")

    client = SimpleNamespace(rest_client=SimpleNamespace(
        request=request, pool_manager=SimpleNamespace(clear=lambda: cleared.append(True))))
    k8s_client._bound_requests(client)  # type: ignore[arg-type]
    client.rest_client.request("GET", "/api/v1/nodes/n")
    client.rest_client.request("GET", "/api/v1/pods/log", _request_timeout=5)
    assert sent == [k8s_client.REQUEST_TIMEOUT, 5] and not cleared
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        client.rest_client.request("GET", "/dead")
    assert cleared == [True], "a timeout drops the pooled connections"


def test_a_lowered_renewal_shortens_every_time_that_follows_from_it():
    """MONARCH_OPERATOR_WATCH_RENEW_SECONDS (the tests' clusters use 10): the stall cut, the
    backstop and /healthz's limit move with the renewal; 30 gives the documented 40/50/70."""
    assert (watchhealth.DEFAULT_TIMES.stall, watchhealth.DEFAULT_TIMES.inactivity,
            watchhealth.DEFAULT_TIMES.unhealthy_after) == (40.0, 50.0, 70.0)
    settings = kopf.OperatorSettings()
    clock = Clock()
    health = watchhealth.StreamHealth(clock)
    watchhealth.configure(settings, watchhealth.WatchTimes(10), health)
    assert (settings.watching.server_timeout, settings.watching.client_timeout,
            settings.watching.inactivity_timeout) == (10, 20.0, 30.0)
    health.started("pods in 'a'")
    clock.now += 29
    assert health.not_working() == {}
    clock.now += 1
    assert list(health.not_working()) == ["pods in 'a'"], "30 s = two renewals and the margin"


@pytest.mark.parametrize("value", ["4", "301", "10.5", "ten", ""])
def test_a_watch_renewal_out_of_range_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("MONARCH_OPERATOR_WATCH_RENEW_SECONDS", value)
    with pytest.raises(ValueError, match=r"MONARCH_OPERATOR_WATCH_RENEW_SECONDS=.*whole "
                                         r"seconds, 5-300"):
        Settings.from_env()


def test_a_watch_renewal_in_range_is_read(monkeypatch):
    monkeypatch.delenv("MONARCH_OPERATOR_WATCH_RENEW_SECONDS", raising=False)
    assert Settings.from_env().watch_renew_seconds == watchhealth.RENEW_SECONDS
    monkeypatch.setenv("MONARCH_OPERATOR_WATCH_RENEW_SECONDS", "10")
    assert Settings.from_env().watch_renew_seconds == 10
