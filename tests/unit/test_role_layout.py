"""Named roles on hostfile hosts (issue 33): a table of layouts and of refusals.

Pure: no Monarch, no sockets. Rules are documented in monarch_operator/launcher/hosts/layout.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from monarch_operator.hostfile import Host
from monarch_operator.launcher.hosts.layout import RoleSpec, plan_layout
from monarch_operator.launcher.hosts.plans import PlacementError, RoleNotFound, format_plan


def hosts(*spec: str) -> list[Host]:
    """``hosts("a:2", "b:2")`` -> two Hosts with 2 slots each."""
    return [Host(name, int(slots)) for name, slots in (item.rsplit(":", 1) for item in spec)]


@dataclass(frozen=True)
class Case:
    """A layout and what each role must get: ``{role: (mesh, hosts, procs/host, gpus)}``."""

    name: str
    hostfile: list[Host]
    roles: list[RoleSpec]
    expected: dict[str, tuple[str, tuple[str, ...], int, tuple[int, ...]]]
    unused: tuple[str, ...] = ()
    meshes: int = field(default=0)  # 0: one per role


FOUR = hosts("a:4", "b:4", "c:4", "d:4")

# fmt: off
CASES = [
    Case("counts slice the hostfile in role order", FOUR,
         [RoleSpec("generator", 2), RoleSpec("trainer", 1)],
         {"generator": ("generator", ("a", "b"), 4, (0, 1, 2, 3)),
          "trainer": ("trainer", ("c",), 4, (0, 1, 2, 3))}, unused=("d",)),
    Case("named hosts, any order; counted roles skip every named host", FOUR,
         [RoleSpec("generator", 2), RoleSpec("trainer", ("d", "a"))],
         {"generator": ("generator", ("b", "c"), 4, (0, 1, 2, 3)),
          "trainer": ("trainer", ("d", "a"), 4, (0, 1, 2, 3))}),
    Case("colocated roles: one mesh, disjoint GPUs in role order", FOUR,
         [RoleSpec("trainer", 2, gpus=2), RoleSpec("ref", colocate_with="trainer", gpus=1),
          RoleSpec("critic", colocate_with="trainer")],
         {"trainer": ("trainer", ("a", "b"), 2, (0, 1)),
          "ref": ("trainer", ("a", "b"), 1, (2,)),
          "critic": ("trainer", ("a", "b"), 1, (3,))}, unused=("c", "d"), meshes=1),
    Case("colocated without gpus: an even split, earlier roles the larger part",
         hosts("a:8"),
         [RoleSpec("a1", 1), RoleSpec("a2", colocate_with="a1"),
          RoleSpec("a3", colocate_with="a1")],
         {"a1": ("a1", ("a",), 3, (0, 1, 2)), "a2": ("a1", ("a",), 3, (3, 4, 5)),
          "a3": ("a1", ("a",), 2, (6, 7))}, meshes=1),
    Case("colocation chains to the first role's mesh", hosts("a:2"),
         [RoleSpec("x", 1, gpus=1), RoleSpec("y", colocate_with="x", gpus=1),
          RoleSpec("z", colocate_with="y", gpus=0)],
         {"x": ("x", ("a",), 1, (0,)), "y": ("x", ("a",), 1, (1,)), "z": ("x", ("a",), 1, ())},
         meshes=1),
    Case("a colocated role may come before the role it names (the operator allows it)",
         hosts("a:4", "b:4"),
         [RoleSpec("ref", ("b",), colocate_with="trainer", gpus=1), RoleSpec("trainer", ("b",)),
          RoleSpec("generator", 1)],
         {"ref": ("trainer", ("b",), 1, (0,)), "trainer": ("trainer", ("b",), 3, (1, 2, 3)),
          "generator": ("generator", ("a",), 4, (0, 1, 2, 3))}, meshes=2),
    Case("a colocated role may restate its partner's hosts", FOUR,
         [RoleSpec("trainer", ("b", "c")), RoleSpec("ref", ("c", "b"), colocate_with="trainer"),
          RoleSpec("critic", 2, colocate_with="trainer", gpus=0)],
         {"trainer": ("trainer", ("b", "c"), 2, (0, 1)), "ref": ("trainer", ("b", "c"), 2, (2, 3)),
          "critic": ("trainer", ("b", "c"), 1, ())}, unused=("a", "d"), meshes=1),
    Case("CPU-only role: no GPUs, one proc per host", hosts("a:4", "b:1"),
         [RoleSpec("trainer", 1), RoleSpec("reward", 1, gpus=0)],
         {"trainer": ("trainer", ("a",), 4, (0, 1, 2, 3)), "reward": ("reward", ("b",), 1, ())}),
    Case("procs per host apart from GPUs", hosts("a:8", "b:2"),
         [RoleSpec("generator", 1, gpus=8, procs=1), RoleSpec("reward", 1, gpus=0, procs=3),
          ],
         {"generator": ("generator", ("a",), 1, tuple(range(8))),
          "reward": ("reward", ("b",), 3, ())}),
    Case("fewer GPUs than slots on a mesh of its own", hosts("a:8"),
         [RoleSpec("trainer", 1, gpus=2)], {"trainer": ("trainer", ("a",), 2, (0, 1))}),
    Case("a colocated CPU-only role leaves every GPU to its partner", hosts("a:2", "b:2"),
         [RoleSpec("trainer", 2), RoleSpec("buffer", colocate_with="trainer", gpus=0)],
         {"trainer": ("trainer", ("a", "b"), 2, (0, 1)), "buffer": ("trainer", ("a", "b"), 1, ())},
         meshes=1),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_layout_table(case: Case) -> None:
    plan = plan_layout(case.hostfile, case.roles)

    got = {role.role: (role.mesh, plan.mesh(role.mesh).hosts, role.procs_per_host, role.gpus)
           for role in plan.roles}
    assert got == case.expected
    assert plan.role_names == tuple(spec.name for spec in case.roles), "start order kept"
    assert plan.unused_hosts == case.unused
    assert len(plan.meshes) == (case.meshes or len(case.roles))
    listed = [host for mesh in plan.meshes for host in mesh.hosts]
    assert len(listed) == len(set(listed)), "a host belongs to at most one mesh"
    for mesh in plan.meshes:
        devices = [gpu for role in plan.roles if role.mesh == mesh.name for gpu in role.gpus]
        assert len(devices) == len(set(devices)) and all(d < mesh.procs_per_host for d in devices)


def test_cpu_only_role_has_an_empty_cuda_visible_devices_and_says_so() -> None:
    plan = plan_layout(hosts("a:2", "b:1"), [RoleSpec("trainer", 1), RoleSpec("reward", 1, gpus=0)])

    assert plan.role("reward").cuda_visible_devices == ""
    assert plan.role("reward").world_size == 1
    assert ('role reward: mesh=reward hosts=1 procs/host=1 world=1 CUDA_VISIBLE_DEVICES="" '
            "(CPU only)") in format_plan(plan)


def test_a_missing_role_names_the_roles_there_are() -> None:
    plan = plan_layout(hosts("a:1", "b:1"), [RoleSpec("generator", 1), RoleSpec("reward", 1)])

    with pytest.raises(RoleNotFound, match="no role 'trainer'; its roles are generator, reward"):
        _ = plan.trainer
    with pytest.raises(KeyError):  # RoleNotFound is a KeyError, as the old lookup raised
        plan.role("ref")


NAME_RULE = "the name must be lowercase letters and digits, starting with a letter, 1-63"


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ([RoleSpec("Trainer", 1)], f"role 'Trainer': {NAME_RULE}"),
        ([RoleSpec("ref_model", 1)], f"role 'ref_model': {NAME_RULE}"),
        ([RoleSpec("ref-model", 1)], f"role 'ref-model': {NAME_RULE}"),
        ([RoleSpec("2nd", 1)], f"role '2nd': {NAME_RULE}"),
        ([RoleSpec("", 1)], f"role '': {NAME_RULE}"),
        ([RoleSpec("a" * 64, 1)], f"role '{'a' * 64}': {NAME_RULE}"),
        ([RoleSpec("x", 1), RoleSpec("x", 1)], "role 'x' is given twice"),
        ([RoleSpec("x", 1), RoleSpec("y", colocate_with="z")],
         "role 'y': colocateWith 'z' must name another role of the layout (roles: x, y)"),
        ([RoleSpec("x", 1), RoleSpec("y", colocate_with="y")],
         "role 'y': colocateWith names the role itself"),
        ([RoleSpec("x", colocate_with="y"), RoleSpec("y", colocate_with="x")],
         "role 'x': colocateWith goes round in a circle (x -> y -> x)"),
        ([RoleSpec("x", 1), RoleSpec("y")], "role 'y': give its hosts (a count or host names)"),
        ([RoleSpec("x", 0)], "role 'x': hosts must be at least 1, got 0"),
        ([RoleSpec("x", ())], "role 'x': the host list is empty"),
        ([RoleSpec("x", ("a", "a"))], "role 'x' lists a more than once"),
        ([RoleSpec("x", 1, gpus=-1)], "role 'x': gpus must be 0 or more, got -1"),
        ([RoleSpec("x", 1, procs=0)], "role 'x': procs must be at least 1, got 0"),
        ([RoleSpec("x", ("a", "e"))],
         "role 'x': host 'e' is not in the hostfile (hosts: a, b, c, d)"),
        ([RoleSpec("x", ("a", "b")), RoleSpec("y", ("b",))],
         "role 'y': host 'b' is already role 'x''s; a host belongs to at most one host mesh: "
         "Monarch's SSHJob would start a second worker on its one worker port"),
        ([RoleSpec("g", 2), RoleSpec("t", 2), RoleSpec("r", 1)],
         "roles need 5 hosts (g 2 + t 2 + r 1), but the hostfile has 4"),
        ([RoleSpec("t", ("a", "b")), RoleSpec("g", 3)],
         "roles need 3 more hosts (g 3), but only 2 of the hostfile's 4 hosts are not named"),
        ([RoleSpec("t", 2), RoleSpec("r", 1, colocate_with="t")],
         "role 'r' colocates with 't', so it shares 't''s 2 hosts; it asks for 1"),
        ([RoleSpec("t", 2), RoleSpec("r", ("a", "c"), colocate_with="t")],
         "role 'r' colocates with 't', so it shares exactly 't''s hosts (a, b); it lists a, c"),
        ([RoleSpec("t", 1, gpus=5)], "role 't' asks for 5 GPUs per host, but its hosts have 4"),
        ([RoleSpec("t", 1, gpus=3), RoleSpec("r", colocate_with="t", gpus=2)],
         "colocated roles need disjoint GPUs: 3 t + 2 r GPUs per host do not fit 4 slots"),
        ([RoleSpec("t", 1, gpus=4), RoleSpec("r", colocate_with="t")],
         "colocated roles need disjoint GPUs: 4 t + 0 r GPUs per host do not fit 4 slots (a "
         "role without gpus shares what the others leave and needs at least 1; gpus=0 makes a "
         "CPU-only role)"),
        ([], "no roles given"),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 40 else None,
)
def test_refusals_name_the_role_and_the_rule(roles: list[RoleSpec], message: str) -> None:
    with pytest.raises(PlacementError) as caught:
        plan_layout(FOUR, roles)

    assert message in str(caught.value)


def test_uneven_slots_within_a_mesh_are_refused_naming_the_mesh() -> None:
    with pytest.raises(PlacementError, match=re.escape(
            "mesh 'generator' needs the same slots on every host, got: a slots=4, b slots=2")):
        plan_layout(hosts("a:4", "b:2", "c:1"), [RoleSpec("generator", 2), RoleSpec("r", 1)])


def test_loopback_mixed_with_remote_hosts_is_refused() -> None:
    with pytest.raises(PlacementError, match="mixes loopback hosts"):
        plan_layout(hosts("worker-a:1", "127.0.0.1:1"), [RoleSpec("x", 1), RoleSpec("y", 1)])
