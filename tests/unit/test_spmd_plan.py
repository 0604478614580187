"""SPMD mode without ssh: host/rank planning, torchrun's variables, the torchrun-style flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from monarch_operator.hostfile import Host
from monarch_operator.launcher.cli import UsageError
from monarch_operator.launcher.programs.spmd import SpmdConfigError, plan_spmd
from monarch_operator.launcher.programs.spmd_actor import World, rank_environment
from monarch_operator.launcher.spmd_cli import build_parser, command_argv, nproc_per_node

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

    assert (args.nproc_per_node, args.master_port, args.script) == (2, 29400, "t.py")


def test_no_python_with_module_is_refused() -> None:
    args = build_parser().parse_args(["--hosts", "a", "--no-python", "-m", "x"])

    with pytest.raises(UsageError, match="cannot be combined"):
        command_argv(args)


# --nproc-per-node keywords (field case C17) ------------------------------------------------

LOCAL = [Host("127.0.0.1", 1)]


# fmt: off
@pytest.mark.parametrize(
    ("hosts", "nproc", "names", "per_host"),
    [
        (LOCAL, "cpu", ["127.0.0.1"], 6),
        ([Host("localhost", 8)], "cpu", ["localhost"], 6),
        ([Host("127.0.0.2", 1), Host("127.0.0.3", 1)], "cpu", ["127.0.0.2", "127.0.0.3"], 6),
        ([Host("login-1", 1)], "cpu", ["login-1"], 6),
        ([Host("LOGIN-1", 1)], "cpu", ["LOGIN-1"], 6),
        (HOSTS, "gpu", ["a", "b", "c"], 4),
        (HOSTS, "auto", ["a", "b", "c"], 4),
        (HOSTS, None, ["a", "b", "c"], 4),
        (HOSTS, 3, ["a", "b", "c"], 3),
        (LOCAL, 1, ["127.0.0.1"], 1),
    ],
    ids=[
        "cpu-loopback-address", "cpu-localhost-not-bounded-by-gpu-slots", "cpu-two-loopback",
        "cpu-own-host-name", "cpu-own-host-name-any-case", "gpu-is-slots", "auto-is-slots",
        "default-is-slots", "integer-wins", "integer-wins-over-cpu-count",
    ],
)
# fmt: on
def test_nproc_per_node_keywords(
    hosts: list[Host], nproc: int | str | None, names: list[str], per_host: int
) -> None:
    used, nproc_per_node = plan_spmd(
        hosts, None, nproc, local_cpu_count=6, local_names=["login-1"]
    )

    assert ([host.name for host in used], nproc_per_node) == (names, per_host)


# fmt: off
@pytest.mark.parametrize(
    ("hosts", "nproc", "cpu_count", "message"),
    [
        ([Host("192.0.2.1", 8)], "cpu", 6,
         "--nproc-per-node cpu: the CPU count is known here only for this machine, not for "
         "192.0.2.1; give the ranks per host as an integer"),
        ([Host("127.0.0.1", 1), Host("node2", 1), Host("node3", 1)], "cpu", 6,
         "--nproc-per-node cpu: the CPU count is known here only for this machine, not for "
         "node2, node3;"),
        (LOCAL, "cpu", None, "--nproc-per-node cpu: this machine's CPU count is unknown"),
        (HOSTS, "xpu", 6, "--nproc-per-node 'xpu': expected an integer or one of cpu, gpu, auto"),
        ([Host("a", 2), Host("b", 4)], "gpu", 6, "hosts have different slots"),
        ([Host("a", 2), Host("b", 4)], "auto", 6, "hosts have different slots"),
    ],
    ids=[
        "cpu-remote-host", "cpu-one-remote-host", "cpu-count-unknown", "unknown-keyword",
        "gpu-uneven-slots", "auto-uneven-slots",
    ],
)
# fmt: on
def test_nproc_per_node_keywords_refused(
    hosts: list[Host], nproc: str, cpu_count: int | None, message: str
) -> None:
    with pytest.raises(SpmdConfigError) as raised:
        plan_spmd(hosts, None, nproc, local_cpu_count=cpu_count, local_names=["login-1"])

    assert str(raised.value).startswith(message)


def test_cpu_keyword_respects_nnodes() -> None:
    hosts = [Host("127.0.0.1", 1), Host("192.0.2.9", 1)]

    used, per_host = plan_spmd(hosts, 1, "cpu", local_cpu_count=3)

    assert ([host.name for host in used], per_host) == (["127.0.0.1"], 3)


@pytest.mark.parametrize(
    ("text", "value"),
    [("cpu", "cpu"), ("gpu", "gpu"), ("auto", "auto"), ("4", 4), ("1", 1), (" 2", 2)],
)
def test_nproc_per_node_flag_values(text: str, value: int | str) -> None:
    assert nproc_per_node(text) == value
    args = build_parser().parse_args(["--hosts", "a", "--nproc-per-node", text, "p.py"])
    assert args.nproc_per_node == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "must be at least 1, got 0"),
        ("-2", "must be at least 1, got -2"),
        ("CPU", "expected an integer or one of cpu, gpu, auto, got 'CPU'"),
        ("two", "expected an integer or one of cpu, gpu, auto, got 'two'"),
        ("1.5", "expected an integer or one of cpu, gpu, auto, got '1.5'"),
    ],
)
def test_nproc_per_node_flag_refuses(
    text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--hosts", "a", "--nproc-per-node", text, "p.py"])

    assert exited.value.code == 2
    assert f"argument --nproc-per-node/--nproc_per_node: {message}" in capsys.readouterr().err


def test_help_documents_the_nproc_keywords(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])

    help_text = " ".join(capsys.readouterr().out.split())
    assert "N|cpu|gpu|auto" in help_text
    assert "'cpu' is this machine's CPU count, only when every host is this machine" in help_text
    assert "'gpu' and 'auto' are the hosts' slots" in help_text


def test_spmd_launcher_without_known_hosts_builds_and_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The in-code example of docs/standalone.md ("In code") passes no known_hosts: this once
    # raised NameError.
    from monarch_operator.launcher import spmd_launcher
    from monarch_operator.launcher.programs.spmd import SpmdConfigError

    monkeypatch.delenv("MONARCH_KNOWN_HOSTS", raising=False)
    launcher = spmd_launcher(hosts="node1,node2", nproc_per_node=1)
    assert launcher.plan_dict()["world_size"] == 2

    monkeypatch.setenv("MONARCH_KNOWN_HOSTS", str(tmp_path / "missing"))
    with pytest.raises(SpmdConfigError, match="known_hosts .*missing: no such file"):
        spmd_launcher(hosts="node1,node2", nproc_per_node=1)
