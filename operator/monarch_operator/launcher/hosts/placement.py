"""Pure placement: which hostfile hosts form which Monarch host mesh, and which role runs where.

No Monarch, no sockets, no clock: a plan is computed from the hostfile hosts and the role counts
alone, so every rule here is a table test (tests/unit/test_placement.py).

Rules:
- Separate roles: the trainer takes the first ``trainer_hosts`` hosts in hostfile order, the
  reference model the next ``ref_hosts``; any further hosts stay unused.
- Colocated roles: both roles run on the same first ``trainer_hosts`` hosts, which form ONE host
  mesh (one Monarch worker per host) that gets one ``spawn_procs`` call per role. The host's
  slots (GPUs) are split into disjoint sets: the trainer takes devices ``0..t-1``, the reference
  model ``t..t+r-1``, and each role's procs see only their set through ``CUDA_VISIBLE_DEVICES``.
  Default split: the trainer gets the larger half (``ceil(slots / 2)``), ref the rest.
  A host is never listed in two meshes, because Monarch's SSHJob would start two workers on
  the same port for it, and the second one dies with "Address already in use" while
  ``job.kill()`` leaks the first ssh (seen with torchmonarch 0.7.0).
- Every host of one mesh must have the same slots: ``spawn_procs(per_host=...)`` takes one shape
  for the whole mesh.
- A hostfile that mixes loopback names (``localhost``, ``127.x``, ``::1``) with other hosts is
  refused (field case C3): a remote worker cannot reach a loopback address of another machine.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from monarch_operator.hostfile import Host

TRAINER = "trainer"
REF = "ref"
# Name of the single host mesh used when both roles share hosts.
COLOCATED_MESH = "workers"

# Names that mean "this machine" without being an IP literal.
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class PlacementError(ValueError):
    """The requested roles cannot be placed on the hostfile's hosts; the message says why."""


@dataclass(frozen=True)
class MeshPlan:
    """One Monarch host mesh (one worker per host): its name, hosts, and slots per host."""

    name: str
    hosts: tuple[str, ...]
    procs_per_host: int


@dataclass(frozen=True)
class RolePlan:
    """Where one role (trainer or ref) runs.

    Attributes:
        role: the role name.
        mesh: the host mesh it spawns its procs on.
        hosts: number of hosts (the mesh's hosts, in order).
        procs_per_host: ranks per host, one per GPU.
        gpus: device indices on every host of the role, ``len(gpus) == procs_per_host``; set as
            ``CUDA_VISIBLE_DEVICES`` in each of the role's procs.
    """

    role: str
    mesh: str
    hosts: int
    procs_per_host: int
    gpus: tuple[int, ...] = ()

    @property
    def cuda_visible_devices(self) -> str:
        """The role's ``CUDA_VISIBLE_DEVICES`` value, e.g. ``"2,3"``."""
        return ",".join(str(index) for index in self.gpus)

    @property
    def world_size(self) -> int:
        """Number of processes (ranks) of this role."""
        return self.hosts * self.procs_per_host


@dataclass(frozen=True)
class Plan:
    """The whole placement: distinct host meshes, the two roles on them, and the unused hosts."""

    meshes: tuple[MeshPlan, ...]
    trainer: RolePlan
    ref: RolePlan
    unused_hosts: tuple[str, ...]
    colocated: bool

    @property
    def roles(self) -> tuple[RolePlan, ...]:
        """Every role in start order; printing and JSON go through this, so a further role
        (e.g. a generator) only needs a field here and a rule in :func:`plan_placement`."""
        return (self.trainer, self.ref)

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


def plan_placement(
    hosts: list[Host],
    trainer_hosts: int | None = None,
    ref_hosts: int | None = None,
    colocate: bool = False,
    trainer_gpus: int | None = None,
    ref_gpus: int | None = None,
) -> Plan:
    """Assign hostfile hosts to the trainer and ref meshes.

    Args:
        hosts: hostfile hosts in file order (from :func:`monarch_operator.hostfile.read_hostfile`).
        trainer_hosts: hosts for the trainer. Default: separate roles, every host not given to
            ref; colocated, every host.
        ref_hosts: hosts for the reference model. Default: 1 when separate; when colocated it
            must equal ``trainer_hosts`` (both roles on the same hosts).
        colocate: run both roles on the same hosts, as one host mesh.
        trainer_gpus: colocated only, GPUs (slots) per host for the trainer; default
            ``ceil(slots / 2)``, or ``slots - ref_gpus`` when only ``ref_gpus`` is given.
        ref_gpus: colocated only, GPUs per host for the reference model; default the slots the
            trainer leaves.

    Returns:
        The :class:`Plan`.

    Raises:
        PlacementError: counts below 1, more hosts asked for than the hostfile has, colocated
            roles with different host counts, GPU counts that do not fit the slots, GPU counts
            without colocation, non-uniform slots within one mesh, or loopback names mixed with
            other hosts.
    """
    _refuse_mixed_loopback(hosts)
    if colocate:
        return _plan_colocated(hosts, trainer_hosts, ref_hosts, trainer_gpus, ref_gpus)
    if trainer_gpus is not None or ref_gpus is not None:
        raise PlacementError(
            "--trainer-gpus/--ref-gpus split a host's GPUs between colocated roles; without "
            "--colocate every role takes all slots of its hosts"
        )
    return _plan_separate(hosts, trainer_hosts, ref_hosts)


def _plan_separate(hosts: list[Host], trainer_hosts: int | None, ref_hosts: int | None) -> Plan:
    ref_count = 1 if ref_hosts is None else ref_hosts
    _require_positive(ref_count, "ref hosts", hosts)
    if trainer_hosts is None and len(hosts) <= ref_count:
        raise PlacementError(
            f"{ref_count} ref hosts leave no host for the trainer: {len(hosts)} hosts given, "
            f"separate roles need at least {ref_count + 1}; lower --ref-hosts or use --colocate"
        )
    trainer_count = len(hosts) - ref_count if trainer_hosts is None else trainer_hosts
    _require_positive(trainer_count, "trainer hosts", hosts)
    needed = trainer_count + ref_count
    if needed > len(hosts):
        raise PlacementError(
            f"plan needs {needed} hosts ({trainer_count} trainer + {ref_count} ref, separate), "
            f"but {len(hosts)} are given; lower --trainer-hosts/--ref-hosts or use "
            "--colocate"
        )
    trainer_mesh = _mesh(TRAINER, hosts[:trainer_count])
    ref_mesh = _mesh(REF, hosts[trainer_count:needed])
    return Plan(
        meshes=(trainer_mesh, ref_mesh),
        trainer=_whole_hosts(TRAINER, trainer_mesh),
        ref=_whole_hosts(REF, ref_mesh),
        unused_hosts=tuple(host.name for host in hosts[needed:]),
        colocated=False,
    )


def _whole_hosts(role: str, mesh: MeshPlan) -> RolePlan:
    count = mesh.procs_per_host
    return RolePlan(role, mesh.name, len(mesh.hosts), count, tuple(range(count)))


def _split_gpus(slots: int, trainer_gpus: int | None, ref_gpus: int | None) -> tuple[int, int]:
    """Return (trainer, ref) GPUs per host for colocated roles on hosts with ``slots`` GPUs."""
    if trainer_gpus is None and ref_gpus is None:
        trainer_gpus = (slots + 1) // 2
    if trainer_gpus is None:
        assert ref_gpus is not None
        trainer_gpus = slots - ref_gpus
    if ref_gpus is None:
        ref_gpus = slots - trainer_gpus
    if trainer_gpus < 1 or ref_gpus < 1 or trainer_gpus + ref_gpus > slots:
        raise PlacementError(
            f"colocated roles need disjoint GPUs: {trainer_gpus} trainer + {ref_gpus} ref GPUs "
            f"per host do not fit {slots} slots (each role needs at least 1; a host with 1 slot "
            "cannot be shared)"
        )
    return trainer_gpus, ref_gpus


def _plan_colocated(
    hosts: list[Host],
    trainer_hosts: int | None,
    ref_hosts: int | None,
    trainer_gpus: int | None,
    ref_gpus: int | None,
) -> Plan:
    trainer_count = len(hosts) if trainer_hosts is None else trainer_hosts
    ref_count = trainer_count if ref_hosts is None else ref_hosts
    _require_positive(trainer_count, "trainer hosts", hosts)
    if ref_count != trainer_count:
        raise PlacementError(
            f"colocated roles share their hosts, so ref hosts ({ref_count}) must equal trainer "
            f"hosts ({trainer_count})"
        )
    if trainer_count > len(hosts):
        raise PlacementError(
            f"plan needs {trainer_count} hosts (trainer and ref colocated), but only "
            f"{len(hosts)} are given"
        )
    mesh = _mesh(COLOCATED_MESH, hosts[:trainer_count])
    trainer_share, ref_share = _split_gpus(mesh.procs_per_host, trainer_gpus, ref_gpus)
    trainer_devices = tuple(range(trainer_share))
    ref_devices = tuple(range(trainer_share, trainer_share + ref_share))
    return Plan(
        meshes=(mesh,),
        trainer=RolePlan(TRAINER, mesh.name, trainer_count, trainer_share, trainer_devices),
        ref=RolePlan(REF, mesh.name, trainer_count, ref_share, ref_devices),
        unused_hosts=tuple(host.name for host in hosts[trainer_count:]),
        colocated=True,
    )


def _mesh(name: str, hosts: list[Host]) -> MeshPlan:
    slots = {host.slots for host in hosts}
    if len(slots) > 1:
        listing = ", ".join(f"{host.name} slots={host.slots}" for host in hosts)
        raise PlacementError(
            f"mesh {name!r} needs the same slots on every host, got: {listing} "
            "(Monarch spawns one proc shape per mesh)"
        )
    return MeshPlan(name=name, hosts=tuple(host.name for host in hosts), procs_per_host=slots.pop())


def _require_positive(count: int, what: str, hosts: list[Host]) -> None:
    if count < 1:
        raise PlacementError(f"{what} must be at least 1, got {count} ({len(hosts)} hosts given)")


def _refuse_mixed_loopback(hosts: list[Host]) -> None:
    loopback = [host.name for host in hosts if is_loopback_name(host.name)]
    if loopback and len(loopback) < len(hosts):
        raise PlacementError(
            f"hostfile mixes loopback hosts ({', '.join(loopback)}) with other hosts; remote "
            "workers cannot reach a loopback address, list a routable name or IP instead"
        )


def format_plan(plan: Plan) -> list[str]:
    """Render the plan as human-readable lines, printed by the launcher before it starts.

    Returns:
        Lines without newlines, e.g. ``mesh trainer: hosts=a,b procs/host=2``.
    """
    lines = [f"plan: {'colocated' if plan.colocated else 'separate'} roles"]
    for mesh in plan.meshes:
        lines.append(
            f"mesh {mesh.name}: hosts={','.join(mesh.hosts)} procs/host={mesh.procs_per_host}"
        )
    for role in plan.roles:
        lines.append(
            f"role {role.role}: mesh={role.mesh} hosts={role.hosts} "
            f"procs/host={role.procs_per_host} world={role.world_size} "
            f"CUDA_VISIBLE_DEVICES={role.cuda_visible_devices}"
        )
    if plan.unused_hosts:
        lines.append(f"unused hosts: {','.join(plan.unused_hosts)}")
    return lines


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Return the plan as plain JSON-ready data (what ``monarch-launch --json`` prints).

    Shape: ``{"colocated": bool, "meshes": [{"name", "hosts": [..], "slots_per_host"}],
    "roles": [{"role", "mesh", "hosts", "procs_per_host", "world_size", "gpus": [..],
    "cuda_visible_devices"}], "unused_hosts": [..]}``.
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
