"""Placement of the trainer and ref roles on hostfile hosts: a table of named cases.

Pure: no Monarch, no sockets. Rules are documented in monarch_operator/launcher/hosts/placement.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest

from monarch_operator.hostfile import Host
from monarch_operator.launcher.hosts.placement import (
    COLOCATED_MESH,
    REF,
    TRAINER,
    PlacementError,
    format_plan,
    is_loopback_name,
    plan_placement,
    plan_to_dict,
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
    Case("colocated defaults: every host, one mesh, GPUs split 1+1", hosts("a:2", "b:2"), None,
         None, True, {COLOCATED_MESH: (("a", "b"), 2)}, trainer_world=2, ref_world=2),
    Case("colocated on the first host only, 4+4 of 8", hosts("a:8", "b:8"), 1, None, True,
         {COLOCATED_MESH: (("a",), 8)}, trainer_world=4, ref_world=4, unused=("b",)),
    Case("colocated with equal explicit counts, odd slots: trainer gets the larger half",
         hosts("a:3", "b:3", "c:3"), 3, 3, True,
         {COLOCATED_MESH: (("a", "b", "c"), 3)}, trainer_world=6, ref_world=3),
    Case("single loopback host colocated", hosts("localhost:2"), None, None, True,
         {COLOCATED_MESH: (("localhost",), 2)}, trainer_world=1, ref_world=1),
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
            "plan needs 4 hosts (3 trainer + 1 ref, separate), but 3 are given",
        ),
        (
            hosts("a:2", "b:2"),
            2,
            2,
            False,
            "plan needs 4 hosts (2 trainer + 2 ref, separate), but 2 are given",
        ),
        (
            hosts("a:2"),
            None,
            None,
            False,
            "1 ref hosts leave no host for the trainer: 1 hosts given, separate roles need at "
            "least 2",
        ),
        (
            hosts("a:2", "b:2"),
            3,
            None,
            True,
            "plan needs 3 hosts (trainer and ref colocated), but only 2 are given",
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
        "role trainer: mesh=trainer hosts=2 procs/host=2 world=4 CUDA_VISIBLE_DEVICES=0,1",
        "role ref: mesh=ref hosts=1 procs/host=1 world=1 CUDA_VISIBLE_DEVICES=0",
        "unused hosts: d",
    ]


@pytest.mark.parametrize(
    ("slots", "trainer_gpus", "ref_gpus", "trainer_devices", "ref_devices"),
    [
        (2, None, None, (0,), (1,)),
        (8, None, None, (0, 1, 2, 3), (4, 5, 6, 7)),
        (3, None, None, (0, 1), (2,)),
        (8, 6, None, (0, 1, 2, 3, 4, 5), (6, 7)),
        (8, None, 1, (0, 1, 2, 3, 4, 5, 6), (7,)),
        (8, 2, 3, (0, 1), (2, 3, 4)),
    ],
)
def test_colocated_roles_get_disjoint_gpu_sets(
    slots: int,
    trainer_gpus: int | None,
    ref_gpus: int | None,
    trainer_devices: tuple[int, ...],
    ref_devices: tuple[int, ...],
) -> None:
    plan = plan_placement(
        hosts(f"a:{slots}", f"b:{slots}"),
        colocate=True,
        trainer_gpus=trainer_gpus,
        ref_gpus=ref_gpus,
    )

    assert (plan.trainer.gpus, plan.ref.gpus) == (trainer_devices, ref_devices)
    assert not set(plan.trainer.gpus) & set(plan.ref.gpus)
    assert plan.trainer.procs_per_host == len(trainer_devices)
    assert plan.ref.cuda_visible_devices == ",".join(map(str, ref_devices))
    assert len(plan.meshes) == 1, "one host mesh: one Monarch worker per host"


@pytest.mark.parametrize(
    ("slots", "trainer_gpus", "ref_gpus", "message"),
    [
        (1, None, None, "1 trainer + 0 ref GPUs per host do not fit 1 slots"),
        (4, 3, 2, "3 trainer + 2 ref GPUs per host do not fit 4 slots"),
        (4, 4, None, "4 trainer + 0 ref GPUs per host do not fit 4 slots"),
        (4, 0, None, "0 trainer + 4 ref GPUs"),
    ],
)
def test_colocated_gpu_split_that_does_not_fit_is_refused(
    slots: int, trainer_gpus: int | None, ref_gpus: int | None, message: str
) -> None:
    with pytest.raises(PlacementError, match=re.escape(message)):
        plan_placement(
            hosts(f"a:{slots}"), colocate=True, trainer_gpus=trainer_gpus, ref_gpus=ref_gpus
        )


def test_gpu_split_without_colocation_is_refused() -> None:
    with pytest.raises(PlacementError, match="without --colocate"):
        plan_placement(hosts("a:2", "b:2"), 1, 1, trainer_gpus=1)


def test_plan_as_json_data() -> None:
    plan = plan_placement(hosts("a:4", "b:4", "c:4"), 2, colocate=True, trainer_gpus=3)

    data = plan_to_dict(plan)

    assert json.loads(json.dumps(data)) == {
        "colocated": True,
        "meshes": [{"name": COLOCATED_MESH, "hosts": ["a", "b"], "slots_per_host": 4}],
        "roles": [
            {
                "role": TRAINER,
                "mesh": COLOCATED_MESH,
                "hosts": 2,
                "procs_per_host": 3,
                "world_size": 6,
                "gpus": [0, 1, 2],
                "cuda_visible_devices": "0,1,2",
            },
            {
                "role": REF,
                "mesh": COLOCATED_MESH,
                "hosts": 2,
                "procs_per_host": 1,
                "world_size": 2,
                "gpus": [3],
                "cuda_visible_devices": "3",
            },
        ],
        "unused_hosts": ["c"],
    }
