"""The trainer/ref placement: ``--trainer-hosts``/``--ref-hosts``/``--colocate`` and their
``MONARCH_*`` variables as a two-role layout (:mod:`.layout`), so every plan comes out of one
code path.

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

The plan's types and printing live in :mod:`.plans` and are re-exported here.
"""

from __future__ import annotations

from monarch_operator.hostfile import Host
from monarch_operator.launcher.hosts.layout import RoleSpec, plan_layout
from monarch_operator.launcher.hosts.plans import (  # re-exported (__all__), as before
    MeshPlan,
    PlacementError,
    Plan,
    RoleNotFound,
    RolePlan,
    format_plan,
    is_loopback_name,
    plan_to_dict,
    refuse_mixed_loopback,
)

__all__ = [
    "COLOCATED_MESH", "REF", "TRAINER", "MeshPlan", "PlacementError", "Plan", "RoleNotFound",
    "RolePlan", "format_plan", "is_loopback_name", "plan_placement", "plan_to_dict",
]

TRAINER = "trainer"
REF = "ref"
# Name of the single host mesh used when both roles share hosts.
COLOCATED_MESH = "workers"


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
    refuse_mixed_loopback(hosts)
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
    return plan_layout(hosts, [RoleSpec(TRAINER, trainer_count), RoleSpec(REF, ref_count)])


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
    # Both roles need GPUs here (min_gpus=1): the old --colocate rule, kept as it was.
    return plan_layout(hosts, [
        RoleSpec(TRAINER, trainer_count, gpus=trainer_gpus, mesh=COLOCATED_MESH, min_gpus=1),
        RoleSpec(REF, gpus=ref_gpus, colocate_with=TRAINER, min_gpus=1),
    ])


def _require_positive(count: int, what: str, hosts: list[Host]) -> None:
    if count < 1:
        raise PlacementError(f"{what} must be at least 1, got {count} ({len(hosts)} hosts given)")
