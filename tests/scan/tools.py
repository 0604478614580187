"""The pinned linters and scanners (scripts/scanners.txt), as installed by
``scripts/install-scanners.sh`` (run by ``scripts/setup.sh``) into their own virtualenv."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.chart import ROOT

INSTALL_SCRIPT = ROOT / "scripts" / "install-scanners.sh"


def scanner(name: str) -> Path:
    """Path of the pinned ``name`` (``hadolint``, ``shellcheck``, ``checkov``).

    Not installed: the test is skipped with the command that installs it, except under ``CI``
    (set by ``.ci/run``), where ``scripts/setup.sh`` has installed it and its absence fails.
    """
    venv = Path(subprocess.run(["bash", str(INSTALL_SCRIPT), "--path"], capture_output=True,
                               text=True, check=True).stdout.strip())
    tool = venv / "bin" / name
    if not (venv / ".complete").is_file() or not os.access(tool, os.X_OK):
        message = f"{name} is not installed in {venv}: run scripts/install-scanners.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return tool


def run(tool: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run a scanner; its exit status, stdout and stderr (never raises on a finding)."""
    return subprocess.run([str(tool), *args], capture_output=True, text=True, cwd=cwd,
                          check=False)
