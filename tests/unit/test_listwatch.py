"""The node agent's list-then-watch cache (``localcluster.listwatch``) against a scripted API:
one LIST, watch events applied in order, a LIST again on 410 Gone and after a broken watch, and
the change event set for every change but a bookmark."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from monarch_operator.localcluster import listwatch


def pod(uid: str, version: str, phase: str = "Pending") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": f"pod-{uid}", "resourceVersion": version},
            "status": {"phase": phase}}


class Response:
    """What ``_preload_content=False`` gives: ``.data`` for a LIST, ``.stream()`` for a watch."""

    def __init__(self, document: dict[str, Any] | None = None,
                 lines: list[dict[str, Any] | str] | None = None) -> None:
        self.data = json.dumps(document or {}).encode()
        self._lines = lines or []
        self.released = False

    def stream(self, amt: Any = None, decode_content: Any = None) -> Any:
        for line in self._lines:
            # Split across chunks, as a network read may.
            text = line if isinstance(line, str) else json.dumps(line)
            half = len(text) // 2
            yield (text[:half]).encode()
            yield (text[half:] + "\n").encode()

    def release_conn(self) -> None:
        self.released = True


class ScriptedApi:
    """A lister that answers LISTs with ``lists`` and watches with ``watches``, in order; once
    the script is done, a watch blocks until the test ends."""

    def __init__(self, lists: list[dict[str, Any]],
                 watches: list[list[dict[str, Any] | str] | Exception]) -> None:
        self.lists, self.watches = list(lists), list(watches)
        self.calls: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.gate = threading.Event()  # watches answer once it is set
        self.gate.set()

    def __call__(self, **kwargs: Any) -> Response:
        self.calls.append(kwargs)
        assert kwargs["_preload_content"] is False
        if not kwargs.get("watch"):
            return Response(document=self.lists.pop(0))
        self.gate.wait(10)
        if not self.watches:
            self.done.wait(10)
            return Response(lines=[])
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        return Response(lines=script)


def listing(version: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": version}, "items": list(items)}


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listwatch, "RETRY_S", 0.01)


def test_events_after_the_list_are_applied_in_order() -> None:
    api = ScriptedApi(
        lists=[listing("10", pod("a", "9"), pod("b", "10"))],
        watches=[[{"type": "MODIFIED", "object": pod("a", "11", "Running")},
                  {"type": "ADDED", "object": pod("c", "12")},
                  "",
                  {"type": "DELETED", "object": pod("b", "13")},
                  {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "14"}}}]])
    api.gate.clear()
    changed = threading.Event()
    cache = listwatch.ListWatch(api, changed, "pods")
    try:
        cache.start()
        assert changed.is_set()
        assert {p["metadata"]["uid"] for p in cache.objects()} == {"a", "b"}, "listed at start"
        api.gate.set()
        wait_for(lambda: len(api.calls) >= 3, "the watch after the first ended")

        objects = {p["metadata"]["uid"]: p for p in cache.objects()}
        assert sorted(objects) == ["a", "c"]
        assert objects["a"]["status"]["phase"] == "Running"
        first_watch, second_watch = api.calls[1], api.calls[2]
        assert first_watch["watch"] is True and first_watch["resource_version"] == "10"
        assert first_watch["allow_watch_bookmarks"] is True
        assert second_watch["resource_version"] == "14", "the next watch starts at the bookmark"
    finally:
        cache.stop()
        api.done.set()


def test_a_410_gone_lists_again_and_the_list_replaces_the_objects() -> None:
    api = ScriptedApi(
        lists=[listing("10", pod("a", "9")), listing("30", pod("z", "29"))],
        watches=[[{"type": "ERROR", "object": {"code": 410, "message": "too old"}},
                  {"type": "ADDED", "object": pod("never", "31")}]])
    cache = listwatch.ListWatch(api, threading.Event(), "pods")
    try:
        cache.start()
        wait_for(lambda: len(api.calls) >= 4, "a LIST and a new watch after the 410")

        assert [p["metadata"]["uid"] for p in cache.objects()] == ["z"]
        assert [bool(call.get("watch")) for call in api.calls[:4]] == [False, True, False, True]
        assert api.calls[3]["resource_version"] == "30"
    finally:
        cache.stop()
        api.done.set()


def test_a_broken_watch_lists_again_and_watches_on() -> None:
    api = ScriptedApi(
        lists=[listing("10", pod("a", "9")), listing("20", pod("a", "9"), pod("b", "19"))],
        watches=[ConnectionResetError("the API server restarted"),
                 [{"type": "ADDED", "object": pod("c", "21")}]])
    cache = listwatch.ListWatch(api, threading.Event(), "pods")
    try:
        cache.start()
        wait_for(lambda: len({p["metadata"]["uid"] for p in cache.objects()}) == 3,
                 "the LIST after the failure, then the next watch's event")

        assert api.calls[3]["resource_version"] == "20"
    finally:
        cache.stop()
        api.done.set()


def test_a_failing_first_list_raises_from_start() -> None:
    def refuse(**_: Any) -> Response:
        raise ConnectionRefusedError("no API server")

    with pytest.raises(ConnectionRefusedError):
        listwatch.ListWatch(refuse, threading.Event(), "nodes").start()


def test_only_a_bookmark_leaves_the_change_event_alone() -> None:
    changed = threading.Event()
    cache = listwatch.ListWatch(ScriptedApi([], []), changed, "pods")

    assert cache._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "5"}}}) \
        is False
    assert not changed.is_set()
    cache._apply({"type": "MODIFIED", "object": pod("a", "6")})
    assert changed.is_set()


def test_start_again_after_a_failed_first_list_and_after_success() -> None:
    api = ScriptedApi(lists=[listing("5", pod("a", "4"))], watches=[])
    answers: list[Any] = [ConnectionRefusedError("not yet"), None]

    def lister(**kwargs: Any) -> Response:
        if not kwargs.get("watch") and answers and answers[0] is not None:
            raise answers.pop(0)
        return api(**kwargs)

    cache = listwatch.ListWatch(lister, threading.Event(), "pods")
    try:
        with pytest.raises(ConnectionRefusedError):
            cache.start()
        cache.start()
        cache.start()  # started: no second LIST, no second thread

        assert [p["metadata"]["uid"] for p in cache.objects()] == ["a"]
        assert sum(1 for call in api.calls if not call.get("watch")) == 1
    finally:
        cache.stop()
        api.done.set()
