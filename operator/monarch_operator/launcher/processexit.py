"""How the launcher process ends once it has printed its final line: with the status it
reported, and nothing of the interpreter's finalization after it.

Python's normal exit finalizes the interpreter while daemon threads still run: Monarch's client
and torch keep threads in native code, and CPython 3.11 ends a daemon thread that asks for the
GIL during finalization with ``pthread_exit``, whose forced unwind through C++ frames that catch
it aborts the process ("FATAL: exception not rethrown", status 134; CPython issue 87135). A
launcher that had reported exit 1 (or a rank's own status, field case C9) then ended 134 and
the operator recorded that status (CI 2026-12-07, field case C21's test; C9's loop: 1 run in
50 under load).

So the console scripts end with :func:`exit_process`: what ``sys.exit`` does before finalizing
(wait for the threads that are not daemons, run the ``atexit`` callbacks: logging's shutdown,
``weakref.finalize`` of temporary directories, the progress forwarder's close, Monarch's own
client shutdown), flush the standard streams, then ``os._exit`` with the status.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """End this process with status ``code`` (0-255) without finalizing the interpreter.

    Joins every live thread that is not a daemon (as ``sys.exit`` would), runs the ``atexit``
    callbacks (an exception in one is printed and the others still run, as at a normal exit),
    flushes ``sys.stdout`` and ``sys.stderr`` (a closed or broken stream is skipped), then
    calls ``os._exit(code)``. Never returns.
    """
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread.is_alive():
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, a broken pipe, or None
            pass
    os._exit(code)
