"""Placement of the trainer and ref roles on hostfile hosts: a table of named cases.

Pure: no Monarch, no sockets. Rules are documented in monarch_operator/launcher/placement.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from monarch_operator.hostfile import Host
from monarch_operator.launcher.placement import (
    COLOCATED_MESH,
    REF,
    TRAINER,
    PlacementError,
    format_plan,
    is_loopback_name,
    plan_placement,
)


def hosts(*spec: str) -> list[Host]:
    """``hosts("a:2", "b:2")`` -> two Hosts with 2 slots each."""
    result = []
    for item in spec:
        name, slots = item.rsplit(":", 1)
        result.append(Host(name, int(slots)))
    return result


@dataclass(frozen=True)
class Case:
    """One placement request and the meshes it must produce: ``{mesh: (hosts, procs/host)}``."""

    name: str
    hostfile: list[Host]
    trainer_hosts: int | None
    ref_hosts: int | None
    colocate: bool
    meshes: dict[str, tuple[tuple[str, ...], int]]
    trainer_world: int
    ref_world: int
    unused: tuple[str, ...] = ()


# fmt: off
CASES = [
    Case("separate 2+1", hosts("a:2", "b:2", "c:1"), 2, 1, False,
         {TRAINER: (("a", "b"), 2), REF: (("c",), 1)}, trainer_world=4, ref_world=1),
    Case("separate defaults: ref gets the last host", hosts("a:4", "b:4", "c:4"), None, None,
         False, {TRAINER: (("a", "b"), 4), REF: (("c",), 4)}, trainer_world=8, ref_world=4),
    Case("separate 1+1 leaves the rest unused", hosts("a:8", "b:8", "c:8", "d:8"), 1, 1, False,
         {TRAINER: (("a",), 8), REF: (("b",), 8)}, trainer_world=8, ref_world=8,
         unused=("c", "d")),
    Case("separate 1+2, ref takes the next two in file order", hosts("a:1", "b:2", "c:2"), 1, 2,
         False, {TRAINER: (("a",), 1), REF: (("b", "c"), 2)}, trainer_world=1, ref_world=4),
    Case("colocated defaults: every host, one mesh", hosts("a:2", "b:2"), None, None, True,
         {COLOCATED_MESH: (("a", "b"), 2)}, trainer_world=4, ref_world=4),
    Case("colocated on the first host only", hosts("a:8", "b:8"), 1, None, True,
         {COLOCATED_MESH: (("a",), 8)}, trainer_world=8, ref_world=8, unused=("b",)),
    Case("colocated with equal explicit counts", hosts("a:1", "b:1", "c:1"), 3, 3, True,
         {COLOCATED_MESH: (("a", "b", "c"), 1)}, trainer_world=3, ref_world=3),
    Case("single loopback host colocated", hosts("localhost:2"), None, None, True,
         {COLOCATED_MESH: (("localhost",), 2)}, trainer_world=2, ref_world=2),
    Case("all-loopback hosts are fine (local testing)", hosts("127.0.0.2:2", "127.0.0.3:1"),
         1, 1, False, {TRAINER: (("127.0.0.2",), 2), REF: (("127.0.0.3",), 1)},
         trainer_world=2, ref_world=1),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_placement_table(case: Case) -> None:
    plan = plan_placement(case.hostfile, case.trainer_hosts, case.ref_hosts, case.colocate)

    assert {mesh.name: (mesh.hosts, mesh.procs_per_host) for mesh in plan.meshes} == case.meshes
    assert (plan.trainer.world_size, plan.ref.world_size) == (case.trainer_world, case.ref_world)
    assert plan.unused_hosts == case.unused
    assert plan.colocated is case.colocate


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_no_host_is_listed_in_two_meshes(case: Case) -> None:
    plan = plan_placement(case.hostfile, case.trainer_hosts, case.ref_hosts, case.colocate)

    listed = [host for mesh in plan.meshes for host in mesh.hosts]
    assert len(listed) == len(set(listed))


def test_colocated_roles_share_one_mesh() -> None:
    plan = plan_placement(hosts("a:2", "b:2"), colocate=True)

    assert plan.trainer.mesh == plan.ref.mesh == COLOCATED_MESH
    assert len(plan.meshes) == 1


@pytest.mark.parametrize(
    ("hostfile", "trainer_hosts", "ref_hosts", "colocate", "message"),
    [
        (
            hosts("a:2", "b:2", "c:2"),
            3,
            1,
            False,
            "plan needs 4 hosts (3 trainer + 1 ref, separate), but the hostfile has 3",
        ),
        (
            hosts("a:2", "b:2"),
            2,
            2,
            False,
            "plan needs 4 hosts (2 trainer + 2 ref, separate), but the hostfile has 2",
        ),
        (hosts("a:2"), None, None, False, "trainer hosts must be at least 1, got 0"),
        (
            hosts("a:2", "b:2"),
            3,
            None,
            True,
            "plan needs 3 hosts (trainer and ref colocated), but the hostfile has 2",
        ),
        (hosts("a:2", "b:2"), 0, 1, False, "trainer hosts must be at least 1, got 0"),
        (hosts("a:2", "b:2"), 1, 0, False, "ref hosts must be at least 1, got 0"),
        (hosts("a:2", "b:2"), 2, 1, True, "ref hosts (1) must equal trainer hosts (2)"),
    ],
    ids=[
        "3+1 on 3",
        "2+2 on 2",
        "one host separate",
        "colocated 3 on 2",
        "zero trainer",
        "zero ref",
        "colocated unequal",
    ],
)
def test_impossible_plans_are_refused_with_the_numbers(
    hostfile: list[Host],
    trainer_hosts: int | None,
    ref_hosts: int | None,
    colocate: bool,
    message: str,
) -> None:
    with pytest.raises(PlacementError) as caught:
        plan_placement(hostfile, trainer_hosts, ref_hosts, colocate)

    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("hostfile", "trainer_hosts", "colocate", "mesh"),
    [
        (hosts("a:2", "b:4", "c:1"), 2, False, TRAINER),
        (hosts("a:2", "b:2", "c:1", "d:2"), 2, False, REF),
        (hosts("a:8", "b:4"), None, True, COLOCATED_MESH),
    ],
    ids=["trainer", "ref", "colocated"],
)
def test_non_uniform_slots_within_a_mesh_are_refused(
    hostfile: list[Host], trainer_hosts: int | None, colocate: bool, mesh: str
) -> None:
    ref_hosts = None if colocate else len(hostfile) - (trainer_hosts or 0)

    with pytest.raises(PlacementError) as caught:
        plan_placement(hostfile, trainer_hosts, ref_hosts, colocate)

    assert f"mesh {mesh!r} needs the same slots on every host" in str(caught.value)


def test_non_uniform_slots_across_meshes_are_fine() -> None:
    plan = plan_placement(hosts("a:8", "b:8", "c:2"), 2, 1)

    assert (plan.trainer.procs_per_host, plan.ref.procs_per_host) == (8, 2)


@pytest.mark.parametrize("loopback", ["localhost", "127.0.0.1", "127.0.1.1", "::1", "LOCALHOST"])
def test_loopback_mixed_with_remote_hosts_is_refused(loopback: str) -> None:
    # Field case C3: a remote worker cannot reach "this machine" of another machine.
    with pytest.raises(PlacementError, match="mixes loopback hosts"):
        plan_placement(hosts("worker-a:8", f"{loopback}:8"), 1, 1)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("localhost", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("worker-a", False),
        ("192.0.2.1", False),
        ("127.example.com", False),
    ],
)
def test_is_loopback_name(name: str, expected: bool) -> None:
    assert is_loopback_name(name) is expected


def test_format_plan_lists_meshes_roles_and_unused_hosts() -> None:
    plan = plan_placement(hosts("a:2", "b:2", "c:1", "d:1"), 2, 1)

    assert format_plan(plan) == [
        "plan: separate roles",
        "mesh trainer: hosts=a,b procs/host=2",
        "mesh ref: hosts=c procs/host=1",
        "role trainer: mesh=trainer hosts=2 procs/host=2 world=4",
        "role ref: mesh=ref hosts=1 procs/host=1 world=1",
        "unused hosts: d",
    ]
