"""Static checks that catch real faults before a test has to hit them: undefined names, unused
or shadowed imports, syntax errors, and bugbear's likely-bug patterns (pyflakes F, E9, B rules,
via ruff pinned in the dev extra). Style rules (line length, import order) are not enforced
here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    """The pinned ruff of this venv (``python -m ruff``), else one on PATH."""
    if subprocess.run(
        [sys.executable, "-m", "ruff", "--version"], capture_output=True, check=False
    ).returncode == 0:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    assert found, "ruff is not installed: pip install -e '.[dev]' (it pins ruff)"
    return [found]


def test_no_undefined_names_or_likely_bugs() -> None:
    # An undefined name in spmd_launcher's default path once shipped (NameError on the
    # documented in-code example, docs/standalone.md): this is the check that would have caught it.
    done = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--select", "F,E9,B", "--output-format", "concise",
         "operator", "tests", "bench", "examples"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
