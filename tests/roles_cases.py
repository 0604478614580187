"""Worker groups and roles (docs/roles.md): the four-role example and the specs each rule
refuses, shared by the unit tests (``JobSpec.from_body``) and the cluster test (the CRD's CEL
rules on the real API server), so that both judge the same manifests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monarch_operator.controller.spec import groups as g

IMAGE = "ghcr.io/monarch-operator/worker:0.1.0"

# docs/roles.md's example: generator 4 GPUs x 2 workers, trainer with 2 GPUs and the reference
# model colocated on its worker's other 2, reward on a CPU-only worker.
FOUR_ROLES: dict[str, Any] = {
    "workerGroups": [
        {"name": "generator", "replicas": 2, "gpusPerWorker": 4},
        {"name": "trainer", "replicas": 1, "gpusPerWorker": 4},
        {"name": "reward", "replicas": 1, "gpusPerWorker": 0},
    ],
    "roles": [
        {"name": "generator", "group": "generator"},
        {"name": "trainer", "group": "trainer", "gpus": 2},
        {"name": "ref", "group": "trainer", "colocateWith": "trainer", "gpus": 2},
        {"name": "reward", "group": "reward"},
    ],
    "launcher": {"program": "grpo.controller:main"},
}


def roles_job(name: str = "rl", **spec: Any) -> dict[str, Any]:
    """A MonarchJob with the four-role example, ``spec`` added over it."""
    return {"apiVersion": "monarch-operator.dev/v1alpha1", "kind": "MonarchJob",
            "metadata": {"name": name},
            "spec": {"image": IMAGE, **copy.deepcopy(FOUR_ROLES), **spec}}


@dataclass(frozen=True)
class Refusal:
    """A spec one rule refuses: ``change`` applied to :func:`roles_job`'s spec; ``message``
    the rule's message (the CRD's and ``JobSpec.from_body``'s), ``field`` the path the API
    server names; ``server`` what the API server says instead when the schema (not CEL)
    refuses it."""

    name: str
    change: Callable[[dict[str, Any]], None]
    field: str
    message: str
    server: str | None = None
    job_name: str = "rl"


def _role(index: int, **values: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec["roles"][index].update(values)
    return change


def _group(index: int, **values: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec["workerGroups"][index].update(values)
    return change


def _set(**values: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec.update(copy.deepcopy(values))
    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        del spec[key]
    return change


def _add_role(**role: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        spec["roles"].append(role)
    return change


def _spmd_instead(spec: dict[str, Any]) -> None:
    """spec.spmd instead of the launcher's program (never both: another rule)."""
    del spec["launcher"]
    spec["spmd"] = {"script": "train.py"}


def _many_groups(spec: dict[str, Any]) -> None:
    spec["workerGroups"] += [{"name": f"extra{i}", "replicas": 1, "gpusPerWorker": 0}
                             for i in range(g.MAX_GROUPS + 1 - len(spec["workerGroups"]))]


REFUSALS = [
    Refusal("groups-without-roles", _drop("roles"), "spec.roles", g.MSG_TOGETHER),
    Refusal("roles-without-groups", _drop("workerGroups"), "spec.roles", g.MSG_TOGETHER),
    Refusal("roles-without-program", _drop("launcher"), "spec.launcher", g.MSG_NEEDS_PROGRAM),
    Refusal("groups-with-spmd", _spmd_instead, "spec.spmd", g.MSG_NO_SPMD),
    Refusal("groups-and-workers-replicas", _set(workers={"replicas": 3}), "spec.workers",
            g.MSG_NO_WORKERS),
    Refusal("roles-and-meshes", _set(meshes={"trainer": {"hosts": 2}}), "spec.meshes",
            g.MSG_NO_MESHES),
    Refusal("group-twice", _group(2, name="trainer"), "spec.workerGroups", g.MSG_GROUP_UNIQUE),
    Refusal("role-twice", _role(3, name="trainer"), "spec.roles", g.MSG_ROLE_UNIQUE),
    Refusal("group-name-dash", _group(2, name="re-ward"), "spec.workerGroups[2].name",
            g.MSG_GROUP_NAME),
    Refusal("group-name-launcher", _group(2, name="launcher"), "spec.workerGroups[2].name",
            g.MSG_GROUP_NAME),
    Refusal("role-name-underscore", _role(2, name="ref_model"), "spec.roles[2].name",
            g.MSG_ROLE_NAME),
    Refusal("statefulset-name-too-long", _set(), "spec.workerGroups", g.MSG_SET_LENGTH,
            job_name="j" * 43),
    Refusal("role-group-missing", _role(3, group="scorer"), "spec.roles", g.MSG_ROLE_GROUP),
    Refusal("colocate-other-group", _role(2, colocateWith="reward"), "spec.roles",
            g.MSG_COLOCATE_TARGET),
    Refusal("colocate-unknown-role", _add_role(name="late", group="reward",
                                             colocateWith="zeta"), "spec.roles",
            g.MSG_COLOCATE_TARGET),
    Refusal("colocated-with-hosts", _role(2, hosts=1), "spec.roles[2].hosts",
            g.MSG_COLOCATE_HOSTS),
    Refusal("rest-not-last", _add_role(name="critic", group="generator", hosts=1),
            "spec.roles", g.MSG_REST_LAST),
    Refusal("two-without-hosts", _add_role(name="critic", group="generator"), "spec.roles",
            g.MSG_REST_LAST),
    Refusal("hosts-over-replicas", _role(0, hosts=3), "spec.roles", g.MSG_HOSTS_FIT),
    Refusal("gpus-on-cpu-group", _role(3, gpus=1), "spec.roles", g.MSG_ROLE_GPUS),
    Refusal("colocated-gpus-over", _role(1, gpus=3), "spec.roles", g.MSG_COLOCATED_GPUS),
    Refusal("too-many-groups", _many_groups, "spec.workerGroups",
            "spec.workerGroups must be a list of 1 to 17 items",
            server="must have at most 17 items"),
    Refusal("group-gpus-over", _group(0, gpusPerWorker=65), "spec.workerGroups[0].gpusPerWorker",
            "spec.workerGroups[0].gpusPerWorker must be an integer from 0 to 64",
            server="should be less than or equal to 64"),
    Refusal("group-replicas-missing", _group(0, replicas=None), "spec.workerGroups[0].replicas",
            "spec.workerGroups[0].replicas must be an integer from 1 to 4096",
            server="Required value"),
]


def refused_job(refusal: Refusal) -> dict[str, Any]:
    """The manifest of ``refusal``."""
    body = roles_job(refusal.job_name)
    refusal.change(body["spec"])
    for item in body["spec"].get("workerGroups") or []:
        if item.get("replicas", 0) is None:
            del item["replicas"]
    return body
