"""SPMD mode without ssh: host/rank planning, torchrun's variables, the torchrun-style flags."""

from __future__ import annotations

import pytest

from monarch_operator.hostfile import Host
from monarch_operator.launcher.cli import UsageError
from monarch_operator.launcher.spmd import SpmdConfigError, plan_spmd
from monarch_operator.launcher.spmd_actor import World, rank_environment
from monarch_operator.launcher.spmd_cli import build_parser, command_argv

HOSTS = [Host("a", 4), Host("b", 4), Host("c", 4)]


@pytest.mark.parametrize(
    ("nnodes", "nproc", "names", "per_host"),
    [
        (None, None, ["a", "b", "c"], 4),
        (2, None, ["a", "b"], 4),
        (1, 2, ["a"], 2),
        (3, 4, ["a", "b", "c"], 4),
    ],
)
def test_plan_spmd(nnodes: int | None, nproc: int | None, names: list[str], per_host: int) -> None:
    hosts, nproc_per_node = plan_spmd(HOSTS, nnodes, nproc)

    assert ([host.name for host in hosts], nproc_per_node) == (names, per_host)


@pytest.mark.parametrize(
    ("hosts", "nnodes", "nproc", "message"),
    [
        (HOSTS, 4, None, "--nnodes 4 asks for more hosts than the 3 given"),
        (HOSTS, 0, None, "--nnodes must be at least 1, got 0"),
        (HOSTS, None, 5, "--nproc-per-node 5 exceeds the slots of a slots=4, b slots=4"),
        (HOSTS, None, 0, "--nproc-per-node must be at least 1, got 0"),
        ([Host("a", 2), Host("b", 4)], None, None, "hosts have different slots"),
    ],
)
def test_plan_spmd_refuses_what_does_not_fit(
    hosts: list[Host], nnodes: int | None, nproc: int | None, message: str
) -> None:
    with pytest.raises(SpmdConfigError, match=message):
        plan_spmd(hosts, nnodes, nproc)


def world(nproc: int = 2) -> World:
    return World(
        hosts=("a", "b"),
        addresses=("192.0.2.1", "192.0.2.2"),
        nproc_per_node=nproc,
        master_addr="192.0.2.1",
        master_port=29500,
        run_id="r1",
    )


def test_rank_environment_matches_torchrun_numbering() -> None:
    # Host-major, as torchrun: the second host's second proc is rank 3 of 4.
    env = rank_environment(world(), group_rank=1, local_rank=1, base={"PATH": "/bin"})

    assert env == {
        "PATH": "/bin",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default",
        "MASTER_ADDR": "192.0.2.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "r1",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "OMP_NUM_THREADS": "1",
    }


def test_omp_threads_left_alone_with_one_proc_per_host_or_when_set() -> None:
    assert "OMP_NUM_THREADS" not in rank_environment(world(1), 0, 0, {})
    assert rank_environment(world(2), 0, 0, {"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "8"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train.py", "--lr", "0.1"], ["PY", "train.py", "--lr", "0.1"]),
        (["-m", "pkg.train", "-x"], ["PY", "-m", "pkg.train", "-x"]),
        (["--no-python", "./run.sh", "a"], ["./run.sh", "a"]),
        (["--no_python", "./run.sh"], ["./run.sh"]),
    ],
)
def test_command_per_rank(argv: list[str], expected: list[str]) -> None:
    args = build_parser().parse_args(["--hosts", "a", "--python-exe", "PY", *argv])

    assert command_argv(args) == expected


def test_torchrun_underscore_flags_are_accepted() -> None:
    args = build_parser().parse_args(
        ["--hosts", "a", "--nproc_per_node", "2", "--master_port", "29400", "t.py"]
    )

    assert (args.nproc_per_node, args.master_port, args.script) == ("2", 29400, "t.py")


def test_no_python_with_module_is_refused() -> None:
    args = build_parser().parse_args(["--hosts", "a", "--no-python", "-m", "x"])

    with pytest.raises(UsageError, match="cannot be combined"):
        command_argv(args)
