"""Audit log readings and percentiles used by bench/operator_scale.py."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import pytest

from monarch_operator.testing import apiaudit


def _event(stage: str, verb: str, resource: str = "pods", subresource: str | None = None,
           user: str = "monarch-operator", when: str = "2026-11-30T09:00:01.250000Z",
           **extra: Any) -> str:
    ref: dict[str, str] = {"resource": resource, "namespace": "bench", "name": "job-worker-0"}
    if subresource:
        ref["subresource"] = subresource
    event = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
             "auditID": "x", "stage": stage, "verb": verb, "requestURI": "/api/v1/...",
             "user": {"username": user, "groups": ["system:masters"]}, "objectRef": ref,
             "responseStatus": {"code": 200}, "requestReceivedTimestamp": when, **extra}
    return json.dumps(event)


def test_short_request_counts_once_when_complete() -> None:
    request = apiaudit.parse_line(_event("ResponseComplete", "patch", "pods", "status"))
    assert request is not None
    assert (request.verb, request.resource, request.user) == ("patch", "pods/status",
                                                              "monarch-operator")
    assert request.is_write
    assert request.time == dt.datetime(2026, 11, 30, 9, 0, 1, 250000, tzinfo=dt.UTC)


def test_watch_counts_when_it_opens_not_when_it_ends() -> None:
    assert apiaudit.parse_line(_event("ResponseStarted", "watch")) is not None
    assert apiaudit.parse_line(_event("ResponseComplete", "watch")) is None


def test_other_stages_and_blank_lines_do_not_count() -> None:
    assert apiaudit.parse_line(_event("Panic", "get")) is None
    assert apiaudit.parse_line("   ") is None
    assert apiaudit.parse_line(json.dumps({"kind": "Status"})) is None


def test_non_resource_url_is_named_by_its_path() -> None:
    line = json.dumps({"kind": "Event", "stage": "ResponseComplete", "verb": "get",
                       "requestURI": "/readyz?verbose", "user": {"username": "u"},
                       "requestReceivedTimestamp": "2026-11-30T09:00:00.000001Z"})
    request = apiaudit.parse_line(line)
    assert request is not None and request.resource == "/readyz" and request.code == 0


def test_read_log_leaves_a_partial_last_line_for_later(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    first, second = _event("ResponseComplete", "get"), _event("ResponseComplete", "create")
    log.write_text(first + "\n" + second[:20])
    requests, offset = apiaudit.read_log(log)
    assert [r.verb for r in requests] == ["get"]
    log.write_text(first + "\n" + second + "\n")
    requests, offset = apiaudit.read_log(log, offset)
    assert [r.verb for r in requests] == ["create"]
    assert apiaudit.read_log(log, offset) == ([], offset)
    log.write_text(first + "\n")  # rotated: a new, shorter file
    requests, _ = apiaudit.read_log(log, offset)
    assert [r.verb for r in requests] == ["get"]
    assert apiaudit.read_log(tmp_path / "missing.log") == ([], 0)


def test_count_by_user_and_window_then_split_writes() -> None:
    lines = [
        _event("ResponseComplete", "get", when="2026-11-30T09:00:00.000000Z"),
        _event("ResponseComplete", "patch", "monarchjobs", "status",
               when="2026-11-30T09:00:01.000000Z"),
        _event("ResponseComplete", "patch", "monarchjobs", "status",
               when="2026-11-30T09:00:02.000000Z"),
        _event("ResponseComplete", "create", "events", when="2026-11-30T09:00:03.000000Z"),
        _event("ResponseComplete", "get", user="system:kube-scheduler",
               when="2026-11-30T09:00:02.000000Z"),
        _event("ResponseComplete", "list", when="2026-11-30T09:00:04.000000Z"),  # at end: out
    ]
    requests = [r for line in lines if (r := apiaudit.parse_line(line)) is not None]
    counts = apiaudit.count_by_verb_resource(
        requests, "monarch-operator", apiaudit.parse_time("2026-11-30T09:00:00Z"),
        apiaudit.parse_time("2026-11-30T09:00:04Z"))
    assert counts == {("get", "pods"): 1, ("patch", "monarchjobs/status"): 2,
                      ("create", "events"): 1}
    assert apiaudit.split_writes(counts) == (3, 1)


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([3.0], 99, 3.0),
    ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0),
    ([5.0, 1.0, 4.0, 2.0, 3.0], 0, 1.0),
    ([1.0, 2.0, 3.0, 4.0, 5.0], 100, 5.0),
    ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
    ([0.0, 10.0], 95, 9.5),
])
def test_percentile_interpolates_between_ranks(values: list[float], q: float,
                                               expected: float) -> None:
    assert apiaudit.percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_nan_and_q_is_checked() -> None:
    assert math.isnan(apiaudit.percentile([], 50))
    with pytest.raises(ValueError, match="within 0-100"):
        apiaudit.percentile([1.0], 101)
