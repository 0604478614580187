"""Named roles on hostfile hosts (issue 33): a list of roles in start order becomes a
:class:`.plans.Plan`. Pure: the plan comes from the hosts and the roles alone (table tests in
tests/unit/test_role_layout.py).

Each role (:class:`RoleSpec`) has

- ``name``: a Monarch mesh name, ``^[a-z][a-z0-9]*$`` and 1-63 characters (Monarch's
  KubernetesJob and MonarchMesh refuse others, so a layout that works over ssh keeps working
  in attach mode);
- ``hosts``: a count N, the next N hosts in host order that no other role took or names (as
  Monarch's SlurmJob slices its host list, in role order), or explicit host names, each in the
  hostfile, in the order listed (rank order follows it);
- ``gpus``: GPUs per host (default: every slot of its hosts); 0 makes a CPU-only role whose
  procs see no GPU (``CUDA_VISIBLE_DEVICES`` set empty);
- ``procs``: procs (ranks) per host, default ``gpus``, or 1 when ``gpus`` is 0;
- ``colocate_with``: another role whose hosts it shares exactly: both roles' procs run on ONE
  host mesh (one Monarch worker per host), with disjoint GPU sets taken in role order. Usually
  an earlier role; a later one is accepted too, as the operator allows it (the mesh is the
  named role's either way); a chain leads to the role that names no partner.

Rules:
- A host belongs to at most one host mesh: Monarch's SSHJob would start a second worker on the
  host's single worker port, which dies with "Address already in use" while ``job.kill()``
  leaks the first ssh (seen with torchmonarch 0.7.0). Roles share hosts only by colocation.
- Every host of a mesh has the same slots (:func:`.plans.uniform_mesh`).
- Colocated roles without ``gpus`` share the slots the others leave evenly, earlier roles
  taking the larger part; the roles' GPUs must fit the slots.
- The hostfile may not mix loopback names with other hosts (:func:`.plans.refuse_mixed_loopback`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from monarch_operator.hostfile import Host
from monarch_operator.launcher.hosts.plans import (
    MeshPlan,
    PlacementError,
    Plan,
    RolePlan,
    refuse_mixed_loopback,
    uniform_mesh,
)

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]*$")
NAME_MAX_LENGTH = 63
NAME_RULE = "lowercase letters and digits, starting with a letter, 1-63 characters (a Monarch " \
            "mesh name)"
# Why no host may serve two meshes, for the messages that refuse it.
_ONE_MESH_PER_HOST = (
    "a host belongs to at most one host mesh: Monarch's SSHJob would start a second worker on "
    "its one worker port, and that worker dies with 'Address already in use'"
)


@dataclass(frozen=True)
class RoleSpec:
    """One role as asked for (see the module doc); :func:`plan_layout` checks it.

    Attributes:
        name: the role's name, also its proc mesh's and (when it starts one) its host mesh's.
        hosts: a count of hosts, or host names as in the hostfile; None only with
            ``colocate_with`` (then the partner's hosts).
        gpus: GPUs per host, 0 or more; None: every slot, or an even share when colocated.
        procs: procs per host, 1 or more; None: ``gpus``, or 1 when that is 0.
        colocate_with: the name of another role whose hosts (one host mesh) it shares.
        mesh: the host mesh's name when this role starts one (None: the role's name); the
            trainer/ref placement names its shared mesh ``workers``.
        min_gpus: the least GPUs a colocated role may get (the trainer/ref placement's rule
            is 1: neither of its roles runs on CPU only).
    """

    name: str
    hosts: int | tuple[str, ...] | None = None
    gpus: int | None = None
    procs: int | None = None
    colocate_with: str | None = None
    mesh: str | None = None
    min_gpus: int = 0


def check_role_name(name: object) -> str:
    """Return ``name`` if it is a valid role name, else raise :class:`PlacementError` naming it
    and the rule (:data:`NAME_RULE`)."""
    if (not isinstance(name, str) or len(name) > NAME_MAX_LENGTH
            or not NAME_PATTERN.match(name)):
        raise PlacementError(f"role {name!r}: the name must be {NAME_RULE}")
    return name


def _check_spec(spec: RoleSpec, earlier: dict[str, RoleSpec]) -> None:
    check_role_name(spec.name)
    if spec.name in earlier:
        raise PlacementError(f"role {spec.name!r} is given twice; role names must be unique")
    if spec.colocate_with is None and spec.hosts is None:
        raise PlacementError(f"role {spec.name!r}: give its hosts (a count or host names)")
    if isinstance(spec.hosts, int) and spec.hosts < 1:
        raise PlacementError(f"role {spec.name!r}: hosts must be at least 1, got {spec.hosts}")
    if isinstance(spec.hosts, tuple):
        if not spec.hosts:
            raise PlacementError(f"role {spec.name!r}: the host list is empty")
        twice = sorted({host for host in spec.hosts if spec.hosts.count(host) > 1})
        if twice:
            raise PlacementError(f"role {spec.name!r} lists {', '.join(twice)} more than once")
    if spec.gpus is not None and spec.gpus < 0:
        raise PlacementError(f"role {spec.name!r}: gpus must be 0 or more, got {spec.gpus}")
    if spec.procs is not None and spec.procs < 1:
        raise PlacementError(f"role {spec.name!r}: procs must be at least 1, got {spec.procs}")


def _anchors(specs: list[RoleSpec]) -> dict[str, str]:
    """Each role's anchor: the role at the end of its colocateWith chain, which names its own
    hosts and gives the mesh (itself when not colocated).

    Raises:
        PlacementError: colocateWith names the role itself, no role of the layout, or a chain
            that comes back to where it started.
    """
    by_name = {spec.name: spec for spec in specs}
    anchor: dict[str, str] = {}
    for spec in specs:
        chain = [spec.name]
        current = spec
        while current.colocate_with is not None:
            partner = current.colocate_with
            if partner == current.name:
                raise PlacementError(f"role {current.name!r}: colocateWith names the role itself")
            if partner not in by_name:
                raise PlacementError(
                    f"role {current.name!r}: colocateWith {partner!r} must name another role of "
                    f"the layout (roles: {', '.join(by_name)})")
            if partner in chain:
                raise PlacementError(
                    f"role {spec.name!r}: colocateWith goes round in a circle "
                    f"({' -> '.join([*chain, partner])}); one role of a colocated set names "
                    "its hosts and no partner")
            chain.append(partner)
            current = by_name[partner]
        anchor[spec.name] = current.name
    return anchor


def _named_hosts(specs: list[RoleSpec], hosts: list[Host]) -> dict[str, tuple[str, ...]]:
    """The hosts of every role that names its hosts and starts a mesh, checked."""
    known = [host.name for host in hosts]
    named: dict[str, tuple[str, ...]] = {}
    owner: dict[str, str] = {}
    for spec in specs:
        if spec.colocate_with is not None or not isinstance(spec.hosts, tuple):
            continue
        for host in spec.hosts:
            if host not in known:
                raise PlacementError(
                    f"role {spec.name!r}: host {host!r} is not in the hostfile (hosts: "
                    f"{', '.join(known)})")
            if host in owner:
                raise PlacementError(
                    f"role {spec.name!r}: host {host!r} is already role {owner[host]!r}'s; "
                    f"{_ONE_MESH_PER_HOST}; to share {owner[host]!r}'s hosts, colocate with it")
            owner[host] = spec.name
        named[spec.name] = spec.hosts
    return named


def _counted_hosts(specs: list[RoleSpec], hosts: list[Host],
                   named: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Give every role that asks for a count of hosts the next ones in host order."""
    taken = {host for names in named.values() for host in names}
    pool = [host.name for host in hosts if host.name not in taken]
    counted = [(spec.name, spec.hosts) for spec in specs
               if spec.colocate_with is None and isinstance(spec.hosts, int)]
    needed = sum(count for _, count in counted)
    if needed > len(pool):
        asked = " + ".join(f"{name} {count}" for name, count in counted)
        if taken:
            raise PlacementError(
                f"roles need {needed} more hosts ({asked}), but only {len(pool)} of the "
                f"hostfile's {len(hosts)} hosts are not named by a role")
        raise PlacementError(
            f"roles need {needed} hosts ({asked}), but the hostfile has {len(hosts)}")
    result: dict[str, tuple[str, ...]] = {}
    start = 0
    for name, count in counted:
        result[name] = tuple(pool[start:start + count])
        start += count
    return result


def _check_colocated_hosts(spec: RoleSpec, partner: str, hosts: tuple[str, ...]) -> None:
    if spec.hosts is None:
        return
    if isinstance(spec.hosts, int) and spec.hosts != len(hosts):
        raise PlacementError(
            f"role {spec.name!r} colocates with {partner!r}, so it shares {partner!r}'s "
            f"{len(hosts)} hosts; it asks for {spec.hosts}")
    if isinstance(spec.hosts, tuple) and set(spec.hosts) != set(hosts):
        raise PlacementError(
            f"role {spec.name!r} colocates with {partner!r}, so it shares exactly "
            f"{partner!r}'s hosts ({', '.join(hosts)}); it lists {', '.join(spec.hosts)}")


def _share_gpus(group: list[RoleSpec], slots: int) -> list[int]:
    """GPUs per host of each role of one mesh, in role order (module doc's rules)."""
    if len(group) == 1:
        (alone,) = group
        wanted = slots if alone.gpus is None else alone.gpus
        if wanted > slots:
            raise PlacementError(
                f"role {alone.name!r} asks for {wanted} GPUs per host, but its hosts have "
                f"{slots} slots")
        return [wanted]
    given = sum(spec.gpus for spec in group if spec.gpus is not None)
    open_roles = [spec for spec in group if spec.gpus is None]
    left = max(slots - given, 0)
    shares = iter([left // len(open_roles) + (1 if index < left % len(open_roles) else 0)
                   for index in range(len(open_roles))] if open_roles else [])
    gpus = [spec.gpus if spec.gpus is not None else next(shares) for spec in group]
    short = any(count < max(spec.min_gpus, 0 if spec.gpus is not None else 1)
                for spec, count in zip(group, gpus, strict=True))
    if short or sum(gpus) > slots:
        asked = " + ".join(f"{count} {spec.name}" for spec, count in zip(group, gpus, strict=True))
        rule = ("each role needs at least 1; a host with 1 slot cannot be shared"
                if any(spec.min_gpus for spec in group) else
                "a role without gpus shares what the others leave and needs at least 1; "
                "gpus=0 makes a CPU-only role")
        raise PlacementError(
            f"colocated roles need disjoint GPUs: {asked} GPUs per host do not fit {slots} "
            f"slots ({rule})")
    return gpus


def plan_layout(hosts: list[Host], specs: list[RoleSpec]) -> Plan:
    """Place ``specs`` (roles in start order) on ``hosts`` (hostfile order); see the module doc.

    Returns:
        The :class:`.plans.Plan`: one mesh per role that does not colocate (in role order,
        named after it), its colocated roles on the same mesh with disjoint GPUs, and the
        hosts no role uses.

    Raises:
        PlacementError: a bad name, count or reference (naming the role and the rule), hosts
            not in the hostfile or asked beyond it (naming the counts), a host in two meshes,
            uneven slots within a mesh, GPUs that do not fit, loopback mixed with other hosts.
    """
    refuse_mixed_loopback(hosts)
    if not specs:
        raise PlacementError("no roles given; a layout needs at least one role")
    checked: dict[str, RoleSpec] = {}
    for spec in specs:
        _check_spec(spec, checked)
        checked[spec.name] = spec
    anchor = _anchors(specs)
    host_sets = _named_hosts(specs, hosts)
    host_sets.update(_counted_hosts(specs, hosts, host_sets))
    by_name = {host.name: host for host in hosts}
    meshes: dict[str, MeshPlan] = {}
    groups: dict[str, list[RoleSpec]] = {}
    for spec in specs:
        if spec.colocate_with is None:
            names = host_sets[spec.name]
            meshes[spec.name] = uniform_mesh(spec.mesh or spec.name,
                                             [by_name[name] for name in names])
        else:
            _check_colocated_hosts(spec, spec.colocate_with, host_sets[anchor[spec.name]])
        groups.setdefault(anchor[spec.name], []).append(spec)
    roles: dict[str, RolePlan] = {}
    for first, group in groups.items():
        mesh = meshes[first]
        start = 0
        for spec, gpus in zip(group, _share_gpus(group, mesh.procs_per_host), strict=True):
            procs = spec.procs if spec.procs is not None else (gpus or 1)
            roles[spec.name] = RolePlan(spec.name, mesh.name, len(mesh.hosts), procs,
                                        tuple(range(start, start + gpus)))
            start += gpus
    used = {host for mesh in meshes.values() for host in mesh.hosts}
    return Plan(
        meshes=tuple(meshes.values()),
        roles=tuple(roles[spec.name] for spec in specs),
        unused_hosts=tuple(host.name for host in hosts if host.name not in used),
        colocated=any(len(group) > 1 for group in groups.values()),
    )
