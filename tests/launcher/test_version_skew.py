"""Field case C27 over real sshd: two loopback hosts at the same Python path, where the second
host's sessions see another torchmonarch release (a distribution's metadata earlier on its
PYTHONPATH, set by that sshd alone: ``Match LocalAddress`` + ``SetEnv``). The built-in job is
refused in the pre-flight before any worker starts, naming the host, the component and both
versions; the first host passes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from monarch_operator.launcher.session.preflight import PreflightError, run_preflight
from monarch_operator.launcher.session.versions import VERSION_SKEW
from monarch_operator.testing.loopback_sshd import LoopbackSshd, SshCluster, free_port
from tests.launcher.launching import run_launch
from tests.launcher.test_preflight import settings_for

pytestmark = pytest.mark.ssh

OTHER_RELEASE = "0.0.1"


@pytest.fixture
def skewed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    """127.0.0.2 and 127.0.0.3 on their own port; sessions on 127.0.0.3 find torchmonarch
    ``OTHER_RELEASE``'s metadata first."""
    state = tmp_path_factory.mktemp("skew")
    shadow = state / "shadow"
    dist = shadow / f"torchmonarch-{OTHER_RELEASE}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torchmonarch\nVersion: {OTHER_RELEASE}\n")
    extra = f"Match LocalAddress 127.0.0.3\n    SetEnv PYTHONPATH={shadow}\n"
    with LoopbackSshd(2, state, extra_config=extra) as cluster:
        yield cluster


def test_a_host_with_another_torchmonarch_is_refused_naming_both_versions(
        skewed_cluster: SshCluster, tmp_path: Path) -> None:
    port = free_port(skewed_cluster.hosts)
    ours = metadata.version("torchmonarch")
    with pytest.raises(PreflightError) as caught:
        run_preflight(skewed_cluster.hosts, settings_for(skewed_cluster, port))
    [failure] = caught.value.failures
    assert (failure.host, failure.reason) == ("127.0.0.3", VERSION_SKEW), failure
    assert failure.detail.startswith(
        f"torchmonarch {OTHER_RELEASE} on the host, {ours} on the launcher"), failure.detail

    launch = run_launch(tmp_path, skewed_cluster, "127.0.0.2 slots=1\n127.0.0.3 slots=1\n",
                        port, "--trainer-hosts", "1", "--ref-hosts", "1", "--steps", "1",
                        "--json")
    assert launch.returncode == 1, launch.describe()
    results = [json.loads(line) for line in launch.lines if line.startswith("{")]
    final = results[-1]
    assert "127.0.0.3" in json.dumps(final) and VERSION_SKEW in json.dumps(final), final
    assert f"torchmonarch {OTHER_RELEASE} on the host, {ours} on the launcher" in json.dumps(final)
    assert not any("attached" in line for line in launch.lines), launch.describe()
