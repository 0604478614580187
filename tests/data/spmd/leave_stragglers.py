"""Leaves processes behind the way badly behaved programs do, records their pids in
``argv[1]/<kind>-<RANK>.pid`` and then exits 0 (``argv[2]`` is ``exit``) or sleeps until stopped.

Kinds, each one outside what stopping the rank's process group or ssh session reaches:
- ``setsid``: ``setsid sleep 1000`` in the background (its own session);
- ``nohup``: ``nohup sh -c 'trap "" TERM; exec sleep 1000'``, which ignores SIGHUP and SIGTERM;
- ``daemon``: a Python daemon made by a double fork with ``setsid`` between the forks (as a
  daemonized data loader or rendezvous server is), which ignores SIGTERM and SIGHUP; on rank 0 it
  listens on ``MASTER_ADDR:MASTER_PORT``, the port the next run's rendezvous needs.

Every straggler's output goes to /dev/null, as a daemon's does (one that kept the rank's
output pipe open would hold the run open too). Rank 0 prints ``stragglers started`` once every
rank recorded its pids.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

folder, mode = Path(sys.argv[1]), sys.argv[2]
rank = os.environ["RANK"]
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}


def record(kind: str, pid: int) -> None:
    path = folder / f"{kind}-{rank}.pid"
    path.with_suffix(".tmp").write_text(str(pid))
    path.with_suffix(".tmp").replace(path)


def daemon(listen: bool) -> int:
    read_end, write_end = os.pipe()
    first = os.fork()
    if first:
        os.close(write_end)
        os.waitpid(first, 0)
        with os.fdopen(read_end) as pipe:
            return int(pipe.read())
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    server = None
    if listen:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        server.listen()
    os.write(write_end, str(os.getpid()).encode())
    os.close(write_end)
    while True:  # the socket stays open in this frame
        time.sleep(1000)


record("setsid", subprocess.Popen(["setsid", "sleep", "1000"], **quiet).pid)
ignoring = 'trap "" TERM; exec sleep 1000'
record("nohup", subprocess.Popen(["nohup", "sh", "-c", ignoring], **quiet).pid)
record("daemon", daemon(listen=rank == "0"))
if rank == "0":
    while len(list(folder.glob("*.pid"))) < 3 * int(os.environ["WORLD_SIZE"]):
        time.sleep(0.1)
    print("stragglers started", flush=True)
if mode != "exit":
    time.sleep(1000)
