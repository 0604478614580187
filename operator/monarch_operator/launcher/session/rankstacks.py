"""Every rank's Python stack and flight recorder, taken over ssh (issue 35 items 3 and 4).

**In the rank** (:data:`BOOTSTRAP`, run as ``python -c BOOTSTRAP script args...`` by
:func:`wrap_argv`), before the user's script:

- :func:`faulthandler.register` on :data:`STACKS_SIGNAL` (SIGUSR2) writes every thread's stack
  to ``<dir>/rank-<RANK>.stack``. faulthandler, not a Python signal handler nor py-spy: its
  handler is C and async-signal-safe, so it answers while the main thread is blocked in native
  code (``time.sleep``, a gloo/NCCL wait), even holding the GIL; a Python handler runs only
  between bytecodes in the main thread, which a rank stuck in a collective never reaches.
  py-spy needs ptrace (``process_vm_readv``), i.e. ``SYS_PTRACE`` or a permissive Yama
  ``ptrace_scope``, which Pod Security 'restricted' forbids; sending a signal to a process of
  the same uid needs nothing.
- A daemon thread waits on the FIFO ``<dir>/rank-<RANK>.fifo``; when the collector writes to it,
  the thread writes the PyTorch flight recorder's JSON (``_dump_nccl_trace_json`` for NCCL,
  ``_dump_fr_trace_json`` for other backends such as gloo, and groups made without
  ``init_process_group``) to ``<dir>/rank-<RANK>.fr``, or ``{}`` when torch.distributed is not
  loaded. It needs the GIL: a rank whose native call
  holds it gives its stack but no flight recorder part.
- ``<dir>/rank-<RANK>.pid`` holds the rank's pid, so the collector knows whom to signal.

**The collector** (:func:`collect`): one ssh per host (the run's own settings, at most
``--ssh-concurrency`` at once) runs :func:`collect_script`: for each rank whose pid still holds
its stack file open (:data:`HOLDS_FILE`: a pid reused by another process after the rank ended
is never signalled; SIGUSR2 would end it) it empties the stack file, signals the rank and pokes
its FIFO, waits (at most :data:`WAIT_S`) until every stack file is non-empty and kept its size
for :data:`QUIET_LOOKS` looks (faulthandler writes thread by thread, with no end mark: a file
read at its first write lost the main thread's frames) and every flight recorder part is there,
and prints them between ``@@monarch-stacks`` lines (:mod:`.stackdumps` parses them). Nothing
is stopped; a run goes on as before.
"""

from __future__ import annotations

import re
import shlex
import signal
from collections.abc import Mapping, Sequence

from monarch_operator.launcher.session.fanout import CommandResult, run_on_hosts
from monarch_operator.launcher.session.ssh import SshSettings, ssh_runner

STACKS_SIGNAL = signal.SIGUSR2
ENV_STACKS_DIR = "MONARCH_STACKS_DIR"
# How long a host's collector waits for the ranks' parts, seconds: a flight recorder part needs
# the rank's Python thread to run, which takes seconds on a loaded machine; the wait ends as
# soon as every part is in.
WAIT_S = 6.0
MAX_PART_BYTES = 65536  # of one rank's stack or flight recorder dump
COLLECT_LIMIT_S = 20.0  # wall limit of one host's ssh
# A dump counts as written once no stack file grew over this many looks 0.1 s apart after the
# first (0.3 s): faulthandler writes a dump in many small writes and has no end mark, and a
# rank descheduled mid-dump on a loaded host pauses between two of them.
QUIET_LOOKS = 3
# Shell function: ``holds PID FILE`` succeeds while process PID has FILE open (a link in
# /proc/PID/fd points at it; the same user may read them without ptrace rights).
HOLDS_FILE = ('holds() { t=$(readlink -f "$2") || return 1; for f in /proc/$1/fd/*; do '
              '[ "$(readlink "$f" 2>/dev/null)" = "$t" ] && return 0; done; return 1; }')

# Runs in the rank's interpreter before the script (``python -c``); standard library only, and
# torch only when the script imported it. Its names are deleted, so the script's globals are
# as under ``python script.py``.
BOOTSTRAP = r"""
import os, sys
def _monarch_stacks():
    import faulthandler, signal, threading
    folder, rank = os.environ.get("MONARCH_STACKS_DIR"), os.environ.get("RANK", "0")
    if not folder:
        return
    base = os.path.join(folder, "rank-" + rank)
    try:
        os.makedirs(folder, exist_ok=True)
        out = open(base + ".stack", "a")
        faulthandler.register(signal.SIGUSR2, file=out, all_threads=True, chain=False)
        if os.path.exists(base + ".fifo"):
            os.unlink(base + ".fifo")
        os.mkfifo(base + ".fifo")
    except OSError as error:
        print("monarch: no stack dumps for rank %s: %s" % (rank, error), file=sys.stderr)
        return
    def flight_recorder():
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return b"{}"
        from torch._C import _distributed_c10d as c10d
        if dist.is_initialized() and "nccl" in str(dist.get_backend()):
            return c10d._dump_nccl_trace_json(True, False)
        return c10d._dump_fr_trace_json(True, False)
    def serve():
        while True:
            with open(base + ".fifo") as fifo:
                fifo.read()
            try:
                data = flight_recorder()
            except Exception as error:
                import json
                data = json.dumps({"error": "%s: %s" % (type(error).__name__, error)})
            data = data.encode() if isinstance(data, str) else data
            with open(base + ".fr.tmp", "wb") as part:
                part.write(data)
            os.replace(base + ".fr.tmp", base + ".fr")
    threading.Thread(target=serve, name="monarch-stacks", daemon=True).start()
    with open(base + ".pid", "w") as pid:
        pid.write(str(os.getpid()))
_monarch_stacks()
del _monarch_stacks
sys.argv = sys.argv[1:]
import runpy
if sys.argv[0] == "-m":
    del sys.argv[0]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
"""

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def stacks_dir(run_id: str) -> str:
    """The folder of one run's rank files on every host: ``/tmp/monarch-stacks-<run id>`` (the
    run id with anything but letters, digits, ``.``, ``_`` and ``-`` made ``_``)."""
    return f"/tmp/monarch-stacks-{_SAFE.sub('_', run_id)[:64]}"


def host_dir(folder: str, host: str) -> str:
    """One host's folder under :func:`stacks_dir`: ``<folder>/<host>`` (hosts that share a
    /tmp, as loopback hosts do, keep their ranks apart)."""
    return f"{folder}/{_SAFE.sub('_', host)[:128]}"


def wrap_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with :data:`BOOTSTRAP` in front of the script: ``[python, script, ...]`` becomes
    ``[python, -c, BOOTSTRAP, script, ...]``, ``[python, -m, mod, ...]`` becomes ``[python, -c,
    BOOTSTRAP, -m, mod, ...]``. Anything else (``--no-python``, interpreter flags) is returned
    unchanged: it is not known to be Python, and those ranks get no stacks."""
    argv = list(argv)
    if len(argv) < 2 or "python" not in argv[0].rsplit("/", 1)[-1]:
        return argv
    if argv[1] == "-m" and len(argv) > 2:
        return [argv[0], "-c", BOOTSTRAP, *argv[1:]]
    if argv[1].startswith("-"):
        return argv
    return [argv[0], "-c", BOOTSTRAP, *argv[1:]]


def collect_script(folder: str, wait_s: float = WAIT_S) -> str:
    """The shell script one host runs (see the module doc); POSIX sh, ``kill``, ``readlink``,
    ``wc`` and ``head``."""
    d = shlex.quote(folder)
    tries = max(1, int(wait_s / 0.1))
    return f"""{HOLDS_FILE}
d={d}; [ -d "$d" ] || exit 0; live=""; pokes=""
for p in "$d"/rank-*.pid; do
  [ -f "$p" ] || continue; r=${{p##*/rank-}}; r=${{r%.pid}}; pid=$(cat "$p")
  if holds "$pid" "$d/rank-$r.stack"; then
    : > "$d/rank-$r.stack"; rm -f "$d/rank-$r.fr"; live="$live $r"
    kill -USR2 "$pid"; (echo > "$d/rank-$r.fifo") 2>/dev/null & pokes="$pokes $!"
  else echo "@@monarch-stacks rank=$r pid=$pid part=gone"; fi
done
last=""; quiet=0; i=0; while [ $i -lt {tries} ]; do
  done_=1; sizes=""
  for r in $live; do [ -s "$d/rank-$r.stack" ] && [ -f "$d/rank-$r.fr" ] || done_=0
    sizes="$sizes $(wc -c < "$d/rank-$r.stack")"; done
  if [ "$sizes" = "$last" ]; then quiet=$((quiet+1)); else quiet=0; fi
  [ $done_ = 1 ] && [ $quiet -ge {QUIET_LOOKS} ] && break
  last=$sizes; sleep 0.1; i=$((i+1))
done
[ -n "$pokes" ] && kill $pokes 2>/dev/null
for r in $live; do pid=$(cat "$d/rank-$r.pid")
  echo "@@monarch-stacks rank=$r pid=$pid part=stack"; head -c {MAX_PART_BYTES} "$d/rank-$r.stack"
  echo; echo "@@monarch-stacks rank=$r pid=$pid part=fr"
  [ -f "$d/rank-$r.fr" ] && head -c {MAX_PART_BYTES} "$d/rank-$r.fr"; echo
done
"""


def collect(settings: SshSettings, targets: Mapping[str, str], folder: str,
            concurrency: int = 10, limit_s: float = COLLECT_LIMIT_S) -> dict[str, CommandResult]:
    """Run :func:`collect_script` on every host over ssh, on its :func:`host_dir` of
    ``folder``; ``targets``: ``{address: host name}``. Returns ``{host name: result}``
    (``exit_status`` None: no answer within ``limit_s`` seconds). Never raises for a host that
    fails."""
    scripts = {address: collect_script(host_dir(folder, host))
               for address, host in targets.items()}
    runner = ssh_runner(settings, lambda address: f"sh -c {shlex.quote(scripts[address])}",
                        limit_s)
    return run_on_hosts(targets, runner, concurrency=concurrency)
