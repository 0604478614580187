"""The operator's Prometheus endpoint on the local control plane: real passes of a real job are
counted, the job shows in its phase, and leaves the count when deleted; a running program's
last report shows in its step series as in its status (issue 22 item 3).

Runs a second operator with ``--metrics`` that watches only a ``chart-*`` namespace, which the
shared test operator leaves alone (two operators must not act on one job)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from monarch_operator.localcluster.orphans import stop_with_parent
from monarch_operator.localcluster.ports import free_port
from tests.chart import ROOT
from tests.cluster.helpers import apply_manifest, get_json, job_manifest, job_status, wait_until

pytestmark = pytest.mark.cluster

REPORT_THEN_WAIT = ("import time; from monarch_operator.job import report; "
                    "report(7, total_steps=10, metrics={'loss': 0.5}); time.sleep(600)")




def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _jobs_by_phase(samples) -> dict[str, float]:
    return {dict(labels)["phase"]: value for (name, labels), value in samples.items()
            if name == "monarch_operator_jobs" and value}


def test_real_passes_are_counted_and_the_job_is_shown_in_its_phase(
        local_cluster, kubectl, operator_process, chart_namespace, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/metrics"
    address = url.split("//")[1].removesuffix("/metrics")
    log_path = tmp_path / "operator.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "monarch_operator.controller",
             f"--namespace={chart_namespace}", f"--metrics={address}"],
            env={**os.environ, **local_cluster.env()}, stdout=log_file,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=stop_with_parent())
    try:
        wait_until(lambda: _scrape(url), 60, "the metrics endpoint")
        job = yaml.safe_load((ROOT / "crds" / "samples" / "demo.yaml").read_text())
        # More GPUs than any node has: the workers stay Unschedulable, nothing runs.
        job["spec"]["workers"] = {"replicas": 2, "gpusPerWorker": 16}
        job["spec"]["meshes"] = {"trainer": {"hosts": 1}, "ref": {"hosts": 1}}
        kubectl("apply", "-n", chart_namespace, "-f", "-", stdin=yaml.safe_dump(job))

        def shown_in_its_phase():
            phase = (get_json(kubectl, "monarchjob", "demo", "-n", chart_namespace)
                     or {}).get("status", {}).get("phase")
            samples = _scrape(url)
            return phase and _jobs_by_phase(samples) == {phase: 1.0} and samples

        samples = wait_until(shown_in_its_phase, 60, "the job counted in its phase")
        assert samples[("monarch_operator_reconcile_total", (("result", "ok"),))] >= 1
        assert samples[("monarch_operator_reconcile_duration_seconds_count", ())] >= 1
        # Its workers never become Ready: every pass it had waited as not urgent.
        assert samples[("monarch_operator_reconcile_wait_seconds_count",
                        (("urgent", "false"),))] >= 1

        # Its own series (issue 22 item 3): phase, 2 workers wanted, none Ready.
        mine = (("job", "demo"), ("namespace", chart_namespace))
        phases = {dict(labels)["phase"] for (name, labels), value in samples.items()
                  if name == "monarch_operator_job_phase" and dict(labels)["job"] == "demo"}
        assert len(phases) == 1, phases
        assert samples[("monarch_operator_job_workers", mine)] == 2
        assert samples[("monarch_operator_job_ready_workers", mine)] == 0

        kubectl("delete", "monarchjob", "demo", "-n", chart_namespace, "--wait=true")
        wait_until(lambda: _jobs_by_phase(_scrape(url)) == {}, 60, "the deleted job to leave")
        assert not [name for name, labels in _scrape(url) if dict(labels).get("job") == "demo"]

        # A running program's last report: the dashboard's step series say what status says.
        apply_manifest(kubectl, chart_namespace, job_manifest(
            "metered", progress={"reportIntervalSeconds": 1},
            launcher={"command": ["python3", "-c", REPORT_THEN_WAIT]}))
        progress = wait_until(lambda: (job_status(kubectl, chart_namespace, "metered").get(
            "progress") or {}).get("step") == 7 and job_status(
                kubectl, chart_namespace, "metered")["progress"], 120, "step 7 in status")
        metered = (("job", "metered"), ("namespace", chart_namespace))
        samples = wait_until(lambda: (s := _scrape(url)).get(
            ("monarch_operator_job_step", metered)) == progress["step"] and s, 60,
            "the step series to follow status")
        assert samples[("monarch_operator_job_total_steps", metered)] == progress["totalSteps"]
        assert 0 <= samples[("monarch_operator_job_seconds_since_report", metered)] < 120
        kubectl("delete", "monarchjob", "metered", "-n", chart_namespace, "--wait=true")
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode in (0, -15), log_path.read_text()[-3000:]
