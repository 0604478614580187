"""Per-job series on /metrics (issue 22 item 3): live jobs only, from their status, scraped
from the real endpoint; and the chart's Grafana dashboard asks only for metrics the operator
exports (its queries parsed, every metric name checked against the registry)."""

from __future__ import annotations

import datetime as dt
import json
import re
import urllib.request

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from monarch_operator.controller.engine import jobmetrics, metrics
from monarch_operator.controller.engine.passes import PassReport, PassRunner
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.state import status as st
from tests.chart import CHART, by_kind, render

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)


def running_status() -> dict:
    return {"phase": "Running", "attempt": 3, "restartCount": 2, "readyWorkers": "3/4",
            "queue": {"name": "q", "queuedSeconds": 40},
            "attempts": [{"number": 1, "class": "Infrastructure"},
                         {"number": 2, "class": "Evicted"},
                         {"number": 3, "startTime": "2026-12-01T11:59:00Z",
                          "launchTime": "2026-12-01T11:59:25Z"}]}


def samples(series: jobmetrics.JobSeries) -> dict:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in series.collect() for sample in family.samples}


def test_a_live_jobs_series_come_from_its_status_and_go_when_it_finishes():
    series = jobmetrics.JobSeries(clock=lambda: NOW)
    job = ("team-a", "demo")
    series.observe(job, running_status())
    got = samples(series)
    key = (("job", "demo"), ("namespace", "team-a"))
    assert got[("monarch_operator_job_phase", (*key[:1], key[1], ("phase", "Running")))] == 1
    assert got[("monarch_operator_job_attempt", key)] == 3
    assert got[("monarch_operator_job_restarts", key)] == 2
    assert got[("monarch_operator_job_attempts_ended",
                (("class", "Evicted"), *key))] == 1
    assert got[("monarch_operator_job_queued_seconds", key)] == 40
    assert got[("monarch_operator_job_startup_seconds", key)] == 25
    assert (got[("monarch_operator_job_workers", key)],
            got[("monarch_operator_job_ready_workers", key)]) == (4, 3)
    assert ("monarch_operator_job_step", key) not in got, "no report yet: no step series"
    # Once the program reported: its step, total and the seconds since.
    series.observe(job, {**running_status(), "progress": {
        "attempt": 3, "step": 120, "totalSteps": 1000,
        "lastUpdatedTime": st.format_time(NOW - dt.timedelta(seconds=42))}})
    got = samples(series)
    assert (got[("monarch_operator_job_step", key)], got[("monarch_operator_job_total_steps", key)],
            got[("monarch_operator_job_seconds_since_report", key)]) == (120, 1000, 42)
    # Queued now: the wait in progress counts, and no start-up runs.
    queued = {"phase": "Queued", "attempt": 1, "attempts": [
        {"number": 1, "startTime": "2026-12-01T11:00:00Z"}],
        "queue": {"queuedSeconds": 10, "queuedSince": "2026-12-01T11:58:00Z"}}
    series.observe(job, queued)
    got = samples(series)
    assert got[("monarch_operator_job_queued_seconds", key)] == 130
    assert ("monarch_operator_job_startup_seconds", key) not in got
    series.observe(job, {**running_status(), "phase": "Succeeded"})
    assert not [name for name, _ in samples(series)]  # finished: every series gone


def test_the_number_of_jobs_shown_is_bounded():
    series = jobmetrics.JobSeries(clock=lambda: NOW, max_jobs=2)
    for name in ("a", "b", "c"):
        series.observe(("ns", name), running_status())
    shown = {dict(labels)["job"] for name, labels in samples(series)
             if name == "monarch_operator_job_attempt"}
    assert shown == {"a", "b"}
    series.forget(("ns", "a"))
    series.observe(("ns", "c"), running_status())
    assert {dict(labels)["job"] for name, labels in samples(series)
            if name == "monarch_operator_job_attempt"} == {"b", "c"}


class ScriptedRunner(PassRunner):
    def __init__(self, reports):
        super().__init__(Settings())
        self.reports = list(reports)

    def _run(self, namespace, name):
        return self.reports.pop(0)


def test_passes_feed_the_endpoint_and_a_deleted_job_leaves_it():
    host, port = metrics.serve("127.0.0.1:0")
    runner = ScriptedRunner([PassReport({}, phase="Running", status=running_status()),
                             PassReport(None, phase=None)])
    runner.run("team-m", "live")

    def scrape() -> set[str]:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        return {sample.name for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.labels.get("job") == "live"}

    assert {"monarch_operator_job_phase", "monarch_operator_job_restarts"} <= scrape()
    runner.run("team-m", "live")  # gone
    assert scrape() == set()


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
            "gauge": ("",), "summary": ("", "_count", "_sum")}


def exported_names() -> set[str]:
    """Every sample name the operator's registry can serve: each family's name with its
    type's suffixes (a labelled family has no sample until a label is used)."""
    import monarch_operator.controller.handlers  # noqa: F401  (every metric registered)
    import monarch_operator.controller.kueue.admission  # noqa: F401  (queue wait histogram)
    return {family.name + suffix for family in REGISTRY.collect()
            for suffix in SUFFIXES.get(family.type, ("",))}


def dashboard() -> dict:
    return json.loads((CHART / "dashboards" / "monarch-operator.json").read_text())


def test_the_dashboard_asks_only_for_metrics_the_operator_exports():
    exported = exported_names()
    used = set()
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\bmonarch_operator_[a-z_]+", target["expr"]))
    assert used, "the dashboard queries nothing"
    assert used <= exported, sorted(used - exported)
    # Every per-job family is on the dashboard.
    per_job = {name for name in exported if name.startswith("monarch_operator_job_")}
    assert per_job <= used | {"monarch_operator_job_phase"}, sorted(per_job - used)


def test_the_chart_ships_the_dashboard_when_asked():
    assert by_kind(render(), "ConfigMap") == []
    [config_map] = by_kind(render("--set", "metrics.grafanaDashboard.enabled=true"), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["monarch-operator.json"]) == dashboard()
