"""Flags for ssh at scale, keepalives and expected host addresses, shared by every mode.

``--ssh-concurrency``, ``--ssh-retries`` (see :mod:`launcher.session.fanout`),
``--ssh-alive-interval``, ``--ssh-alive-count`` (see :mod:`launcher.session.ssh`),
``--host-address`` and ``--dns-stable`` (see :mod:`launcher.session.dnswait`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterable, Mapping

from monarch_operator import constants
from monarch_operator.launcher.flagtypes import non_negative_seconds, positive_int
from monarch_operator.launcher.session.dnswait import (
    DEFAULT_STABLE_S,
    HostAddressError,
    parse_host_addresses,
)
from monarch_operator.launcher.session.fanout import DEFAULT_CONCURRENCY, DEFAULT_RETRIES
from monarch_operator.launcher.session.ssh import ALIVE_COUNT_MAX, ALIVE_INTERVAL_S, SshSettings


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def add_ssh_scale_flags(ssh: argparse._ArgumentGroup) -> None:
    """Add the flags of this module to the ``ssh`` group."""
    ssh.add_argument(
        "--ssh-concurrency",
        type=positive_int,
        default=DEFAULT_CONCURRENCY,
        metavar="N",
        help="ssh connections opened at once, at least 1 (default %(default)s: within one "
        "sshd's default MaxStartups 10:30:100)",
    )
    ssh.add_argument(
        "--ssh-retries",
        type=_non_negative_int,
        default=DEFAULT_RETRIES,
        metavar="N",
        help="retries of an ssh connection the server dropped before login (Exceeded "
        "MaxStartups, connection reset or closed by the remote host), with backoff and jitter "
        "(0.5 s doubling to 8 s); 0 or more (default %(default)s)",
    )
    ssh.add_argument(
        "--ssh-alive-interval",
        type=positive_int,
        default=ALIVE_INTERVAL_S,
        metavar="SECONDS",
        help="ssh keepalive every SECONDS of silence (ServerAliveInterval; default %(default)s)",
    )
    ssh.add_argument(
        "--ssh-alive-count",
        type=positive_int,
        default=ALIVE_COUNT_MAX,
        metavar="N",
        help="unanswered keepalives after which a host counts as lost and the run fails "
        "naming it (ServerAliveCountMax; default %(default)s: 60 s of silence)",
    )
    ssh.add_argument(
        "--host-address",
        action="append",
        default=[],
        metavar="NAME=IP",
        help="the address host NAME has now (repeatable, or comma-separated; env "
        f"{constants.ENV_HOST_ADDRESSES}): wait until NAME resolves to IP for --dns-stable "
        "seconds before connecting",
    )
    ssh.add_argument(
        "--dns-stable",
        type=non_negative_seconds,
        default=_env_seconds(constants.ENV_DNS_STABLE, DEFAULT_STABLE_S),
        metavar="SECONDS",
        help="with --host-address: how long each name must keep resolving to its address "
        f"(env {constants.ENV_DNS_STABLE}; default %(default)s, one DNS cache lifetime)",
    )


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return non_negative_seconds(value)
    except argparse.ArgumentTypeError as error:
        raise SystemExit(f"monarch-launch: {name}={value!r}: {error}") from None


def ssh_settings_with_flags(args: argparse.Namespace, settings: SshSettings) -> SshSettings:
    """Return ``settings`` with the concurrency, retry and keepalive flags applied."""
    return dataclasses.replace(
        settings,
        concurrency=args.ssh_concurrency,
        retries=args.ssh_retries,
        alive_interval_s=args.ssh_alive_interval,
        alive_count_max=args.ssh_alive_count,
    )


def host_addresses_from_args(
    args: argparse.Namespace, environ: Mapping[str, str], hosts: Iterable[str]
) -> dict[str, str]:
    """``{host name: address}`` from ``--host-address`` and ``MONARCH_HOST_ADDRESSES``.

    Raises:
        ValueError: a malformed item, naming it and the rule (see
            :func:`launcher.session.dnswait.parse_host_addresses`).
    """
    items = [environ.get(constants.ENV_HOST_ADDRESSES, ""), *args.host_address]
    try:
        return parse_host_addresses(items, hosts)
    except HostAddressError as error:
        raise ValueError(str(error)) from None
