"""bench/worker_timeline.py: "submit -> workers Ready" split per step from an audit log, the
jobs told apart by namespace (both operators' jobs share a cluster and their names)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import worker_timeline  # noqa: E402  (bench/ is not a package)


def event(at: float, user: str, verb: str, resource: str, name: str, namespace: str = "ours",
          subresource: str | None = None, stage: str = "ResponseComplete") -> dict:
    ref = {"resource": resource, "namespace": namespace, "name": name,
           **({"subresource": subresource} if subresource else {})}
    return {"stage": stage, "verb": verb, "user": {"username": user}, "objectRef": ref,
            "requestReceivedTimestamp": f"2026-12-06T01:00:{at:06.3f}Z"}


def test_each_step_of_a_job_and_a_namesake_in_another_namespace_kept_apart(tmp_path: Path):
    events = [
        event(0, "admin", "create", "monarchjobs", "b-1"),
        event(0.5, "admin", "create", "monarchjobs", "b-1", stage="RequestReceived"),
        event(1, "op", "create", "secrets", "b-1-ssh"),
        event(1.5, "op", "create", "statefulsets", "b-1-worker"),
        event(2, "op", "patch", "monarchjobs", "b-1", subresource="status"),
        event(2, "kcm", "create", "pods", "b-1-worker-0"),
        event(3, "kcm", "create", "pods", "b-1-worker-1"),
        event(3.5, "sched", "create", "pods", "b-1-worker-0", subresource="binding"),
        event(3.6, "sched", "create", "pods", "b-1-worker-1", subresource="binding"),
        event(4, "kwok", "patch", "pods", "b-1-worker-0", subresource="status"),
        event(4.5, "kwok", "patch", "pods", "b-1-worker-1", subresource="status"),
        event(5, "kwok", "patch", "pods", "b-1-worker-0", subresource="status"),
        event(5.5, "kwok", "patch", "pods", "b-1-worker-1", subresource="status"),
        # The other operator's job of the same name, later: none of it is ours.
        event(10, "admin", "create", "mpijobs", "b-1", namespace="theirs"),
        event(11, "kcm", "create", "pods", "b-1-worker-0", namespace="theirs"),
        event(19, "kwok", "patch", "pods", "b-1-worker-0", namespace="theirs",
              subresource="status"),
    ]
    log = tmp_path / "audit.log"
    log.write_text("".join(json.dumps(item) + "\n" for item in events))
    steps = worker_timeline.steps(log, "monarchjobs")
    assert {step: [round(value, 3) for value in values] for step, values in steps.items()} == {
        "submit -> the operator's first create": [1.0],
        "submit -> last worker pod created": [3.0],
        "last pod created -> last bound": [0.6],
        "last bound -> last Running (first status patch)": [0.9],
        "last Running -> last Ready (last status patch)": [1.0],
        "submit -> last worker Ready": [5.5],
    }
    theirs = worker_timeline.steps(log, "mpijobs")
    assert theirs["submit -> last worker pod created"] == [pytest.approx(1.0)]
    assert theirs["submit -> the operator's first create"] == []  # it wrote no status


def test_the_table_has_a_row_per_step(tmp_path: Path, capsys):
    log = tmp_path / "audit.log"
    log.write_text(json.dumps(event(0, "admin", "create", "monarchjobs", "b-1")) + "\n")
    assert worker_timeline.main([str(log)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2 + 6 and rows[-1] == "| submit -> last worker Ready | 0 | - / - / - |"
