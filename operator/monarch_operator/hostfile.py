"""The hostfile format shared by the operator (writer) and the launcher (reader).

One host per line: ``<host> slots=<n>``, as in MPI hostfiles (Open MPI ``--hostfile``,
DeepSpeed). Blank lines and ``#`` comments (full-line or trailing) are ignored; spaces, tabs and
CRLF line ends are accepted; the last line needs no newline (field case C1, mpich #6719).
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
            listed twice with different slots, or a file with no hosts. Messages carry
            ``source:line``.
    """
    hosts: dict[str, Host] = {}
    first_line: dict[str, int] = {}
    for line_number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        name, *fields = line.split()
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
