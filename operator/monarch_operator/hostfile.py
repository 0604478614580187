"""The hostfile format shared by the operator (writer) and the launcher (reader).

One host per line: ``<host> slots=<n>``, as in MPI hostfiles (Open MPI ``--hostfile``,
DeepSpeed). Blank lines and ``#`` comments (full-line or trailing) are ignored; spaces, tabs and
CRLF line ends are accepted; the last line needs no newline (field case C1, mpich #6719).
Hosts keep the order written (field case C11): ranks are placed host by host in that order.

A host entry is a host name or an IPv4 address, nothing more: ``user@host``, ``host:port`` (or
MPICH's ``host:count``) and IPv6 literals are refused by :func:`host_entry_problem`, because the
login user and sshd port are one setting for every host (``--ssh-user``, ``--ssh-port``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Slots given to a host listed without ``slots=``: one process, as Open MPI and MPICH do.
DEFAULT_SLOTS = 1

_SLOTS = re.compile(r"^slots=(\d+)$")


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


def parse_hostfile(text: str, source: str = "<hostfile>") -> list[Host]:
    """Parse hostfile text into hosts, in file order.

    Args:
        text: the file content; ``\\n``, ``\\r\\n`` or ``\\r`` line ends.
        source: file name used in error messages.

    Returns:
        One :class:`Host` per distinct host, in order of first appearance. A host listed twice
        with the same slots is kept once.

    Raises:
        HostfileError: a malformed line (unknown field, ``slots`` not a positive integer), a host
            entry :func:`host_entry_problem` refuses (``user@host``, ``host:port``, IPv6), a
            host listed twice with different slots, or a file with no hosts. Messages carry
            ``source:line``.
    """
    hosts: dict[str, Host] = {}
    first_line: dict[str, int] = {}
    for line_number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        name, *fields = line.split()
        problem = host_entry_problem(name)
        if problem is not None:
            raise HostfileError(f"{source}:{line_number}: {problem}")
        slots = DEFAULT_SLOTS
        for field in fields:
            match = _SLOTS.match(field)
            if not match or int(match.group(1)) < 1:
                raise HostfileError(
                    f"{source}:{line_number}: expected '<host> slots=<positive integer>', "
                    f"got {raw_line.strip()!r}"
                )
            slots = int(match.group(1))
        host = Host(name=name, slots=slots)
        previous = hosts.get(name)
        if previous is not None and previous != host:
            raise HostfileError(
                f"{source}:{line_number}: host {name!r} listed again with slots={slots}, "
                f"but line {first_line[name]} gave slots={previous.slots}"
            )
        if previous is None:
            hosts[name] = host
            first_line[name] = line_number
    if not hosts:
        raise HostfileError(f"{source}: no hosts found")
    return list(hosts.values())


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
