"""Range rules of the launcher's flags, as argparse ``type=`` functions shared by both modes.

A value out of range raises :class:`argparse.ArgumentTypeError`, which argparse reports as its
standard usage error naming the flag (``argument --ssh-port: must be a port number 1..65535,
got 0``) with exit status 2, before anything is read or contacted.
"""

from __future__ import annotations

import argparse
import math

# Highest TCP port number.
_MAX_PORT = 65535


def port_number(text: str) -> int:
    """argparse ``type=`` for a TCP port: an integer 1..65535.

    Args:
        text: the flag's value as given.

    Returns:
        The port.

    Raises:
        argparse.ArgumentTypeError: not an integer, or out of range; argparse turns it into a
            usage error naming the flag (exit status 2).
    """
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a port number 1..{_MAX_PORT}, got {text!r}"
        ) from None
    if not 1 <= port <= _MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be a port number 1..{_MAX_PORT}, got {port}")
    return port


def positive_int(text: str) -> int:
    """argparse ``type=`` for a count of at least 1.

    Raises:
        argparse.ArgumentTypeError: not an integer, or below 1 (a usage error, exit status 2).
    """
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {count}")
    return count


def positive_seconds(text: str) -> float:
    """argparse ``type=`` for a time limit: a finite number of seconds above 0.

    Raises:
        argparse.ArgumentTypeError: not a number, not finite, or not above 0 (a usage error,
            exit status 2).
    """
    seconds = _finite_seconds(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return seconds


def non_negative_seconds(text: str) -> float:
    """argparse ``type=`` for a wait that may be skipped: a finite number of seconds, 0 or more.

    Raises:
        argparse.ArgumentTypeError: not a number, not finite, or below 0 (a usage error, exit
            status 2).
    """
    seconds = _finite_seconds(text)
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"must be 0 seconds or more, got {text}")
    return seconds


def _finite_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return seconds
