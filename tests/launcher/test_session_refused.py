"""A host whose sshd accepts the key but cannot start the session (issue 20, item 6).

In a MonarchJob this is a worker run as another user than the launcher's login: sshd cannot set
its uid, and the launcher used to report ``SSHUnreachable: client_loop: send disconnect: Broken
pipe``, while only the worker's log said why. Here sshd fails the session after a successful
login the way it does then (its session set-up for the user fails: a chroot it cannot enter),
and the pre-flight must say that the login worked and the session could not start, naming the
host and the user.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch_operator.launcher.session.diagnose import SSH_SESSION_FAILED
from monarch_operator.launcher.session.preflight import (
    PreflightError,
    PreflightSettings,
    run_preflight,
)
from monarch_operator.launcher.session.ssh import SshSettings
from monarch_operator.testing.loopback_sshd import LoopbackSshd, SshCluster
from tests.launcher.conftest import running

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def refusing_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    daemons = LoopbackSshd(
        1,
        tmp_path_factory.mktemp("refusing"),
        extra_config="ChrootDirectory /nonexistent-monarch-test-dir\n",
    )
    with running(daemons) as cluster:
        yield cluster


def test_a_session_that_cannot_start_is_named_as_such_not_as_unreachable(
    refusing_cluster: SshCluster, tmp_path: Path
) -> None:
    (host,) = refusing_cluster.hosts
    settings = PreflightSettings(
        ssh=SshSettings(
            port=refusing_cluster.port,
            user="root",
            key=str(refusing_cluster.key),
            known_hosts=str(refusing_cluster.known_hosts),
        ),
        python_exe="/usr/bin/python3",
        monarch_port=1,
    )

    with pytest.raises(PreflightError) as caught:
        run_preflight([host], settings, wait_s=0)

    (failure,) = caught.value.failures
    assert failure.reason == SSH_SESSION_FAILED, failure.describe()
    assert "logged in as root with the key" in failure.detail
    assert "cannot set its uid to root" in failure.detail
    assert "nonexistent-monarch-test-dir" in failure.detail, "the server's own words"
    assert host in str(caught.value)
