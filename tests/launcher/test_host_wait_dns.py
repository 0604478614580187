"""A host whose name resolves late, or to its old address (field case C20, standalone variant).

The launcher runs in a mount namespace whose resolv.conf points at a fake caching resolver
(monarch_operator.testing.fake_dns) that caches "no such name" for 30 s, as CoreDNS's
``cache 30`` does. The host's record appears 2 s after the launcher first asks for it (however
long the launcher took to start): ``--host-wait 40`` rides out
the cached negative answer; the default wait fails naming the host and ``--host-wait``. With
``--host-address NAME=IP`` the launcher also waits until the name resolves to that address,
and keeps resolving to it for ``--dns-stable`` seconds, before it connects.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from monarch_operator.testing.fake_dns import FakeResolver, resolv_conf_wrapper
from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import Launch, run_launch

pytestmark = pytest.mark.ssh

# The fake resolver's address (UDP 53) and the late host's name.
RESOLVER = "127.0.0.81"
LATE_HOST = "late-worker.monarch.test"


def pinned_cluster(tmp_path: Path, cluster: SshCluster) -> SshCluster:
    """``cluster`` with a known_hosts file that also pins LATE_HOST (same daemons' key)."""
    known_hosts = tmp_path / "known_hosts"
    shutil.copy(cluster.known_hosts, known_hosts)
    host_key = (cluster.state_dir / "host_key.pub").read_text()
    with known_hosts.open("a") as pins:
        pins.write(f"[{LATE_HOST}]:{cluster.port} {host_key}")
    return SshCluster(cluster.hosts, cluster.port, cluster.key, cluster.state_dir, known_hosts)


def launch_with_resolver(
    tmp_path: Path,
    cluster: SshCluster,
    monarch_port: int,
    *flags: str,
    extra_env: dict[str, str] | None = None,
) -> Launch:
    a = cluster.hosts[0]
    return run_launch(
        tmp_path,
        pinned_cluster(tmp_path, cluster),
        f"{a} slots=1\n{LATE_HOST} slots=1\n",
        monarch_port,
        *flags,
        "--no-python",
        "sh",
        "-c",
        "echo ok",
        spmd=True,
        wrapper=resolv_conf_wrapper(RESOLVER, tmp_path),
        extra_env=extra_env,
    )


def test_c20_host_wait_40_rides_out_a_cached_negative_answer(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    with FakeResolver(RESOLVER, negative_ttl_s=30) as dns:
        dns.set(LATE_HOST, ssh_cluster.hosts[1], appears_after_s=2)
        launch = launch_with_resolver(tmp_path, ssh_cluster, monarch_port, "--host-wait", "40")

    assert launch.returncode == 0, launch.describe()
    assert f"[spmd/{LATE_HOST}/1] ok" in launch.lines, launch.describe()
    assert launch.wall_s > 25, "the cached negative answer was waited out"


def test_c20_default_host_wait_fails_naming_the_host_and_the_flag(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    with FakeResolver(RESOLVER, negative_ttl_s=30) as dns:
        dns.set(LATE_HOST, ssh_cluster.hosts[1], appears_after_s=2)
        launch = launch_with_resolver(tmp_path, ssh_cluster, monarch_port)

    assert launch.returncode == 1, launch.describe()
    failure = launch.lines[-1]
    assert LATE_HOST in failure and "DNSNotResolvable" in failure, launch.describe()
    assert "--host-wait" in failure, launch.describe()


def test_host_address_waits_until_the_name_resolves_to_it_and_stays(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    # The host was recreated: its name still resolves to the old address (cached 3 s), the
    # new one is ssh_cluster.hosts[1]. The new address comes as a MonarchJob's launcher pod
    # gets it: a file of "NAME IP" lines named by MONARCH_HOST_ADDRESSES. A host wait shorter
    # than the cached answer does not end the wait: one cache lifetime (--dns-stable) bounds
    # it (a job applied again under its name failed with DNSStale after --host-wait's 5 s).
    old, new = "127.0.0.99", ssh_cluster.hosts[1]
    addresses = tmp_path / "addresses"
    addresses.write_text(f"{LATE_HOST} {new}\n")
    with FakeResolver(RESOLVER, positive_ttl_s=3) as dns:
        dns.set(LATE_HOST, old)
        dns.set(LATE_HOST, new, appears_after_s=1)
        launch = launch_with_resolver(
            tmp_path, ssh_cluster, monarch_port, "--dns-stable", "4", "--host-wait", "1",
            extra_env={"MONARCH_HOST_ADDRESSES": str(addresses)},
        )  # fmt: skip
        answers = [(round(t, 1), address) for t, name, address in dns.queries if name == LATE_HOST]

    assert launch.returncode == 0, launch.describe()
    assert f"[spmd/{LATE_HOST}/1] ok" in launch.lines, launch.describe()
    assert answers[0][1] == old, answers
    first_new = next(t for t, address in answers if address == new)
    # It kept asking for the stable window after the first right answer, then went on.
    assert any(address == new and t >= first_new + 4 for t, address in answers), answers
    assert any(f"{LATE_HOST} resolves to {old}, not to {new} yet" in line
               for line in launch.lines), launch.describe()


def test_host_address_still_stale_after_the_wait_is_named_with_both_addresses(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    old, new = "127.0.0.99", ssh_cluster.hosts[1]
    with FakeResolver(RESOLVER, positive_ttl_s=30) as dns:
        dns.set(LATE_HOST, old)
        launch = launch_with_resolver(
            tmp_path, ssh_cluster, monarch_port,
            "--host-address", f"{LATE_HOST}={new}", "--host-wait", "2", "--dns-stable", "3",
        )  # fmt: skip

    assert launch.returncode == 1, launch.describe()
    failure = launch.lines[-1]
    assert f"{LATE_HOST} ({old}): DNSStale: resolves to {old}, not to {new}" in failure, failure
    assert "--host-wait" in failure, failure


def test_host_address_of_an_unknown_host_is_refused_before_any_ssh(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    launch = launch_with_resolver(
        tmp_path, ssh_cluster, monarch_port, "--host-address", "typo-host=10.244.0.1"
    )

    assert launch.returncode == 2, launch.describe()
    assert "'typo-host' is not one of the run's hosts" in launch.lines[-1], launch.describe()
