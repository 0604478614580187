"""The cache keeps only the fields a pass reads (:mod:`monarch_operator.controller.k8s.slim`).

Passes of a job in each stage (workers starting, one not Ready, all Ready, launcher running,
launcher ended, a launch adopted after a restart) run over views whose children are full
objects (worker pods with the spec their StatefulSet gives them, the StatefulSet, Secret,
Service and policy as the builders make them) that record every field a pass asks for, even
one the object lacks. A field read that :func:`slim.slim` drops fails the test, naming it;
the same passes over the slimmed children write the same status and create the same objects.
"""

from __future__ import annotations

import copy
import datetime as dt
import types
from typing import Any

import pytest

from monarch_operator import constants, names
from monarch_operator.controller.builders.statefulset import build_worker_statefulset
from monarch_operator.controller.engine import passes
from monarch_operator.controller.k8s import cache, slim
from monarch_operator.controller.spec.settings import Settings
from monarch_operator.controller.spec.spec import JobSpec
from tests.unit.test_launch_pass import (  # noqa: F401  (fixtures)
    JOB_KIND,
    KINDS,
    NAME,
    NAMESPACE,
    REPLICAS,
    api,
    deletes,
    job_body,
    launcher_pod,
    make_view,
    ready_worker,
    run_pass,
    running_status,
    unrecorded_launch,
)

Path = tuple[str, ...]


class Recording(dict):  # type: ignore[type-arg]
    """A dict that logs ``(kind, path)`` of every key asked for (``[]``, ``get``, ``in``),
    present or not; nested dicts are Recordings too (list items under ``*``)."""

    def __init__(self, data: dict[str, Any], kind: tuple[str, str], path: Path,
                 log: set[tuple[tuple[str, str], Path]]) -> None:
        super().__init__({key: _wrap(value, kind, (*path, key), log)
                          for key, value in data.items()})
        self._kind, self._path, self._log = kind, path, log

    def _note(self, key: object) -> None:
        self._log.add((self._kind, (*self._path, str(key))))

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return copy.deepcopy(dict(self), memo)


def _wrap(value: Any, kind: tuple[str, str], path: Path,
          log: set[tuple[tuple[str, str], Path]]) -> Any:
    if isinstance(value, dict):
        return Recording(value, kind, path, log)
    if isinstance(value, list):
        return [_wrap(item, kind, (*path, "*"), log) for item in value]
    return value


def kept(kind: tuple[str, str], path: Path) -> bool:
    """Whether :func:`slim.slim` keeps what is at ``path`` of an object of ``kind``."""
    if not path or path[0] in ("apiVersion", "kind"):
        return True
    if path[0] == "metadata":
        return path[1:2] != ("managedFields",)
    sections = slim.KEPT_SECTIONS.get(kind)
    if sections is None:
        return True
    if path[0] not in sections:
        return False
    if kind == ("v1", "Pod") and path[0] == "spec" and len(path) > 1:
        if path[1] not in slim.POD_SPEC_FIELDS:
            return False
        return not (path[1] == "containers" and len(path) > 3
                    and path[3] not in slim.POD_CONTAINER_FIELDS)
    return True


def full_worker(ordinal: int, ready: bool = True, phase: str = "Running") -> dict[str, Any]:
    """A worker pod as the API server holds it: the StatefulSet template's spec and metadata."""
    settings = Settings.from_env()
    template = build_worker_statefulset(JobSpec.from_body(job_body()), settings)["spec"][
        "template"]
    pod = ready_worker(ordinal)
    pod["metadata"]["labels"] = {**template["metadata"].get("labels", {}),
                                 **pod["metadata"]["labels"]}
    pod["metadata"]["annotations"] = dict(template["metadata"].get("annotations") or {})
    pod["metadata"]["managedFields"] = [{"manager": "kube-controller-manager"}]
    pod["spec"] = {**copy.deepcopy(template["spec"]), "nodeName": f"node-{ordinal}"}
    pod["status"]["phase"] = phase
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                   {"type": "Ready", "status": "True" if ready else "False"}]
    pod["status"]["containerStatuses"] = [{
        "name": "worker", "ready": ready, "restartCount": 0, "imageID": "img@sha256:aa",
        "state": {"running": {"startedAt": "2026-12-02T04:15:01Z"}}}]
    return pod


def failed_launcher(settings: Settings) -> dict[str, Any]:
    pod = launcher_pod(settings, creationTimestamp="2026-12-02T04:17:05Z")
    pod["status"] = {"phase": "Failed", "containerStatuses": [{
        "name": "launcher", "restartCount": 0, "imageID": "img@sha256:bb", "state": {
            "terminated": {"exitCode": 3, "reason": "Error", "message": "rank 0 exited 3",
                           "startedAt": "2026-12-02T04:17:06Z",
                           "finishedAt": "2026-12-02T04:17:10Z"}}}]}
    return pod


def scenarios(settings: Settings) -> dict[str, tuple[dict[str, Any] | None,
                                                     list[dict[str, Any]], bool]]:
    """name -> (status, pods, workers' StatefulSet exists)."""
    running = running_status(settings)
    adopted_status, adopted_pods = unrecorded_launch(settings, "2026-12-02T04:17:01Z")
    adopted = [full_worker(0), full_worker(1), *adopted_pods[REPLICAS:]]
    for pod, old in zip(adopted, adopted_pods, strict=False):
        pod["metadata"]["creationTimestamp"] = old["metadata"].get("creationTimestamp")
    pending = full_worker(1, ready=False, phase="Pending")
    pending["spec"].pop("nodeName")
    pending["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}
    return {
        "first pass": (None, [], False),
        "one worker not Ready": (None, [full_worker(0), full_worker(1, ready=False)], True),
        "one worker unschedulable": (None, [full_worker(0), pending], True),
        "every worker Ready": (None, [full_worker(0), full_worker(1)], True),
        "launcher running": (running, [full_worker(0), full_worker(1),
                                       launcher_pod(settings)], True),
        "launcher failed": (running, [full_worker(0), full_worker(1),
                                      failed_launcher(settings)], True),
        "launch adopted": (adopted_status, adopted, True),
    }


def view_of(settings: Settings, status: dict[str, Any] | None, pods: list[dict[str, Any]],
            workers: bool, shape: Any) -> cache.JobView:
    """The scenario's view, each child passed through ``shape(kind, body)``."""
    base = make_view(settings, status, worker_pods=pods, workers=workers)
    job_cache = cache.JobCache(JOB_KIND)
    job_cache.attach(JOB_KIND, {(NAMESPACE, NAME): [base.job]})
    for kind in KINDS:
        bodies = list(base.children.get(kind, {}).values())
        job_cache.attach(kind, {(NAMESPACE, NAME): [shape(kind, body) for body in bodies]})
    return job_cache.view((NAMESPACE, NAME))


SCENARIOS = list(scenarios(Settings.from_env()))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_pass_reads_only_fields_the_cache_keeps(scenario, api, deletes):  # noqa: F811
    settings = Settings.from_env()
    status, pods, workers = scenarios(settings)[scenario]
    log: set[tuple[tuple[str, str], Path]] = set()
    run_pass(settings, view_of(settings, status, pods, workers,
                               lambda kind, body: _wrap(copy.deepcopy(body), kind, (), log)))
    assert log, "the pass read no child: the scenario tests nothing"
    dropped = sorted(f"{kind[1]} {'.'.join(path)}" for kind, path in log if not kept(kind, path))
    assert not dropped, f"read by a pass but dropped by slim.slim: {dropped}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_pass_over_slim_children_does_what_it_does_over_full_ones(scenario, api, deletes,  # noqa: F811
                                                                  monkeypatch):
    settings = Settings.from_env()
    # Both passes at one moment: a second ticking over between them changed the condition
    # times they wrote, and the outcomes differed for that alone (a flake under load).
    moment = dt.datetime.now(dt.UTC)

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001, ANN206
            return moment

    monkeypatch.setattr(passes, "dt", types.SimpleNamespace(datetime=Frozen, UTC=dt.UTC))
    outcomes = []
    for shape in (lambda kind, body: copy.deepcopy(body), slim.slim):
        status, pods, workers = scenarios(settings)[scenario]
        api["creates"].clear()
        api["status"].clear()
        deletes.clear()
        report = run_pass(settings, view_of(settings, status, pods, workers, shape))
        outcomes.append((list(api["creates"]), copy.deepcopy(api["status"]), list(deletes),
                         [(e.type, e.reason, e.message) for e in report.events]))
    assert outcomes[0] == outcomes[1]


def test_the_check_catches_a_read_of_a_dropped_field():
    """The recording sees a read of a field slim drops (a pod's volumes, a container's env,
    a StatefulSet's spec), and of one it keeps, so the test above can fail."""
    log: set[tuple[tuple[str, str], Path]] = set()
    pod = _wrap(full_worker(0), ("v1", "Pod"), (), log)
    statefulset = _wrap({"metadata": {"name": "s"}, "spec": {"replicas": 2}},
                        ("apps/v1", "StatefulSet"), (), log)
    assert pod["spec"].get("volumes") and pod["spec"]["containers"][0].get("env") is not None
    assert pod["spec"]["containers"][0]["readinessProbe"] and pod["status"]["phase"]
    assert statefulset["spec"]["replicas"] == 2
    dropped = {(kind[1], ".".join(path)) for kind, path in log if not kept(kind, path)}
    assert dropped == {("Pod", "spec.volumes"), ("Pod", "spec.containers.*.env"),
                       ("StatefulSet", "spec"), ("StatefulSet", "spec.replicas")}


def test_slim_keeps_what_passes_read_and_drops_the_rest():
    pod = full_worker(0)
    cached = slim.slim(("v1", "Pod"), pod)
    assert "managedFields" not in cached["metadata"] and "managedFields" in pod["metadata"]
    assert cached["status"] is pod["status"]
    assert cached["spec"] == {"nodeName": "node-0", "containers": [
        {"name": c["name"], **({"readinessProbe": c["readinessProbe"]}
                               if "readinessProbe" in c else {})}
        for c in pod["spec"]["containers"]]}
    assert set(pod["spec"]) - set(cached["spec"]), "the worker spec had nothing to drop"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
              "data": {"id_ed25519": "a2V5"}, "type": "Opaque"}
    assert slim.slim(("v1", "Secret"), secret) == {"apiVersion": "v1", "kind": "Secret",
                                                   "metadata": {"name": "s"}}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p"},
                 "data": {"report": "{}"}}
    assert slim.slim(("v1", "ConfigMap"), configmap) == configmap
    job = job_body({"phase": "Running"})
    assert slim.slim(JOB_KIND, job) == job
    assert constants.LABEL_JOB in slim.slim(("v1", "Pod"), pod)["metadata"]["labels"]
    assert names.worker_pod(NAME, 0) == cached["metadata"]["name"]
