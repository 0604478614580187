"""Hostfile reading and writing (field case C1: mpich #6719, simgrid #136).

The C1 inputs are kept byte-exact under tests/data/hostfiles (see its .gitattributes); the first
test guards those bytes, since a line-ending normalisation would silently weaken every other one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from monarch_operator.hostfile import (
    DEFAULT_SLOTS,
    Host,
    HostfileError,
    format_hostfile,
    host_entry_problem,
    parse_hostfile,
    read_hostfile,
)

HOSTFILES = Path(__file__).resolve().parent.parent / "data" / "hostfiles"
TWO_WORKERS = [Host("worker-a", 8), Host("worker-b", 8)]


def test_case_files_keep_their_exact_bytes() -> None:
    assert (HOSTFILES / "c1-a.txt").read_bytes() == b"worker-a slots=8\nworker-b slots=8\n"
    assert (HOSTFILES / "c1-b.txt").read_bytes() == b"worker-a slots=8\nworker-b slots=8"
    assert (HOSTFILES / "c1-c.txt").read_bytes() == b"worker-a slots=8\r\nworker-b slots=8\r\n"
    assert (HOSTFILES / "c1-d.txt").read_bytes() == b"localhost\n"
    e_bytes = (HOSTFILES / "c1-e.txt").read_bytes()
    assert e_bytes.startswith(b"  worker-a\tslots=8  \n\n# spare: worker-c slots=8\n")
    assert e_bytes.endswith(b"worker-b slots=8   # rack 2\n")


@pytest.mark.parametrize(
    "name",
    ["c1-a.txt", "c1-b.txt", "c1-c.txt", "c1-e.txt"],
    ids=["plain", "no-final-newline", "crlf", "spaces-tab-blank-comments"],
)
def test_case_c1_files_give_two_workers_in_order(name: str) -> None:
    hosts = read_hostfile(HOSTFILES / name)

    assert hosts == TWO_WORKERS
    for host in hosts:
        assert host.name == host.name.strip() and "\r" not in host.name
        assert type(host.slots) is int


def test_case_c1_bare_host_gets_the_documented_default_slots() -> None:
    assert DEFAULT_SLOTS == 1  # documented in hostfile.py: one process, as Open MPI and MPICH
    assert read_hostfile(HOSTFILES / "c1-d.txt") == [Host("localhost", DEFAULT_SLOTS)]


@pytest.mark.parametrize("name", ["c1-a.txt", "c1-b.txt", "c1-c.txt", "c1-d.txt", "c1-e.txt"])
def test_writer_output_reads_back_to_the_same_hosts(name: str) -> None:
    hosts = read_hostfile(HOSTFILES / name)

    text = format_hostfile(hosts)

    assert parse_hostfile(text) == hosts
    assert text.endswith("\n") and "\r" not in text


def test_old_mac_line_ends_are_accepted() -> None:
    assert parse_hostfile("worker-a slots=8\rworker-b slots=8") == TWO_WORKERS


# Hostfile rules (docs/standalone.md, "Hostfile rules"; Open MPI 5's, see hostfile.py).


def test_a_bare_host_listed_twice_gets_one_slot_per_line() -> None:
    hosts = parse_hostfile("worker-a\nworker-b slots=8\nworker-a\n# spare\nworker-a\n")

    assert hosts == [Host("worker-a", 3), Host("worker-b", 8)]


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("worker-a slots=8\nworker-b slots=8\nworker-a slots=8\n", "'worker-a slots=8'"),
        ("worker-a slots=8\nworker-b slots=8\nworker-a\n", "'worker-a slots=8'"),
        ("worker-a\nworker-b slots=8\nworker-a slots=8\n", "'worker-a'"),
        ("worker-a max_slots=8\nworker-b slots=8\nworker-a\n", "'worker-a max_slots=8'"),
    ],
    ids=["slots-twice-same", "slots-then-bare", "bare-then-slots", "max-slots-then-bare"],
)
def test_a_host_with_slots_listed_again_is_refused_naming_both_lines(text: str, first: str) -> None:
    with pytest.raises(HostfileError) as caught:
        parse_hostfile(text, source="hosts.txt")

    message = str(caught.value)
    third = text.splitlines()[2]
    assert message.startswith(f"hosts.txt:3: {third!r}: host 'worker-a' is already on line 1")
    assert first in message
    assert "either once with slots=<n> or on one bare line per slot" in message


def test_same_host_with_other_slots_names_both_lines() -> None:
    text = "worker-a slots=8\n# comment\nworker-b slots=8\nworker-a slots=4\n"

    with pytest.raises(HostfileError) as caught:
        parse_hostfile(text, source="hosts.txt")

    message = str(caught.value)
    assert message.startswith("hosts.txt:4: 'worker-a slots=4':")
    assert "already on line 1 ('worker-a slots=8')" in message


@pytest.mark.parametrize(
    ("line", "host"),
    [
        ("worker-a slots=4 max_slots=8", Host("worker-a", 4)),
        ("worker-a max_slots=8 slots=4", Host("worker-a", 4)),
        ("worker-a slots=4 max_slots=4", Host("worker-a", 4)),
        ("worker-a max_slots=8", Host("worker-a", 8)),
    ],
    ids=["cap-above-slots", "cap-first", "cap-equal", "cap-alone-is-the-slots"],
)
def test_max_slots_is_accepted_and_changes_no_placement(line: str, host: Host) -> None:
    assert parse_hostfile(f"{line}\nworker-b slots=8\n") == [host, Host("worker-b", 8)]


def test_max_slots_below_slots_is_refused_with_the_rule() -> None:
    with pytest.raises(HostfileError) as caught:
        parse_hostfile("worker-a slots=8 max_slots=4\n", source="hosts.txt")

    assert str(caught.value) == (
        "hosts.txt:1: 'worker-a slots=8 max_slots=4': max_slots=4 is below slots=8; max_slots "
        "caps a host's slots, so it must be at least slots"
    )


def test_the_operators_hostfile_lines_read_back() -> None:
    text = "".join(
        f"demo-worker-{i}.demo-worker.team-a.svc.cluster.local slots=8\n" for i in range(3)
    )

    hosts = parse_hostfile(text)

    assert [host.slots for host in hosts] == [8, 8, 8]
    assert format_hostfile(hosts) == text


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("worker-a slots=abc", "not a number"),
        ("worker-a slots=0", "zero slots"),
        ("worker-a slots=-2", "negative slots"),
        ("worker-a slots=", "empty slots"),
        ("worker-a slots 8", "missing '='"),
        ("worker-a cpus=8", "unknown field"),
        ("worker-a slots=8 extra", "trailing word"),
        ("worker-a slots=8 slots=4", "slots twice"),
        ("worker-a max_slots=0", "zero cap"),
        ("worker-a max_slots=x", "cap not a number"),
    ],
)
def test_malformed_line_is_refused_with_its_line_number_text_and_rule(line: str, why: str) -> None:
    with pytest.raises(HostfileError) as caught:
        parse_hostfile(f"worker-b slots=8\n\n{line}\n", source="hosts.txt")

    assert str(caught.value).startswith(f"hosts.txt:3: {line!r}: "), why
    assert str(caught.value).endswith(
        "a line is '<host> [slots=<n>] [max_slots=<n>]' with n a positive integer"
    ), why


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "   \t\r\n"])
def test_file_without_hosts_is_refused(text: str) -> None:
    with pytest.raises(HostfileError, match="no hosts found"):
        parse_hostfile(text, source="hosts.txt")


def test_read_hostfile_names_the_path_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "hosts.txt"
    path.write_bytes(b"worker-a slots=x\n")

    with pytest.raises(HostfileError, match=f"^{path}:1: 'worker-a slots=x': slots=x is not a"):
        read_hostfile(path)


def test_binary_file_is_a_hostfile_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "hosts.bin"
    path.write_bytes(b"\xff\xfe garbage\n")

    with pytest.raises(HostfileError, match=r"hosts.bin: not a UTF-8 text file \(byte 0"):
        read_hostfile(path)


def test_hosts_keep_file_order_never_sorted() -> None:
    # Field case C11: as text "127.0.0.66" sorts before "127.0.0.7".
    text = "127.0.0.7 slots=2\n127.0.0.66 slots=2\n127.0.0.8 slots=2\n127.0.0.70 slots=2\n"

    hosts = parse_hostfile(text)

    assert [host.name for host in hosts] == ["127.0.0.7", "127.0.0.66", "127.0.0.8", "127.0.0.70"]
    assert format_hostfile(hosts) == text


# fmt: off
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("worker-b:2222 slots=8",
         "host entry 'worker-b:2222': 'host:port' is not supported; the same sshd port is used "
         "on every host, give it with --ssh-port (slots are written 'slots=<n>', not MPICH's "
         "'host:<n>')"),
        ("worker-b:8", "host entry 'worker-b:8': 'host:port' is not supported"),
        ("alice@worker-b slots=8",
         "host entry 'alice@worker-b': 'user@host' is not supported; the same login user is "
         "used on every host, give it with --ssh-user"),
        ("alice@worker-b:22", "host entry 'alice@worker-b:22': 'user@host' is not supported"),
        ("::1 slots=1",
         "host entry '::1': IPv6 addresses are not supported; use a host name or an IPv4 "
         "address"),
        ("2001:db8::7", "host entry '2001:db8::7': IPv6 addresses are not supported"),
        ("[2001:db8::7]:22", "host entry '[2001:db8::7]:22': IPv6 addresses are not supported"),
        ("[worker-b]", "host entry '[worker-b]': IPv6 addresses are not supported"),
    ],
    ids=[
        "host-port", "mpich-host-count", "user-host", "user-host-port", "ipv6-loopback",
        "ipv6", "ipv6-bracketed-port", "bracketed-name",
    ],
)
# fmt: on
def test_host_entry_with_user_port_or_ipv6_is_refused_naming_the_line(
    line: str, message: str
) -> None:
    with pytest.raises(HostfileError) as caught:
        parse_hostfile(f"worker-a slots=8\n# spare\n{line}\n", source="hosts.txt")

    assert str(caught.value).startswith(f"hosts.txt:3: {line!r}: {message}")


@pytest.mark.parametrize(
    "name",
    ["worker-a", "demo-worker-10.demo-worker.team-a.svc.cluster.local", "192.0.2.7", "n_1"],
)
def test_plain_names_and_ipv4_addresses_are_host_entries(name: str) -> None:
    assert host_entry_problem(name) is None
    assert parse_hostfile(f"{name} slots=2") == [Host(name, 2)]
