"""The operator's Prometheus metrics, scraped from the real endpoint (no cluster: passes are
driven through PassRunner with their work replaced, the API is never called)."""

from __future__ import annotations

import urllib.request

import pytest
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from monarch_operator.controller.__main__ import main as operator_main
from monarch_operator.controller.engine import metrics
from monarch_operator.controller.engine.passes import PassReport, PassRunner
from monarch_operator.controller.spec.settings import Settings


@pytest.fixture(scope="module")
def endpoint():
    host, port = metrics.serve("127.0.0.1:0")
    return f"http://{host}:{port}/metrics"


def scrape(endpoint: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(endpoint, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


class ScriptedRunner(PassRunner):
    """A PassRunner whose passes do what the test says instead of calling the API."""

    def __init__(self, outcomes):
        super().__init__(Settings())
        self.outcomes = list(outcomes)

    def _run(self, namespace, name):
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def test_passes_results_durations_api_errors_and_jobs_by_phase_are_served(endpoint):
    before = scrape(endpoint)
    runner = ScriptedRunner([
        PassReport({}, phase="Running"),                        # team-a/one
        PassReport({}, phase="Running"),                        # team-a/two
        ApiException(status=503, reason="Service Unavailable"),  # team-a/two, retried later
        RuntimeError("a bug"),                                  # team-a/two
        PassReport({}, phase="Succeeded"),                      # team-a/one finished
        PassReport(None, phase=None),                           # team-b/gone: not counted
    ])
    for key in [("team-a", "one"), ("team-a", "two"), ("team-a", "two"), ("team-a", "two"),
                ("team-a", "one"), ("team-b", "gone")]:
        runner.run(*key)
    after = scrape(endpoint)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("monarch_operator_reconcile_total", result="ok") == 4
    assert delta("monarch_operator_reconcile_total", result="api_error") == 1
    assert delta("monarch_operator_reconcile_total", result="error") == 1
    assert delta("monarch_operator_api_errors_total", code="503") == 1
    assert delta("monarch_operator_reconcile_duration_seconds_count") == 6
    assert after[("monarch_operator_jobs", (("phase", "Running"),))] >= 1   # two
    assert after[("monarch_operator_jobs", (("phase", "Succeeded"),))] >= 1  # one
    assert metrics.JOB_PHASES.counts().get("Running", 0) == after[
        ("monarch_operator_jobs", (("phase", "Running"),))]


def test_a_job_counts_once_in_its_latest_phase_and_leaves_when_deleted():
    phases = metrics.JobPhases()
    phases.set(("ns", "a"), "Pending")
    phases.set(("ns", "a"), "Running")
    phases.set(("ns", "b"), "Running")
    assert phases.counts() == {"Running": 2}
    phases.set(("ns", "a"), None)
    phases.set(("ns", "never-seen"), None)
    assert phases.counts() == {"Running": 1}
    [family] = phases.collect()
    assert [(s.labels, s.value) for s in family.samples] == [({"phase": "Running"}, 1)]


@pytest.mark.parametrize("address", ["9090", "host:", "host:http", "host:70000"])
def test_a_malformed_metrics_address_exits_naming_the_flag(address, capsys):
    with pytest.raises(SystemExit) as exit_info:
        operator_main(["--metrics", address])
    assert exit_info.value.code == 2
    assert f"--metrics {address}" in capsys.readouterr().err


def test_an_address_in_use_exits_naming_the_flag(endpoint, capsys):
    taken = endpoint.split("//")[1].split("/")[0]
    with pytest.raises(SystemExit) as exit_info:
        operator_main(["--metrics", taken])
    assert exit_info.value.code == 2
    assert f"--metrics {taken}" in capsys.readouterr().err
