"""Field case C27, the pure parts: the fingerprint, the skew between two, the remote check's
copy of the fingerprint, and the operator's verdict on a launcher refused for it (Fatal, named,
never an Application restart)."""

from __future__ import annotations

import subprocess
import sys

from monarch_operator.controller.judge import recreated
from monarch_operator.controller.spec import policy
from monarch_operator.launcher.session import versions

LAUNCHER = {"torchmonarch": "0.7.0", "torch": "2.9.1", "monarch-operator": "0.1.0",
            "python": "3.11"}


def test_the_skew_names_each_component_and_both_versions():
    host = {**LAUNCHER, "torchmonarch": "0.6.0", "python": "3.12"}
    assert versions.skew(LAUNCHER, host) == [
        "torchmonarch 0.6.0 on the host, 0.7.0 on the launcher",
        "python 3.12 on the host, 3.11 on the launcher"]
    assert versions.skew(LAUNCHER, dict(LAUNCHER)) == []
    # Missing on the host: the ImportFailed check's business (a host-key test's bare Python).
    missing = {**LAUNCHER, "torch": versions.NOT_INSTALLED}
    assert versions.skew(LAUNCHER, missing) == []
    assert versions.skew(LAUNCHER, {"python": "3.11"}) == []  # an older check: not compared
    detail = versions.describe_skew(versions.skew(LAUNCHER, host))
    assert detail.startswith("torchmonarch 0.6.0 on the host") and "spec.launcher.image" in detail


def test_the_remote_fingerprint_is_the_local_one():
    """Run the remote check's copy in a fresh Python of this environment."""
    code = versions.REMOTE_FINGERPRINT + "\nimport json\nprint(json.dumps(fingerprint()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    import json
    assert json.loads(out) == versions.fingerprint()
    assert set(versions.fingerprint()) == {*versions.COMPONENTS, versions.PYTHON}


def test_the_operator_fails_the_job_on_a_skew_and_never_restarts_it():
    line = ("monarch-launch: failed: pre-flight failed on 1 of 2 hosts after 1.2s: "
            "demo-worker-1.demo-worker.team-a.svc.cluster.local (10.244.1.3): VersionSkew: "
            "torchmonarch 0.6.0 on the host, 0.7.0 on the launcher: Monarch needs ...")
    assert recreated.version_skew_hosts(line) == [
        "demo-worker-1.demo-worker.team-a.svc.cluster.local"]
    other = line.replace("VersionSkew", "SSHUnreachable")
    assert recreated.version_skew_hosts(other) == []
    assert not policy.decide(policy.RunPolicy(), policy.FATAL, {}).restart
