"""Field case C29: the own-program guide's "same program without Kubernetes", run as a newcomer
runs it. The console block marked ``run as written`` in docs/own-program.md is taken from the
page and run with bash from the checkout, command for command: the finished example over three
loopback hosts (``monarch_operator.testing.loopback_run``) must train to the end."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import reap_processes_mentioning

pytestmark = pytest.mark.ssh

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "own-program.md"
MARK = "<!-- run as written by tests/launcher/test_own_program_guide.py -->"


def marked_commands(text: str) -> list[str]:
    """The commands of the console block after :data:`MARK`: ``$ `` lines with their ``\\``
    continuations, as a shell would read them."""
    after = text.split(MARK, 1)[1]
    block = re.search(r"```console\n(.*?)```", after, re.S)
    assert block, "no console block after the mark"
    commands, current = [], ""
    for line in block[1].splitlines():
        if line.startswith("$ "):
            current = line[2:]
        elif current:
            current += "\n" + line
        if current and not current.endswith("\\"):
            commands.append(current)
            current = ""
    return commands


def test_the_guides_hostfile_run_works_as_written():
    commands = marked_commands(GUIDE.read_text())
    assert commands and all("loopback_run" in command for command in commands), commands
    for command in commands:
        result = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True,
                                text=True, timeout=600, check=False)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        assert "step 5/5" in output and "rl_kl: done" in output, output[-4000:]
        assert "monarch-launch: succeeded" in output.splitlines(), output[-4000:]
    assert not reap_processes_mentioning("monarch-loopback-"), "sshd left running"
