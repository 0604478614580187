"""The chart's metrics toggle: off by default; on, the operator serves /metrics on its pod's
`metrics` port behind a ClusterIP Service that selects exactly the operator pod."""

from __future__ import annotations

import pytest

from tests.chart import CHART, by_kind, helm, render


def _operator_container(objects):
    [deployment] = by_kind(objects, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def test_metrics_are_off_by_default():
    objects = render()
    _, container = _operator_container(objects)
    assert not [arg for arg in container["args"] if arg.startswith("--metrics")]
    assert [port["name"] for port in container["ports"]] == ["health"]
    assert by_kind(objects, "Service") == []


@pytest.mark.parametrize("values", [["-f", str(CHART / "ci" / "metrics-values.yaml")],
                                    ["--set", "metrics.enabled=true"]],
                         ids=["ci-file-port-9102", "default-port-9090"])
def test_metrics_on_serve_the_port_behind_a_service(values):
    objects = render(*values)
    port = 9102 if "-f" in values else 9090
    deployment, container = _operator_container(objects)
    assert f"--metrics=$(POD_IP):{port}" in container["args"]
    assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
    [service] = by_kind(objects, "Service")
    assert service["metadata"]["name"] == "mo-monarch-operator-metrics"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("enabled", [False, True])
def test_helm_lint_strict_with_metrics(enabled):
    result = helm("lint", str(CHART), "--strict",
                  "--set", f"metrics.enabled={str(enabled).lower()}",
                  "--set", f"metrics.grafanaDashboard.enabled={str(enabled).lower()}")
    assert "0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "metrics.port=80"], "/metrics/port"),
    (["--set", "metrics.enabled=yes"], "/metrics/enabled"),
    (["--set", "metrics.path=/x"], "'path' not allowed"),
    (["--set", "metrics.enabled=true", "--set", "metrics.port=8080"],
     "metrics.port must differ from health.port"),
], ids=["privileged-port", "not-a-boolean", "unknown-key", "same-as-health"])
def test_bad_metrics_values_are_refused_naming_the_field(args, message):
    result = helm("template", "mo", str(CHART), *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
