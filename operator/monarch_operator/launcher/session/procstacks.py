"""Every Monarch proc's Python stack, for role mode and the job API (issue 35 items 3 and 4).

**In the proc** (:func:`register`, called by the job's rank probe, the first actor spawned in
every proc of a role, before any user actor): :func:`faulthandler.register` on
:data:`STACKS_SIGNAL` (SIGUSR2) writes every thread's stack to the proc's stack file
(:func:`stack_path`: ``/tmp/monarch-stacks-<run>/<role>-rank-<N>.stack``), and a daemon thread
waits on the FIFO beside it to write PyTorch's flight recorder (``<...>.fr``) when asked, as an
SPMD rank's bootstrap does (:mod:`.rankstacks`). faulthandler, because its handler is C and
needs no GIL: a proc's endpoint thread blocked in a collective or in ``time.sleep`` never runs
Python, so neither a Python signal handler (which would run in the main thread, and Monarch's
main thread runs no user code) nor a Monarch endpoint (the proc's actors are busy or wedged)
would answer; py-spy needs ptrace, which Pod Security 'restricted' forbids.

**The collector** (:func:`collect`): the launcher knows every proc's pid (the probe's
:class:`RankInfo`), so one ssh per host runs :func:`collect_script` over that host's procs. A
pid is signalled only while it still holds its stack file open (a link in ``/proc/<pid>/fd``
points at it): a pid reused by another process after the proc ended is never signalled, and
SIGUSR2's default action would end that process. The script waits until every stack file is
non-empty and has kept its size for :data:`.rankstacks.QUIET_LOOKS` looks (faulthandler writes
thread by thread, with no end mark) and every flight recorder part is there, at most
:data:`WAIT_S`, then prints each part between ``@@monarch-stacks ... role=<role>`` lines
(:mod:`.stackdumps` parses them).

Imports the standard library and :mod:`.rankstacks` only: :func:`register` runs in every role
proc.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shlex
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from monarch_operator.launcher.session.rankstacks import (
    COLLECT_LIMIT_S,
    HOLDS_FILE,
    MAX_PART_BYTES,
    QUIET_LOOKS,
    STACKS_SIGNAL,
    WAIT_S,
    stacks_dir,
)

# PyTorch's flight recorder entries per process group (torch >= 2.8 reads TORCH_FR_BUFFER_SIZE;
# 2.13 still takes the older TORCH_NCCL_TRACE_BUFFER_SIZE but warns that it is deprecated).
# Set for every proc and rank unless the user set either name: recent releases default to
# 2000 too, older ones to 0 (no recorder).
FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_ENV_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"
FR_BUFFER_ENTRIES = "2000"

_registered: list[IO[str]] = []  # keeps the stack file open for the proc's life


@dataclass(frozen=True)
class ProcTarget:
    """One proc to dump: its role, rank within the role, pid and stack file on its host."""

    role: str
    rank: int
    pid: int
    path: str


def stack_path(run_id: str, role: str, rank: int) -> str:
    """The stack file of one proc of a run: ``/tmp/monarch-stacks-<run>/<role>-rank-<N>.stack``
    (the role with anything but letters, digits, ``.``, ``_`` and ``-`` made ``_``)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in role)[:64]
    return f"{stacks_dir(run_id)}/{safe}-rank-{rank}.stack"


def flight_recorder_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``{TORCH_FR_BUFFER_SIZE: 2000}`` when ``environ`` sets neither flight recorder buffer
    name (see :data:`FR_BUFFER_ENV`), else ``{}``."""
    if environ.get(FR_BUFFER_ENV) or environ.get(FR_BUFFER_ENV_OLD):
        return {}
    return {FR_BUFFER_ENV: FR_BUFFER_ENTRIES}


def flight_recorder_json() -> bytes:
    """This process's flight recorder as JSON (``_dump_nccl_trace_json`` for an NCCL default
    group, ``_dump_fr_trace_json`` otherwise: gloo, and groups made without
    ``init_process_group``, such as the built-in example's, which it records too); ``{}`` when
    torch.distributed is not loaded here; ``{"error": ...}`` when the dump raised."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available():
            return b"{}"
        from torch._C import _distributed_c10d as c10d  # type: ignore[import-not-found]

        if dist.is_initialized() and "nccl" in str(dist.get_backend()):
            data = c10d._dump_nccl_trace_json(True, False)
        else:
            data = c10d._dump_fr_trace_json(True, False)
    except Exception as error:  # noqa: BLE001 - said in the dump instead
        data = json.dumps({"error": f"{type(error).__name__}: {error}"})
    return data.encode() if isinstance(data, str) else bytes(data)


def _serve_flight_recorder(base: str) -> None:
    """Write the flight recorder to ``<base>.fr`` each time ``<base>.fifo`` is written to."""
    while True:
        with open(base + ".fifo") as fifo:
            fifo.read()
        with open(base + ".fr.tmp", "wb") as part:
            part.write(flight_recorder_json())
        os.replace(base + ".fr.tmp", base + ".fr")


def register(path: str) -> str | None:
    """In a role proc: dump every thread's stack to ``path`` on SIGUSR2 and serve the flight
    recorder beside it (module doc); sets :func:`flight_recorder_env` in ``os.environ``.

    Returns:
        None when registered, else why not (the proc then gives no stack; it still runs).
    """
    os.environ.update(flight_recorder_env(os.environ))
    base = path.removesuffix(".stack")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        out = open(path, "a")  # noqa: SIM115 - open for the proc's life (faulthandler's file)
        faulthandler.register(STACKS_SIGNAL, file=out, all_threads=True, chain=False)
        _registered.append(out)
        if os.path.lexists(base + ".fifo"):
            os.unlink(base + ".fifo")
        os.mkfifo(base + ".fifo")
    except OSError as error:
        return f"no stack dumps: {error}"
    threading.Thread(target=_serve_flight_recorder, args=(base,), name="monarch-stacks",
                     daemon=True).start()
    return None


def _mark(target: ProcTarget) -> tuple[str, str]:
    """The line that opens a part of ``target``'s output (without its part and role), and its
    role quoted for the shell."""
    return f"@@monarch-stacks rank={target.rank} pid={target.pid}", shlex.quote(target.role)


def collect_script(targets: Sequence[ProcTarget], wait_s: float = WAIT_S) -> str:
    """The shell script one host runs for ``targets`` (see the module doc); POSIX sh with
    ``kill``, ``readlink``, ``wc`` and ``head``."""
    tries = max(1, int(wait_s / 0.1))
    lines = [HOLDS_FILE, 'live=""; pokes=""']
    for index, target in enumerate(targets):
        path = shlex.quote(target.path)
        base = shlex.quote(target.path.removesuffix(".stack"))
        mark, role = _mark(target)
        lines.append(
            f"s{index}={path}; b{index}={base}\n"
            f"if holds {target.pid} \"$s{index}\"; then\n"
            f"  : > \"$s{index}\"; rm -f \"$b{index}.fr\"; live=\"$live {index}\"\n"
            f"  kill -USR2 {target.pid}; (echo > \"$b{index}.fifo\") 2>/dev/null & "
            f"pokes=\"$pokes $!\"\n"
            f"else echo \"{mark} part=gone role=\"{role}; fi")
    lines.append(f"""last=""; quiet=0; i=0; while [ $i -lt {tries} ]; do
  ok=1; sizes=""
  for n in $live; do eval "s=\\$s$n; b=\\$b$n"
    [ -s "$s" ] && [ -f "$b.fr" ] || ok=0; sizes="$sizes $(wc -c < "$s")"; done
  if [ "$sizes" = "$last" ]; then quiet=$((quiet+1)); else quiet=0; fi
  [ $ok = 1 ] && [ $quiet -ge {QUIET_LOOKS} ] && break
  last=$sizes; sleep 0.1; i=$((i+1))
done
[ -n "$pokes" ] && kill $pokes 2>/dev/null""")
    for index, target in enumerate(targets):
        mark, role = _mark(target)
        lines.append(
            f"case \" $live \" in *\" {index} \"*)\n"
            f"  echo \"{mark} part=stack role=\"{role}; head -c {MAX_PART_BYTES} \"$s{index}\""
            f"; echo\n"
            f"  echo \"{mark} part=fr role=\"{role}; [ -f \"$b{index}.fr\" ] && "
            f"head -c {MAX_PART_BYTES} \"$b{index}.fr\"; echo;; esac")
    return "\n".join(lines) + "\n"


def collect(settings: Any, targets: Mapping[str, tuple[str, Sequence[ProcTarget]]],
            concurrency: int = 10, limit_s: float = COLLECT_LIMIT_S) -> dict[str, Any]:
    """Run :func:`collect_script` on every host over ssh (``settings``: the run's
    :class:`.ssh.SshSettings`); ``targets``: ``{address: (host name, its procs)}``. Returns
    ``{host name: fanout.CommandResult}`` (``exit_status`` None: no answer within ``limit_s``
    seconds). Never raises for a host that fails."""
    from monarch_operator.launcher.session.fanout import run_on_hosts
    from monarch_operator.launcher.session.ssh import ssh_runner

    scripts = {address: collect_script(procs) for address, (_, procs) in targets.items()}
    names = {address: host for address, (host, _) in targets.items()}
    runner = ssh_runner(settings, lambda address: f"sh -c {shlex.quote(scripts[address])}",
                        limit_s)
    return run_on_hosts(names, runner, concurrency=concurrency)
