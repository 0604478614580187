"""Worker side of SPMD mode: one actor per rank that runs a script or a function as torchrun would.

Imported on every host by the Monarch procs (the actor classes are unpickled by reference), so
it imports only Monarch and the standard library: no torch, which would cost ~2 s CPU per proc.

Each rank gets the variables torchrun sets (torch.distributed.run, "Environment Variables" in
https://pytorch.org/docs/stable/elastic/run.html): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``,
``ROLE_NAME``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``,
``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``, and ``OMP_NUM_THREADS=1`` when a
host runs more than one rank and the variable is not set. Ranks are numbered host-major, as
torchrun numbers them: rank = group_rank * nproc_per_node + local_rank.

The restart variables come from the launcher's environment, read once there so that every rank
sees the same values (:func:`.spmd.restart_variables`; field case C21): under the operator
``TORCHELASTIC_RESTART_COUNT`` is the job's restarts after failures when the attempt started
and ``TORCHELASTIC_MAX_RESTARTS`` the most its run policy allows; ``MONARCH_ATTEMPT`` is passed
on as it is. Standalone, without those variables, both are 0 and ``MONARCH_ATTEMPT`` is unset.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import cloudpickle
from monarch.actor import Actor, current_rank, current_size, endpoint

from monarch_operator.launcher.programs.distributed import free_port
from monarch_operator.launcher.session.procstacks import flight_recorder_env
from monarch_operator.launcher.session.rankstacks import ENV_STACKS_DIR, host_dir, wrap_argv

# Label of the per-host proc dimension (Monarch's SPMD helpers also read the last label).
LOCAL_LABEL = "gpus"
HOSTS_LABEL = "hosts"
ROLE_NAME = "default"
# prctl(2) option: signal the child when the thread that forked it exits.
_PR_SET_PDEATHSIG = 1
# Bytes a script's output is read in (any line length passes, unlike readline's 64 KiB limit).
_PUMP_CHUNK = 65536
# How long the start of a line waits for its end before it is written as it is.
PARTIAL_LINE_WAIT_S = 0.5

# Pids of this proc's running scripts, each the leader of its own process group; shared by
# SpmdRank (starts them) and SpmdControl (stops them). The two actors run in the same proc but on
# different asyncio loops, so only pids are shared, never asyncio objects.
_RUNNING: set[int] = set()


@dataclass(frozen=True)
class World:
    """The layout every rank needs to compute its variables.

    Attributes:
        hosts: host names in group-rank order (used in output prefixes).
        addresses: their IPv4 addresses; ``addresses[0]`` is the default ``MASTER_ADDR``.
        nproc_per_node: ranks per host.
        master_addr: ``MASTER_ADDR`` for every rank.
        master_port: ``MASTER_PORT`` for every rank.
        run_id: ``TORCHELASTIC_RUN_ID``.
        role: the role name used in output prefixes.
        prefix_output: prefix every output line with ``[role/host/rank]``.
        cwd: working directory for scripts, the launcher's (shared file systems are the norm on
            preallocated clusters); when a host lacks it, the proc's own (the login's home).
        stacks_dir: where a Python script's rank registers its stack dumps
            (:mod:`launcher.session.rankstacks`); None: no dumps.
    """

    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    nproc_per_node: int
    master_addr: str
    master_port: int
    run_id: str
    role: str = "spmd"
    prefix_output: bool = True
    cwd: str | None = None
    restart_count: int = 0
    max_restarts: int = 0
    attempt: int | None = None
    stacks_dir: str | None = None


# Passed on to every rank as it was in the launcher's environment.
ENV_ATTEMPT = "MONARCH_ATTEMPT"


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended.

    Attributes:
        rank: global rank.
        host: host name of the rank.
        local_rank: rank within the host.
        exit_code: the script's exit status (0 = success); ``128 + N`` if killed by signal N;
            for a function, 0 when it returned and 1 when it raised (or ``SystemExit``'s code).
        ended_at: wall-clock time (``time.time()``) the rank finished, seconds.
        value: the function's return value (function mode only).
        error: the remote traceback text when a function raised, else "".
        exception: the raised exception itself when it could be pickled, else None.
        lost: why the rank's host was lost, in words, when it was (it stopped answering, its
            ssh connection was cut): the rank never exited, so ``exit_code`` is the launcher's
            generic 1 and is not reported as the rank's; "" otherwise.
    """

    rank: int
    host: str
    local_rank: int
    exit_code: int
    ended_at: float
    value: Any = None
    error: str = ""
    exception: BaseException | None = None
    lost: str = ""


def rank_environment(
    world: World, group_rank: int, local_rank: int, base: Mapping[str, str]
) -> dict[str, str]:
    """Return ``base`` plus the torchrun variables of the rank at ``(group_rank, local_rank)``.

    Args:
        world: the job layout.
        group_rank: host index (torchrun's node rank), 0-based.
        local_rank: rank within the host, 0-based.
        base: the environment to start from (the proc's own).

    Returns:
        A new dict; ``base`` is not modified.
    """
    nnodes = len(world.hosts)
    world_size = nnodes * world.nproc_per_node
    rank = group_rank * world.nproc_per_node + local_rank
    env = dict(base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world.nproc_per_node),
        GROUP_RANK=str(group_rank),
        GROUP_WORLD_SIZE=str(nnodes),
        ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(world_size),
        ROLE_NAME=ROLE_NAME,
        MASTER_ADDR=world.master_addr,
        MASTER_PORT=str(world.master_port),
        TORCHELASTIC_RUN_ID=world.run_id,
        TORCHELASTIC_RESTART_COUNT=str(world.restart_count),
        TORCHELASTIC_MAX_RESTARTS=str(world.max_restarts),
    )
    if world.attempt is not None:
        env[ENV_ATTEMPT] = str(world.attempt)
    if world.nproc_per_node > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _coordinates() -> tuple[int, int, int]:
    """Return (global rank, group rank, local rank) of the calling proc."""
    point = current_rank()
    sizes = current_size()
    group_rank = point[HOSTS_LABEL] if HOSTS_LABEL in sizes else 0
    local_rank = point[LOCAL_LABEL] if LOCAL_LABEL in sizes else 0
    return point.rank, group_rank, local_rank


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if this proc dies (mesh torn down, crash), the
    # kernel kills the script too, so no rank outlives its launcher.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


async def _pump(stream: asyncio.StreamReader, out: IO[str], prefix: str) -> None:
    """Copy a script's output to ``out`` byte for byte, ``prefix`` at the start of each line
    (field case C30: no decoding, no line-length limit; a last line without ``\n`` gets one).

    Each write carries whole lines: a line's start is held until its ``\n`` comes, at most
    :data:`PARTIAL_LINE_WAIT_S` (a progress bar that redraws with ``\r``) or
    :data:`_PUMP_CHUNK` bytes. Several ranks write to the same output (the launcher's, through
    their ssh sessions): a line written in pieces, as ``print('a', b)`` of an unbuffered
    script does, would be cut into by another rank's line."""
    sink = out.buffer  # type: ignore[attr-defined]
    marker = prefix.encode()
    at_line_start = True
    pending = b""  # the start of a line whose end has not come yet
    while True:
        try:
            chunk: bytes | None = await asyncio.wait_for(
                stream.read(_PUMP_CHUNK), PARTIAL_LINE_WAIT_S if pending else None)
        except TimeoutError:
            chunk = None  # the partial line waited long enough: out it goes as it is
        if chunk == b"":
            break
        if chunk is None or len(pending) + len(chunk) >= _PUMP_CHUNK:
            data, pending = pending + (chunk or b""), b""
        else:
            data = pending + chunk
            cut = data.rfind(b"\n") + 1
            data, pending = data[:cut], data[cut:]
        if not data:
            continue
        pieces = []
        for line in data.splitlines(keepends=True):
            pieces.append(marker + line if at_line_start else line)
            at_line_start = line.endswith(b"\n")
        out.flush()  # whatever went through the text layer first
        sink.write(b"".join(pieces))
        sink.flush()
    if pending:
        sink.write((marker if at_line_start else b"") + pending)
        at_line_start = False
    if not at_line_start:
        sink.write(b"\n")
    sink.flush()


def _remove_rank_files(folder: str | None, rank: int) -> None:
    """The rank's stack-dump files (its script ended), and its folders once empty."""
    if not folder:
        return
    for suffix in (".pid", ".stack", ".fifo", ".fr", ".fr.tmp"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, f"rank-{rank}{suffix}"))
    for empty in (folder, os.path.dirname(folder)):
        with contextlib.suppress(OSError):
            os.rmdir(empty)


def _status(returncode: int) -> int:
    """asyncio's returncode (negative = killed by that signal) as a shell exit status."""
    return 128 - returncode if returncode < 0 else returncode


def _picklable(error: BaseException) -> BaseException | None:
    try:
        cloudpickle.loads(cloudpickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure means: send the text only
        return None
    return error


class SpmdRank(Actor):
    """One SPMD rank: runs the user's script (CLI) or function (in-code API) with rank variables."""

    def __init__(self, world: World) -> None:
        self._world = world
        # Taken at spawn time: inside an endpoint called on a slice of the mesh, current_rank()
        # is the position within that slice, not within the whole mesh.
        self._rank, self._group_rank, self._local_rank = _coordinates()

    @endpoint
    async def free_port(self, address: str) -> int:
        """Return a TCP port free on ``address`` and on every address now (the default
        ``MASTER_PORT``; :func:`.distributed.free_port`)."""
        return free_port(address)

    def _prefix(self, rank: int, group_rank: int) -> str:
        if not self._world.prefix_output:
            return ""
        return f"[{self._world.role}/{self._world.hosts[group_rank]}/{rank}] "

    @endpoint
    async def run_command(self, argv: Sequence[str]) -> RankOutcome:
        """Run ``argv`` with this rank's variables, relaying its output line by line.

        Args:
            argv: the program and its arguments (e.g. ``[python, "-u", "train.py", "--lr", "1"]``).

        Returns:
            The :class:`RankOutcome` with the program's exit status.
        """
        rank, group_rank, local_rank = self._rank, self._group_rank, self._local_rank
        env = rank_environment(self._world, group_rank, local_rank, os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self._world.stacks_dir:  # every rank's stack on a hang or on demand (issue 35)
            env[ENV_STACKS_DIR] = host_dir(self._world.stacks_dir, self._world.hosts[group_rank])
            env.update(flight_recorder_env(env))  # TORCH_FR_BUFFER_SIZE, unless set
            argv = wrap_argv(argv)
        prefix = self._prefix(rank, group_rank)
        host = self._world.hosts[group_rank]
        stacks = host_dir(self._world.stacks_dir, host) if self._world.stacks_dir else None
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=_die_with_parent,
                start_new_session=True,
                cwd=self._world.cwd if self._world.cwd and os.path.isdir(self._world.cwd) else None,
            )
        except OSError as error:
            message = f"cannot start {argv[0]!r}: {error}"
            print(prefix + message, file=sys.stderr, flush=True)
            return RankOutcome(rank, host, local_rank, 127, time.time(), error=message)
        _RUNNING.add(process.pid)
        try:
            assert process.stdout is not None and process.stderr is not None
            await asyncio.gather(
                _pump(process.stdout, sys.stdout, prefix),
                _pump(process.stderr, sys.stderr, prefix),
            )
            returncode = await process.wait()
        finally:
            _RUNNING.discard(process.pid)
            _remove_rank_files(stacks, rank)
        return RankOutcome(rank, host, local_rank, _status(returncode), time.time())

    @endpoint
    async def run_function(
        self, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RankOutcome:
        """Call ``function(*args, **kwargs)`` in this proc with the rank variables in os.environ.

        The function runs in a worker thread, so the proc keeps answering Monarch while it runs.

        Returns:
            The :class:`RankOutcome`: the return value, or the exception and its traceback. An
            exception never escapes, so the controller learns which rank raised what.
        """
        rank, group_rank, local_rank = self._rank, self._group_rank, self._local_rank
        os.environ.update(rank_environment(self._world, group_rank, local_rank, {}))
        host = self._world.hosts[group_rank]
        try:
            value = await asyncio.to_thread(function, *args, **kwargs)
        except SystemExit as error:
            code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
            return RankOutcome(
                rank,
                host,
                local_rank,
                code,
                time.time(),
                error=f"SystemExit({code})",
                exception=error,
            )
        except BaseException as error:  # noqa: BLE001 - reported to the controller, not lost
            text = "".join(traceback.format_exception(error))
            return RankOutcome(
                rank, host, local_rank, 1, time.time(), error=text, exception=_picklable(error)
            )
        try:
            cloudpickle.dumps(value)
        except Exception as error:  # noqa: BLE001 - any pickling failure
            message = (
                f"the function's return value on rank {rank} cannot be sent back: "
                f"{type(value).__name__} is not picklable ({error})"
            )
            return RankOutcome(rank, host, local_rank, 1, time.time(), error=message)
        return RankOutcome(rank, host, local_rank, 0, time.time(), value=value)


class SpmdControl(Actor):
    """Stops the scripts of its proc; separate from SpmdRank, whose endpoint is busy running one."""

    @endpoint
    async def terminate(self, grace_s: float) -> int:
        """SIGTERM the process group of every running script of this proc; SIGKILL after
        ``grace_s`` seconds those still running.

        Returns:
            How many scripts were running.
        """
        pids = set(_RUNNING)
        _signal_groups(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and pids & _RUNNING:
            await asyncio.sleep(0.05)
        _signal_groups(pids & _RUNNING, signal.SIGKILL)
        return len(pids)


def _signal_groups(pids: set[int], signal_number: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signal_number)
        except OSError:
            pass  # already gone
