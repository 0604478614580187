"""Field case C11 (pytorch #191190): rank and host order follow the source, never a sort.

As text, "127.0.0.66" sorts before "127.0.0.7", and "node10" before "node2"; users order
hostfiles by topology on purpose and Slurm lists nodes in its node table's order, so every
source keeps the order written: ranks 0-1 on the first host given, 2-3 on the second, and
MASTER_ADDR is the host of rank 0.
"""

from __future__ import annotations

import pytest

from monarch_operator.hostfile import Host, parse_hostfile
from monarch_operator.launcher.hosts.placement import plan_placement
from monarch_operator.launcher.hosts.sources import hosts_from_list, hosts_from_slurm
from monarch_operator.launcher.programs.spmd import default_master_addr, plan_spmd
from monarch_operator.launcher.programs.spmd_actor import World, rank_environment

C11_HOSTS = ["127.0.0.7", "127.0.0.66", "127.0.0.8", "127.0.0.70"]
C11_HOSTFILE = "".join(f"{name} slots=2\n" for name in C11_HOSTS)


def c11_sources() -> dict[str, list[Host]]:
    """The C11 hosts from each source, as the launcher reads them."""
    return {
        "hostfile": parse_hostfile(C11_HOSTFILE),
        "--hosts": hosts_from_list(",".join(C11_HOSTS), 2),
        "slurm": hosts_from_slurm(
            {"SLURM_JOB_NODELIST": "node[10-11],node2", "SLURM_GPUS_ON_NODE": "2"}
        ),
    }


EXPECTED_ORDER = {
    "hostfile": C11_HOSTS,
    "--hosts": C11_HOSTS,
    "slurm": ["node10", "node11", "node2"],
}


@pytest.mark.parametrize("source", list(EXPECTED_ORDER))
def test_hosts_keep_the_order_of_the_source(source: str) -> None:
    hosts = c11_sources()[source]

    assert [host.name for host in hosts] == EXPECTED_ORDER[source]
    assert {host.slots for host in hosts} == {2}


@pytest.mark.parametrize("source", list(EXPECTED_ORDER))
def test_spmd_ranks_fill_hosts_in_the_order_given(source: str) -> None:
    used, nproc = plan_spmd(c11_sources()[source], None, None)
    names = [host.name for host in used]
    # Addresses as the pre-flight would resolve them; distinct per host.
    addresses = {name: f"192.0.2.{index + 10}" for index, name in enumerate(names)}
    world = World(
        hosts=tuple(names),
        addresses=tuple(addresses[name] for name in names),
        nproc_per_node=nproc,
        master_addr=default_master_addr(names, addresses),
        master_port=29500,
        run_id="c11",
    )

    host_of_rank = {}
    for group_rank, name in enumerate(names):
        for local_rank in range(nproc):
            env = rank_environment(world, group_rank, local_rank, {})
            host_of_rank[int(env["RANK"])] = name
            assert env["MASTER_ADDR"] == addresses[EXPECTED_ORDER[source][0]]

    expected_names = EXPECTED_ORDER[source]
    assert names == expected_names
    assert host_of_rank == {
        rank: expected_names[rank // 2] for rank in range(2 * len(expected_names))
    }
    assert world.master_addr == addresses[host_of_rank[0]]


def test_master_addr_override_wins() -> None:
    names = ["127.0.0.7", "127.0.0.66"]
    addresses = {"127.0.0.7": "127.0.0.7", "127.0.0.66": "127.0.0.66"}

    assert default_master_addr(names, addresses) == "127.0.0.7"
    assert default_master_addr(names, addresses, "192.0.2.99") == "192.0.2.99"


@pytest.mark.parametrize("source", list(EXPECTED_ORDER))
def test_role_placement_takes_hosts_in_the_order_given(source: str) -> None:
    hosts = c11_sources()[source]
    expected = EXPECTED_ORDER[source]

    separate = plan_placement(hosts, trainer_hosts=2, ref_hosts=1)
    colocated = plan_placement(hosts, colocate=True)

    assert separate.mesh("trainer").hosts == tuple(expected[:2])
    assert separate.mesh("ref").hosts == (expected[2],)
    assert separate.unused_hosts == tuple(expected[3:])
    assert colocated.meshes[0].hosts == tuple(expected)
