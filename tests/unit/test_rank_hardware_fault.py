"""monarch-launch names a rank failure caused by the hardware (issue 35 item 2, C34 standalone):
a failed rank whose own words or whose host's last output lines carry a line that means a
device or link fault is reported Infrastructure/GPUHardwareError with its host and rank; its
exit status stays the rank's (the exit status rule, C9)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from monarch_operator import hwerrors
from monarch_operator.launcher.jobconfig import session_from_args
from monarch_operator.launcher.options import UsageError, build_job_parser
from monarch_operator.launcher.programs.failures import report_failure
from monarch_operator.launcher.programs.job import RankFailure, describe_exit_code
from monarch_operator.launcher.report import Reporter
from monarch_operator.launcher.session.lifecycle import FaultRecorder

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


@pytest.fixture(autouse=True)
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv("MONARCH_TERMINATION_LOG", str(path))
    return path


def report(failure: RankFailure, outputs: dict[str, list[str]] | None,
           patterns: tuple[hwerrors.Pattern, ...] = hwerrors.DEFAULT_PATTERNS
           ) -> tuple[int, dict]:
    out = io.StringIO()
    reporter = Reporter(json_mode=True, out=out, err=io.StringIO())
    recorder = FaultRecorder(reporter)
    recorder.hardware_patterns = patterns
    if outputs is not None:
        recorder.output_of = lambda host: outputs.get(host, [])
    code = report_failure(failure, recorder, reporter)
    return code, json.loads(out.getvalue().splitlines()[-1])


def test_a_rank_that_printed_an_ecc_error_and_exited_is_a_hardware_fault(
        termination_log: Path) -> None:
    failure = RankFailure("trainer", 2, "demo-worker-1", 0, 1, describe_exit_code(1))
    outputs = {"demo-worker-1": ["step 2/3 loss=1.30", ECC, "CUDA kernel errors might be "
                                 "asynchronously reported at some other API call"],
               "demo-worker-0": ["step 2/3 loss=1.30"]}
    code, result = report(failure, outputs)
    assert code == 1  # the rank's own status
    assert result["failure_class"] == "Infrastructure"
    assert result["failure_reason"] == hwerrors.REASON
    assert result["hardware"] == {"host": "demo-worker-1", "rank": 2,
                                  "pattern": "ECCUncorrectable", "line": ECC}
    assert result["reason"] == (
        "trainer rank 2 (host demo-worker-1, local rank 0): exited with code 1 "
        f"[GPUHardwareError on host demo-worker-1: hardware error (ECCUncorrectable): {ECC}]")
    # The operator reads the same words from the termination message.
    assert hwerrors.MARKER.search(termination_log.read_text()) is not None


def test_a_raised_error_is_read_from_the_ranks_own_traceback() -> None:
    failure = RankFailure("trainer", 1, "w-0", 1, 1, f"raised {ECC}",
                          traceback=f"Traceback (most recent call last):\n  ...\n{ECC}\n")
    code, result = report(failure, None)
    assert code == 1 and result["hardware"]["pattern"] == "ECCUncorrectable"


def test_only_the_failed_ranks_host_output_is_read() -> None:
    failure = RankFailure("trainer", 0, "w-0", 0, 3, describe_exit_code(3))
    code, result = report(failure, {"w-1": [ECC]})
    assert code == 3 and "failure_class" not in result and "hardware" not in result
    assert "GPUHardwareError" not in result["reason"]


def test_a_programs_own_failure_stays_unclassed() -> None:
    failure = RankFailure("trainer", 0, "w-0", 0, 1, "raised ValueError: boom at step 2",
                          traceback="Traceback ...\nValueError: boom at step 2\n")
    _, result = report(failure, {"w-0": ["torch.OutOfMemoryError: CUDA out of memory."]})
    assert "failure_class" not in result


def test_an_own_pattern_from_the_flag_or_environment_applies(monkeypatch) -> None:
    parser = build_job_parser()
    args = parser.parse_args(["--hosts", "w-0", "--hardware-error-pattern", r"mlx5_\d+: link down"])
    environ = {hwerrors.ENV: hwerrors.to_env({"patterns": ["disk on fire"],
                                              "replaceDefaults": True})}
    session = session_from_args(args, environ, ("monarch",))
    assert [pattern.regex for pattern in session.hardware_patterns] == [
        "disk on fire", r"mlx5_\d+: link down"]
    failure = RankFailure("trainer", 0, "w-0", 0, 1, describe_exit_code(1))
    _, result = report(failure, {"w-0": ["kernel: mlx5_1: link down"]}, session.hardware_patterns)
    assert result["hardware"]["pattern"] == "--hardware-error-pattern[0]"
    _, result = report(failure, {"w-0": [ECC]}, session.hardware_patterns)
    assert "hardware" not in result  # the defaults were replaced
    with pytest.raises(UsageError, match=r"^--hardware-error-pattern\[0\]: not a valid"):
        session_from_args(parser.parse_args(["--hosts", "w-0", "--hardware-error-pattern", "("]),
                          {}, ("monarch",))
