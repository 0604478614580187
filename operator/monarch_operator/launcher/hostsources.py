"""Where the launcher's hosts come from: a hostfile, an explicit ``--hosts`` list, or Slurm.

Pure: no sockets, no subprocesses, and the environment is passed in as a mapping, so every rule
here is a table test (tests/unit/test_hostsources.py). Slots are GPUs: one Monarch process per
slot. All three sources produce the same :class:`~monarch_operator.hostfile.Host` list that the
hostfile reader does, so placement never needs to know which one was used.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# ClusterShell (LGPL-2.1-or-later) ships no type hints.
from ClusterShell.NodeSet import (
    RESOLVER_NOGROUP,
    NodeSet,
    NodeSetParseError,
)

from monarch_operator.hostfile import DEFAULT_SLOTS, Host, HostfileError, read_hostfile

# Slurm sets SLURM_JOB_NODELIST; SLURM_NODELIST is the older name, still set for compatibility.
SLURM_NODELIST_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")

# One item of SLURM_GPUS_PER_NODE: ``4``, ``a100:4``, ``gpu:4`` or ``gpu:a100:4``.
_TYPED_GPU_COUNT = re.compile(r"^(?:[^:]+:)*([0-9]+)$")

# ClusterShell's set operators (difference, intersection, symmetric difference); a Slurm
# hostlist has none, so a nodelist holding one is refused rather than computed.
_NODESET_OPERATORS = "!&^"

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
            twice, a name the hostfile format could not hold (whitespace or ``#`` inside), or
            ``slots`` below 1.
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
    """Hosts of the Slurm allocation this process runs in, in sorted order.

    Host names come from ``SLURM_JOB_NODELIST`` (or, if unset, ``SLURM_NODELIST``), a compressed
    hostlist such as ``node[01-04],gpu7`` expanded by ClusterShell's ``NodeSet``.

    ClusterShell returns the nodes sorted, not in the order written, and merges duplicates:
    names are grouped by their non-numeric pattern in string order (``b1,a[1-2]`` gives ``a1``,
    ``a2``, ``b1``; ``gpu[2-3],cpu[01-02]`` gives the ``cpu`` nodes first), and numerically
    within a pattern (``node[8-10]`` gives ``node8``, ``node9``, ``node10``, not string order).
    This is how Slurm itself writes the variable: it builds the job's nodelist from a bitmap of
    its nodes, which holds each node once, and sorts it (``bitmap2node_name`` in Slurm's
    src/common/node_conf.c), so a nodelist Slurm wrote is already sorted and duplicate-free.
    A node repeated across comma-separated items (``n[1-2],n2``) is refused; one repeated inside
    a single bracket (``n[1,1]``, ``n[1-2,2]``) is merged by ClusterShell before it can be seen.
    ClusterShell's own extensions are not applied: ``@group`` and ``*`` are not resolved (no
    groups.conf is read) and the set operators ``!``, ``&``, ``^`` are refused.

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
        One :class:`Host` per node, sorted as above, all with the same slots.

    Raises:
        HostSourceError: not inside a Slurm allocation (no nodelist variable), an empty or
            malformed nodelist (ClusterShell's error, with the variable and value), a set
            operator, a node listed twice across items, a name with whitespace or ``#``, a GPU
            variable that is not a positive count, or ``slots`` below 1.
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
    """Refuse a name the hostfile format cannot hold: it splits fields on whitespace and
    starts a comment at ``#`` (see monarch_operator/hostfile.py)."""
    if "#" in name or any(character.isspace() for character in name):
        raise HostSourceError(
            f"{source}: host name {name!r} cannot contain whitespace or '#', "
            "which the hostfile format uses as separators"
        )


def _slurm_nodelist_variable(environ: Mapping[str, str]) -> str:
    """The first nodelist variable that is set, or the not-in-Slurm error."""
    for variable in SLURM_NODELIST_VARIABLES:
        if variable in environ:
            return variable
    raise HostSourceError(
        "slurm: not inside a Slurm allocation: SLURM_JOB_NODELIST is not set "
        "(nor SLURM_NODELIST); run under sbatch or salloc, or use --hostfile or --hosts"
    )


def _expand_slurm_nodelist(variable: str, nodelist: str) -> list[str]:
    """The node names of ``nodelist`` (the value of ``variable``), sorted and each once, as
    described on hosts_from_slurm; refuses what that docstring says is refused."""
    for operator in _NODESET_OPERATORS:
        if operator in nodelist:
            raise HostSourceError(
                f"slurm: {variable}={nodelist!r} is not a valid Slurm hostlist: "
                f"{operator!r} is a ClusterShell set operator, not part of a Slurm hostlist"
            )
    try:
        nodes = NodeSet(nodelist, resolver=RESOLVER_NOGROUP)
        # ClusterShell merges duplicates silently; look for a node in two items ourselves.
        seen = NodeSet(resolver=RESOLVER_NOGROUP)
        for item in _top_level_items(nodelist):
            item_nodes = NodeSet(item, resolver=RESOLVER_NOGROUP)
            repeated = seen.intersection(item_nodes)
            if len(repeated) > 0:
                raise HostSourceError(
                    f"slurm: {variable}={nodelist!r} lists node {str(repeated[0])!r} twice"
                )
            seen.update(item_nodes)
    except NodeSetParseError as error:
        raise HostSourceError(
            f"slurm: {variable}={nodelist!r} is not a valid Slurm hostlist: {error}"
        ) from error
    names = [str(node) for node in nodes]
    if not names:
        raise HostSourceError(f"slurm: {variable}={nodelist!r} names no nodes")
    return names


def _top_level_items(nodelist: str) -> list[str]:
    """The comma-separated items of a hostlist, split only outside brackets:
    ``a[1,3],b`` gives ``['a[1,3]', 'b']``. Call after NodeSet has accepted the brackets."""
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
