"""Every shell script in the repository passes ShellCheck (pinned, scripts/scanners.txt)."""

from __future__ import annotations

import subprocess

import pytest

from tests.chart import ROOT
from tests.scan.tools import run, scanner


def _shell_scripts() -> list[str]:
    """Tracked files ending in .sh or starting with a shell shebang (e.g. .ci/run)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    scripts = []
    for name in filter(None, tracked):
        path = ROOT / name
        if not path.is_file():
            continue
        with path.open("rb") as handle:
            first_line = handle.readline()
        if name.endswith(".sh") or first_line.startswith((b"#!/usr/bin/env bash", b"#!/bin/sh",
                                                          b"#!/bin/bash")):
            scripts.append(name)
    return sorted(scripts)


SCRIPTS = _shell_scripts()


def test_the_scripts_are_found():
    assert {".ci/run", "scripts/setup.sh", "images/worker/entrypoint.sh",
            "scripts/install-scanners.sh"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck_finds_nothing(script):
    result = run(scanner("shellcheck"), "--external-sources", script)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_reports_what_it_should(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")
    result = run(scanner("shellcheck"), str(bad))
    assert result.returncode != 0 and "SC2086" in result.stdout, result.stdout
