"""Pinned host keys against real sshd on 127.0.0.2-4 (issue 10, item 5): with a known_hosts
file the launcher checks every host strictly, under the name it was given. The pinned key is
accepted; a host presenting another key, or one the file does not know, is refused at once with
a reason naming the host and the file; and ``monarch-launch`` stops before starting any worker.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import subprocess
from pathlib import Path

import pytest

from monarch_operator.launcher.session.preflight import (
    PreflightError,
    PreflightSettings,
    run_preflight,
)
from monarch_operator.launcher.session.ssh import HOST_KEY_CHANGED, HOST_KEY_UNKNOWN, SshSettings
from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh


def settings(cluster: SshCluster, known_hosts: Path, monarch_port: int) -> PreflightSettings:
    ssh = SshSettings(port=cluster.port, user="root", key=str(cluster.key),
                      known_hosts=str(known_hosts))
    return PreflightSettings(ssh=ssh, python_exe="python3", monarch_port=monarch_port,
                             modules=())


def public_key_of_a_new_key(tmp_path: Path) -> str:
    path = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (tmp_path / "impostor.pub").read_text().strip()


def pinned(cluster: SshCluster) -> str:
    return (cluster.state_dir / "host_key.pub").read_text().strip()


def test_the_pinned_key_is_accepted_on_every_host(
    ssh_cluster: SshCluster, monarch_port: int
) -> None:
    addresses = run_preflight(ssh_cluster.hosts,
                              settings(ssh_cluster, ssh_cluster.known_hosts, monarch_port))
    assert list(addresses) == list(ssh_cluster.hosts)


def test_a_host_presenting_another_key_is_refused_naming_host_and_file(
    ssh_cluster: SshCluster, monarch_port: int, tmp_path: Path
) -> None:
    a, b, c = ssh_cluster.hosts
    port = ssh_cluster.port
    # b's sshd presents the cluster's key, but this file pins another one for b: to the
    # launcher, b is a host presenting a key other than the pinned one.
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{a}]:{port},[{c}]:{port} {pinned(ssh_cluster)}\n"
                           f"[{b}]:{port} {public_key_of_a_new_key(tmp_path)}\n")

    with pytest.raises(PreflightError) as caught:
        run_preflight(ssh_cluster.hosts, settings(ssh_cluster, known_hosts, monarch_port))

    (failure,) = caught.value.failures
    assert (failure.host, failure.reason) == (b, HOST_KEY_CHANGED)
    assert failure.detail.startswith(f"{b} presented a host key (SHA256:")
    assert f"other than the one {known_hosts}:2 pins for [{b}]:{port}; refused" in failure.detail
    assert f"ssh-keygen -f '{known_hosts}' -R '[{b}]:{port}'" in failure.detail
    assert set(caught.value.ready) == {a, c}, "the other hosts passed"


def test_a_host_missing_from_the_file_is_refused_not_learned(
    ssh_cluster: SshCluster, monarch_port: int, tmp_path: Path
) -> None:
    a, b, c = ssh_cluster.hosts
    known_hosts = tmp_path / "known_hosts"
    original = f"[{a}]:{ssh_cluster.port},[{b}]:{ssh_cluster.port} {pinned(ssh_cluster)}\n"
    known_hosts.write_text(original)

    with pytest.raises(PreflightError) as caught:
        run_preflight(ssh_cluster.hosts, settings(ssh_cluster, known_hosts, monarch_port))

    (failure,) = caught.value.failures
    assert (failure.host, failure.reason) == (c, HOST_KEY_UNKNOWN)
    assert failure.detail.startswith(
        f"no host key for [{c}]:{ssh_cluster.port} in {known_hosts}; refused (strict checking)")
    assert known_hosts.read_text() == original, "strict checking never writes the file"


def test_keys_are_checked_under_the_name_given_not_the_address(
    ssh_cluster: SshCluster, monarch_port: int, tmp_path: Path
) -> None:
    # 127.0.0.2 written as one number is another name for the same address: the key pinned
    # for the address must not vouch for it (as with a DNS name, the name given is what counts).
    a = ssh_cluster.hosts[0]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{a}]:{ssh_cluster.port} {pinned(ssh_cluster)}\n")
    name = str(int(ipaddress.IPv4Address(a)))

    with pytest.raises(PreflightError) as caught:
        run_preflight([name], settings(ssh_cluster, known_hosts, monarch_port))

    (failure,) = caught.value.failures
    assert (failure.host, failure.address, failure.reason) == (name, a, HOST_KEY_UNKNOWN)
    known_hosts.write_text(f"[{name}]:{ssh_cluster.port} {pinned(ssh_cluster)}\n")
    assert run_preflight([name], settings(ssh_cluster, known_hosts, monarch_port)) == {name: a}


def test_monarch_launch_stops_before_any_worker_on_a_changed_key(
    ssh_cluster: SshCluster, monarch_port: int, tmp_path: Path
) -> None:
    a, b, _ = ssh_cluster.hosts
    known_hosts = tmp_path / "impostor_known_hosts"
    known_hosts.write_text(f"[{a}]:{ssh_cluster.port},[{b}]:{ssh_cluster.port} "
                           f"{public_key_of_a_new_key(tmp_path)}\n")
    cluster = dataclasses.replace(ssh_cluster, known_hosts=known_hosts)

    launch = run_launch(tmp_path, cluster, f"{a} slots=1\n{b} slots=1\n", monarch_port)

    assert launch.returncode == 1, launch.describe()
    failure = launch.lines[-1]
    assert "pre-flight failed on 2 of 2 hosts" in failure, launch.describe()
    assert failure.count("HostKeyChanged") == 2 and str(known_hosts) in failure
    assert not any(line.endswith(" attached") for line in launch.lines), launch.describe()
