"""spec.launcher (program, args, env, resources, template), spec.meshes.*.gpus and spec.spmd on
the real API server: each CEL rule refuses naming its field; accepted specs run."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from tests.cluster.helpers import get_json

pytestmark = pytest.mark.cluster

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
SAMPLES = Path(__file__).resolve().parents[2] / "crds" / "samples"
COLOCATED = {"trainer": {"hosts": 2}, "ref": {"hosts": 2}, "colocate": True}


def manifest(name: str, **spec) -> str:
    body = {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": {"name": name},
            "spec": {"image": IMAGE, "workers": {"replicas": 2, "gpusPerWorker": 4}, **spec}}
    # JSON, so that every string stays a string (YAML would read an unquoted 1e-4 as a number).
    return json.dumps(body)


def apply(kubectl, namespace: str, text: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "apply", "-n", namespace, *flags, "-f", "-"], input=text,
                          capture_output=True, text=True, env=kubectl.env)


REFUSED = [
    # The launcher runs once per attempt; restarts are the run policy's, never the kubelet's.
    ("launcher-restart-policy",
     {"launcher": {"template": {"spec": {"restartPolicy": "Always"}}}},
     ["spec.launcher.template.spec.restartPolicy: Unsupported value: \"Always\"",
      'supported values: "Never"']),
    ("trainer-gpus-not-colocated",
     {"meshes": {"trainer": {"hosts": 1, "gpus": 2}, "ref": {"hosts": 1}}},
     ["spec.meshes.trainer.gpus: Forbidden", "only allowed with meshes.colocate"]),
    ("ref-gpus-not-colocated",
     {"meshes": {"trainer": {"hosts": 1}, "ref": {"hosts": 1, "gpus": 2}}},
     ["spec.meshes.ref.gpus: Forbidden", "only allowed with meshes.colocate"]),
    ("gpus-zero",
     {"meshes": {**COLOCATED, "trainer": {"hosts": 2, "gpus": 0}}},
     ["spec.meshes.trainer.gpus: Invalid value", "greater than or equal to 1"]),
    ("gpus-sum-too-large",
     {"meshes": {**COLOCATED, "trainer": {"hosts": 2, "gpus": 3},
                 "ref": {"hosts": 2, "gpus": 2}}},
     ["spec.meshes: Invalid value", "must be at most workers.gpusPerWorker"]),
    ("gpus-alone-leaves-none",
     {"meshes": {**COLOCATED, "trainer": {"hosts": 2, "gpus": 4}}},
     ["spec.meshes: Invalid value", "must be at most workers.gpusPerWorker"]),
    ("program-and-command",
     {"launcher": {"program": "my_rl.train:main", "command": ["python", "x.py"]}},
     ["spec.launcher: Invalid value",
      "at most one of launcher.program, launcher.command and spmd"]),
    ("program-and-spmd",
     {"launcher": {"program": "my_rl.train:main"}, "spmd": {"script": "t.py"}},
     ["spec.launcher: Invalid value", "at most one of"]),
    ("command-and-spmd",
     {"launcher": {"command": ["python", "x.py"]}, "spmd": {"module": "m"}},
     ["spec.launcher: Invalid value", "at most one of"]),
    ("spmd-script-and-module", {"spmd": {"script": "t.py", "module": "m"}},
     ["spec.spmd: Invalid value", "exactly one of script (a path) and module"]),
    ("spmd-neither", {"spmd": {"args": ["--x"]}},
     ["spec.spmd: Invalid value", "exactly one of script (a path) and module"]),
    ("spmd-nproc-too-large", {"spmd": {"script": "t.py", "nprocPerNode": 5}},
     ["spec.spmd.nprocPerNode: Invalid value", "at most workers.gpusPerWorker"]),
    ("spmd-nproc-zero", {"spmd": {"script": "t.py", "nprocPerNode": 0}},
     ["spec.spmd.nprocPerNode: Invalid value", "greater than or equal to 1"]),
    ("spmd-with-launcher-args", {"spmd": {"script": "t.py"}, "launcher": {"args": ["a"]}},
     ["spec.launcher.args: Forbidden", "spmd.args"]),
    ("reserved-env",
     {"launcher": {"env": [{"name": "OK", "value": "1"},
                           {"name": "MONARCH_HOSTFILE", "value": "/x"}]}},
     ["spec.launcher.env: Forbidden", "must not set the operator's own launcher variables"]),
    ("bad-quantity", {"launcher": {"resources": {"limits": {"cpu": "2 cores"}}}},
     ["spec.launcher.resources.limits.cpu", "should match"]),
    # Found by the generated specs: the builders need a template's metadata, spec, labels and
    # annotations to be objects (a string crashed every pass); the schema says so now.
    ("template-spec-string", {"workers": {"replicas": 2, "template": {"spec": "x"}}},
     ["spec.workers.template.spec: Invalid value", "must be of type object"]),
    ("template-metadata-string", {"launcher": {"template": {"metadata": "x"}}},
     ["spec.launcher.template.metadata: Invalid value", "must be of type object"]),
    ("template-label-int", {"launcher": {"template": {"metadata": {"labels": {"a": 5}}}}},
     ["spec.launcher.template.metadata.labels.a: Invalid value", "must be of type string"]),
]


def test_fractional_quantity_refused_on_one_line_naming_the_field(kubectl, namespace):
    """``cpu: 0.5`` (a JSON number with a fraction) in launcher.resources: a CRD keeps
    quantities as integer-or-string, so it is refused, with one error naming the field (it gave
    five, three of them about anyOf and ``<nil>``); ``"0.5"`` is admitted."""
    refused = apply(kubectl, namespace, manifest("half", launcher={
        "resources": {"limits": {"cpu": 0.5}}}))
    assert refused.returncode != 0
    errors = [line for line in refused.stderr.splitlines() if line.startswith("* ")
              and "some validation rules were not checked" not in line] or [refused.stderr]
    assert len(errors) == 1, refused.stderr
    assert "spec.launcher.resources.limits.cpu: Invalid value" in errors[0]
    assert "must be of type integer,string" in errors[0]
    admitted = apply(kubectl, namespace, manifest("half", launcher={
        "resources": {"limits": {"cpu": "0.5"}, "requests": {"cpu": 1}}}), "--dry-run=server")
    assert admitted.returncode == 0, admitted.stderr


def test_new_rules_refuse_naming_field_and_rule(kubectl, namespace):
    failures = []
    for name, spec, fragments in REFUSED:
        result = apply(kubectl, namespace, manifest(name, **spec))
        missing = [f for f in fragments if f not in result.stderr]
        if result.returncode == 0 or missing:
            failures.append(f"{name}: rc={result.returncode} missing {missing}: {result.stderr}")
    assert not failures, "\n".join(failures)
    assert json.loads(kubectl("get", "monarchjobs", "-n", namespace, "-o", "json"))["items"] == []


ACCEPTED = [
    ("colocated-split", {"meshes": {**COLOCATED, "trainer": {"hosts": 2, "gpus": 3},
                                    "ref": {"hosts": 2, "gpus": 1}}}),
    ("colocated-trainer-only", {"meshes": {**COLOCATED, "trainer": {"hosts": 2, "gpus": 3}}}),
    # spec.meshes is ignored with spmd: one worker is fine although trainer + ref = 2 hosts.
    ("spmd-one-worker", {"workers": {"replicas": 1, "gpusPerWorker": 2},
                         "spmd": {"module": "my_project.train", "nprocPerNode": 2,
                                  "args": ["--config", "big.yaml"]}}),
    ("program-args-env", {"launcher": {"program": "my_rl.train:main", "args": ["--lr", "1e-4"],
                                       # Other MONARCH_* names are the user's (Monarch's own).
                                       "env": [{"name": "HF_HOME", "value": "/cache"},
                                               {"name": "MONARCH_FILE_LOG", "value": "info"}],
                                       "template": {"spec": {"nodeSelector": {"a": "b"}}}}}),
]


def test_new_fields_and_the_samples_accepted(kubectl, namespace):
    for name, spec in ACCEPTED:
        result = apply(kubectl, namespace, manifest(name, **spec), "--dry-run=server")
        assert result.returncode == 0, f"{name}: {result.stderr}"
    for sample in sorted(SAMPLES.glob("*.yaml")):
        result = apply(kubectl, namespace, sample.read_text(), "--dry-run=server")
        assert result.returncode == 0, f"{sample.name}: {result.stderr}"


# Runs in the launcher pod: a program with its own SSH launcher reads the torchforge-style
# hostfile and reaches a worker with the job's key and port, checking the worker's host key
# strictly against the job's known_hosts (issue 10); the worker's ssh session finds the
# pod environment set in spec.workers.template (field case C16).
LAUNCHER_SCRIPT = r"""
set -eu
test "$MONARCH_JOB_NAME" = cpu2 && test -n "$MONARCH_JOB_NAMESPACE" && test "$GREETING" = hi
host=$(head -n 1 "$MONARCH_HOSTFILE" | cut -d ' ' -f 1)
ssh -i "$MONARCH_SSH_KEY" -p "$MONARCH_SSH_PORT" -o BatchMode=yes \
    -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$MONARCH_KNOWN_HOSTS" "$host" python3 - <<'PY'
import json, os, sys
saved = json.load(open(os.environ["MONARCH_POD_ENV_FILE"]))
print("pod env", saved.get("FOO"), saved.get("NCCL_SOCKET_IFNAME"))
sys.exit(0 if (saved.get("FOO"), saved.get("NCCL_SOCKET_IFNAME")) == ("bar", "eth7") else 4)
PY
"""

# Written out so that `cpu: 2` is a YAML integer, as people write it (field case C12A).
RUNS = """\
apiVersion: monarch-operator.dev/v1alpha1
kind: MonarchJob
metadata:
  name: cpu2
spec:
  image: {image}
  workers:
    replicas: 2
    gpusPerWorker: 1
    template:
      spec:
        containers:
          - name: worker
            env:
              - {{name: NCCL_SOCKET_IFNAME, value: eth7}}
              - {{name: FOO, value: bar}}
  launcher:
    command: [sh, -c]
    args: [{script}]
    env:
      - {{name: GREETING, value: hi}}
    resources:
      limits: {{cpu: 2}}
    template:
      metadata:
        labels: {{team: a}}
"""


def test_launcher_with_integer_cpu_env_and_template_runs(kubectl, namespace):
    text = RUNS.format(image=IMAGE, script=json.dumps(LAUNCHER_SCRIPT))
    assert "limits: {cpu: 2}" in text
    result = apply(kubectl, namespace, text)
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 180
    job = None
    while time.monotonic() < deadline:
        job = get_json(kubectl, "monarchjob", "cpu2", "-n", namespace)
        if job and job.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            break
        time.sleep(1)
    assert job and job["status"]["phase"] == "Succeeded", json.dumps(job.get("status"), indent=1)
    template = get_json(kubectl, "pod", "cpu2-launcher", "-n", namespace)
    (container,) = template["spec"]["containers"]
    assert container["resources"]["limits"] == {"cpu": "2"}
    assert container["env"][-1] == {"name": "GREETING", "value": "hi"}
    assert template["metadata"]["labels"]["team"] == "a"
    assert container["command"] == ["sh", "-c", LAUNCHER_SCRIPT]
