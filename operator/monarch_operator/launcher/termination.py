"""The launcher's final failure line as the container's termination message.

When a container ends, Kubernetes reads the file at its ``terminationMessagePath`` (default
``/dev/termination-log``, an empty file the kubelet mounts into every container) and shows it
as ``state.terminated.message`` of the pod; the operator puts it into the MonarchJob's Failed
condition. Outside Kubernetes that file does not exist and nothing is written.
"""

from __future__ import annotations

import os

# Overrides the path (tests, or a pod with a custom terminationMessagePath).
ENV_TERMINATION_LOG = "MONARCH_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# The kubelet reads at most 4 KiB of the file (MaxContainerTerminationMessageLength).
MAX_MESSAGE_BYTES = 4096

# Where the program saved its state (:func:`.stoprequest.checkpoint_saved`), None until named.
_checkpoint: str | None = None


def set_checkpoint(location: str | None) -> None:
    """End every termination message from now on with `` [checkpoint: LOCATION]``
    (:mod:`.stoprequest` checks ``location`` first); None forgets it."""
    global _checkpoint
    _checkpoint = location


def checkpoint_location() -> str | None:
    """The location given to :func:`set_checkpoint` last, or None."""
    return _checkpoint


def checkpoint_marker() -> str:
    """`` [checkpoint: LOCATION]`` for the termination message, "" when none was saved."""
    return "" if _checkpoint is None else f" [checkpoint: {_checkpoint}]"


def termination_log_path() -> str | None:
    """Where the termination message goes, or None when there is nowhere to write it.

    ``$MONARCH_TERMINATION_LOG`` when set; else ``/dev/termination-log`` only if that file
    already exists and is writable (in a Kubernetes container), never created elsewhere.
    """
    explicit = os.environ.get(ENV_TERMINATION_LOG)
    if explicit:
        return explicit
    if os.path.isfile(DEFAULT_TERMINATION_LOG) and os.access(DEFAULT_TERMINATION_LOG, os.W_OK):
        return DEFAULT_TERMINATION_LOG
    return None


def write_termination_message(message: str) -> None:
    """Replace the termination log's content with ``message`` on one line (line breaks and runs
    of spaces become one space; UTF-8, at most 4096 bytes): the operator shows the message's
    last line, which then is all of it. A checkpoint the program named
    (:func:`.stoprequest.checkpoint_saved`) ends it as `` [checkpoint: LOCATION]``, never cut.

    Best effort: an unwritable path is ignored, so reporting a failure never fails the launcher.
    """
    path = termination_log_path()
    if path is None:
        return
    marker = checkpoint_marker().encode("utf-8")  # where the program saved its state, last
    data = " ".join(message.split()).encode("utf-8", "replace")[:MAX_MESSAGE_BYTES - len(marker)]
    data = (data.decode("utf-8", "ignore").encode("utf-8") + marker).strip()  # no char cut
    try:
        with open(path, "wb") as termination_log:
            termination_log.write(data)
    except OSError:
        pass
