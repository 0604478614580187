"""What a rank inherits on each host: the locked-memory limit, and a warning when RDMA needs more.

Ranks are started by the host's Monarch worker, which runs in the launcher's ssh login: they
inherit that login's resource limits, exactly what ``ssh HOST 'ulimit -l'`` shows (field case
C26, spur PR #449, ompi #6468). Those come from whatever started sshd: its service manager
(systemd ``LimitMEMLOCK=``), ``/etc/security/limits.conf`` through PAM, and in a container the
container runtime's default for every container of the node (containerd's and docker's systemd
units set ``LimitMEMLOCK=infinity``; a runtime started otherwise may leave the kernel's 64 KiB or
8 MiB). RDMA (NCCL's InfiniBand/RoCE transport) pins its buffers and fails with a small limit,
often far into a run ("NET/IB : ... ibv_reg_mr failed", "Cannot allocate memory").

The pre-flight reads each host's limit (:class:`launcher.session.preflight.HostCheck`
``memlock``); :func:`memlock_lines` turns them into one line for the plan and, when RDMA is in
play (:func:`rdma_in_play`) and a host's limit is not unlimited, a warning naming the hosts,
their limit and where it is raised, shown before any worker starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from monarch_operator.launcher.session.preflight import HostCheck

# getrlimit's "no limit" as the remote check reports it.
UNLIMITED = -1
# How many hosts a line names before it says "and N more".
_NAMED_HOSTS = 8


def format_limit(limit: int) -> str:
    """``unlimited``, ``64 KiB``, ``8 MiB`` or ``1.5 GiB``, as ``ulimit -l`` means it."""
    if limit < 0:
        return "unlimited"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if limit >= size:
            return f"{limit / size:g} {unit}"
    return f"{limit} bytes"


def rdma_in_play(environment: Mapping[str, str], checks: Iterable[HostCheck]) -> str | None:
    """Say why RDMA is in play for the workers, or return None when it is not.

    Args:
        environment: the workers' environment (the launcher's ``NCCL_*`` and every ``--env``).
        checks: the hosts' pre-flight results (``infiniband``: the host has ``/dev/infiniband``).

    Returns:
        ``"NCCL_IB_HCA is set"`` or ``"/dev/infiniband exists on a, b"``; None when
        ``NCCL_IB_DISABLE=1`` or neither holds.
    """
    if environment.get("NCCL_IB_DISABLE", "").strip() == "1":
        return None
    ib_variables = sorted(name for name in environment if name.startswith("NCCL_IB_"))
    if ib_variables:
        return f"{', '.join(ib_variables)} {'is' if len(ib_variables) == 1 else 'are'} set"
    devices = [check.host for check in checks if check.infiniband]
    if devices:
        return f"/dev/infiniband exists on {_name_hosts(devices)}"
    return None


def _name_hosts(hosts: list[str]) -> str:
    named = ", ".join(hosts[:_NAMED_HOSTS])
    rest = len(hosts) - _NAMED_HOSTS
    return f"{named} and {rest} more" if rest > 0 else named


def memlock_lines(
    checks: Iterable[HostCheck], environment: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """The plan line and the warning (or None) about the hosts' locked-memory limits.

    Args:
        checks: pre-flight results of the ready hosts, in host order.
        environment: the workers' environment.

    Returns:
        ``(summary, warning)``: summary like ``locked memory (ulimit -l) per host: 64 KiB on
        a, b; unlimited on c`` (None when no host reported a limit); warning when RDMA is in
        play and some host's soft limit is not unlimited, naming those hosts and their limit.
    """
    checks = list(checks)
    by_limit: dict[int, list[str]] = {}
    for check in checks:
        if check.memlock is not None:
            by_limit.setdefault(check.memlock[0], []).append(check.host)
    if not by_limit:
        return None, None
    summary = "locked memory (ulimit -l) per host: " + "; ".join(
        f"{format_limit(limit)} on {_name_hosts(hosts)}" for limit, hosts in by_limit.items()
    )
    why = rdma_in_play(environment, checks)
    limited = {limit: hosts for limit, hosts in by_limit.items() if limit != UNLIMITED}
    if why is None or not limited:
        return summary, None
    where = "; ".join(
        f"{_name_hosts(hosts)}: {format_limit(limit)}" for limit, hosts in limited.items()
    )
    warning = (
        f"RDMA is in play ({why}) but locked memory is limited on {where}; every rank inherits "
        "the login's limit, and NCCL's InfiniBand transport can fail to register its buffers. "
        "Raise it where sshd gets it: its service manager (LimitMEMLOCK=infinity), "
        "/etc/security/limits.conf (memlock), or for a worker container the node's container "
        "runtime (its service's LimitMEMLOCK, or its default ulimits)"
    )
    return summary, warning
