"""One status write per pass, and progress alone (ready count, waiting message) at most once per
interval per job and spaced out operator-wide while jobs start: the decisions in
reconcile._write_status and progress.ProgressWrites, no cluster (the API call is recorded)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from monarch_operator.controller.engine import progress, reconcile
from monarch_operator.controller.k8s import writes as k8s_writes
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.controller.state import status as st

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
    monkeypatch.setattr(k8s_writes, "patch_job_status",
                        lambda namespace, name, status: sent.append(status) or {})
    return sent


def write(previous: dict[str, Any], new: dict[str, Any],
          after: dt.datetime | None) -> float | None:
    """Write as a pass at NOW would, the job's progress held until ``after``."""
    state = reconcile.Pass(job=JOB, status=new, now=NOW)
    hold = None if after is None else (lambda: max((after - NOW).total_seconds(), 0.0))
    return reconcile._write_status(state, previous, hold)


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
    """READY of a Failed job (a KeepAll one, whose pods stay) follows its workers at once."""
    failed = st.set_condition(waiting(4, "waiting"), st.FAILED, True, st.REASON_LAUNCHER_FAILED,
                              "launcher exited with code 3", 1, "2026-11-30T11:59:30Z")
    failed["phase"] = st.summarize_phase(failed)
    failed["message"] = st.summarize_message(failed)
    released = {**failed, "readyWorkers": "3/4"}
    assert st.only_progress_changed(failed, released)
    assert write(failed, released, NOW + dt.timedelta(seconds=3)) is None
    assert patches == [released]


def test_a_job_writes_progress_once_per_interval():
    writes, key = progress.ProgressWrites(interval=10, spacing=0.5), ("ns", "a")
    assert writes.hold_seconds(key, NOW) == 0.0  # never written: at once
    writes.written(key, NOW)
    assert writes.hold_seconds(key, NOW + dt.timedelta(seconds=4)) == 6.0
    assert writes.hold_seconds(key, NOW + dt.timedelta(seconds=10)) == 0.0


def test_starting_jobs_take_turns_for_progress_writes_and_keep_their_turn():
    writes = progress.ProgressWrites(interval=10, spacing=0.5)
    keys = [("ns", f"job-{index}") for index in range(4)]
    # Four jobs want to write progress at the same moment: one now, the others 0.5 s apart.
    assert [writes.hold_seconds(key, NOW) for key in keys] == [
        0.0, 0.5, 1.0, 1.5]
    # Asking again does not move a job back in line; its turn comes, it writes.
    later = NOW + dt.timedelta(seconds=1)
    assert writes.hold_seconds(keys[3], later) == 0.5
    assert writes.hold_seconds(keys[2], later) == 0.0
    writes.written(keys[2], later)
    assert writes.hold_seconds(keys[2], later) == 10.0  # its own interval now
    # Long after, turns are free again: no burst was saved up meanwhile beyond one.
    idle = NOW + dt.timedelta(seconds=60)
    assert writes.hold_seconds(("ns", "new-1"), idle) == 0.0
    assert writes.hold_seconds(("ns", "new-2"), idle) == 0.5
    writes.forget(keys[3])
    assert writes.hold_seconds(keys[3], idle) == 1.0  # a new turn
