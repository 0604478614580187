"""Monarch's own log file stays small: the launcher and its workers log only warnings there.

Every Monarch process appends to ``/tmp/<user>/monarch_log[_<suffix>].log``; at Monarch's default
level (info) this run wrote 107 KB, and nothing ever trims the file. The run uses its own
``MONARCH_LOG_SUFFIX`` so that its file is measured alone.
"""

from __future__ import annotations

import os
import pwd
import uuid
from pathlib import Path

import pytest

from monarch_operator.launcher.session.environment import monarch_log_path
from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.launching import run_launch

pytestmark = pytest.mark.ssh

# Bytes one two-host SPMD run may add to Monarch's log file (client, 2 workers, 2 procs).
LOG_LIMIT_BYTES = 32 * 1024


def test_a_run_logs_little_to_monarchs_file_and_ranks_see_the_level(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    suffix = f"launcher-test-{uuid.uuid4().hex[:8]}"
    log = Path(monarch_log_path(pwd.getpwuid(os.geteuid()).pw_name, suffix))
    script = tmp_path / "show_log_level.py"
    script.write_text("import os\nprint('file log level', os.environ.get('MONARCH_FILE_LOG'))\n")

    try:
        launch = run_launch(
            tmp_path,
            ssh_cluster,
            f"{a} slots=1\n{b} slots=1\n",
            monarch_port,
            "--env",
            f"MONARCH_LOG_SUFFIX={suffix}",
            str(script),
            spmd=True,
            extra_env={"MONARCH_LOG_SUFFIX": suffix},  # the launcher's own Monarch client
        )

        assert launch.returncode == 0, launch.describe()
        levels = sorted(line for line in launch.lines if "file log level" in line)
        assert levels == [
            f"[spmd/{a}/0] file log level warn",
            f"[spmd/{b}/1] file log level warn",
        ], launch.describe()
        assert log.exists(), f"Monarch wrote no {log}: {launch.describe()}"
        size = log.stat().st_size
        assert size < LOG_LIMIT_BYTES, f"{log} has {size} bytes:\n{log.read_text()[-3000:]}"
    finally:
        log.unlink(missing_ok=True)
        Path(f"{log}.1").unlink(missing_ok=True)
