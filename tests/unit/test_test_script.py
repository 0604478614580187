"""scripts/test.sh runs the set-up beside the tests: pytest starts once the venv part is done,
the set-up's later lines come after the tests, and a failure of either fails the run. Run here
on a copy of the script with a stand-in set-up and a stand-in pytest (shell scripts)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The stand-in set-up: writes its parts' ends as scripts/setup.sh does, FAIL_AT says where it
# fails (before-venv, after-venv or nowhere), and it records that the tests started before its end.
FAKE_SETUP = """#!/usr/bin/env bash
echo "[setup] venv: started" >&2
if [ "$FAIL_AT" = before-venv ]; then echo "[setup] venv: FAILED (exit 3)" >&2; exit 3; fi
echo 5 >"$MONARCH_SETUP_STATE/venv.done"
echo "[setup] venv: done in 5 s" >&2
for _ in $(seq 100); do [ -e "$MONARCH_SETUP_STATE/tests-started" ] && break; sleep 0.05; done
echo "[setup] node: done in 9 s" >&2
if [ "$FAIL_AT" = after-venv ]; then echo "[setup] node: FAILED (exit 4)" >&2; exit 4; fi
echo 9 >"$MONARCH_SETUP_STATE/all.done"
"""
# The stand-in pytest: notes its start and the set-up it sees, exits with TESTS_EXIT.
FAKE_PYTHON = """#!/usr/bin/env bash
touch "$MONARCH_SETUP_STATE/tests-started"
echo "pytest $* state=${MONARCH_SETUP_STATE:+set} before=$MONARCH_SETUP_SECONDS"
echo "venv done: $(cat "$MONARCH_SETUP_STATE/venv.done")"
exit "${TESTS_EXIT:-0}"
"""


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "scripts").mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    for path, text in ((tmp_path / "scripts" / "setup.sh", FAKE_SETUP),
                       (tmp_path / ".venv" / "bin" / "python", FAKE_PYTHON)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    return subprocess.run(["bash", "scripts/test.sh", "-k", "x"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path),
                               "FAIL_AT": "", **env})


def test_the_tests_start_once_the_venv_is_done_and_the_set_up_goes_on(tmp_path) -> None:
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pytest -m pytest -n 2 --dist loadscope --no-loadscope-reorder -k x state=set" \
        in result.stdout
    assert "venv done: 5" in result.stdout
    # The set-up's lines before the tests, then what it printed beside them.
    before, after = result.stderr.split("[test] the tests start", 1)
    assert "[setup] venv: done in 5 s" in before and "node" not in before
    assert "[test] the set-up beside the tests:\n[setup] node: done in 9 s" in after
    assert not list(tmp_path.glob("monarch-setup-state.*"))  # its state folder is removed


@pytest.mark.parametrize(("env", "code", "said"), [
    ({"TESTS_EXIT": "1"}, 1, None),
    ({"FAIL_AT": "after-venv"}, 4, "[test] the set-up failed (exit 4)"),
    ({"FAIL_AT": "after-venv", "TESTS_EXIT": "2"}, 2, "[test] the set-up failed (exit 4)"),
    ({"FAIL_AT": "before-venv"}, 3, "[test] the set-up ended (exit 3) before the venv was ready"),
])
def test_a_failed_set_up_or_test_run_fails_the_run(tmp_path, env, code, said) -> None:
    result = _run(tmp_path, **env)
    assert result.returncode == code, result.stderr
    if said:
        assert said in result.stderr
    if env.get("FAIL_AT") == "before-venv":
        assert "pytest" not in result.stdout
