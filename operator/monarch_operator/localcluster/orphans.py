"""Processes that must not outlive the process that started them.

A test run killed with SIGKILL (a CI timeout, a developer's Ctrl-\\) never runs its fixtures'
teardown, so the local cluster it started (etcd, kube-apiserver, ..., the node agent and its pods)
and the operator under test used to keep running, holding CPU, memory and the test slot's pod
addresses. Children started with :func:`stop_with_parent` as their ``preexec_fn`` get a signal
from the kernel when their parent dies (``PR_SET_PDEATHSIG``, prctl(2)): SIGTERM for the node
agent (it stops its pods) and the operator, SIGKILL for the Go binaries.

Only for children of a long-lived owner such as pytest: ``monarch-localcluster up`` starts a
cluster that must outlive the command, and does not use this.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def stop_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None]:
    """Return a ``preexec_fn`` for :class:`subprocess.Popen` that makes the child receive
    ``sig`` when the calling thread's process dies.

    SIGTERM suits children that clean up (the node agent stops its pods, the operator lets go
    of its watches). SIGKILL suits the control plane's Go binaries: all of them get the signal
    at once, and a kube-apiserver whose etcd is already gone hangs in its graceful shutdown
    until a second signal that nobody sends; their state is wiped by the next ``up`` anyway.

    The kernel sends the signal when the *thread* that forked the child exits, so call
    ``Popen`` from a thread that lives as long as its owner (pytest's main thread does). If the
    parent is already gone when the child runs the hook, the child exits at once (status 1).
    The setting survives ``execve`` (not for set-user-ID programs, which none of ours are).
    """
    parent = os.getpid()

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(1)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec
