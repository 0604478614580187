"""Flags for ssh at scale, keepalives and expected host addresses, shared by every mode.

``--ssh-concurrency``, ``--ssh-retries`` (see :mod:`launcher.session.fanout`),
``--ssh-alive-interval``, ``--ssh-alive-count`` (see :mod:`launcher.session.ssh`),
``--host-address``, ``--host-addresses`` and ``--dns-stable`` (see
:mod:`launcher.session.dnswait`).
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
    host_address_lines,
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
        help="the address host NAME has now (repeatable, or comma-separated): wait until NAME "
        "resolves to IP for --dns-stable seconds before connecting",
    )
    ssh.add_argument(
        "--host-addresses",
        default=os.environ.get(constants.ENV_HOST_ADDRESSES) or None,
        metavar="FILE",
        help="the same for every 'NAME IP' line of FILE (env "
        f"{constants.ENV_HOST_ADDRESSES}, set in a MonarchJob's launcher pod; a missing file "
        "named only by the environment is skipped)",
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
    """``{host name: address}`` from ``--host-addresses FILE`` (default: the file named by
    ``MONARCH_HOST_ADDRESSES``) and every ``--host-address``.

    Raises:
        ValueError: a malformed line or item, naming it and the rule (see
            :mod:`launcher.session.dnswait`), or a ``--host-addresses`` file that cannot be read.
    """
    items: list[str] = []
    path = args.host_addresses
    if path:
        try:
            with open(os.path.expanduser(path)) as listing:
                items = host_address_lines(listing.read(), path)
        except HostAddressError as error:
            raise ValueError(str(error)) from None
        except OSError as error:
            # The operator's variable may name a ConfigMap key an older operator did not write.
            if path != environ.get(constants.ENV_HOST_ADDRESSES):
                raise ValueError(f"--host-addresses {path}: {error.strerror}") from None
    try:
        return parse_host_addresses([*items, *args.host_address], hosts)
    except HostAddressError as error:
        raise ValueError(str(error)) from None
