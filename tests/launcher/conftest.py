"""Fixtures for launcher tests: an SSH "cluster" on loopback and a leak check per test.

``ssh_cluster`` starts one real sshd per address 127.0.0.2, .3 and .4, all on one free port,
with a generated host key and client key (:mod:`monarch_operator.testing.loopback_sshd`). It
needs root (sshd must switch to the login user) and ``/usr/sbin/sshd``: without them the
fixture fails when ``CI`` is set and skips otherwise.

``monarch_port`` hands each test a fresh free port for the Monarch workers and afterwards kills,
and fails the test on, any process whose command line still mentions ``:<port>``: a leaked ssh
client or an orphaned worker would break the next job on that port.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import NoReturn

import pytest

from monarch_operator.testing.loopback_sshd import (
    LoopbackSshd,
    SshCluster,
    SshdUnavailable,
    free_port,
    loopback_hosts,
    reap_processes_mentioning,
)

__all__ = ["SSH_HOSTS", "SshCluster", "free_port", "running"]

SSH_HOSTS = loopback_hosts(3)


def _unavailable(reason: str) -> NoReturn:
    message = f"ssh cluster unavailable: {reason}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def running(daemons: LoopbackSshd) -> Iterator[SshCluster]:
    """``daemons`` started for the block and stopped after it; without sshd or root the test
    fails when ``CI`` is set and is skipped otherwise (:func:`_unavailable`)."""
    try:
        cluster = daemons.start()
    except SshdUnavailable as error:
        _unavailable(str(error))
    try:
        yield cluster
    finally:
        daemons.stop()


@pytest.fixture(scope="session")
def ssh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    """Three sshd daemons on 127.0.0.2-4, one shared free port, key-only root login."""
    with running(LoopbackSshd(len(SSH_HOSTS), tmp_path_factory.mktemp("ssh"))) as cluster:
        yield cluster


@pytest.fixture
def monarch_port(ssh_cluster: SshCluster) -> Iterator[int]:
    """A fresh free Monarch worker port; after the test, no process may still use it."""
    port = free_port(ssh_cluster.hosts)
    yield port
    strays = reap_processes_mentioning(f":{port}")
    if strays:
        listing = "\n".join(f"  {pid} {args}" for pid, args in strays)
        pytest.fail(f"processes left on monarch port {port} (killed):\n{listing}", pytrace=False)
