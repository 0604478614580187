"""Test helper: the Monarch worker on one host dies at start-up, after the pre-flight passed.

Put this directory on the workers' ``PYTHONPATH`` and pass ``--env CRASH_WORKER_ON=<address>``.
The pre-flight never imports ``monarch.actor`` and never sees ``CRASH_WORKER_ON`` (a private
variable, loaded by the worker itself), so it passes; the worker whose ssh session reached
that address (``SSH_CONNECTION``'s server address) then fails importing ``monarch.actor``.
"""

import importlib.abc
import os
import sys


class _FailMonarchActorImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != "monarch.actor":
            return None
        connection = os.environ.get("SSH_CONNECTION", "").split()
        server_address = connection[2] if len(connection) == 4 else None
        if server_address and server_address == os.environ.get("CRASH_WORKER_ON"):
            raise ImportError(f"deliberate worker crash on {server_address}")
        return None


sys.meta_path.insert(0, _FailMonarchActorImport())
