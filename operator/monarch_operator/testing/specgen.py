"""Hypothesis strategies for MonarchJob manifests, valid and invalid (issue 9 item 9).

:func:`job_specs` draws a spec that the CRD should admit (images, worker and launcher pod
templates, launcher resources and env, run policy, meshes or spmd, deadlines, suspend, labels
and annotations, quantities written as int, float or string), then applies zero to two *flaws*
from :data:`FLAWS`: bad names, wrong types, out-of-range and huge values, unknown fields, CEL
rule violations, templates the API server refuses, specs that can only wait. Each flaw says
what should happen (:class:`Expect`); :mod:`.speccheck` applies the manifests to a real API
server with the operator running and checks the outcome.

Pods of generated jobs do not run real processes: the worker template carries the local
cluster's ``localcluster.monarch-operator.dev/simulate: ready`` label (kwok makes them Ready
after 1 s) and the launcher either the same with ``succeed`` (Succeeded 1 s later) or a real,
instant ``sh -c 'exit N'`` (docs/local-cluster.md, "Simulated nodes").

Needs ``hypothesis`` (the ``dev`` extra); only tests and ``bench/generated_specs.py`` import it.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"
# The local cluster's simulated pods (localcluster/kwok-stages.yaml).
SIMULATE_LABEL = "localcluster.monarch-operator.dev/simulate"
SIMULATE_READY_AFTER = "localcluster.monarch-operator.dev/simulate-ready-after"
SIMULATE_SUCCEED_AFTER = "localcluster.monarch-operator.dev/simulate-succeed-after"
# Replaced by a unique id (4 digits) when a manifest is made, so every name in a batch differs.
NAME_ID = "{id}"
INT64_MAX = 2**63 - 1
RESERVED_ENV = ("POD_IP", "MONARCH_HOSTFILE", "MONARCH_SSH_KEY", "MONARCH_ATTEMPT",
                "MONARCH_CLIENT_ADDRESS")


class Expect(enum.Enum):
    """What a flaw should lead to."""

    REFUSED = "refused"  # refused at admission (CRD schema or CEL), naming the field
    FAILED = "failed"  # admitted; the job Fails naming a spec field (e.g. TemplateRefused)
    WAIT = "wait"  # admitted; the job waits, saying why (e.g. Unschedulable)
    ANY = "any"  # admitted or refused; only the general properties apply


@dataclass(frozen=True)
class GeneratedSpec:
    """One generated MonarchJob.

    Attributes:
        body: the manifest; ``metadata.name`` contains :data:`NAME_ID`.
        flaws: names of the flaws applied (empty: meant to be valid and to run).
        expects: what each flaw should lead to, in the same order.
        update: the name of a change of :data:`UPDATES` applied to the admitted job once it
            settled (``kubectl apply`` again), or None.
    """

    body: dict[str, Any]
    flaws: tuple[str, ...] = ()
    expects: tuple[Expect, ...] = ()
    update: str | None = None

    def updated_manifest(self, ident: int) -> dict[str, Any]:
        """The manifest after :attr:`update` (the same manifest when there is none)."""
        body = self.manifest(ident)
        for name, change in UPDATES:
            if name == self.update:
                change(body)
        return body

    def manifest(self, ident: int) -> dict[str, Any]:
        """The manifest with job id ``ident`` in its name."""
        body = copy.deepcopy(self.body)
        body["metadata"]["name"] = body["metadata"]["name"].replace(NAME_ID, f"{ident:04d}")
        return body

    @property
    def expected(self) -> Expect | None:
        """The strongest expectation: refused beats failed beats wait; None for a valid spec."""
        for expect in (Expect.REFUSED, Expect.ANY, Expect.FAILED, Expect.WAIT):
            if expect in self.expects:
                return expect
        return None


# ---------------------------------------------------------------------------------------------
# Valid building blocks.

_dns_tail = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z")
_env_names = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,15}\Z").filter(
    lambda name: name not in RESERVED_ENV and not name.startswith("MONARCH_T")
    and not name.startswith("MONARCH_R") and name not in (
        "MONARCH_JOB_NAME", "MONARCH_JOB_NAMESPACE", "MONARCH_SSH_PORT",
        "MONARCH_KNOWN_HOSTS", "MONARCH_COLOCATE"))
_label_values = st.from_regex(r"\A([A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?)?\Z")
_label_keys = st.sampled_from(["team", "kueue.x-k8s.io/queue-name", "example.com/owner",
                               "app.kubernetes.io/part-of", "tier"])
_annotation_values = st.one_of(
    st.text(max_size=40),
    # Large: two of them, and kubectl's last-applied copy of both, stay under the 256 KiB limit.
    st.integers(1_000, 50_000).map(lambda size: "a" * size),
)
# Quantities as people write them: integers and strings with suffixes; in a pod template (free
# form, sent as given) also numbers with a fraction, which the CRD's spec.launcher.resources
# refuses (int-or-string, as CRDs hold quantities; write "0.5" or "500m").
_cpu = st.one_of(st.integers(1, 4), st.sampled_from(["500m", "1", "0.5", "2", "1.5", "100m"]))
_pod_cpu = st.one_of(_cpu, st.sampled_from([0.5, 0.25, 1.5, 0.001]))
_memory = st.one_of(st.sampled_from(["64Mi", "1Gi", "512M", "1e9"]),
                    st.integers(1_048_576, 2**33))


def _env_list(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(_env_names, max_size=4, unique=True))
    env: list[dict[str, Any]] = []
    for name in names:
        if draw(st.booleans()):
            env.append({"name": name, "value": draw(st.text(max_size=30))})
        else:
            env.append({"name": name,
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    return env


def _resources(draw: st.DrawFn, cpu: st.SearchStrategy[Any] = _cpu) -> dict[str, Any]:
    """Requests, or limits, or both equal (requests may never exceed limits)."""
    amounts = {"cpu": draw(cpu)}
    if draw(st.booleans()):
        amounts["memory"] = draw(_memory)
    kind = draw(st.sampled_from(["limits", "requests", "both"]))
    if kind == "both":
        return {"limits": dict(amounts), "requests": dict(amounts)}
    return {kind: amounts}


def _labels(draw: st.DrawFn) -> dict[str, str]:
    labels = draw(st.dictionaries(_label_keys, _label_values, max_size=3))
    if "kueue.x-k8s.io/queue-name" in labels:  # names a LocalQueue: an object name
        labels["kueue.x-k8s.io/queue-name"] = draw(_dns_tail)
    return labels


@st.composite
def _worker_template(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    container: dict[str, Any] = {"name": "worker"}
    if draw(st.booleans()):
        container["env"] = _env_list(draw)
    if draw(st.booleans()):
        container["resources"] = _resources(draw, _pod_cpu)
    if len(container) > 1:
        spec["containers"] = [container]
    if draw(st.booleans()):
        spec["tolerations"] = [{"key": "example.com/gpu", "operator": "Exists"}]
    if draw(st.booleans()):
        spec["terminationGracePeriodSeconds"] = draw(st.integers(0, 30))
    template: dict[str, Any] = {"metadata": {"labels": _labels(draw)}}
    if draw(st.booleans()):
        template["metadata"]["annotations"] = {"example.com/note": draw(st.text(max_size=20))}
    if spec:
        template["spec"] = spec
    return template


@st.composite
def _launcher(draw: st.DrawFn, spmd: bool) -> tuple[dict[str, Any], bool]:
    """``spec.launcher`` and whether its pod runs for real (a quick shell command)."""
    launcher: dict[str, Any] = {}
    real = not spmd and draw(st.integers(0, 3)) == 0
    if real:
        code = draw(st.sampled_from([0, 0, 3]))
        launcher["command"] = ["sh", "-c", f"exit {code}"]
    elif not spmd:
        what = draw(st.sampled_from(["builtin", "program", "command"]))
        if what == "program":
            launcher["program"] = draw(st.sampled_from(["my_rl.train:main", "my_rl.train",
                                                        "/app/train.py"]))
        elif what == "command":
            launcher["command"] = ["python", "-c", "print('hi')"]
        if draw(st.booleans()):
            launcher["args"] = draw(st.lists(st.text(max_size=12), max_size=4))
    if draw(st.booleans()):
        launcher["env"] = _env_list(draw)
    if draw(st.booleans()):
        launcher["resources"] = _resources(draw)
    if draw(st.booleans()):
        launcher["image"] = draw(st.sampled_from([IMAGE, "localhost:5000/launcher:dev"]))
    if draw(st.booleans()):
        launcher["steps"] = draw(st.integers(1, 10_000))
    labels = _labels(draw)
    if not real:
        labels[SIMULATE_LABEL] = draw(st.sampled_from(["succeed", "succeed", "ready"]))
    template: dict[str, Any] = {"metadata": {
        "labels": labels, "annotations": {SIMULATE_SUCCEED_AFTER: "1s"}}}
    if draw(st.booleans()):
        template["spec"] = {"terminationGracePeriodSeconds": draw(st.integers(0, 5))}
    launcher["template"] = template
    return launcher, real


@st.composite
def _meshes_and_spmd(draw: st.DrawFn, replicas: int, gpus: int) -> dict[str, Any]:
    """``meshes`` (separate or colocated roles) or ``spmd``, consistent with the workers."""
    modes = ["spmd"]
    if replicas >= 2:
        modes.append("separate")
    if gpus >= 2:
        modes.append("colocate")
    mode = draw(st.sampled_from(modes))
    if mode == "spmd":
        spmd: dict[str, Any] = (
            {"script": draw(st.sampled_from(["/app/train.py", "train.py"]))}
            if draw(st.booleans()) else
            {"module": draw(st.sampled_from(["my_project.train", "train"]))})
        if draw(st.booleans()):
            spmd["args"] = draw(st.lists(st.text(max_size=10), max_size=3))
        if draw(st.booleans()):
            spmd["nprocPerNode"] = draw(st.integers(1, gpus))
        return {"spmd": spmd}
    if mode == "separate":
        trainer = draw(st.integers(1, replicas - 1))
        ref = draw(st.integers(1, replicas - trainer))
        return {"meshes": {"trainer": {"hosts": trainer}, "ref": {"hosts": ref}}}
    hosts = draw(st.integers(1, replicas))
    meshes: dict[str, Any] = {"trainer": {"hosts": hosts}, "ref": {"hosts": hosts},
                              "colocate": True}
    split = draw(st.sampled_from(["none", "trainer", "both"]))
    if split == "trainer":
        meshes["trainer"]["gpus"] = draw(st.integers(1, gpus - 1))
    elif split == "both":
        trainer_gpus = draw(st.integers(1, gpus - 1))
        meshes["trainer"]["gpus"] = trainer_gpus
        meshes["ref"]["gpus"] = draw(st.integers(1, gpus - trainer_gpus))
    return {"meshes": meshes}


@st.composite
def _run_policy(draw: st.DrawFn) -> dict[str, Any]:
    policy: dict[str, Any] = {}
    if draw(st.booleans()):
        policy["backoffLimit"] = draw(st.integers(0, 1000))
    if draw(st.booleans()):
        policy["infrastructureBackoffLimit"] = draw(st.integers(0, 1000))
    rules = []
    for _ in range(draw(st.integers(0, 2))):
        operator = draw(st.sampled_from(["In", "NotIn"]))
        values = draw(st.lists(st.integers(0 if operator == "NotIn" else 1, 255),
                               min_size=1, max_size=4, unique=True))
        rules.append({"action": draw(st.sampled_from(["FailJob", "Ignore", "Count"])),
                      "onExitCodes": {"operator": operator, "values": values}})
    if rules:
        policy["podFailurePolicy"] = {"rules": rules}
    return policy


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A MonarchJob manifest the CRD admits and whose pods the local cluster can run."""
    replicas = draw(st.integers(1, 3))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    spec: dict[str, Any] = {"image": draw(st.sampled_from(
        [IMAGE, "worker", "localhost:5000/worker@sha256:" + "a" * 64]))}
    spec["workers"] = {"replicas": replicas, "gpusPerWorker": gpus,
                       "template": draw(_worker_template())}
    spec.update(draw(_meshes_and_spmd(replicas, gpus)))
    spec["launcher"], _ = draw(_launcher("spmd" in spec))
    if draw(st.booleans()):
        spec["startupTimeoutSeconds"] = draw(st.integers(10, 86400))
    deadline = draw(st.sampled_from(["none", "none", "small", "large", "huge"]))
    if deadline == "small":
        spec["activeDeadlineSeconds"] = draw(st.integers(1, 5))
    elif deadline == "large":
        spec["activeDeadlineSeconds"] = draw(st.integers(3600, 10**9))
    elif deadline == "huge":
        spec["activeDeadlineSeconds"] = draw(st.sampled_from([INT64_MAX, 10**15, 2**40]))
    ttl = draw(st.sampled_from(["none", "none", "small", "huge"]))
    if ttl == "small":
        spec["ttlSecondsAfterFinished"] = draw(st.integers(0, 3))
    elif ttl == "huge":
        spec["ttlSecondsAfterFinished"] = draw(st.sampled_from([INT64_MAX, 2**31 - 1, 10**12]))
    if draw(st.booleans()):
        spec["cleanupPolicy"] = draw(st.sampled_from(["DeleteWorkers", "DeleteAll", "KeepAll"]))
    if draw(st.integers(0, 5)) == 5:  # not 0: hypothesis draws its simplest values often
        spec["suspend"] = True
    elif draw(st.booleans()):
        spec["suspend"] = False
    if draw(st.booleans()):
        spec["runPolicy"] = draw(_run_policy())
    metadata: dict[str, Any] = {"name": f"g{NAME_ID}-{draw(_dns_tail)}"}
    labels = _labels(draw)
    if labels:
        metadata["labels"] = labels
    if draw(st.booleans()):
        metadata["annotations"] = draw(st.dictionaries(
            st.sampled_from(["example.com/note", "kubectl.kubernetes.io/x", "description"]),
            _annotation_values, max_size=2))
    return {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": metadata, "spec": spec}


# ---------------------------------------------------------------------------------------------
# Flaws: each changes a valid manifest in place; the draw function gives it a value.

# A flaw changes the manifest in place; ``extra`` is a drawn number for flaws that need one.
Flaw = Callable[[int, dict[str, Any]], None]


def _dict_at(body: dict[str, Any], path: str) -> dict[str, Any]:
    """The object at ``path`` (dot-separated) in ``body``, made an empty one where an earlier
    flaw left something else there (or nothing)."""
    node = body
    for key in path.split("."):
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    return node


def _set(path: str, value: Any) -> Flaw:
    """A flaw that sets ``path`` (dot-separated, from the manifest's root) to ``value``."""
    def apply(_: int, body: dict[str, Any]) -> None:
        parent, _dot, last = path.rpartition(".")
        _dict_at(body, parent)[last] = copy.deepcopy(value)
    return apply


def _queue_name(value: str) -> Flaw:
    """A flaw that labels the job with queue name ``value`` (its other labels stay)."""
    def apply(_: int, body: dict[str, Any]) -> None:
        _dict_at(body, "metadata.labels")["kueue.x-k8s.io/queue-name"] = value
    return apply


def _name(template: str) -> Flaw:
    def apply(_: int, body: dict[str, Any]) -> None:
        body["metadata"]["name"] = template
    return apply


def _drop_image(_: int, body: dict[str, Any]) -> None:
    body["spec"].pop("image", None)


def _separate_meshes_too_many(_: int, body: dict[str, Any]) -> None:
    spec = body["spec"]
    spec.pop("spmd", None)
    replicas = spec["workers"]["replicas"]
    spec["meshes"] = {"trainer": {"hosts": replicas}, "ref": {"hosts": 1}}


def _colocate_unequal(_: int, body: dict[str, Any]) -> None:
    spec = body["spec"]
    spec.pop("spmd", None)
    spec["workers"]["gpusPerWorker"] = 2
    spec["workers"]["replicas"] = 3
    spec["meshes"] = {"trainer": {"hosts": 2}, "ref": {"hosts": 1}, "colocate": True}


def _gpus_without_colocate(_: int, body: dict[str, Any]) -> None:
    spec = body["spec"]
    spec.pop("spmd", None)
    spec["workers"]["replicas"] = 2
    spec["meshes"] = {"trainer": {"hosts": 1, "gpus": 1}, "ref": {"hosts": 1}}


def _program_and_command(_: int, body: dict[str, Any]) -> None:
    body["spec"].pop("spmd", None)
    body["spec"]["workers"]["replicas"] = 2
    body["spec"]["meshes"] = {}
    body["spec"]["launcher"].update(program="a.b:main", command=["python"])


def _attach_without_program(_: int, body: dict[str, Any]) -> None:
    body["spec"]["mode"] = "attach"
    body["spec"].pop("spmd", None)
    for key in ("program", "command"):
        body["spec"]["launcher"].pop(key, None)


def _attach_with_spmd(_: int, body: dict[str, Any]) -> None:
    body["spec"]["mode"] = "attach"
    body["spec"]["spmd"] = {"script": "t.py"}
    for key in ("program", "command", "args"):
        body["spec"]["launcher"].pop(key, None)


def _spmd_with(spmd: dict[str, Any], launcher_args: bool = False) -> Flaw:
    def apply(_: int, body: dict[str, Any]) -> None:
        spec = body["spec"]
        spec["spmd"] = copy.deepcopy(spmd)
        for key in ("program", "command"):
            spec["launcher"].pop(key, None)
        if launcher_args:
            spec["launcher"]["args"] = ["--lr", "1"]
        else:
            spec["launcher"].pop("args", None)
    return apply


def _worker_container(field: str, value: Any) -> Flaw:
    def apply(_: int, body: dict[str, Any]) -> None:
        pod = _dict_at(body, "spec.workers.template.spec")
        containers = pod.get("containers")
        if not (isinstance(containers, list) and containers
                and isinstance(containers[0], dict)):
            containers = pod["containers"] = [{"name": "worker"}]
        containers[0][field] = copy.deepcopy(value)
    return apply


def _launcher_env(entry: dict[str, Any]) -> Flaw:
    def apply(_: int, body: dict[str, Any]) -> None:
        launcher = _dict_at(body, "spec.launcher")
        if not isinstance(launcher.get("env"), list):
            launcher["env"] = []
        launcher["env"].append(copy.deepcopy(entry))
    return apply


def _launcher_quantity(value: Any, kind: str = "limits") -> Flaw:
    def apply(_: int, body: dict[str, Any]) -> None:
        _dict_at(body, "spec.launcher")["resources"] = {kind: {"cpu": copy.deepcopy(value)}}
    return apply


def _unschedulable_gpus(extra: int, body: dict[str, Any]) -> None:
    body["spec"]["workers"]["gpusPerWorker"] = 9 + extra % 56  # more than a node has (8)
    body["spec"].pop("meshes", None)
    body["spec"]["spmd"] = {"script": "t.py"}
    for key in ("program", "command", "args"):
        body["spec"]["launcher"].pop(key, None)
    body["spec"]["suspend"] = False


def _worker_pod_field(field: str, value: Any) -> Flaw:
    def apply(_: int, body: dict[str, Any]) -> None:
        _dict_at(body, "spec.workers.template.spec")[field] = copy.deepcopy(value)
        body["spec"]["suspend"] = False
    return apply


def _launcher_template(path: str, value: Any) -> Flaw:
    return _set(f"spec.launcher.template.{path}", value)


def _huge_replicas_suspended(_: int, body: dict[str, Any]) -> None:
    spec = body["spec"]
    spec["workers"]["replicas"] = 4096
    spec["suspend"] = True


R, F, W, A = Expect.REFUSED, Expect.FAILED, Expect.WAIT, Expect.ANY

# (name, what it should lead to, how it changes a valid manifest)
FLAWS: list[tuple[str, Expect, Flaw]] = [
    # metadata
    ("name-too-long", R, _name("g" + NAME_ID + "-" + "x" * 45)),
    ("name-with-dot", R, _name("g" + NAME_ID + ".x")),
    ("name-uppercase", R, _name("G" + NAME_ID + "-Bad")),
    ("name-underscore", R, _name("g" + NAME_ID + "_x")),
    ("name-leading-digit", R, _name(NAME_ID + "-g")),
    ("name-trailing-dash", R, _name("g" + NAME_ID + "-")),
    ("label-value-invalid", R, _set("metadata.labels.team", "bad value!")),
    ("label-key-invalid", R, _set("metadata.labels", {"-bad/key/": "x"})),
    ("annotations-too-large", R, _set("metadata.annotations", {"big": "a" * 300_000})),
    # A valid label value but no LocalQueue name; CEL cannot read labels, the operator refuses.
    ("queue-name-invalid", F, _queue_name("ZB")),
    # image
    ("image-missing", R, _drop_image),
    ("image-empty", R, _set("spec.image", "")),
    ("image-int", R, _set("spec.image", 5)),
    # workers
    ("replicas-zero", R, _set("spec.workers.replicas", 0)),
    ("replicas-negative", R, _set("spec.workers.replicas", -1)),
    ("replicas-too-many", R, _set("spec.workers.replicas", 4097)),
    ("replicas-beyond-int64", R, _set("spec.workers.replicas", 2**64)),
    ("replicas-string", R, _set("spec.workers.replicas", "2")),
    ("replicas-float", R, _set("spec.workers.replicas", 1.5)),
    ("gpus-zero", R, _set("spec.workers.gpusPerWorker", 0)),
    ("gpus-too-many", R, _set("spec.workers.gpusPerWorker", 65)),
    ("workers-template-list", R, _set("spec.workers.template", ["x"])),
    ("workers-unknown-field", R, _set("spec.workers.podsPerHost", 2)),
    ("replicas-huge-suspended", A, _huge_replicas_suspended),
    # meshes and spmd
    ("meshes-exceed-workers", R, _separate_meshes_too_many),
    ("colocate-unequal-hosts", R, _colocate_unequal),
    ("gpus-without-colocate", R, _gpus_without_colocate),
    ("program-and-command", R, _program_and_command),
    ("spmd-script-and-module", R, _spmd_with({"script": "t.py", "module": "m"})),
    ("spmd-neither", R, _spmd_with({"args": ["x"]})),
    ("spmd-launcher-args", R, _spmd_with({"script": "t.py"}, launcher_args=True)),
    ("spmd-nproc-too-large", R, _spmd_with({"script": "t.py", "nprocPerNode": 65})),
    ("spmd-module-invalid", R, _spmd_with({"module": "1bad-module"})),
    # spec.mode (attach mode: docs/attach.md)
    ("mode-unknown", R, _set("spec.mode", "mpi")),
    ("attach-without-program", R, _attach_without_program),
    ("attach-with-spmd", R, _attach_with_spmd),
    # launcher
    ("program-dash", R, _set("spec.launcher.program", "-x")),
    ("program-empty", R, _set("spec.launcher.program", "")),
    ("steps-zero", R, _set("spec.launcher.steps", 0)),
    ("args-too-many", R, _set("spec.launcher.args", ["a"] * 1025)),
    ("args-not-strings", R, _set("spec.launcher.args", [1, 2])),
    ("env-reserved", R, _launcher_env({"name": "MONARCH_HOSTFILE", "value": "/x"})),
    ("env-without-name", R, _launcher_env({"value": "x"})),
    ("env-value-int", R, _launcher_env({"name": "N", "value": 5})),
    ("quantity-words", R, _launcher_quantity("2 cores")),
    ("quantity-object", R, _launcher_quantity({"a": 1})),
    ("quantity-bool", R, _launcher_quantity(True)),
    ("quantity-empty", R, _launcher_quantity("")),
    ("launcher-unknown-field", R, _set("spec.launcher.programme", "x")),
    ("launcher-template-string", R, _set("spec.launcher.template", "x")),
    # life cycle
    ("startup-too-short", R, _set("spec.startupTimeoutSeconds", 5)),
    ("startup-too-long", R, _set("spec.startupTimeoutSeconds", 86401)),
    ("deadline-zero", R, _set("spec.activeDeadlineSeconds", 0)),
    ("deadline-beyond-int64", R, _set("spec.activeDeadlineSeconds", 2**64)),
    ("ttl-negative", R, _set("spec.ttlSecondsAfterFinished", -1)),
    ("cleanup-unknown", R, _set("spec.cleanupPolicy", "Never")),
    ("suspend-string", R, _set("spec.suspend", "yes")),
    ("backoff-negative", R, _set("spec.runPolicy.backoffLimit", -1)),
    ("backoff-too-large", R, _set("spec.runPolicy.backoffLimit", 1001)),
    ("rule-zero-in", R, _set("spec.runPolicy.podFailurePolicy",
                             {"rules": [{"action": "Count", "onExitCodes": {"values": [0]}}]})),
    ("rule-duplicate-codes", R, _set("spec.runPolicy.podFailurePolicy", {"rules": [
        {"action": "Count", "onExitCodes": {"values": [3, 3]}}]})),
    ("rule-code-too-large", R, _set("spec.runPolicy.podFailurePolicy", {"rules": [
        {"action": "Count", "onExitCodes": {"values": [256]}}]})),
    ("rule-unknown-action", R, _set("spec.runPolicy.podFailurePolicy", {"rules": [
        {"action": "Restart", "onExitCodes": {"values": [3]}}]})),
    ("spec-unknown-field", R, _set("spec.replicas", 3)),
    # admitted, then refused by the API server when the operator creates the child
    ("worker-restart-never", F, _worker_pod_field("restartPolicy", "Never")),
    ("worker-quantity-words", F, _worker_container("resources", {"limits": {"cpu": "2 cores"}})),
    ("worker-quantity-negative", F, _worker_container("resources", {"requests": {"cpu": -1}})),
    ("worker-env-not-list", F, _worker_container("env", "A=1")),
    ("worker-node-selector-string", F, _worker_pod_field("nodeSelector", "gpu")),
    ("worker-bad-container", F, _worker_pod_field("containers", [{"name": "Bad_Name",
                                                                  "image": "x"}])),
    ("launcher-requests-over-limits", F, _set("spec.launcher.resources", {
        "limits": {"cpu": 1}, "requests": {"cpu": 2}})),
    ("launcher-env-name-equals", F, _launcher_env({"name": "A=B", "value": "x"})),
    ("launcher-env-value-from-empty", F, _launcher_env({"name": "EMPTY", "valueFrom": {}})),
    ("launcher-image-empty", F, _set("spec.launcher.image", "")),
    # admitted; odd but possible shapes inside the free-form templates
    ("worker-template-spec-null", A, _set("spec.workers.template.spec", None)),
    ("worker-template-metadata-string", A, _set("spec.workers.template.metadata", "x")),
    ("worker-template-spec-string", A, _set("spec.workers.template.spec", "x")),
    ("worker-containers-null", A, _worker_pod_field("containers", None)),
    ("worker-resources-null", A, _worker_container("resources", None)),
    ("worker-unknown-pod-field", F, _worker_pod_field("nodeSelectr", {"a": "b"})),
    ("launcher-unknown-container-field", F, _launcher_template(
        "spec.containers", [{"name": "launcher", "imagePullPolicyy": "Always"}])),
    ("worker-empty-dir-quantity", A, _worker_pod_field("volumes", [
        {"name": "scratch", "emptyDir": {"sizeLimit": 1073741824}}])),
    ("launcher-template-metadata-string", A, _launcher_template("metadata", "x")),
    ("launcher-template-spec-string", A, _launcher_template("spec", "x")),
    ("launcher-template-containers-string", A, _launcher_template("spec.containers", "x")),
    ("launcher-restart-always", A, _launcher_template("spec.restartPolicy", "Always")),
    ("launcher-float-cpu", R, _launcher_quantity(0.5)),
    ("launcher-huge-cpu", A, _launcher_quantity("1e100")),
    ("launcher-claims", A, _set("spec.launcher.resources", {"claims": [{"name": "gpu"}]})),
    # admitted; the workers can never be scheduled or created: a reasoned wait
    ("unschedulable-gpus", W, _unschedulable_gpus),
    ("node-selector-no-match", W, _worker_pod_field("nodeSelector", {"example.com/pool": "none"})),
    ("service-account-missing", W, _worker_pod_field("serviceAccountName", "missing")),
    ("priority-class-missing", W, _worker_pod_field("priorityClassName", "missing")),
]


@st.composite
def job_specs(draw: st.DrawFn) -> GeneratedSpec:
    """A valid MonarchJob manifest (see :func:`valid_specs`) with 0-2 flaws of :data:`FLAWS`."""
    body = draw(valid_specs())
    count = draw(st.sampled_from([0, 1, 1, 2]))
    chosen = draw(st.lists(st.sampled_from(range(len(FLAWS))), min_size=count, max_size=count,
                           unique=True))
    return with_flaws(body, tuple(chosen), draw(st.integers(0, 2**16)))


def with_flaws(body: dict[str, Any], flaws: tuple[int, ...], extra: int) -> GeneratedSpec:
    """``body`` (a valid manifest, changed in place) with the flaws at indices ``flaws`` of
    :data:`FLAWS` applied in order, its workers simulated."""
    for index in flaws:
        FLAWS[index][2](extra, body)
    _simulate_workers(body)
    return GeneratedSpec(body, tuple(FLAWS[i][0] for i in flaws),
                         tuple(FLAWS[i][1] for i in flaws))


def _spec_change(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        parent, _dot, last = path.rpartition(".")
        _dict_at(body, parent)[last] = copy.deepcopy(value)
    return apply


def _bump_replicas(body: dict[str, Any]) -> None:
    workers = _dict_at(body, "spec.workers")
    workers["replicas"] = int(workers.get("replicas", 2)) + 1


def _both(*changes: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        for change in changes:
            change(body)
    return apply


# Spec changes applied to an admitted job that settled (issue 9 item 8: what may change while
# a job exists). What the job runs may change only while it is (or becomes) suspended; the CRD's
# transition rules refuse the rest naming the field.
UPDATES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("suspend", _spec_change("spec.suspend", True)),
    ("resume", _spec_change("spec.suspend", False)),
    ("image", _spec_change("spec.image", "ghcr.io/monarch-operator/worker:0.2.0")),
    ("image-suspended", _both(_spec_change("spec.image", "ghcr.io/monarch-operator/worker:0.2.0"),
                              _spec_change("spec.suspend", True))),
    ("replicas", _bump_replicas),
    ("replicas-suspended", _both(_bump_replicas, _spec_change("spec.suspend", True))),
    ("launcher-env", _spec_change("spec.launcher.env", [{"name": "NEW", "value": "1"}])),
    ("deadline", _spec_change("spec.activeDeadlineSeconds", 3600)),
    ("deadline-short", _spec_change("spec.activeDeadlineSeconds", 1)),
    ("ttl", _spec_change("spec.ttlSecondsAfterFinished", 1)),
    ("cleanup", _spec_change("spec.cleanupPolicy", "KeepAll")),
    ("run-policy", _spec_change("spec.runPolicy.backoffLimit", 2)),
    ("startup-timeout", _spec_change("spec.startupTimeoutSeconds", 10)),
    ("labels", _spec_change("metadata.labels", {"team": "b"})),
]
# Every UPDATE_EVERY-th spec gets a change once admitted, the changes in turn.
UPDATE_EVERY = 3


# Every VALID_EVERY-th spec has no flaw; the others take the flaws in turn, in an order that
# mixes the kinds (a stride through FLAWS), so that a few dozen specs cover many kinds of flaw
# and 500 cover each several times; every SECOND_FLAW_EVERY-th flawed spec gets a second,
# drawn one.
VALID_EVERY = 4
SECOND_FLAW_EVERY = 5
_FLAW_STRIDE = 29


def planned_flaws(index: int, drawn: int) -> tuple[int, ...]:
    """The flaws (indices into :data:`FLAWS`) of the ``index``-th spec; ``drawn`` picks the
    second flaw where there is one."""
    if index % VALID_EVERY == VALID_EVERY - 1:
        return ()
    flawed = index - index // VALID_EVERY
    first = (flawed * _FLAW_STRIDE) % len(FLAWS)
    if flawed % SECOND_FLAW_EVERY != SECOND_FLAW_EVERY - 1:
        return (first,)
    second = drawn % (len(FLAWS) - 1)
    return (first, second if second < first else second + 1)


def generate_specs(count: int, seed: int | None = None) -> list[GeneratedSpec]:
    """``count`` specs: valid manifests drawn by hypothesis, with :func:`planned_flaws`.

    No shrinking: each spec is checked once, on a cluster, and reported whole.

    Args:
        seed: hypothesis's seed; None: derandomized (the same specs every run, for CI).
    """
    specs: list[GeneratedSpec] = []
    drawn = st.tuples(valid_specs(), st.integers(0, 2**16), st.integers(0, 2**16))

    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              derandomize=seed is None, suppress_health_check=list(HealthCheck))
    @given(drawn)
    def draw_one(example: tuple[dict[str, Any], int, int]) -> None:
        # The plan is applied after the draw, so that what hypothesis draws never depends on
        # how many specs came before (it checks that its draws are reproducible).
        body, pick, extra = example
        if len(specs) < count:
            index = len(specs)
            spec = with_flaws(copy.deepcopy(body), planned_flaws(index, pick), extra)
            if index % UPDATE_EVERY == UPDATE_EVERY - 1:  # the changes in turn
                name, _ = UPDATES[(index // UPDATE_EVERY) % len(UPDATES)]
                spec = dataclasses.replace(spec, update=name)
            specs.append(spec)

    run = draw_one if seed is None else hypothesis_seed(seed)(draw_one)
    while len(specs) < count:  # hypothesis may stop before max_examples; draw more
        run()
    return specs


def _simulate_workers(body: dict[str, Any]) -> None:
    """Worker pods are simulated (kwok makes them Ready after 1 s): label their template, unless
    a flaw made its metadata something else than an object."""
    workers = body["spec"].get("workers")
    if not isinstance(workers, dict) or not isinstance(workers.get("template"), dict):
        return
    metadata = workers["template"].setdefault("metadata", {})
    if isinstance(metadata, dict):
        if not isinstance(metadata.get("labels"), dict):
            metadata["labels"] = {}
        metadata["labels"][SIMULATE_LABEL] = "ready"
