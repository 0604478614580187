"""Host sources of the standalone launcher: --hosts lists, Slurm allocations, the one-source rule.

Pure: the environment is a plain dict, no Slurm needed. Rules are documented in
monarch_operator/launcher/hosts/sources.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from monarch_operator.hostfile import DEFAULT_SLOTS, Host
from monarch_operator.launcher.hosts.sources import (
    HostSourceError,
    hosts_from_list,
    hosts_from_slurm,
    resolve_host_source,
)


def names(hosts: list[Host]) -> list[str]:
    return [host.name for host in hosts]


def assert_int_slots(hosts: list[Host], expected: int) -> None:
    """Every host has exactly ``expected`` slots, as an int (not a str read from the env)."""
    for host in hosts:
        assert type(host.slots) is int
        assert host.slots == expected


# --hosts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "slots", "expected"),
    [
        ("a", None, [Host("a", DEFAULT_SLOTS)]),
        ("a,b,c", None, [Host("a", 1), Host("b", 1), Host("c", 1)]),
        (" a , b\t,\tc ", 4, [Host("a", 4), Host("b", 4), Host("c", 4)]),
        ("c,a,b", 8, [Host("c", 8), Host("a", 8), Host("b", 8)]),
        ("192.0.2.1,worker-b.svc", 2, [Host("192.0.2.1", 2), Host("worker-b.svc", 2)]),
    ],
    ids=["single", "default-slots", "whitespace-stripped", "order-kept", "addresses"],
)
def test_hosts_from_list(text: str, slots: int | None, expected: list[Host]) -> None:
    hosts = hosts_from_list(text, slots)
    assert hosts == expected
    assert_int_slots(hosts, expected[0].slots)


# fmt: off
@pytest.mark.parametrize(
    ("text", "slots", "message"),
    [
        ("", None, "--hosts '': item 1 is empty"),
        ("a,,b", None, "--hosts 'a,,b': item 2 is empty"),
        ("a,b,", None, "--hosts 'a,b,': item 3 is empty"),
        ("a, ,b", None, "--hosts 'a, ,b': item 2 is empty"),
        ("a,b,a", None, "--hosts 'a,b,a': host 'a' is listed twice"),
        ("a, a", None, "--hosts 'a, a': host 'a' is listed twice"),
        ("a b,c", None, "--hosts: host name 'a b' cannot contain whitespace or '#'"),
        ("a#1", None, "--hosts: host name 'a#1' cannot contain whitespace or '#'"),
        ("a", 0, "--slots-per-host must be a positive integer, got 0"),
        ("a", -2, "--slots-per-host must be a positive integer, got -2"),
        ("a,b:2222", None,
         "--hosts: host entry 'b:2222': 'host:port' is not supported; the same sshd port is "
         "used on every host, give it with --ssh-port"),
        ("alice@a", None,
         "--hosts: host entry 'alice@a': 'user@host' is not supported; the same login user is "
         "used on every host, give it with --ssh-user"),
        ("alice@a:22", None, "--hosts: host entry 'alice@a:22': 'user@host' is not supported"),
        ("::1", None, "--hosts: host entry '::1': IPv6 addresses are not supported"),
        ("a,fe80::1%eth0", None,
         "--hosts: host entry 'fe80::1%eth0': IPv6 addresses are not supported"),
        ("[2001:db8::1]:22", None,
         "--hosts: host entry '[2001:db8::1]:22': IPv6 addresses are not supported"),
    ],
    ids=[
        "empty", "empty-middle", "trailing-comma", "blank-item", "duplicate",
        "duplicate-after-strip", "inner-space", "hash", "zero-slots", "negative-slots",
        "host-port", "user-host", "user-host-port", "ipv6-loopback", "ipv6-scoped",
        "ipv6-bracketed-port",
    ],
)
# fmt: on
def test_hosts_from_list_refuses(text: str, slots: int | None, message: str) -> None:
    with pytest.raises(HostSourceError) as raised:
        hosts_from_list(text, slots)
    assert str(raised.value).startswith(message)


# Slurm nodelists ---------------------------------------------------------------------------


# Field case C11: nodes come in the order written, never sorted (Slurm writes its own node-table
# order, which sites lay out by topology); zero padding is kept; several brackets in one item
# give every combination, the first bracket varying slowest.
# fmt: off
@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("node01", ["node01"]),
        ("node[01-03]", ["node01", "node02", "node03"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("n[1,3,5-6]", ["n1", "n3", "n5", "n6"]),
        ("node[10-11],node2", ["node10", "node11", "node2"]),
        ("b1,a[1-2]", ["b1", "a1", "a2"]),
        ("gpu[2-3],cpu[01-02]", ["gpu2", "gpu3", "cpu01", "cpu02"]),
        ("n[3,1,2]", ["n3", "n1", "n2"]),
        ("n[5-6,1-2]", ["n5", "n6", "n1", "n2"]),
        ("node[010-011],node9", ["node010", "node011", "node9"]),
        ("a[1-2,5],b[01-03]", ["a1", "a2", "a5", "b01", "b02", "b03"]),
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("node[1-3]-ib", ["node1-ib", "node2-ib", "node3-ib"]),
        ("x[2-1000]-y", [f"x{i}-y" for i in range(2, 1001)]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("r[2,1]n[02,01]", ["r2n02", "r2n01", "r1n02", "r1n01"]),
        ("  node[01-02]\n", ["node01", "node02"]),
        ("a, b", ["a", "b"]),
        ("192.0.2.[7-8],gpu-a.b_c", ["192.0.2.7", "192.0.2.8", "gpu-a.b_c"]),
    ],
    ids=[
        "single", "zero-padded-range", "mixed", "width-grows", "list-in-brackets",
        "c11-slurm-order", "written-order-across-items", "written-order-across-patterns",
        "written-order-in-brackets", "written-order-of-ranges", "padded-then-unpadded",
        "nested-lists-with-padding", "padded-width-kept", "suffix-after-brackets",
        "suffix-after-long-range", "two-ranges", "two-ranges-written-order",
        "outer-whitespace", "space-after-comma-stripped", "dots-dashes-underscores",
    ],
)
# fmt: on
def test_slurm_nodelist_expansion(nodelist: str, expected: list[str]) -> None:
    hosts = hosts_from_slurm({"SLURM_JOB_NODELIST": nodelist})
    assert names(hosts) == expected
    assert_int_slots(hosts, DEFAULT_SLOTS)


def test_slurm_falls_back_to_slurm_nodelist() -> None:
    assert names(hosts_from_slurm({"SLURM_NODELIST": "old[1-2]"})) == ["old1", "old2"]


def test_slurm_job_nodelist_wins_over_slurm_nodelist() -> None:
    environ = {"SLURM_JOB_NODELIST": "new1", "SLURM_NODELIST": "old1"}
    assert names(hosts_from_slurm(environ)) == ["new1"]


# fmt: off
@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "slurm: not inside a Slurm allocation: SLURM_JOB_NODELIST is not set"),
        ({"SLURM_GPUS_ON_NODE": "4"},
         "slurm: not inside a Slurm allocation: SLURM_JOB_NODELIST is not set"),
        ({"SLURM_JOB_NODELIST": "node[01-"},
         "slurm: SLURM_JOB_NODELIST='node[01-' is not a valid Slurm hostlist: "
         "'node[01-': '[' without a closing ']'"),
        ({"SLURM_NODELIST": "n[3-1]"},
         "slurm: SLURM_NODELIST='n[3-1]' is not a valid Slurm hostlist: "
         "'n[3-1]': range '3-1' goes down; write it as '1-3'"),
        ({"SLURM_JOB_NODELIST": "n[a-b]"},
         "slurm: SLURM_JOB_NODELIST='n[a-b]' is not a valid Slurm hostlist: "
         "'n[a-b]': 'a-b' in brackets is not a number or a range such as '1-4'"),
        ({"SLURM_JOB_NODELIST": "n[1-]"},
         "slurm: SLURM_JOB_NODELIST='n[1-]' is not a valid Slurm hostlist: "
         "'n[1-]': '1-' in brackets is not a number or a range"),
        ({"SLURM_JOB_NODELIST": "n[1,,2]"},
         "slurm: SLURM_JOB_NODELIST='n[1,,2]' is not a valid Slurm hostlist: "
         "'n[1,,2]': '' in brackets is not a number or a range"),
        ({"SLURM_JOB_NODELIST": "n[[1]]"},
         "slurm: SLURM_JOB_NODELIST='n[[1]]' is not a valid Slurm hostlist: "
         "'n[[1]]': brackets cannot be nested"),
        ({"SLURM_JOB_NODELIST": "n]1,n2"},
         "slurm: SLURM_JOB_NODELIST='n]1,n2' is not a valid Slurm hostlist: "
         "'n]1,n2': ']' without a '[' before it"),
        ({"SLURM_JOB_NODELIST": "n[1-2]]"},
         "slurm: SLURM_JOB_NODELIST='n[1-2]]' is not a valid Slurm hostlist: "
         "'n[1-2]]': ']' without a '[' before it"),
        ({"SLURM_JOB_NODELIST": "n[01-2]"},
         "slurm: SLURM_JOB_NODELIST='n[01-2]' is not a valid Slurm hostlist: "
         "'n[01-2]': range '01-2' mixes widths; zero-padded bounds need the same number of "
         "digits, e.g. '01-02'"),
        ({"SLURM_JOB_NODELIST": "n[8-010]"},
         "slurm: SLURM_JOB_NODELIST='n[8-010]' is not a valid Slurm hostlist: "
         "'n[8-010]': range '8-010' mixes widths"),
        ({"SLURM_JOB_NODELIST": "n[]"},
         "slurm: SLURM_JOB_NODELIST='n[]' is not a valid Slurm hostlist: "
         "'n[]': empty brackets '[]'"),
        ({"SLURM_JOB_NODELIST": "n[1-100000]"},
         "slurm: SLURM_JOB_NODELIST='n[1-100000]' is not a valid Slurm hostlist: "
         "'n[1-100000]': the list expands to more than 65536 nodes"),
        ({"SLURM_JOB_NODELIST": "a[1-40000],b[1-40000]"},
         "slurm: SLURM_JOB_NODELIST='a[1-40000],b[1-40000]' is not a valid Slurm hostlist: "
         "'b[1-40000]': the list expands to more than 65536 nodes"),
        ({"SLURM_JOB_NODELIST": "r[1-300]n[1-300]"},
         "slurm: SLURM_JOB_NODELIST='r[1-300]n[1-300]' is not a valid Slurm hostlist: "
         "'r[1-300]n[1-300]': the list expands to more than 65536 nodes"),
        ({"SLURM_JOB_NODELIST": ""}, "slurm: SLURM_JOB_NODELIST='' names no nodes"),
        ({"SLURM_JOB_NODELIST": " \n"}, "slurm: SLURM_JOB_NODELIST='' names no nodes"),
        ({"SLURM_JOB_NODELIST": ","},
         "slurm: SLURM_JOB_NODELIST=',' is not a valid Slurm hostlist: item 1 is empty"),
        ({"SLURM_JOB_NODELIST": "a,,b"},
         "slurm: SLURM_JOB_NODELIST='a,,b' is not a valid Slurm hostlist: item 2 is empty"),
        ({"SLURM_JOB_NODELIST": "a,b,"},
         "slurm: SLURM_JOB_NODELIST='a,b,' is not a valid Slurm hostlist: item 3 is empty"),
        ({"SLURM_JOB_NODELIST": "n[1-2],n2"},
         "slurm: SLURM_JOB_NODELIST='n[1-2],n2' lists node 'n2' twice"),
        ({"SLURM_JOB_NODELIST": "a,b,a"},
         "slurm: SLURM_JOB_NODELIST='a,b,a' lists node 'a' twice"),
        ({"SLURM_JOB_NODELIST": "n[1-3],m1,n[3-4]"},
         "slurm: SLURM_JOB_NODELIST='n[1-3],m1,n[3-4]' lists node 'n3' twice"),
        ({"SLURM_JOB_NODELIST": "n[1,1]"},
         "slurm: SLURM_JOB_NODELIST='n[1,1]' lists node 'n1' twice"),
        ({"SLURM_JOB_NODELIST": "n[1-2,2]"},
         "slurm: SLURM_JOB_NODELIST='n[1-2,2]' lists node 'n2' twice"),
        ({"SLURM_JOB_NODELIST": "n[1-3]!n2"},
         "slurm: SLURM_JOB_NODELIST='n[1-3]!n2' is not a valid Slurm hostlist: "
         "'!' is a ClusterShell set operator (difference), not Slurm syntax"),
        ({"SLURM_JOB_NODELIST": "n[1-3]&n2"},
         "slurm: SLURM_JOB_NODELIST='n[1-3]&n2' is not a valid Slurm hostlist: "
         "'&' is a ClusterShell set operator (intersection)"),
        ({"SLURM_JOB_NODELIST": "n1^n2"},
         "slurm: SLURM_JOB_NODELIST='n1^n2' is not a valid Slurm hostlist: "
         "'^' is a ClusterShell set operator (symmetric difference)"),
        ({"SLURM_JOB_NODELIST": "@group"},
         "slurm: SLURM_JOB_NODELIST='@group' is not a valid Slurm hostlist: "
         "'@' is ClusterShell group syntax, not Slurm syntax"),
        ({"SLURM_JOB_NODELIST": "n*"},
         "slurm: SLURM_JOB_NODELIST='n*' is not a valid Slurm hostlist: "
         "'*' is a ClusterShell wildcard, not Slurm syntax"),
        ({"SLURM_JOB_NODELIST": "n1 n2,n3"},
         "slurm SLURM_JOB_NODELIST: host name 'n1 n2' cannot contain whitespace or '#'"),
        ({"SLURM_JOB_NODELIST": "n#1"},
         "slurm SLURM_JOB_NODELIST: host name 'n#1' cannot contain whitespace or '#'"),
        ({"SLURM_JOB_NODELIST": "n[1-2]:22"},
         "slurm SLURM_JOB_NODELIST: host entry 'n1:22': 'host:port' is not supported"),
    ],
    ids=[
        "no-variables", "gpus-but-no-nodelist", "unbalanced", "reversed-range", "bad-range",
        "open-range", "empty-bracket-item", "nested", "closing-without-opening",
        "extra-closing", "padding-mismatch", "padding-on-high-bound", "empty-brackets",
        "huge-range", "huge-list", "huge-product", "empty", "whitespace-only", "only-comma",
        "empty-item", "trailing-comma", "duplicate", "duplicate-name",
        "duplicate-range-overlap", "duplicate-in-brackets", "duplicate-range-in-brackets",
        "difference-operator", "intersection-operator", "xor-operator", "group",
        "wildcard", "inner-space", "hash", "port",
    ],
)
# fmt: on
def test_slurm_refuses(environ: dict[str, str], message: str) -> None:
    with pytest.raises(HostSourceError) as raised:
        hosts_from_slurm(environ)
    assert str(raised.value).startswith(message)


# Slurm GPUs per node -> slots --------------------------------------------------------------


# fmt: off
@pytest.mark.parametrize(
    ("gpu_variables", "slots"),
    [
        ({}, DEFAULT_SLOTS),
        ({"SLURM_GPUS_ON_NODE": "4"}, 4),
        ({"SLURM_GPUS_PER_NODE": "4"}, 4),
        ({"SLURM_GPUS_PER_NODE": "gpu:4"}, 4),
        ({"SLURM_GPUS_PER_NODE": "a100:8"}, 8),
        ({"SLURM_GPUS_PER_NODE": "gpu:a100:2"}, 2),
        ({"SLURM_GPUS_PER_NODE": "a100:2,v100:1"}, 3),
        ({"SLURM_JOB_GPUS": "0,1,2"}, 3),
        ({"SLURM_JOB_GPUS": "5"}, 1),
        ({"SLURM_STEP_GPUS": "0,1"}, 2),
        ({"SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_NODE": "8", "SLURM_JOB_GPUS": "0"}, 2),
        ({"SLURM_GPUS_PER_NODE": "a100:6", "SLURM_JOB_GPUS": "0,1"}, 6),
        ({"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_STEP_GPUS": "0"}, 4),
        ({"SLURM_GPUS_ON_NODE": "", "SLURM_GPUS_PER_NODE": "3"}, 3),
        ({"SLURM_GPUS_ON_NODE": " 7 "}, 7),
    ],
    ids=[
        "none-default", "on-node", "per-node-plain", "per-node-gpu-prefix", "per-node-type",
        "per-node-gres-type", "per-node-two-types-summed", "job-gpus-counted", "job-gpus-one",
        "step-gpus", "on-node-first", "per-node-before-ids", "job-before-step",
        "empty-is-unset", "whitespace",
    ],
)
# fmt: on
def test_slurm_slots_from_gpu_variables(gpu_variables: dict[str, str], slots: int) -> None:
    hosts = hosts_from_slurm({"SLURM_JOB_NODELIST": "n[1-2]", **gpu_variables})
    assert hosts == [Host("n1", slots), Host("n2", slots)]
    assert_int_slots(hosts, slots)


# fmt: off
@pytest.mark.parametrize(
    ("gpu_variables", "message"),
    [
        ({"SLURM_GPUS_ON_NODE": "four"},
         "slurm: SLURM_GPUS_ON_NODE='four' is not a positive GPU count"),
        ({"SLURM_GPUS_ON_NODE": "0"}, "slurm: SLURM_GPUS_ON_NODE='0' is not a positive GPU count"),
        ({"SLURM_GPUS_ON_NODE": "-1"},
         "slurm: SLURM_GPUS_ON_NODE='-1' is not a positive GPU count"),
        ({"SLURM_GPUS_PER_NODE": "a100"},
         "slurm: SLURM_GPUS_PER_NODE='a100' is not a GPU count"),
        ({"SLURM_GPUS_PER_NODE": "gpu:a100:x"},
         "slurm: SLURM_GPUS_PER_NODE='gpu:a100:x' is not a GPU count"),
        ({"SLURM_GPUS_PER_NODE": "a100:0"},
         "slurm: SLURM_GPUS_PER_NODE='a100:0' is not a positive GPU count"),
        ({"SLURM_JOB_GPUS": "0,,1"}, "slurm: SLURM_JOB_GPUS='0,,1' has an empty item"),
        ({"SLURM_STEP_GPUS": "0,"}, "slurm: SLURM_STEP_GPUS='0,' has an empty item"),
    ],
    ids=[
        "on-node-word", "on-node-zero", "on-node-negative", "per-node-type-only",
        "per-node-bad-count", "per-node-zero", "job-gpus-empty-item", "step-gpus-trailing-comma",
    ],
)
# fmt: on
def test_slurm_refuses_gpu_variables(gpu_variables: dict[str, str], message: str) -> None:
    with pytest.raises(HostSourceError) as raised:
        hosts_from_slurm({"SLURM_JOB_NODELIST": "n1", **gpu_variables})
    assert str(raised.value).startswith(message)


def test_slurm_slots_override_skips_gpu_variables() -> None:
    environ = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_GPUS_ON_NODE": "not-a-number"}
    assert hosts_from_slurm(environ, slots=3) == [Host("n1", 3), Host("n2", 3)]


# resolve_host_source -----------------------------------------------------------------------

SLURM_ENV = {"SLURM_JOB_NODELIST": "node[01-02]", "SLURM_GPUS_ON_NODE": "4"}


@pytest.mark.parametrize(
    ("hostfile", "hosts", "slurm", "found"),
    [
        (None, None, False, "none"),
        ("hosts.txt", "a,b", False, "--hostfile, --hosts"),
        ("hosts.txt", None, True, "--hostfile, --slurm"),
        (None, "a", True, "--hosts, --slurm"),
        ("hosts.txt", "a", True, "--hostfile, --hosts, --slurm"),
    ],
    ids=["none", "hostfile-and-hosts", "hostfile-and-slurm", "hosts-and-slurm", "all-three"],
)
def test_resolve_needs_exactly_one_source(
    hostfile: str | None, hosts: str | None, slurm: bool, found: str
) -> None:
    with pytest.raises(HostSourceError) as raised:
        resolve_host_source(hostfile, hosts, slurm, None, SLURM_ENV)
    assert str(raised.value) == (
        f"give exactly one host source of --hostfile, --hosts, --slurm; got {found}"
    )


def test_resolve_hostfile_passthrough(tmp_path: Path) -> None:
    path = tmp_path / "hosts.txt"
    path.write_text("worker-a slots=8\nworker-b slots=2  # spare\n", encoding="utf-8")
    hosts, description = resolve_host_source(str(path), None, False, None, SLURM_ENV)
    assert hosts == [Host("worker-a", 8), Host("worker-b", 2)]
    assert description == f"hostfile {path}"


def test_resolve_hostfile_parse_error_keeps_its_message(tmp_path: Path) -> None:
    path = tmp_path / "hosts.txt"
    path.write_text("worker-a slots=8\nworker-b slots=zero\n", encoding="utf-8")
    with pytest.raises(HostSourceError) as raised:
        resolve_host_source(str(path), None, False, None, {})
    assert str(raised.value) == (
        f"--hostfile: {path}:2: 'worker-b slots=zero': slots=zero is not a positive integer; "
        "a line is '<host> [slots=<n>] [max_slots=<n>]' with n a positive integer"
    )


def test_resolve_missing_hostfile(tmp_path: Path) -> None:
    path = tmp_path / "absent.txt"
    with pytest.raises(HostSourceError) as raised:
        resolve_host_source(str(path), None, False, None, {})
    assert str(raised.value) == f"--hostfile: [Errno 2] No such file or directory: '{path}'"


def test_resolve_refuses_slots_with_hostfile(tmp_path: Path) -> None:
    path = tmp_path / "hosts.txt"
    path.write_text("worker-a slots=8\n", encoding="utf-8")
    with pytest.raises(HostSourceError) as raised:
        resolve_host_source(str(path), None, False, 4, {})
    assert str(raised.value).startswith("--slots-per-host applies to --hosts and --slurm only")


# fmt: off
@pytest.mark.parametrize(
    ("hosts", "slurm", "slots", "environ", "expected", "description"),
    [
        ("a, b", False, None, {}, [Host("a", 1), Host("b", 1)], "--hosts"),
        ("a,b", False, 8, SLURM_ENV, [Host("a", 8), Host("b", 8)], "--hosts"),
        (None, True, None, SLURM_ENV, [Host("node01", 4), Host("node02", 4)],
         "slurm SLURM_JOB_NODELIST=node[01-02]"),
        (None, True, 2, SLURM_ENV, [Host("node01", 2), Host("node02", 2)],
         "slurm SLURM_JOB_NODELIST=node[01-02]"),
        (None, True, None, {"SLURM_NODELIST": "x[7-8]"}, [Host("x7", 1), Host("x8", 1)],
         "slurm SLURM_NODELIST=x[7-8] (no GPU variable set: 1 slot per node; pass "
         "--slots-per-host or request GPUs with --gpus-per-node)"),
    ],
    ids=["hosts", "hosts-with-slots", "slurm-gpus", "slurm-slots-override", "slurm-old-name"],
)
# fmt: on
def test_resolve_hosts_and_slurm(
    hosts: str | None,
    slurm: bool,
    slots: int | None,
    environ: dict[str, str],
    expected: list[Host],
    description: str,
) -> None:
    found, found_description = resolve_host_source(None, hosts, slurm, slots, environ)
    assert found == expected
    assert_int_slots(found, expected[0].slots)
    assert found_description == description


def test_resolve_slurm_outside_allocation() -> None:
    with pytest.raises(HostSourceError) as raised:
        resolve_host_source(None, None, True, None, {"HOME": "/root"})
    assert "not inside a Slurm allocation: SLURM_JOB_NODELIST is not set" in str(raised.value)
