"""Where the launcher's hosts come from: a hostfile, an explicit ``--hosts`` list, or Slurm.

Pure: no sockets, no subprocesses, and the environment is passed in as a mapping, so every rule
here is a table test (tests/unit/test_hostsources.py). Slots are GPUs: one Monarch process per
slot. All three sources produce the same :class:`~monarch_operator.hostfile.Host` list that the
hostfile reader does, so placement never needs to know which one was used.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from monarch_operator.hostfile import (
    DEFAULT_SLOTS,
    Host,
    HostfileError,
    host_entry_problem,
    read_hostfile,
)

# Slurm sets SLURM_JOB_NODELIST; SLURM_NODELIST is the older name, still set for compatibility.
SLURM_NODELIST_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")

# One item of SLURM_GPUS_PER_NODE: ``4``, ``a100:4``, ``gpu:4`` or ``gpu:a100:4``.
_TYPED_GPU_COUNT = re.compile(r"^(?:[^:]+:)*([0-9]+)$")

# Characters of ClusterShell's node-set language that a Slurm hostlist never holds: a nodelist
# holding one was not written by Slurm, so it is refused rather than guessed at.
_NOT_SLURM_SYNTAX = {
    "!": "a ClusterShell set operator (difference)",
    "&": "a ClusterShell set operator (intersection)",
    "^": "a ClusterShell set operator (symmetric difference)",
    "@": "ClusterShell group syntax",
    "*": "a ClusterShell wildcard",
}
# One item inside brackets: a number or an ascending range of numbers, ``7`` or ``01-16``.
_BRACKET_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")
# Most nodes one nodelist may expand to: far above any allocation, low enough that a typo such
# as ``n[1-100000000]`` is refused at once instead of filling memory.
MAX_NODELIST_NODES = 65536

_SOURCE_FLAGS = "--hostfile, --hosts, --slurm"
# Where the GPUs per node come from, in order (see hosts_from_slurm).
_SLURM_GPU_VARIABLES = (
    "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_NODE",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
)


class HostSourceError(ValueError):
    """A host source that cannot be used; the message names the source, the flag or environment
    variable, and the rule broken."""


def hosts_from_list(text: str, slots: int | None) -> list[Host]:
    """Hosts of an explicit ``--hosts a,b,c`` flag, in the order given.

    Args:
        text: comma-separated host names; whitespace around each name is ignored.
        slots: slots (GPUs, one process each) on every host, from ``--slots-per-host``;
            ``None`` means :data:`~monarch_operator.hostfile.DEFAULT_SLOTS`.

    Returns:
        One :class:`Host` per name, all with the same slots.

    Raises:
        HostSourceError: an empty list or empty item (``a,,b``, a trailing comma), a name listed
            twice, a name the hostfile format could not hold (whitespace or ``#`` inside), an
            entry with a user or port (``user@host``, ``host:port``: use ``--ssh-user`` and
            ``--ssh-port``) or an IPv6 address, or ``slots`` below 1.
    """
    slots_per_host = _checked_slots(slots)
    names: dict[str, None] = {}  # ordered set: keeps the order given
    for position, item in enumerate(text.split(","), start=1):
        name = item.strip()
        if not name:
            raise HostSourceError(
                f"--hosts {text!r}: item {position} is empty; "
                "expected comma-separated host names such as 'node1,node2'"
            )
        _check_host_name(name, "--hosts")
        if name in names:
            raise HostSourceError(f"--hosts {text!r}: host {name!r} is listed twice")
        names[name] = None
    return [Host(name=name, slots=slots_per_host) for name in names]


def hosts_from_slurm(environ: Mapping[str, str], *, slots: int | None = None) -> list[Host]:
    """Hosts of the Slurm allocation this process runs in, in the order Slurm wrote them.

    Host names come from ``SLURM_JOB_NODELIST`` (or, if unset, ``SLURM_NODELIST``), a compressed
    hostlist such as ``node[01-04],gpu7``, expanded by :func:`expand_hostlist` in written order
    (field case C11): ``node[10-11],node2`` gives ``node10``, ``node11``, ``node2``, never a
    sort. Slurm writes the list in the order of its own node table (slurm.conf), which sites lay
    out by topology, so rank 0 lands on the first node Slurm lists, as with ``srun``.
    A node listed twice is refused. ClusterShell's extensions (``@group``, ``*``, the set
    operators ``!``, ``&``, ``^``) are not Slurm syntax and are refused.

    Slots per host are GPUs per node, taken from the first of these that is set and non-empty
    (see "OUTPUT ENVIRONMENT VARIABLES" in
    https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES):

    1. ``slots`` (the ``--slots-per-host`` flag), when given;
    2. ``SLURM_GPUS_ON_NODE``: a count, e.g. ``4``;
    3. ``SLURM_GPUS_PER_NODE``: ``[type:]count`` as passed to ``--gpus-per-node``, e.g. ``4``,
       ``a100:4``, ``gpu:a100:4``; a comma list of types (``a100:2,v100:2``) is summed;
    4. ``SLURM_JOB_GPUS``, then ``SLURM_STEP_GPUS``: a comma list of GPU ids, e.g. ``0,1,2,3``,
       counted;
    5. :data:`~monarch_operator.hostfile.DEFAULT_SLOTS`.

    These variables describe the node running the batch script; every node is assumed to have
    the same GPU count, as with ``--gpus-per-node``.

    Args:
        environ: the environment to read, usually ``os.environ``.
        slots: slots (GPUs) per host overriding the variables above; ``None`` to read them.

    Returns:
        One :class:`Host` per node, in nodelist order, all with the same slots.

    Raises:
        HostSourceError: not inside a Slurm allocation (no nodelist variable), an empty or
            malformed nodelist (the variable, its value and the rule broken), ClusterShell-only
            syntax, a node listed twice, a name that
            :func:`~monarch_operator.hostfile.host_entry_problem` refuses, a GPU variable that is
            not a positive count, or ``slots`` below 1.
    """
    variable = _slurm_nodelist_variable(environ)
    nodelist = environ[variable].strip()
    names = _expand_slurm_nodelist(variable, nodelist)
    for name in names:
        _check_host_name(name, f"slurm {variable}")
    slots_per_host = _checked_slots(slots) if slots is not None else _slurm_gpus_per_node(environ)
    return [Host(name=name, slots=slots_per_host) for name in names]


def resolve_host_source(
    hostfile: str | None,
    hosts: str | None,
    slurm: bool,
    slots: int | None,
    environ: Mapping[str, str],
) -> tuple[list[Host], str]:
    """Hosts from the one source the command line chose, and a short description to print.

    Args:
        hostfile: ``--hostfile`` path, or ``None``.
        hosts: ``--hosts`` text, or ``None``.
        slurm: whether ``--slurm`` was given.
        slots: ``--slots-per-host`` (GPUs per host), or ``None``. Sets the slots of ``--hosts``
            and overrides the Slurm GPU count; a hostfile carries its own slots, so it is refused
            there.
        environ: the environment, read only for ``--slurm``.

    Returns:
        ``(hosts, description)``, e.g. ``(..., "hostfile hosts.txt")``, ``(..., "--hosts")`` or
        ``(..., "slurm SLURM_JOB_NODELIST=node[01-04]")``.

    Raises:
        HostSourceError: no source or more than one, ``--slots-per-host`` with ``--hostfile``, or
            any error of the chosen source (a hostfile's read or parse error keeps its message).
    """
    chosen = [
        flag
        for flag, given in (
            ("--hostfile", hostfile is not None),
            ("--hosts", hosts is not None),
            ("--slurm", slurm),
        )
        if given
    ]
    if len(chosen) != 1:
        found = ", ".join(chosen) if chosen else "none"
        raise HostSourceError(f"give exactly one host source of {_SOURCE_FLAGS}; got {found}")
    if hostfile is not None:
        if slots is not None:
            raise HostSourceError(
                "--slots-per-host applies to --hosts and --slurm only; "
                f"hostfile {hostfile} sets slots per line ('<host> slots=<n>')"
            )
        try:
            return read_hostfile(hostfile), f"hostfile {hostfile}"
        except (HostfileError, OSError) as error:
            raise HostSourceError(f"--hostfile: {error}") from error
    if hosts is not None:
        return hosts_from_list(hosts, slots), "--hosts"
    found_hosts = hosts_from_slurm(environ, slots=slots)
    variable = _slurm_nodelist_variable(environ)
    description = f"slurm {variable}={environ[variable].strip()}"
    if slots is None and not any(environ.get(name, "").strip() for name in _SLURM_GPU_VARIABLES):
        description += (
            f" (no GPU variable set: {DEFAULT_SLOTS} slot per node; pass --slots-per-host or "
            "request GPUs with --gpus-per-node)"
        )
    return found_hosts, description


def _checked_slots(slots: int | None) -> int:
    """``--slots-per-host`` as a positive int, ``DEFAULT_SLOTS`` when not given."""
    if slots is None:
        return DEFAULT_SLOTS
    if slots < 1:
        raise HostSourceError(f"--slots-per-host must be a positive integer, got {slots}")
    return slots


def _check_host_name(name: str, source: str) -> None:
    """Refuse an entry that is not a plain host name or IPv4 address; see
    :func:`monarch_operator.hostfile.host_entry_problem` for the rules."""
    problem = host_entry_problem(name)
    if problem is not None:
        raise HostSourceError(f"{source}: {problem}")


def _slurm_nodelist_variable(environ: Mapping[str, str]) -> str:
    """The first nodelist variable that is set, or the not-in-Slurm error."""
    for variable in SLURM_NODELIST_VARIABLES:
        if variable in environ:
            return variable
    raise HostSourceError(
        "slurm: not inside a Slurm allocation: SLURM_JOB_NODELIST is not set "
        "(nor SLURM_NODELIST); run under sbatch or salloc, or use --hostfile or --hosts"
    )


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm hostlist into node names, in the order written.

    Items are separated by commas outside brackets; whitespace around an item is ignored. In an
    item, each ``[...]`` holds comma-separated numbers and ascending ranges (``[1-2,5]``) and is
    expanded in the order written; a range whose bound has a leading zero keeps that width
    (``b[01-03]`` gives ``b01``, ``b02``, ``b03``; both bounds must then have the same width).
    Text may follow a bracket (``node[1-3]-ib``), and an item with several brackets gives every
    combination, the first bracket varying slowest (``r[1-2]n[1-2]`` gives ``r1n1``, ``r1n2``,
    ``r2n1``, ``r2n2``), as Slurm expands them.

    Args:
        hostlist: the compressed list, e.g. ``node[10-11],node2``.

    Returns:
        Node names in written order; duplicates are kept (the caller decides about them).

    Raises:
        ValueError: the reason the text is not a hostlist: an empty item, unbalanced or nested
            brackets, empty brackets, an item in brackets that is not a number or an ascending
            range, bounds of different zero-padded widths, or more than
            :data:`MAX_NODELIST_NODES` nodes.
    """
    names: list[str] = []
    for position, written in enumerate(_top_level_items(hostlist), start=1):
        item = written.strip()
        if not item:
            raise ValueError(f"item {position} is empty")
        names.extend(_expand_item(item, MAX_NODELIST_NODES - len(names)))
    return names


def _expand_item(item: str, room: int) -> list[str]:
    """The names of one comma-free item such as ``rack[1-2]-n[01-04]``, at most ``room`` of them."""
    choices: list[list[str]] = []  # the item as text pieces, each with its alternatives
    rest = item
    while rest:
        opening, closing = rest.find("["), rest.find("]")
        if closing != -1 and (opening == -1 or closing < opening):
            raise ValueError(f"{item!r}: ']' without a '[' before it")
        if opening == -1:
            choices.append([rest])
            break
        closing = rest.find("]", opening)
        if closing == -1:
            raise ValueError(f"{item!r}: '[' without a closing ']'")
        inside = rest[opening + 1 : closing]
        if "[" in inside:
            raise ValueError(f"{item!r}: brackets cannot be nested")
        choices.append([rest[:opening]])
        choices.append(_expand_brackets(item, inside))
        rest = rest[closing + 1 :]
    count = 1
    for alternatives in choices:
        count *= len(alternatives)
    if count > room:
        raise ValueError(f"{item!r}: the list expands to more than {MAX_NODELIST_NODES} nodes")
    return ["".join(pieces) for pieces in itertools.product(*choices)]


def _expand_brackets(item: str, inside: str) -> list[str]:
    """The numbers of one bracket's content, ``1-2,5`` or ``01-03``, as text, in written order."""
    if not inside:
        raise ValueError(f"{item!r}: empty brackets '[]'")
    numbers: list[str] = []
    for part in inside.split(","):
        match = _BRACKET_RANGE.match(part)
        if match is None:
            raise ValueError(
                f"{item!r}: {part!r} in brackets is not a number or a range such as '1-4'"
            )
        low, high = match.group(1), match.group(2) or match.group(1)
        padded = (len(low) > 1 and low.startswith("0")) or (len(high) > 1 and high.startswith("0"))
        if padded and len(low) != len(high):
            width = max(len(low), len(high))
            raise ValueError(
                f"{item!r}: range {part!r} mixes widths; zero-padded bounds need the same "
                f"number of digits, e.g. '{low.zfill(width)}-{high.zfill(width)}'"
            )
        if int(low) > int(high):
            raise ValueError(f"{item!r}: range {part!r} goes down; write it as '{high}-{low}'")
        if int(high) - int(low) + 1 > MAX_NODELIST_NODES:
            raise ValueError(f"{item!r}: the list expands to more than {MAX_NODELIST_NODES} nodes")
        width = len(low) if padded else 0
        numbers.extend(str(number).zfill(width) for number in range(int(low), int(high) + 1))
    return numbers


def _expand_slurm_nodelist(variable: str, nodelist: str) -> list[str]:
    """The node names of ``nodelist`` (the value of ``variable``) in written order, each once;
    refuses what hosts_from_slurm's docstring says is refused."""
    invalid = f"slurm: {variable}={nodelist!r} is not a valid Slurm hostlist"
    for character, what in _NOT_SLURM_SYNTAX.items():
        if character in nodelist:
            raise HostSourceError(f"{invalid}: {character!r} is {what}, not Slurm syntax")
    if not nodelist:
        raise HostSourceError(f"slurm: {variable}={nodelist!r} names no nodes")
    try:
        names = expand_hostlist(nodelist)
    except ValueError as error:
        raise HostSourceError(f"{invalid}: {error}") from None
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise HostSourceError(f"slurm: {variable}={nodelist!r} lists node {name!r} twice")
        seen.add(name)
    return names


def _top_level_items(nodelist: str) -> list[str]:
    """The comma-separated items of a hostlist, split only outside brackets:
    ``a[1,3],b`` gives ``['a[1,3]', 'b']``. Unbalanced brackets are left for the item parser
    to name."""
    items: list[str] = []
    depth = 0
    start = 0
    for index, character in enumerate(nodelist):
        if character == "[":
            depth += 1
        elif character == "]":
            depth -= 1
        elif character == "," and depth == 0:
            items.append(nodelist[start:index])
            start = index + 1
    items.append(nodelist[start:])
    return items


def _slurm_gpus_per_node(environ: Mapping[str, str]) -> int:
    """GPUs per node from the Slurm variables, in the order documented on hosts_from_slurm."""
    value = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    if value:
        return _positive_count("SLURM_GPUS_ON_NODE", value, value)
    value = environ.get("SLURM_GPUS_PER_NODE", "").strip()
    if value:
        total = 0
        for item in value.split(","):
            match = _TYPED_GPU_COUNT.match(item.strip())
            if match is None:
                raise HostSourceError(
                    f"slurm: SLURM_GPUS_PER_NODE={value!r} is not a GPU count; "
                    "expected '[type:]<count>' items such as '4' or 'a100:4'"
                )
            total += int(match.group(1))
        return _positive_count("SLURM_GPUS_PER_NODE", value, str(total))
    for variable in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        value = environ.get(variable, "").strip()
        if value:
            gpu_ids = [gpu_id.strip() for gpu_id in value.split(",")]
            if not all(gpu_ids):
                raise HostSourceError(
                    f"slurm: {variable}={value!r} has an empty item; "
                    "expected a comma list of GPU ids such as '0,1,2,3'"
                )
            return len(gpu_ids)
    return DEFAULT_SLOTS


def _positive_count(variable: str, value: str, count: str) -> int:
    """``count`` as an int of at least 1, or an error naming ``variable=value``."""
    if not re.fullmatch(r"[0-9]+", count) or int(count) < 1:
        raise HostSourceError(
            f"slurm: {variable}={value!r} is not a positive GPU count; "
            "pass --slots-per-host to set the slots per host"
        )
    return int(count)
