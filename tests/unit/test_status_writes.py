"""One status write per pass, and progress alone (ready count, waiting message) at most once per
interval: the decision in reconcile._write_status, no cluster (the API call is recorded)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from monarch_operator.controller import k8s, reconcile
from monarch_operator.controller import status as st
from monarch_operator.controller.spec import JobSpec

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
JOB = JobSpec.from_body({
    "metadata": {"name": "demo", "namespace": "team-a", "uid": "uid-1", "generation": 1},
    "spec": {"image": "img:1", "workers": {"replicas": 4, "gpusPerWorker": 1},
             "meshes": {"trainer": {"hosts": 4}}}})


def waiting(ready: int, message: str) -> dict[str, Any]:
    status = st.set_condition({}, st.WORKERS_READY, False, st.REASON_WAITING_FOR_WORKERS,
                              message, 1, "2026-11-30T11:59:00Z")
    status.update(readyWorkers=f"{ready}/4", observedGeneration=1)
    status["phase"] = st.summarize_phase(status)
    status["message"] = st.summarize_message(status)
    return status


@pytest.fixture()
def patches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(k8s, "patch_job_status",
                        lambda namespace, name, status: sent.append(status) or {})
    return sent


def write(previous: dict[str, Any], new: dict[str, Any],
          after: dt.datetime | None) -> float | None:
    state = reconcile.Pass(job=JOB, status=new, now=NOW)
    return reconcile._write_status(state, previous, after)


def test_progress_only_is_held_back_until_the_interval_ends(patches):
    before, after = waiting(1, "waiting for w-1, w-2, w-3"), waiting(2, "waiting for w-2, w-3")
    assert st.only_progress_changed(before, after)
    assert write(before, after, NOW + dt.timedelta(seconds=3)) == 3.0
    assert patches == []
    assert write(before, after, NOW) is None  # the interval is over: written
    assert patches == [after]


def test_a_transition_is_written_at_once(patches):
    before = waiting(3, "waiting for w-3")
    ready = st.set_condition(before, st.WORKERS_READY, True, st.REASON_ALL_WORKERS_READY,
                             "4 of 4 workers accept SSH", 1, "2026-11-30T12:00:00Z")
    ready["readyWorkers"] = "4/4"
    assert not st.only_progress_changed(before, ready)
    assert write(before, ready, NOW + dt.timedelta(seconds=3)) is None
    assert len(patches) == 1


def test_nothing_changed_writes_nothing(patches):
    status = waiting(0, "waiting for everyone")
    assert not st.only_progress_changed(status, dict(status))
    assert write(status, dict(status), None) is None
    assert patches == []


def test_a_finished_job_shows_its_ready_count_at_once(patches):
    """READY of a Failed job drops to 0/4 as its workers go (no holding back)."""
    failed = st.set_condition(waiting(4, "waiting"), st.FAILED, True, st.REASON_LAUNCHER_FAILED,
                              "launcher exited with code 3", 1, "2026-11-30T11:59:30Z")
    failed["phase"] = st.summarize_phase(failed)
    failed["message"] = st.summarize_message(failed)
    released = {**failed, "readyWorkers": "0/4"}
    assert st.only_progress_changed(failed, released)
    assert write(failed, released, NOW + dt.timedelta(seconds=3)) is None
    assert patches == [released]
