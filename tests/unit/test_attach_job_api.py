"""Attach mode in the job API and on the worker (issue 23 item 1): the role meshes read from the
launcher's environment or a job's status, ``kubernetes_job()`` giving Monarch's own
``KubernetesJob`` every mesh with a ``kill()`` that leaves the pods alone, and the worker's
address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch_operator.controller.spec import attachmode
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.job import AttachError, AttachMesh, parse_meshes
from monarch_operator.launcher import attachworker
from monarch_operator.launcher.programs.attach import _namespace_and_meshes, meshes_from_env

ROOT = Path(__file__).resolve().parents[2]


def published() -> list[dict]:
    """What the operator publishes for a 2 trainer + 1 ref attach-mode job."""
    job = JobSpec.from_body({"metadata": {"name": "demo", "namespace": "team-a"}, "spec": {
        "image": "img:1", "mode": "attach", "launcher": {"program": "/app/t.py"},
        "workers": {"replicas": 3}, "meshes": {"trainer": {"hosts": 2}, "ref": {"hosts": 1}}}})
    return attachmode.published_meshes(job)


def test_what_the_operator_publishes_parses_back_from_json_and_from_status():
    expected = [AttachMesh(role="trainer", mesh_name="trainer",
                           label_selector=published()[0]["labelSelector"],
                           pod_rank_label="monarch-operator.dev/trainer-rank", replicas=2,
                           port=26600),
                AttachMesh(role="ref", mesh_name="ref",
                           label_selector=published()[1]["labelSelector"],
                           pod_rank_label="monarch-operator.dev/ref-rank", replicas=1,
                           port=26600)]
    assert parse_meshes(json.dumps(published())) == expected
    assert parse_meshes(published()) == expected


@pytest.mark.parametrize("meshes, words", [
    ("not json", "not JSON"),
    ("[]", "non-empty list"),
    ([{"role": "trainer"}], "meshName must be a str"),
    ([{**published()[0], "meshName": "ref_model"}], "no Monarch mesh name"),
    ([{**published()[0], "replicas": 0}], "replicas 0 must be at least 1"),
    ([{**published()[0], "port": True}], "port must be a int"),
])
def test_malformed_meshes_are_refused_saying_what(meshes, words):
    with pytest.raises(AttachError, match=words):
        parse_meshes(meshes)


def test_what_is_given_wins_and_the_rest_comes_from_the_environment():
    environ = {"MONARCH_OPERATOR_NAMESPACE": "team-a"}
    namespace, meshes = _namespace_and_meshes(None, published(), environ)
    assert namespace == "team-a" and len(meshes) == 2
    assert _namespace_and_meshes("team-b", published(), environ)[0] == "team-b"
    with pytest.raises(AttachError, match="pass meshes="):
        _namespace_and_meshes("team-b", None, environ)


def test_meshes_from_env_need_both_variables():
    environ = {"MONARCH_OPERATOR_MESHES": json.dumps(published()),
               "MONARCH_OPERATOR_NAMESPACE": "team-a"}
    namespace, meshes = meshes_from_env(environ)
    assert namespace == "team-a" and [mesh.mesh_name for mesh in meshes] == ["trainer", "ref"]
    with pytest.raises(AttachError, match="spec.mode: attach"):
        meshes_from_env({"MONARCH_OPERATOR_NAMESPACE": "team-a"})


def test_worker_advertises_its_service_name_and_listens_everywhere():
    environ = {"MONARCH_WORKER_DOMAIN": "demo-worker.team-a.svc.cluster.local.",
               "MONARCH_PORT": "26600"}
    name = attachworker.advertised_name("demo-worker-1", environ)
    assert name == "demo-worker-1.demo-worker.team-a.svc.cluster.local"
    assert attachworker.worker_address(name, attachworker.worker_port(environ)) == (
        "tcp://demo-worker-1.demo-worker.team-a.svc.cluster.local:26600@tcp://0.0.0.0:26600")
    assert attachworker.worker_port({}) == 26600


@pytest.mark.parametrize("port", ["0", "70000", "abc"])
def test_worker_refuses_a_bad_port(port):
    with pytest.raises(ValueError):
        attachworker.worker_port({"MONARCH_PORT": port})


def test_attach_worker_bounds_monarchs_log_before_monarch_starts(monkeypatch, tmp_path):
    # Attach mode's worker is a long-lived Monarch worker too: the log level is set before the
    # worker loop (Monarch reads it at its first import), and a user's level wins.
    import monarch.actor

    seen = []
    monkeypatch.setattr(monarch.actor, "run_worker_loop_forever",
                        lambda **_: seen.append(os.environ.get("MONARCH_FILE_LOG")))
    monkeypatch.setattr(attachworker, "reexec_with_entry", lambda: None)
    monkeypatch.setenv("MONARCH_LOG_SUFFIX", f"unit-{os.getpid()}-never-written")
    monkeypatch.setenv("MONARCH_WORKER_DOMAIN", "demo.svc")
    monkeypatch.delenv("MONARCH_FILE_LOG", raising=False)
    assert attachworker.main() == 0
    monkeypatch.setenv("MONARCH_FILE_LOG", "debug")
    assert attachworker.main() == 0
    assert seen == ["warn", "debug"]


# Run with the real torchmonarch in a process of its own (KubernetesJob's constructor changes
# Monarch's process-wide transport setting). No cluster: kill() must not need one.
HELPER_CHECK = textwrap.dedent("""
    import json, sys
    from monarch.job.kubernetes import KubernetesJob
    from monarch_operator.job import kubernetes_job
    job = kubernetes_job()
    assert isinstance(job, KubernetesJob), type(job)
    from monarch.config import get_runtime_config
    transport = get_runtime_config().get("default_transport")
    assert str(transport) == "tcp:127.0.0.1:0", transport  # Monarch writes it so
    meshes = {name: (m["num_replicas"], m["label_selector"], m["pod_rank_label"], m["port"],
                     m["provisioned"]) for name, m in job._meshes.items()}
    job.apply()                   # attach-only meshes: nothing is created
    job.kill()                    # upstream raises NotImplementedError here
    print(json.dumps({"meshes": meshes, "namespace": job._namespace, "active": job.active}))
""")


def test_kubernetes_job_is_monarchs_own_with_every_mesh_and_a_harmless_kill():
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(
                   [str(ROOT / "operator"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "MONARCH_OPERATOR_MESHES": json.dumps(published()),
               "MONARCH_OPERATOR_NAMESPACE": "team-a",
               "MONARCH_CLIENT_ADDRESS": "tcp://127.0.0.1:0",
               "KUBERNETES_SERVICE_HOST": "", "KUBECONFIG": os.devnull}
    done = subprocess.run([sys.executable, "-c", HELPER_CHECK], env=environ, text=True,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["namespace"] == "team-a" and result["active"] is False
    assert result["meshes"] == {
        mesh["meshName"]: [mesh["replicas"], mesh["labelSelector"], mesh["podRankLabel"],
                           mesh["port"], False] for mesh in published()}
