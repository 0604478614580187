"""Named worker groups and the roles (Monarch meshes) placed on them (docs/roles.md).

``spec.workerGroups`` gives groups of identical workers, one StatefulSet and headless Service
``<job>-<group>`` each; ``spec.roles`` gives the meshes the launcher makes, each a slice of one
group's workers (``MONARCH_ROLES``). A job without them has one unnamed group from
``spec.workers`` (:data:`monarch_operator.names.LEGACY_GROUP`), children named as before.

The rules here are the CRD's CEL rules on these fields, for callers without a cluster and for
objects admitted under an older CRD; each refusal starts with the CRD rule's message (a unit
test keeps the two lists equal) and then names the group or role.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from monarch_operator import names

# Kueue v0.19 (the version tests/cluster/test_kueue.py installs) allows 18 pod sets in a
# Workload (jobframework.MaxPodSets); one is the launcher's, so 17 groups at most.
MAX_GROUPS = 17
MAX_ROLES = 32
ROLE_NAME_PATTERN = names.GROUP_NAME_PATTERN
# spec.workers' defaults (the CRD's): the values that say "not given" once defaulted.
WORKERS_DEFAULT_REPLICAS = 2
WORKERS_DEFAULT_GPUS = 8
# A worker without GPUs runs one process (its hostfile slots).
CPU_WORKER_SLOTS = 1
# The hostfile ConfigMap's key listing one group's workers: hostfile.<group>.
GROUP_HOSTFILE_KEY_PREFIX = "hostfile."

# The CRD's messages, word for word (tests/unit/test_roles_spec.py compares them).
MSG_TOGETHER = ("workerGroups and roles go together: the roles name the meshes the launcher "
                "makes on the groups' workers")
MSG_NO_SPMD = ("spmd does not apply with workerGroups: monarch-torchrun runs one command on "
               "identical workers; give roles")
MSG_NO_WORKERS = ("with workerGroups, workers.replicas and workers.gpusPerWorker do not apply: "
                  "give replicas and gpusPerWorker per group (workers.template still applies "
                  "to every group)")
MSG_NO_MESHES = "meshes does not apply with roles: the roles say which workers each mesh gets"
MSG_NEEDS_PROGRAM = ("with roles, launcher.program or launcher.command must say what runs on "
                     "them: the built-in example knows only the trainer and ref meshes")
MSG_GROUP_UNIQUE = "workerGroups[].name must be unique"
MSG_ROLE_UNIQUE = "roles[].name must be unique"
MSG_GROUP_NAME = ("workerGroups[].name must be lowercase letters and digits, starting with a "
                  "letter, and not ssh, hostfile, launcher, isolation or progress (it names "
                  "the StatefulSet <job>-<group>)")
MSG_ROLE_NAME = ("roles[].name must be 1-63 lowercase letters and digits, starting with a "
                 "letter: a Monarch mesh name")
MSG_SET_LENGTH = ("metadata.name plus '-' plus each workerGroups[].name must be at most 52 "
                  "characters: the StatefulSet <job>-<group> and its revision hash label must "
                  "stay within 63")
MSG_ROLE_GROUP = "roles[].group must name one of workerGroups"
MSG_COLOCATE_TARGET = ("roles[].colocateWith must name another role on the same group that "
                       "is not itself colocated")
MSG_COLOCATE_HOSTS = ("roles[].hosts does not apply with colocateWith: a colocated role runs on "
                      "the hosts of the role it names")
MSG_REST_LAST = ("a role without hosts takes the rest of its group's workers, so it must be the "
                 "last role on that group (colocated roles aside)")
MSG_HOSTS_FIT = ("the hosts of the roles on a group (at least 1 for a role without hosts, "
                 "colocated roles aside) must add up to at most its replicas")
MSG_ROLE_GPUS = "roles[].gpus must be at most its group's gpusPerWorker"
MSG_COLOCATED_GPUS = ("the gpus of a role and of the roles colocated with it must add up to at "
                      "most their group's gpusPerWorker: they get disjoint GPUs on the same hosts")
RULE_MESSAGES = (MSG_TOGETHER, MSG_NO_SPMD, MSG_NO_WORKERS, MSG_NO_MESHES,
                 MSG_NEEDS_PROGRAM,
                 MSG_GROUP_UNIQUE, MSG_ROLE_UNIQUE, MSG_GROUP_NAME, MSG_ROLE_NAME,
                 MSG_SET_LENGTH, MSG_ROLE_GROUP, MSG_COLOCATE_TARGET, MSG_COLOCATE_HOSTS,
                 MSG_REST_LAST, MSG_HOSTS_FIT, MSG_ROLE_GPUS, MSG_COLOCATED_GPUS)


class GroupRuleError(ValueError):
    """A rule on ``spec.workerGroups`` or ``spec.roles`` is broken (spec.py turns it into
    ``InvalidSpecError``)."""


@dataclass(frozen=True)
class WorkerGroup:
    """One group of identical workers: StatefulSet ``<job>-<name>`` with ``replicas`` pods of
    ``gpus_per_worker`` GPUs (0: none requested) each. ``template`` is the group's own pod
    template, merged over ``spec.workers.template``; ``labelled`` is False only for the
    unnamed group of a job without ``spec.workerGroups`` (its pods carry no group label)."""

    name: str
    replicas: int
    gpus_per_worker: int
    image: str
    template: dict[str, Any] = field(default_factory=dict)
    labelled: bool = True

    @property
    def slots(self) -> int:
        """Hostfile slots of each of its workers: its GPUs, one for a worker without."""
        return self.gpus_per_worker or CPU_WORKER_SLOTS


@dataclass(frozen=True)
class Role:
    """One of ``spec.roles``: a Monarch mesh on ``hosts`` workers of group ``group`` (None: the
    rest of the group, or with ``colocate_with`` the hosts of that role)."""

    name: str
    group: str
    hosts: int | None = None
    gpus: int | None = None
    procs: int | None = None
    colocate_with: str | None = None


def parse_groups(spec: dict[str, Any], job_name: str, image: str,
                 template_of: Any) -> tuple[tuple[WorkerGroup, ...], tuple[Role, ...]]:
    """``spec.workerGroups`` and ``spec.roles`` checked against every rule of the CRD.

    Args:
        template_of: checks a pod template, ``(template, field path) -> template``.

    Raises:
        GroupRuleError: the first rule broken, its CRD message then the group or role.
    """
    raw_groups, raw_roles = spec.get("workerGroups"), spec.get("roles")
    if raw_groups is None and raw_roles is None:
        return (), ()
    _check_job_level(spec, raw_groups, raw_roles)
    groups = tuple(_group(item, index, image, template_of)
                   for index, item in enumerate(raw_groups or []))
    roles = tuple(_role(item, index) for index, item in enumerate(raw_roles or []))
    _check_names(job_name, groups, roles)
    _check_roles(groups, roles)
    return groups, roles


def _check_job_level(spec: dict[str, Any], raw_groups: Any, raw_roles: Any) -> None:
    if (raw_groups is None) != (raw_roles is None):
        raise GroupRuleError(MSG_TOGETHER)
    for path, items, limit in (("spec.workerGroups", raw_groups, MAX_GROUPS),
                               ("spec.roles", raw_roles, MAX_ROLES)):
        if not isinstance(items, list) or not 1 <= len(items) <= limit:
            raise GroupRuleError(f"{path} must be a list of 1 to {limit} items")
    if spec.get("spmd") is not None:
        raise GroupRuleError(MSG_NO_SPMD)
    workers = spec.get("workers") or {}
    if (workers.get("replicas", WORKERS_DEFAULT_REPLICAS) != WORKERS_DEFAULT_REPLICAS
            or workers.get("gpusPerWorker", WORKERS_DEFAULT_GPUS) != WORKERS_DEFAULT_GPUS):
        raise GroupRuleError(MSG_NO_WORKERS)
    meshes = spec.get("meshes") or {}
    trainer, ref = meshes.get("trainer") or {}, meshes.get("ref") or {}
    if (trainer.get("hosts", 1) != 1 or ref.get("hosts", 1) != 1 or meshes.get("colocate")
            or "gpus" in trainer or "gpus" in ref):
        raise GroupRuleError(MSG_NO_MESHES)
    launcher = spec.get("launcher") or {}
    if not (launcher.get("program") or launcher.get("command")):
        raise GroupRuleError(MSG_NEEDS_PROGRAM)


def _item_name(item: Any, path: str, valid: Any, message: str) -> str:
    """The ``name`` of list item ``item`` at ``path``; raises GroupRuleError naming the path
    when the item is no object or ``valid(name)`` is false."""
    if not isinstance(item, dict):
        raise GroupRuleError(f"{path} must be an object")
    name = str(item.get("name") or "")
    if not valid(name):
        raise GroupRuleError(f"{message}: {path}.name {name!r}")
    return name


def _group(item: Any, index: int, image: str, template_of: Any) -> WorkerGroup:
    path = f"spec.workerGroups[{index}]"
    name = _item_name(item, path, names.valid_group_name, MSG_GROUP_NAME)
    replicas = _integer(item, "replicas", path, 1, 4096) or 0
    gpus = _integer(item, "gpusPerWorker", path, 0, 64) or 0
    return WorkerGroup(name=name, replicas=replicas, gpus_per_worker=gpus,
                       image=str(item.get("image") or image),
                       template=template_of(item.get("template"), f"{path}.template"))


def _role(item: Any, index: int) -> Role:
    path = f"spec.roles[{index}]"
    name = _item_name(item, path, names.valid_role_name, MSG_ROLE_NAME)
    if "hosts" in item and item.get("colocateWith") is not None:
        raise GroupRuleError(f"{MSG_COLOCATE_HOSTS}: role {name!r}")
    return Role(name=name, group=str(item.get("group") or ""),
                hosts=_integer(item, "hosts", path, 1, 4096, required=False),
                gpus=_integer(item, "gpus", path, 1, 64, required=False),
                procs=_integer(item, "procs", path, 1, 1024, required=False),
                colocate_with=(str(item["colocateWith"])
                               if item.get("colocateWith") is not None else None))


def _integer(item: dict[str, Any], key: str, path: str, low: int, high: int,
             required: bool = True) -> int | None:
    value = item.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise GroupRuleError(f"{path}.{key} must be an integer from {low} to {high}, "
                             f"not {value!r}")
    return value


def _check_names(job_name: str, groups: tuple[WorkerGroup, ...],
                 roles: tuple[Role, ...]) -> None:
    for kind, message, taken in (("group", MSG_GROUP_UNIQUE, [g.name for g in groups]),
                                 ("role", MSG_ROLE_UNIQUE, [r.name for r in roles])):
        twice = sorted({name for name in taken if taken.count(name) > 1})
        if twice:
            raise GroupRuleError(f"{message}: {kind} {twice[0]!r} is given twice")
    for group in groups:
        if names.group_set_name_problem(job_name, group.name):
            raise GroupRuleError(f"{MSG_SET_LENGTH}: StatefulSet "
                                 f"{names.group_set(job_name, group.name)!r}")


def _check_roles(groups: tuple[WorkerGroup, ...], roles: tuple[Role, ...]) -> None:
    by_name = {group.name: group for group in groups}
    for role in roles:
        if role.group not in by_name:
            raise GroupRuleError(f"{MSG_ROLE_GROUP}: role {role.name!r} names {role.group!r}")
    for role in roles:
        target = next((r for r in roles if r.name == role.colocate_with), None)
        if role.colocate_with is not None and (
                target is None or target is role or target.group != role.group
                or target.colocate_with is not None):
            raise GroupRuleError(f"{MSG_COLOCATE_TARGET}: role {role.name!r} names "
                                 f"{role.colocate_with!r}")
        own = [r for r in roles if r.group == role.group and r.colocate_with is None]
        if role.hosts is None and role.colocate_with is None and own[-1] is not role:
            raise GroupRuleError(f"{MSG_REST_LAST}: role {role.name!r} on group {role.group!r}")
        group = by_name[role.group]
        if role.gpus is not None and role.gpus > group.gpus_per_worker:
            raise GroupRuleError(f"{MSG_ROLE_GPUS}: role {role.name!r} asks {role.gpus}, group "
                                 f"{group.name!r} has {group.gpus_per_worker}")
        if role.colocate_with is None:
            together = [r.gpus for r in roles if r is role or r.colocate_with == role.name]
            if sum(gpus for gpus in together if gpus is not None) > group.gpus_per_worker:
                raise GroupRuleError(f"{MSG_COLOCATED_GPUS}: role {role.name!r} on group "
                                     f"{group.name!r} ({group.gpus_per_worker} per worker)")
    for group in groups:
        wanted = sum(r.hosts or 1 for r in roles
                     if r.group == group.name and r.colocate_with is None)
        if wanted > group.replicas:
            raise GroupRuleError(f"{MSG_HOSTS_FIT}: group {group.name!r} has {group.replicas} "
                                 f"replicas, its roles ask {wanted}")


def role_ordinals(groups: tuple[WorkerGroup, ...],
                  roles: tuple[Role, ...]) -> dict[str, list[int]]:
    """Each role's worker ordinals in its group: roles on one group take consecutive slices
    in role order (one without ``hosts`` the rest); a colocated role the same as the role it
    names, wherever that role comes."""
    replicas = {group.name: group.replicas for group in groups}
    taken = {group.name: 0 for group in groups}
    ordinals: dict[str, list[int]] = {}
    for role in roles:
        if role.colocate_with is None:
            start = taken[role.group]
            end = start + role.hosts if role.hosts is not None else replicas[role.group]
            ordinals[role.name] = list(range(start, end))
            taken[role.group] = end
    for role in roles:  # a colocated role may come before the role it names
        if role.colocate_with is not None:
            ordinals[role.name] = list(ordinals.get(role.colocate_with, []))
    return {role.name: ordinals[role.name] for role in roles}


def roles_env_value(job_name: str, namespace: str, cluster_domain: str,
                    groups: tuple[WorkerGroup, ...], roles: tuple[Role, ...]) -> str:
    """``MONARCH_ROLES``: a JSON list in role order of ``{"name", "hosts": [fqdn, ...],
    "gpus"?, "procs"?, "colocateWith"?}``, each host as its hostfile line names it
    (docs/roles.md; the launcher reads exactly this). A role on a group of 0 GPUs per worker
    gets ``"gpus": 0``: its hostfile lines say ``slots=1`` (one proc), and without it the
    launcher would give that proc device 0 (``CUDA_VISIBLE_DEVICES=0``) rather than none."""
    ordinals = role_ordinals(groups, roles)
    cpu_only = {group.name for group in groups if group.gpus_per_worker == 0}
    entries = []
    for role in roles:
        entry: dict[str, Any] = {"name": role.name, "hosts": [
            names.group_fqdn(job_name, role.group, namespace, ordinal, cluster_domain)
            for ordinal in ordinals[role.name]]}
        gpus = 0 if role.group in cpu_only else role.gpus
        for key, value in (("gpus", gpus), ("procs", role.procs),
                           ("colocateWith", role.colocate_with)):
            if value is not None:
                entry[key] = value
        entries.append(entry)
    return json.dumps(entries)
