"""The launcher's exit status: one documented rule, pure so that it is unit-tested.

Rule (field case C9, mpich #7057, ompi #1344):

- ``0``: every step ran and teardown was attempted.
- ``2``: the request cannot be run as given (bad flags, hostfile or placement); nothing started.
- ``N``: a worker process exited with non-zero code ``N``; the first failure Monarch reported to
  the launcher decides (every rank exiting 3 at once gives 3).
- ``128 + S``: a worker process was killed by signal ``S`` (shell convention; SIGKILL gives 137).
- ``128 + S`` also when the launcher itself is stopped by signal ``S`` (SIGTERM: 143, after
  tearing the workers down).
- ``1``: any other failure (unreachable host, attach timeout, an actor raising, ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SUCCESS = 0
FAILURE = 1
USAGE = 2
SIGNAL_BASE = 128

# Wording of Monarch's supervision errors (torchmonarch 0.7.0), e.g. "... the process this actor
# was running on exited with non-zero code 17" and "... failed: Killed(sig=9)".
_EXIT_CODE = re.compile(r"exited with non-zero code (\d+)")
_SIGNAL = re.compile(r"Killed\(sig=(\d+)\)|killed by signal (\d+)", re.IGNORECASE)


def exit_code_from_message(message: str) -> int | None:
    """Return the exit status a Monarch failure message implies, or None if it names none.

    Args:
        message: a supervision error or fault report text.

    Returns:
        The worker's exit code (1..255), ``128 + signal`` for a signal, else None. Whichever of
        the two appears first in the text wins.
    """
    candidates: list[tuple[int, int]] = []
    exit_match = _EXIT_CODE.search(message)
    if exit_match:
        candidates.append((exit_match.start(), int(exit_match.group(1))))
    signal_match = _SIGNAL.search(message)
    if signal_match:
        signal_number = int(signal_match.group(1) or signal_match.group(2))
        candidates.append((signal_match.start(), SIGNAL_BASE + signal_number))
    if not candidates:
        return None
    code = min(candidates)[1]
    return code if 0 < code < 256 else FAILURE


def exit_code_for_failure(messages: Iterable[str]) -> int:
    """Return the launcher's exit status for a failed run.

    Args:
        messages: failure texts in the order the launcher saw them (fault reports first, then
            the exception that stopped the run).

    Returns:
        The code implied by the first message that implies one, else :data:`FAILURE`.
    """
    for message in messages:
        code = exit_code_from_message(message)
        if code is not None:
            return code
    return FAILURE
