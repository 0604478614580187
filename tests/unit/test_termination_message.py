"""The launcher's failure reason lands in the termination log that Kubernetes reads."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from monarch_operator.launcher import termination
from monarch_operator.launcher.report import Reporter


@pytest.fixture
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(termination.ENV_TERMINATION_LOG, str(path))
    return path


def quiet_reporter() -> Reporter:
    return Reporter(out=io.StringIO(), err=io.StringIO())


def test_failure_reason_is_the_termination_message(termination_log: Path) -> None:
    reason = "trainer rank 1 (host demo-worker-0, local rank 1): raised ValueError: boom at step 2"
    assert quiet_reporter().result(3, reason) == 3
    assert termination_log.read_text() == reason


def test_a_reason_of_several_lines_is_written_on_one(termination_log: Path) -> None:
    # The operator shows a termination message's last line (a user's command's log tail).
    reason = "mesh spmd did not attach: the worker on node-1 exited (ssh exit 255):\n  last output"
    assert quiet_reporter().result(1, reason) == 1
    assert termination_log.read_text() == (
        "mesh spmd did not attach: the worker on node-1 exited (ssh exit 255): last output")


def test_success_and_reasonless_failures_write_nothing(termination_log: Path) -> None:
    quiet_reporter().result(0)
    quiet_reporter().result(1, None)
    assert not termination_log.exists()


def test_last_failure_wins_and_is_cut_at_4096_bytes_on_a_character(termination_log: Path) -> None:
    quiet_reporter().result(1, "first")
    quiet_reporter().result(1, "x" * 4095 + "é" + "tail")  # é is 2 bytes: would end at 4097
    assert termination_log.read_bytes() == b"x" * 4095


def test_unwritable_path_never_fails_the_launcher(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(termination.ENV_TERMINATION_LOG, str(tmp_path / "missing-dir" / "log"))
    assert quiet_reporter().result(4, "boom") == 4
    monkeypatch.setenv(termination.ENV_TERMINATION_LOG, str(tmp_path))  # a directory
    assert quiet_reporter().result(4, "boom") == 4


def test_default_path_is_used_only_when_it_already_exists(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(termination.ENV_TERMINATION_LOG, raising=False)
    default = tmp_path / "termination-log"
    monkeypatch.setattr(termination, "DEFAULT_TERMINATION_LOG", str(default))
    termination.write_termination_message("boom")
    assert not default.exists(), "outside Kubernetes nothing is created"
    default.write_text("")
    termination.write_termination_message("boom")
    assert default.read_text() == "boom"
