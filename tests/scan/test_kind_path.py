"""The kind path (scripts/kind-e2e.sh and its workflow) as far as this machine can check it
without Docker: the script parses (ShellCheck runs on it with every script), pins kind and its
node image by digest, and the workflow is valid YAML that runs it."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.chart import ROOT

SCRIPT = ROOT / "scripts" / "kind-e2e.sh"
WORKFLOW = ROOT / ".github" / "workflows" / "kind-e2e.yaml"


def test_the_script_parses():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr


def test_kind_and_its_node_image_are_pinned():
    text = SCRIPT.read_text()
    assert re.search(r"^KIND_VERSION=v\d+\.\d+\.\d+$", text, re.M)
    assert re.search(r'^NODE_IMAGE="kindest/node:v\d+\.\d+\.\d+@sha256:[0-9a-f]{64}"$', text, re.M)


def test_the_script_installs_the_chart_and_waits_for_the_sample():
    text = SCRIPT.read_text()
    for step in ("kind create cluster", "docker build -f images/operator/Dockerfile",
                 "docker build -f images/worker/Dockerfile", "kind load docker-image",
                 "install monarch-operator charts/monarch-operator",
                 "-f crds/samples/demo.yaml", "kubectl get monarchjobs",
                 "kind delete cluster"):
        assert step in text, step


def test_the_workflow_parses_and_runs_the_script():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the key `on` as True.
    assert "workflow_dispatch" in workflow[True]
    [job] = workflow["jobs"].values()
    runs = [step.get("run", "") for step in job["steps"]]
    assert "scripts/kind-e2e.sh" in runs
    assert workflow["permissions"] == {"contents": "read"}
