"""What a placement plan is, and how it is shown: host meshes, the roles on them, unused hosts.

Pure data and formatting, shared by the trainer/ref placement (:mod:`.placement`) and the named
role layout (:mod:`.layout`), which both produce a :class:`Plan`. Also the rules every plan
obeys whoever computed it: one proc shape (slots) per mesh, no loopback names mixed with others.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from monarch_operator.hostfile import Host

# Names that mean "this machine" without being an IP literal.
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class PlacementError(ValueError):
    """The requested roles cannot be placed on the hostfile's hosts; the message says why."""


class RoleNotFound(KeyError):
    """A role the plan does not have was asked for; the message names the roles it has."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such role"


@dataclass(frozen=True)
class MeshPlan:
    """One Monarch host mesh (one worker per host): its name, hosts, and slots per host."""

    name: str
    hosts: tuple[str, ...]
    procs_per_host: int


@dataclass(frozen=True)
class RolePlan:
    """Where one role runs.

    Attributes:
        role: the role name.
        mesh: the host mesh it spawns its procs on.
        hosts: number of hosts (all hosts of the mesh, in order).
        procs_per_host: ranks per host (by default one per GPU; one for a CPU-only role).
        gpus: device indices on every host of the role, set as ``CUDA_VISIBLE_DEVICES`` in each
            of the role's procs; empty for a CPU-only role (``CUDA_VISIBLE_DEVICES`` empty).
    """

    role: str
    mesh: str
    hosts: int
    procs_per_host: int
    gpus: tuple[int, ...] = ()

    @property
    def cuda_visible_devices(self) -> str:
        """The role's ``CUDA_VISIBLE_DEVICES`` value, e.g. ``"2,3"``; ``""`` without GPUs."""
        return ",".join(str(index) for index in self.gpus)

    @property
    def world_size(self) -> int:
        """Number of processes (ranks) of this role."""
        return self.hosts * self.procs_per_host


@dataclass(frozen=True)
class Plan:
    """The whole placement: distinct host meshes, the roles on them (in start order), and the
    hosts no role uses. ``colocated``: some mesh holds more than one role."""

    meshes: tuple[MeshPlan, ...]
    roles: tuple[RolePlan, ...]
    unused_hosts: tuple[str, ...]
    colocated: bool

    @property
    def role_names(self) -> tuple[str, ...]:
        """The roles' names in start order."""
        return tuple(role.role for role in self.roles)

    def role(self, name: str) -> RolePlan:
        """Return the role called ``name``.

        Raises:
            RoleNotFound: the plan has no such role (the message lists the ones it has).
        """
        for role in self.roles:
            if role.role == name:
                return role
        raise RoleNotFound(
            f"this job has no role {name!r}; its roles are {', '.join(self.role_names)}")

    @property
    def trainer(self) -> RolePlan:
        """The ``trainer`` role (raises :class:`RoleNotFound` when the layout has none)."""
        return self.role("trainer")

    @property
    def ref(self) -> RolePlan:
        """The ``ref`` role (raises :class:`RoleNotFound` when the layout has none)."""
        return self.role("ref")

    def mesh(self, name: str) -> MeshPlan:
        """Return the mesh called ``name``; raises KeyError if the plan has none."""
        for mesh in self.meshes:
            if mesh.name == name:
                return mesh
        raise KeyError(name)


def is_loopback_name(name: str) -> bool:
    """True if ``name`` is a loopback IP literal or a well-known loopback host name.

    Only the text is inspected; names that resolve to loopback through DNS or /etc/hosts are
    caught later, by the launcher's address resolution.
    """
    if name.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_mixed_loopback(hosts: list[Host]) -> None:
    """Raise :class:`PlacementError` when loopback names are mixed with other hosts (field case
    C3): a remote worker cannot reach a loopback address of another machine."""
    loopback = [host.name for host in hosts if is_loopback_name(host.name)]
    if loopback and len(loopback) < len(hosts):
        raise PlacementError(
            f"hostfile mixes loopback hosts ({', '.join(loopback)}) with other hosts; remote "
            "workers cannot reach a loopback address, list a routable name or IP instead"
        )


def uniform_mesh(name: str, hosts: list[Host]) -> MeshPlan:
    """The mesh ``name`` over ``hosts``; every host must have the same slots, because Monarch's
    ``spawn_procs(per_host=...)`` takes one shape for the whole mesh.

    Raises:
        PlacementError: the hosts' slots differ (the message lists each host's).
    """
    slots = {host.slots for host in hosts}
    if len(slots) > 1:
        listing = ", ".join(f"{host.name} slots={host.slots}" for host in hosts)
        raise PlacementError(
            f"mesh {name!r} needs the same slots on every host, got: {listing} "
            "(Monarch spawns one proc shape per mesh)"
        )
    return MeshPlan(name=name, hosts=tuple(host.name for host in hosts), procs_per_host=slots.pop())


def _plan_kind(plan: Plan) -> str:
    if not plan.colocated:
        return "separate roles"
    if len(plan.meshes) == 1:
        return "colocated roles"
    return f"{len(plan.roles)} roles on {len(plan.meshes)} host meshes, some colocated"


def format_plan(plan: Plan) -> list[str]:
    """Render the plan as human-readable lines, printed by the launcher before it starts.

    Returns:
        Lines without newlines, e.g. ``mesh trainer: hosts=a,b procs/host=2``; a role without
        GPUs shows ``CUDA_VISIBLE_DEVICES="" (CPU only)``.
    """
    lines = [f"plan: {_plan_kind(plan)}"]
    for mesh in plan.meshes:
        lines.append(
            f"mesh {mesh.name}: hosts={','.join(mesh.hosts)} procs/host={mesh.procs_per_host}"
        )
    for role in plan.roles:
        devices = role.cuda_visible_devices if role.gpus else '"" (CPU only)'
        lines.append(
            f"role {role.role}: mesh={role.mesh} hosts={role.hosts} "
            f"procs/host={role.procs_per_host} world={role.world_size} "
            f"CUDA_VISIBLE_DEVICES={devices}"
        )
    if plan.unused_hosts:
        lines.append(f"unused hosts: {','.join(plan.unused_hosts)}")
    return lines


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Return the plan as plain JSON-ready data (what ``monarch-launch --json`` prints).

    Shape: ``{"colocated": bool, "meshes": [{"name", "hosts": [..], "slots_per_host"}],
    "roles": [{"role", "mesh", "hosts", "procs_per_host", "world_size", "gpus": [..],
    "cuda_visible_devices"}], "unused_hosts": [..]}``; roles in start order, a role's host
    names are its mesh's.
    """
    return {
        "colocated": plan.colocated,
        "meshes": [
            {"name": mesh.name, "hosts": list(mesh.hosts), "slots_per_host": mesh.procs_per_host}
            for mesh in plan.meshes
        ],
        "roles": [
            {
                "role": role.role,
                "mesh": role.mesh,
                "hosts": role.hosts,
                "procs_per_host": role.procs_per_host,
                "world_size": role.world_size,
                "gpus": list(role.gpus),
                "cuda_visible_devices": role.cuda_visible_devices,
            }
            for role in plan.roles
        ],
        "unused_hosts": list(plan.unused_hosts),
    }
