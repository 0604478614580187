"""The hostfile format shared by the operator (writer) and the launcher (reader).

One host per line, as in MPI hostfiles (Open MPI ``--hostfile``, DeepSpeed). Blank lines and
``#`` comments (full-line or trailing) are ignored; spaces, tabs and CRLF line ends are accepted;
the last line needs no newline (field case C1, mpich #6719). Hosts keep the order of their first
line (field case C11): ranks are placed host by host in that order.

Slots follow Open MPI 5 (PRRTE's hostfile rules and its "slots-given" refusal); the same rules
are in docs/standalone.md ("Hostfile rules") and in every refusal:

- ``<host>``: one slot. A bare host listed on several lines gets one slot per line
  (``a``, ``a`` is ``a`` with 2 slots).
- ``<host> slots=<n>``: ``n`` slots (a positive integer). Such a host is listed on that one line
  only: a second line for it (with ``slots=`` or bare) is refused, naming both lines. Open MPI
  4 added the counts up; Open MPI 5 refuses, and so do we: a hostfile pasted in twice would
  otherwise ask for twice the GPUs each host has.
- ``max_slots=<n>``: Open MPI's cap on a host's slots (it oversubscribes a host up to it). It
  must be at least the line's ``slots``; since the launcher never places more ranks on a host
  than its slots, the cap changes no placement. Given without ``slots=``, it is the slot count,
  as in Open MPI. A line with ``max_slots=`` defines its host's slots like ``slots=`` does.

A host entry is a host name or an IPv4 address, nothing more: ``user@host``, ``host:port`` (or
MPICH's ``host:count``) and IPv6 literals are refused by :func:`host_entry_problem`, because the
login user and sshd port are one setting for every host (``--ssh-user``, ``--ssh-port``).
The operator writes one ``<fqdn> slots=<gpus>`` line per worker (:func:`format_hostfile`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Slots given to a host listed without ``slots=``: one process, as Open MPI and MPICH do.
DEFAULT_SLOTS = 1

# What a hostfile line may hold, quoted in every refusal of a malformed line.
LINE_FORM = "'<host> [slots=<n>] [max_slots=<n>]' with n a positive integer"
# The fields a line may carry after its host, each at most once.
_FIELDS = ("slots", "max_slots")
_POSITIVE = re.compile(r"^[0-9]+$")


class HostfileError(ValueError):
    """A hostfile line that cannot be read; the message names the source and line number."""


@dataclass(frozen=True)
class Host:
    """One machine of a hostfile: its name or address and how many processes (slots) it takes."""

    name: str
    slots: int


def host_entry_problem(name: str) -> str | None:
    """Say why ``name`` cannot be a host entry, or return None when it can.

    A host entry is a host name or an IPv4 address. Refused, each with the flag to use instead:
    whitespace or ``#`` (the hostfile's separators), ``user@host`` (``--ssh-user``),
    ``host:port`` and MPICH's ``host:count`` (``--ssh-port``; slots are ``slots=<n>``), and
    IPv6 literals such as ``::1`` or ``[fe80::1]`` (not supported by this launcher).

    Args:
        name: one host entry as written, already stripped of surrounding whitespace.

    Returns:
        A message naming the entry and the rule it breaks, or None.
    """
    if "#" in name or any(character.isspace() for character in name):
        return (
            f"host name {name!r} cannot contain whitespace or '#', "
            "which the hostfile format uses as separators"
        )
    if "@" in name:
        return (
            f"host entry {name!r}: 'user@host' is not supported; the same login user is used "
            "on every host, give it with --ssh-user"
        )
    if _is_ipv6_literal(name):
        return (
            f"host entry {name!r}: IPv6 addresses are not supported; "
            "use a host name or an IPv4 address"
        )
    if ":" in name:
        return (
            f"host entry {name!r}: 'host:port' is not supported; the same sshd port is used "
            "on every host, give it with --ssh-port (slots are written 'slots=<n>', not MPICH's "
            "'host:<n>')"
        )
    return None


def _is_ipv6_literal(name: str) -> bool:
    """``::1``, ``fe80::1%eth0``, ``[::1]`` or ``[::1]:22``: two colons or a bracket mean IPv6,
    whether or not the text is a well-formed address (no host name has either)."""
    return name.startswith("[") or name.count(":") >= 2


@dataclass
class _Listed:
    """A host as read so far: its first line, its slots, and whether it came on bare lines."""

    line_number: int
    text: str
    slots: int
    bare: bool


def _line_fields(fields: list[str]) -> tuple[int | None, int | None]:
    """``(slots, max_slots)`` of one line's fields after its host, None where not given.

    Raises:
        ValueError: the problem, in words (an unknown field, a field twice, a value that is no
            positive integer, ``max_slots`` below ``slots``).
    """
    values: dict[str, int] = {}
    for field in fields:
        key, equals, value = field.partition("=")
        if not equals and key in _FIELDS:
            raise ValueError(f"{key} needs a value, as in {key}=8; a line is {LINE_FORM}")
        if not equals or key not in _FIELDS:
            raise ValueError(f"unknown field {field!r}; a line is {LINE_FORM}")
        if key in values:
            raise ValueError(f"{key}= is given twice; a line is {LINE_FORM}")
        if not _POSITIVE.match(value) or int(value) < 1:
            raise ValueError(f"{key}={value} is not a positive integer; a line is {LINE_FORM}")
        values[key] = int(value)
    slots, cap = values.get("slots"), values.get("max_slots")
    if slots is not None and cap is not None and cap < slots:
        raise ValueError(
            f"max_slots={cap} is below slots={slots}; max_slots caps a host's slots, so it "
            "must be at least slots"
        )
    return slots, cap


def parse_hostfile(text: str, source: str = "<hostfile>") -> list[Host]:
    """Parse hostfile text into hosts, in the order of each host's first line.

    The rules are the module's (Open MPI 5's): a bare line is one slot and repeated bare lines
    add up; ``slots=<n>`` (or ``max_slots=<n>`` alone) gives ``n`` slots on the host's only
    line; ``max_slots`` must be at least ``slots`` and changes no placement.

    Args:
        text: the file content; ``\\n``, ``\\r\\n`` or ``\\r`` line ends.
        source: file name used in error messages.

    Returns:
        One :class:`Host` per distinct host, in order of first appearance.

    Raises:
        HostfileError: a malformed line (unknown field, a field twice, a count that is not a
            positive integer, ``max_slots`` below ``slots``), a host entry
            :func:`host_entry_problem` refuses (``user@host``, ``host:port``, IPv6), a host
            given ``slots=`` on one line and listed on another, or a file with no hosts. A
            line's refusal reads ``source:line: 'the line': the problem; the rule``.
    """
    hosts: dict[str, _Listed] = {}
    for line_number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{line_number}: {raw_line.strip()!r}"
        name, *fields = line.split()
        problem = host_entry_problem(name)
        if problem is not None:
            raise HostfileError(f"{where}: {problem}")
        try:
            slots, cap = _line_fields(fields)
        except ValueError as error:
            raise HostfileError(f"{where}: {error}") from None
        bare = slots is None and cap is None
        previous = hosts.get(name)
        if previous is None:
            count = slots if slots is not None else cap if cap is not None else DEFAULT_SLOTS
            hosts[name] = _Listed(line_number, raw_line.strip(), count, bare)
        elif bare and previous.bare:
            previous.slots += DEFAULT_SLOTS  # Open MPI: each bare line is one more slot
        else:
            raise HostfileError(
                f"{where}: host {name!r} is already on line {previous.line_number} "
                f"({previous.text!r}); list a host either once with slots=<n> or on one bare "
                "line per slot, not both (Open MPI's rule)"
            )
    if not hosts:
        raise HostfileError(f"{source}: no hosts found")
    return [Host(name=name, slots=listed.slots) for name, listed in hosts.items()]


def read_hostfile(path: str | Path) -> list[Host]:
    """Read and parse the hostfile at ``path``; see :func:`parse_hostfile` for rules and errors.

    Raises:
        HostfileError: also when the file is not UTF-8 text (e.g. a binary file given by mistake).
        OSError: the file cannot be read.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise HostfileError(
            f"{path}: not a UTF-8 text file (byte {error.start}: {error.reason}); expected "
            "'<host> slots=<n>' lines"
        ) from None
    return parse_hostfile(text, source=str(path))


def format_hostfile(hosts: list[Host]) -> str:
    """Render hosts as hostfile text, one ``<name> slots=<n>`` line each, newline-terminated.

    :func:`parse_hostfile` of the result gives ``hosts`` back (round trip, field case C1).
    """
    return "".join(f"{host.name} slots={host.slots}\n" for host in hosts)
