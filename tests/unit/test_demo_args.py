"""scripts/demo.sh checks its arguments before the set-up, with the demo's own parser run by a
bare python3 (localcluster/args.py), and says what happened when the job outlives --timeout."""

import subprocess
import sys
from pathlib import Path

import pytest

from monarch_operator.localcluster import args, demo

ROOT = Path(__file__).resolve().parents[2]
ARGS_SCRIPT = ROOT / "operator" / "monarch_operator" / "localcluster" / "args.py"


@pytest.mark.parametrize(("argv", "said"), [
    (["--nodes", "0"], "argument --nodes: 0: at least 1 real node (--simulated runs kwok"),
    (["--nodes", "-1"], "argument --nodes: -1: at least 1 real node"),
    (["--nodes", "two"], "argument --nodes: 'two' is not a whole number of nodes"),
    (["--timeout", "0"], "argument --timeout: 0: must be more than 0 seconds"),
    (["--timeout", "nan"], "argument --timeout: nan: must be more than 0 seconds"),
    (["--namespace", "Team_A"], "argument --namespace: 'Team_A' is not a namespace name"),
    (["--namespace", "a" * 64], "is not a namespace name: at most 63"),
    (["--kep"], "unrecognized arguments: --kep"),
])
def test_a_bad_argument_is_refused_with_its_flag_and_rule(argv, said, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        args.demo_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err


def test_good_arguments_parse_to_what_the_demo_uses() -> None:
    parsed = args.demo_parser().parse_args(["--nodes", "3", "--timeout", "90.5", "--namespace",
                                            "team-b", "--keep", "--dir", "/tmp/x"])
    assert (parsed.nodes, parsed.timeout, parsed.namespace, parsed.keep, parsed.dir) == \
        (3, 90.5, "team-b", True, Path("/tmp/x"))
    defaults = args.demo_parser().parse_args([])
    assert (defaults.nodes, defaults.timeout, defaults.simulated) == (2, 600.0, False)


def test_the_check_runs_on_a_bare_python_before_any_set_up(tmp_path) -> None:
    # -S -I: no site-packages at all, so the file may import the standard library only.
    bad = subprocess.run([sys.executable, "-S", "-I", str(ARGS_SCRIPT), "demo", "--nodes", "-1"],
                         cwd=tmp_path, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "at least 1 real node" in bad.stderr
    good = subprocess.run([sys.executable, "-S", "-I", str(ARGS_SCRIPT), "demo", "--keep"],
                          cwd=tmp_path, capture_output=True, text=True, check=False)
    assert (good.returncode, good.stdout, good.stderr) == (0, "", "")
    script = (ROOT / "scripts" / "demo.sh").read_text()
    assert script.index("args.py demo") < script.index("scripts/setup.sh\n")


class _Kubectl:
    """Answers the calls demo.timed_out makes, as a job stuck in Running would."""

    def __call__(self, *argv: str, check: bool = True) -> str:
        assert argv[:2] == ("get", "monarchjobs")
        return "NAME   PHASE     READY\ndemo   Running   3/3\n"

    def json(self, *argv: str) -> dict:
        if argv[0] == "monarchjob":
            return {"status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "reason": "WorkersReady",
                 "message": "3/3 workers ready"}]}}
        return {"items": []}  # no launcher pod (yet)


def test_a_job_past_the_timeout_is_reported_not_a_traceback(tmp_path) -> None:
    text = demo.timed_out(_Kubectl(), tmp_path, "team-a", 5,  # type: ignore[arg-type]
                          TimeoutError("team-a/demo still ('Running', '3/3') after 5s"))
    assert text.startswith("[demo] the job did not finish within 5 s (team-a/demo still")
    assert "--timeout SECONDS waits longer" in text
    assert "demo   Running   3/3" in text
    assert "condition Ready=True WorkersReady: 3/3 workers ready" in text
    assert f"the operator's log: {tmp_path / 'logs' / 'operator.log'}" in text
