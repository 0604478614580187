"""The launcher's side of progress in status (issue 22 item 1): what a program reports, how
it is coalesced and rate-limited, and that the last report is written at the end."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from monarch_operator import constants
from monarch_operator.launcher import progress


class Clock:
    """A monotonic clock the test moves (the forwarder's waits are real: with a long interval
    only a close ends them)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sink:
    def __init__(self) -> None:
        self.texts: list[dict] = []

    def __call__(self, text: str) -> None:
        self.texts.append(json.loads(text))

    def wait(self, count: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.texts) >= count:
                return
            time.sleep(0.01)
        raise AssertionError(f"{len(self.texts)} writes, expected {count}: {self.texts}")


WALL = dt.datetime(2026, 12, 2, 3, 0, tzinfo=dt.UTC)


def test_reports_are_coalesced_to_one_write_per_interval_and_the_last_is_flushed():
    clock, sink = Clock(), Sink()
    forwarder = progress.Forwarder(sink, interval=3600, attempt=2, clock=clock, now=lambda: WALL)
    forwarder.offer({"step": 1, "totalSteps": 100, "metrics": {"loss": 2.5}})
    sink.wait(1)  # the first report goes at once
    for step in range(2, 51):
        clock.now += 1
        forwarder.offer({"step": step, "metrics": {"loss": 2.5 - step / 100}})
    time.sleep(0.2)
    assert len(sink.texts) == 1, "the interval holds every later report back"
    forwarder.close()  # the launcher ends: the latest state goes now, not after the interval
    assert len(sink.texts) == 2
    first, last = sink.texts
    assert first == {"attempt": 2, "step": 1, "totalSteps": 100, "metrics": {"loss": 2.5},
                     "time": "2026-12-02T03:00:00Z"}
    # Fields left out keep their last value; the rate comes from the reports' times.
    assert last["step"] == 50 and last["totalSteps"] == 100
    assert last["metrics"] == {"loss": 2.0} and last["stepsPerSecond"] == 1.0


def test_a_report_after_the_interval_is_written_without_a_close():
    sink = Sink()
    forwarder = progress.Forwarder(sink, interval=0.05)  # real time
    forwarder.offer({"step": 1})
    sink.wait(1)
    forwarder.offer({"step": 2})
    sink.wait(2)
    assert [text["step"] for text in sink.texts] == [1, 2]
    forwarder.close()
    assert len(sink.texts) == 2, "nothing pending: the close writes nothing more"


def test_the_interval_counts_from_the_end_of_a_slow_write():
    """The first write loads the Kubernetes client (about a second): the next one still waits
    a whole interval after it, so writes never arrive closer than the interval."""
    interval, texts, ends = 0.3, [], []

    def slow_sink(text: str) -> None:
        time.sleep(0.25 if not texts else 0.0)
        texts.append(json.loads(text))
        ends.append(time.monotonic())

    forwarder = progress.Forwarder(slow_sink, interval=interval)  # real time
    forwarder.offer({"step": 1})
    time.sleep(0.05)
    forwarder.offer({"step": 2})  # pending while the first write is still under way
    deadline = time.monotonic() + 5
    while len(ends) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    forwarder.close()
    assert [text["step"] for text in texts] == [1, 2]
    assert ends[1] - ends[0] >= interval, ends


def test_a_step_going_back_restarts_the_rate():
    clock, sink = Clock(), Sink()
    forwarder = progress.Forwarder(sink, interval=3600, clock=clock, now=lambda: WALL)
    for step in (10, 20, 30):
        forwarder.offer({"step": step})
        clock.now += 10
    forwarder.offer({"step": 5})  # resumed from an earlier checkpoint
    forwarder.close()
    assert "stepsPerSecond" not in sink.texts[-1] and sink.texts[-1]["step"] == 5


def test_lines_from_ranks_are_reports_whatever_their_prefix(monkeypatch):
    got = []
    monkeypatch.setattr(progress, "_forwarder", type("F", (), {"offer": lambda self, f:
                                                              got.append(f)})())
    progress.feed_line('[trainer/host-0/0] MONARCH_PROGRESS {"step": 7, "totalSteps": 9}')
    progress.feed_line("MONARCH_PROGRESS not json")
    progress.feed_line('MONARCH_PROGRESS [1, 2]')
    progress.feed_line("step 7/9 loss=0.1")
    assert got == [{"step": 7, "totalSteps": 9}]


def test_report_outside_the_launcher_prints_the_line_the_launcher_reads(monkeypatch, capsys):
    monkeypatch.setattr(progress, "_forwarder", None)
    monkeypatch.setattr(progress, "_in_launcher", False)
    for name in (constants.ENV_PROGRESS_CONFIGMAP, constants.ENV_NAMESPACE):
        monkeypatch.delenv(name, raising=False)
    progress.report(3, total_steps=10, metrics={"loss": 0.5, "phase": "warmup"},
                    run_url="https://wandb.ai/team/run/abc")
    line = capsys.readouterr().out.strip()
    assert line.startswith(constants.PROGRESS_LINE_MARKER)
    assert json.loads(line.removeprefix(constants.PROGRESS_LINE_MARKER)) == {
        "step": 3, "totalSteps": 10, "metrics": {"loss": 0.5, "phase": "warmup"},
        "runURL": "https://wandb.ai/team/run/abc"}


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"step": -1}, ValueError, "report(step=-1): at least 0"),
    ({"step": 1.5}, TypeError, "report(step=...): an int, not float"),
    ({"total_steps": 0}, ValueError, "report(total_steps=0): at least 1"),
    ({"metrics": [1]}, TypeError, "report(metrics=...)"),
    ({"metrics": {"loss": None}}, TypeError, "report(metrics={'loss': ...})"),
    ({"run_url": ""}, TypeError, "report(run_url=...): a non-empty string"),
])
def test_bad_reports_name_the_argument(kwargs, error, words):
    with pytest.raises(error) as raised:
        progress.report(**kwargs)
    assert words in str(raised.value)


def test_the_forwarder_is_made_only_in_a_launcher_pod():
    assert progress.install({}) is None
    assert progress.install({constants.ENV_PROGRESS_CONFIGMAP: "demo-progress"}) is None


def test_a_failed_write_is_said_once_and_never_raised(capsys):
    class Refusing:
        def patch_namespaced_config_map(self, *args, **kwargs):
            error = RuntimeError("forbidden")
            error.status, error.reason = 403, "Forbidden"  # type: ignore[attr-defined]
            raise error

    writer = progress.ConfigMapWriter("team-a", "demo-progress")
    writer._api = Refusing()
    writer('{"step": 1}')
    writer('{"step": 2}')
    err = capsys.readouterr().err
    assert err.count("progress not written to ConfigMap team-a/demo-progress: HTTP 403") == 1
    assert "serviceAccountName" in err


def test_in_the_launchers_process_without_a_job_a_report_goes_nowhere(monkeypatch, capsys):
    """A run on a hostfile: the controller's reports are not printed as marker lines."""
    monkeypatch.setattr(progress, "_forwarder", None)
    monkeypatch.setattr(progress, "_in_launcher", False)
    monkeypatch.delenv(constants.ENV_PROGRESS_CONFIGMAP, raising=False)
    progress.mark_launcher()
    progress.report(1, total_steps=2)
    assert capsys.readouterr().out == ""


def test_the_metrics_keep_the_order_the_program_gave_them():
    """The METRIC column is the first metric the program reported (docs/progress.md), not the
    first in alphabetical order: the launcher's write keeps the report's order, and so does
    the operator's reading of it."""
    from monarch_operator.controller.launch import reported

    texts: list[str] = []
    forwarder = progress.Forwarder(texts.append, interval=3600, clock=Clock(), now=lambda: WALL)
    forwarder.offer({"step": 1, "metrics": {"reward": 0.9, "loss": 2.5, "kl": 0.01}})
    forwarder.close()
    [text] = texts
    assert list(json.loads(text)["metrics"]) == ["reward", "loss", "kl"]
    shown = reported.summarize(reported.parse(text))
    assert shown["mainMetric"] == "reward=0.9"


def test_a_checkpoint_is_reported_with_when_the_program_named_it():
    clock, sink = Clock(), Sink()
    forwarder = progress.Forwarder(sink, interval=3600, attempt=1, clock=clock, now=lambda: WALL)
    forwarder.offer({"checkpoint": "/ckpt/7"})
    forwarder.close()
    assert sink.texts[-1]["checkpointTime"] == "2026-12-02T03:00:00Z"


class Refusing:
    """The API server's answer to the launcher's writes: OK until ``after`` writes, then
    ``status`` (the job's ConfigMap or its RoleBinding gone)."""

    def __init__(self, status: int, after: int) -> None:
        self.status, self.after, self.calls = status, after, 0

    def patch_namespaced_config_map(self, *args, **kwargs):
        self.calls += 1
        if self.calls > self.after:
            error = RuntimeError("refused")
            error.status, error.reason = self.status, "Forbidden"  # type: ignore[attr-defined]
            raise error


@pytest.mark.parametrize("status", [403, 404])
def test_a_refusal_after_writes_went_through_ends_the_launcher_quietly(capsys, status):
    """The job is being deleted: its ConfigMap, Role and RoleBinding go with it. The launcher
    ends at once (no teardown towards workers that are going), saying why in one line, not
    the ServiceAccount hint, which has nothing to do with it."""
    ended: list[int] = []
    writer = progress.ConfigMapWriter(
        "team-a", "demo-progress", progress.end_with_job("team-a", "demo-progress",
                                                         exit_now=ended.append))
    writer._api = Refusing(status, after=1)
    writer('{"step": 1}')
    writer('{"step": 2}')
    assert ended == [143]
    err = capsys.readouterr().err
    assert "serviceAccountName" not in err
    assert err.count("\n") == 1 and "the MonarchJob is being deleted" in err, err


def test_a_refusal_from_the_first_write_still_names_what_to_check(capsys):
    ended: list[int] = []
    writer = progress.ConfigMapWriter(
        "team-a", "demo-progress", progress.end_with_job("team-a", "demo-progress",
                                                         exit_now=ended.append))
    writer._api = Refusing(403, after=0)
    writer('{"step": 1}')
    assert ended == []  # never written: the ServiceAccount may be the cause
    assert "serviceAccountName" in capsys.readouterr().err


class Reading:
    """The API server's answer to the launcher's read of its ConfigMap."""

    def __init__(self, status: int | None) -> None:
        self.status = status

    def read_namespaced_config_map(self, *args, **kwargs):
        if self.status is not None:
            error = RuntimeError("refused")
            error.status, error.reason = self.status, "NotFound"  # type: ignore[attr-defined]
            raise error
        return {}


@pytest.mark.parametrize(("status", "written", "ends"), [
    (404, False, True),  # its ConfigMap is gone: the job is being deleted
    (403, True, True),  # its Role or RoleBinding gone after writes went through
    (403, False, False),  # never written: the ServiceAccount may be the cause
    (None, True, False),  # the job is there: a plain stop, the teardown as always
    (500, True, False),
])
def test_a_launcher_stopped_while_its_job_is_deleted_ends_without_waiting_for_workers(
        status, written, ends):
    """SIGTERM because the job is being deleted: its workers go with it, so the teardown's
    mesh shutdowns would only time out (15 s each, past the pod's 30 s grace period). The
    launcher asks its ConfigMap first and ends at once when the job is going."""
    ended: list[int] = []
    writer = progress.ConfigMapWriter(
        "team-a", "demo-progress", progress.end_with_job("team-a", "demo-progress",
                                                         exit_now=ended.append))
    writer._api = Reading(status)
    writer._written = written
    writer.end_if_job_gone()
    assert ended == ([143] if ends else [])


def test_the_teardown_asks_first_only_after_a_stop_from_outside():
    import inspect

    from monarch_operator.launcher.session import lifecycle

    source = inspect.getsource(lifecycle.started_job)
    finally_block = source[source.index("    finally:"):]
    assert finally_block.index("progress.end_if_job_gone()") < finally_block.index("teardown(")
    assert "stopsignal.received() is not None" in finally_block


def test_the_writer_sends_a_merge_patch_and_a_read_of_its_configmap_only():
    """The launcher's two calls, as sent (no typed client): the report merged into the
    ConfigMap's data, its read at a stop; a refusal keeps its HTTP status for the writer."""
    from monarch_operator.launcher import configmapwriter
    from tests.apifake import FakeApi, Request

    statuses = [200, 200, 403]
    fake = FakeApi(lambda request: (statuses.pop(0), {"kind": "ConfigMap"}))
    maps = object.__new__(configmapwriter._ConfigMaps)  # no in-cluster credentials here
    maps._client = fake.client
    writer = progress.ConfigMapWriter("team-a", "demo-progress")
    writer._api = maps
    writer('{"step": 1}')
    writer.end_if_job_gone()
    with pytest.raises(Exception) as raised:
        maps.read_namespaced_config_map("demo-progress", "team-a", _request_timeout=5)
    path = "/api/v1/namespaces/team-a/configmaps/demo-progress"
    assert fake.requests == [
        Request("PATCH", path, {}, {"data": {constants.PROGRESS_REPORT_KEY: '{"step": 1}'}}),
        Request("GET", path, {}, None), Request("GET", path, {}, None)]
    assert raised.value.status == 403
