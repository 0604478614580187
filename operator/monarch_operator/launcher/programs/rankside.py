"""Runs in every role proc: who this rank is, and what the controller learns when it fails.

The job spawns one :class:`RankProbe` actor on each role's proc mesh right after the procs start
(before any user actor). Its constructor runs in every proc of the role and

- records the rank's identity (role, rank, host, local rank, GPUs) from the proc's position in
  the whole mesh;
- registers the proc's stack dump on SIGUSR2 (:mod:`launcher.session.procstacks`), so the
  launcher can show every proc's stack on a stall, on request or before a stop;
- makes ``os._exit`` leave an exit record first (:mod:`launcher.session.exitrecords`), so the
  launcher reports a rank's own exit status exactly;
- adds a note ``raised on <role> rank R (host H, local rank L)`` to every exception a user
  endpoint raises in this proc (:func:`launcher.session.monarch_compat.add_note_to_actor_errors`),
  so the controller's error names the rank.

Then the job asks it for a free port on the role's first host and gives every proc the
variables of the role's torch.distributed group (:mod:`launcher.programs.distributed`).

Imports Monarch and the standard library only (no torch: it costs ~2 s of CPU per proc).
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass

from monarch.actor import Actor, current_rank, current_size, endpoint

from monarch_operator.launcher.programs.distributed import (
    RoleGroup,
    free_port,
    group_environment,
    interface_of,
)
from monarch_operator.launcher.session.exitrecords import install_exit_recorder
from monarch_operator.launcher.session.procstacks import register as register_stacks
from monarch_operator.launcher.session.procstacks import stack_path

# Label of the per-host proc dimension; Monarch's SPMD helpers treat the last label as local rank.
PROCS_LABEL = "gpus"
HOSTS_LABEL = "hosts"

# The note added to exceptions raised in endpoints, and how the controller reads it back.
_NOTE = "raised on {role} rank {rank} (host {host}, local rank {local_rank})"
NOTE_PATTERN = re.compile(
    r"raised on (?P<role>[\w.-]+) rank (?P<rank>\d+) \(host (?P<host>[^,]+), "
    r"local rank (?P<local_rank>\d+)\)"
)

_identity: RankInfo | None = None


@dataclass(frozen=True)
class RankInfo:
    """Where one rank of a role runs.

    Attributes:
        role: the role name.
        rank: rank within the role, host-major (``host_index * procs_per_host + local_rank``).
        world_size: number of ranks of the role.
        host: host name as given to the launcher (hostfile, ``--hosts`` or Slurm).
        host_index: position of the host in the role's mesh.
        local_rank: index of the rank on its host.
        pid: the proc's process id on its host.
        hostname: the host's own ``gethostname()``.
        ssh_address: server address of the ssh login that started the host's worker (from
            ``SSH_CONNECTION``), "-" when not started over ssh; tells apart loopback test hosts
            that share a host name.
        worker_pid: pid of the Monarch worker this proc descends from (colocated roles share
            it), -1 if none.
        cuda_visible_devices: the proc's ``CUDA_VISIBLE_DEVICES``, "-" when unset.
    """

    role: str
    rank: int
    world_size: int
    host: str
    host_index: int
    local_rank: int
    pid: int
    hostname: str
    ssh_address: str
    worker_pid: int
    cuda_visible_devices: str

    def describe(self) -> str:
        """``<role> rank R (host H, local rank L)``."""
        return f"{self.role} rank {self.rank} (host {self.host}, local rank {self.local_rank})"


def current_identity() -> RankInfo | None:
    """This proc's :class:`RankInfo` once its probe ran; None in other processes."""
    return _identity


def _describe_current() -> str | None:
    identity = _identity
    if identity is None:
        return None
    return _NOTE.format(
        role=identity.role,
        rank=identity.rank,
        host=identity.host,
        local_rank=identity.local_rank,
    )


def _worker_pid() -> int:
    """Pid of the Monarch worker (``run_worker_loop_forever``) this proc descends from, or -1."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"run_worker_loop_forever" in cmdline.read():
                    return pid
            with open(f"/proc/{pid}/stat") as stat:
                # Field 4 is the parent pid; field 2 (the name) may hold spaces: split after ")".
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return -1
    return -1


def _ssh_server_address() -> str:
    # SSH_CONNECTION is "<client ip> <client port> <server ip> <server port>".
    fields = os.environ.get("SSH_CONNECTION", "").split()
    return fields[2] if len(fields) == 4 else "-"


class RankProbe(Actor):
    """Identifies its proc and installs the exit recorder and the error note (module doc)."""

    def __init__(self, role: str, hosts: tuple[str, ...], run_id: str) -> None:
        """Runs in every proc of the role at spawn time, where ``current_rank()`` is the
        position in the whole mesh (inside a call on a slice it would be the slice's)."""
        global _identity
        import socket

        from monarch_operator.launcher.session.monarch_compat import add_note_to_actor_errors

        point, sizes = current_rank(), current_size()
        host_index = point[HOSTS_LABEL] if HOSTS_LABEL in sizes else 0
        local_rank = point[PROCS_LABEL] if PROCS_LABEL in sizes else 0
        _identity = RankInfo(
            role=role,
            rank=point.rank,
            world_size=math.prod(sizes.values()),
            host=hosts[host_index],
            host_index=host_index,
            local_rank=local_rank,
            pid=os.getpid(),
            hostname=socket.gethostname(),
            ssh_address=_ssh_server_address(),
            worker_pid=_worker_pid(),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", "-"),
        )
        # Every thread's stack on SIGUSR2, registered before any user actor runs (issue 35).
        refused = register_stacks(stack_path(run_id, role, point.rank))
        if refused is not None:
            print(f"monarch: {role} rank {point.rank}: {refused}", file=sys.stderr, flush=True)
        install_exit_recorder(run_id, role, point.rank, _identity.host, local_rank)
        add_note_to_actor_errors(_describe_current)

    @endpoint
    def identify(self) -> RankInfo:
        """Return this proc's :class:`RankInfo`."""
        assert _identity is not None
        return _identity

    @endpoint
    def free_port(self, address: str, avoid: tuple[int, ...] = ()) -> int:
        """Return a TCP port free on this host's ``address`` now, not one of ``avoid``."""
        return free_port(address, avoid)

    @endpoint
    def join_group(self, group: RoleGroup, addresses: tuple[str, ...]) -> None:
        """Set this proc's torch.distributed variables for ``group`` (module doc of
        :mod:`launcher.programs.distributed`); ``addresses``: the role's hosts, by index."""
        assert _identity is not None
        interface = interface_of(addresses[_identity.host_index])
        os.environ.update(group_environment(
            group, _identity.rank, _identity.local_rank, interface, os.environ))
