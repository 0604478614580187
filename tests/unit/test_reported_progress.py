"""The operator's side of progress in status (issue 22 item 1): the launcher's report in the
job's ConfigMap becomes ``status.progress``, bounded and checked; the CRD shows it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from monarch_operator import constants, names
from monarch_operator.controller.builders.progress import (
    build_launcher_account,
    build_progress_binding,
    build_progress_configmap,
    build_progress_role,
)
from monarch_operator.controller.engine import reconcile
from monarch_operator.controller.k8s import client
from monarch_operator.controller.launch import reported
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from tests.unit.test_launch_pass import NAME, NAMESPACE, job_body, make_view, stored
from tests.unit.test_verdicts import api, running_status  # noqa: F401 - fixture

CRD = Path(__file__).resolve().parents[2] / "crds" / "monarchjobs.monarch-operator.dev.yaml"


def report_text(**fields) -> str:
    return json.dumps({"attempt": 1, "time": "2026-12-02T03:00:00Z", **fields})


def test_a_report_becomes_the_progress_kubectl_shows():
    progress = reported.summarize(reported.parse(report_text(
        step=250, totalSteps=1000, stepsPerSecond=2.5,
        metrics={"loss": 0.123456789, "reward": 3, "phase": "rollout"},
        checkpoint="s3://b/run/250", runURL="https://wandb.ai/t/p/runs/x")))
    assert progress == {
        "attempt": 1, "step": 250, "totalSteps": 1000, "stepsPerSecond": 2.5,
        "progressPercentage": 25, "percent": "25%", "estimatedRemainingSeconds": 300,
        "eta": "5m00s", "checkpoint": "s3://b/run/250", "runURL": "https://wandb.ai/t/p/runs/x",
        "metrics": [{"name": "loss", "value": "0.123457"}, {"name": "reward", "value": "3"},
                    {"name": "phase", "value": "rollout"}],
        "mainMetric": "loss=0.123457", "lastUpdatedTime": "2026-12-02T03:00:00Z"}


@pytest.mark.parametrize(("text", "expected"), [
    ("not json", None),
    ("[1, 2]", None),
    ("x" * (reported.MAX_REPORT_BYTES + 1), None),
    (json.dumps({"step": -1, "totalSteps": True, "attempt": "2"}), {}),
    (json.dumps({"stepsPerSecond": -1.0}), {}),
    (json.dumps({"runURL": "javascript:alert(1)"}), {}),
    (json.dumps({"metrics": {f"m{i}": i for i in range(40)}}),
     {"metrics": [{"name": f"m{i}", "value": str(i)} for i in range(reported.MAX_METRICS)]}),
    (json.dumps({"checkpoint": "c" * 2000}), {"checkpoint": "c" * reported.MAX_TEXT}),
])
def test_what_a_program_wrote_is_bounded_and_checked(text, expected):
    assert reported.parse(text) == expected


@pytest.mark.parametrize(("seconds", "shown"), [
    (0, "0s"), (59, "59s"), (250, "4m10s"), (3600 + 300, "1h05m"), (2 * 86400 + 3 * 3600, "2d3h")])
def test_eta_reads_like_kubectl_ages(seconds, shown):
    assert reported.duration(seconds) == shown


def test_done_or_past_the_total_is_100_percent_and_nothing_left():
    progress = reported.summarize({"step": 1200, "totalSteps": 1000, "stepsPerSecond": 1.0})
    assert (progress["percent"], progress["eta"]) == ("100%", "0s")


def test_the_pass_copies_the_report_into_status_and_the_attempts_record(api):  # noqa: F811
    settings = Settings.from_env()
    status = running_status(settings)
    body = job_body(status)
    view = make_view(settings, status)
    configmap = build_progress_configmap(JobSpec.from_body(body))
    configmap["data"] = {constants.PROGRESS_REPORT_KEY: report_text(
        step=7, totalSteps=10, runURL="https://mlflow.example/#/runs/1")}
    view.children[("v1", "ConfigMap")][names.progress_configmap(NAME)] = stored(configmap, "cm")
    with client.reading_from(view):
        outcome = reconcile.reconcile(body, settings, reported_now())
    assert outcome.status["progress"]["step"] == 7
    assert outcome.status["progress"]["percent"] == "70%"
    record = outcome.status["attempts"][0]
    assert (record["lastStep"], record["runURL"]) == (7, "https://mlflow.example/#/runs/1")


def reported_now() -> dt.datetime:
    return dt.datetime(2026, 12, 2, 3, 0, 5, tzinfo=dt.UTC)


def test_the_launcher_may_write_its_jobs_progress_and_nothing_else():
    job = JobSpec.from_body({"metadata": {"name": "demo", "namespace": NAMESPACE, "uid": "u"},
                             "spec": {"image": "img"}})
    role, binding = build_progress_role(job), build_progress_binding(job)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["demo-progress"], "verbs": ["get", "patch"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-launcher",
                                    "namespace": NAMESPACE}]
    assert build_launcher_account(job)["automountServiceAccountToken"] is False
    # A template's own ServiceAccount is the one bound.
    mine = JobSpec.from_body({"metadata": {"name": "demo", "namespace": NAMESPACE},
                              "spec": {"image": "img", "launcher": {"template": {
                                  "spec": {"serviceAccountName": "trainer"}}}}})
    assert build_progress_binding(mine)["subjects"][0]["name"] == "trainer"


def test_the_crd_shows_step_progress_and_eta_and_the_metric_wide():
    crd = yaml.safe_load(CRD.read_text())
    columns = {column["name"]: column for column in
               crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Step"]["jsonPath"] == ".status.progress.step"
    assert columns["Progress"]["jsonPath"] == ".status.progress.percent"
    assert columns["ETA"]["jsonPath"] == ".status.progress.eta"
    assert columns["Metric"]["priority"] == 1
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    fields = schema["status"]["properties"]["progress"]["properties"]
    summary = reported.summarize(reported.parse(report_text(
        step=1, totalSteps=2, stepsPerSecond=1.0, metrics={"a": 1}, checkpoint="c",
        checkpointTime="2026-12-02T03:00:00Z", runURL="https://x")))
    assert "checkpointTime" in summary
    assert set(summary) <= set(fields), "every field the operator writes is in the schema"
    interval = schema["spec"]["properties"]["progress"]["properties"]["reportIntervalSeconds"]
    assert (interval["default"], interval["minimum"]) == (10, 1)
