"""Monarch imported in a thread while the pre-flight runs (launcher/session/earlyimport.py,
issue 36 item 2): Monarch's environment is set before it loads, the import runs beside the
caller, a failed import is left to the caller, and a second start does nothing. Each case runs
in a fresh interpreter (the import is process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


def run(script: str, env: dict[str, str] | None = None) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
        timeout=120, env={**os.environ, **(env or {})}, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_monarch_loads_in_a_thread_with_its_environment_set_first(tmp_path):
    seen = run("""
        import json, os, sys, threading
        from monarch_operator.launcher.session import earlyimport
        assert "monarch" not in sys.modules
        earlyimport.start(["monarch_operator.launcher.programs.rankside"])
        threads = [t.name for t in threading.enumerate()]
        env = {k: os.environ.get(k) for k in ("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY",
                                              "MONARCH_FILE_LOG")}
        earlyimport.start()  # a second start does nothing
        second = [t.name for t in threading.enumerate()].count("monarch-import")
        earlyimport.finish()
        print(json.dumps({"threads": threads, "second": second, "env": env,
                          "loaded": [m for m in ("monarch.actor", "monarch.config",
                                     "monarch_operator.launcher.session.sshjob",
                                     "monarch_operator.launcher.programs.rankside")
                                     if m in sys.modules]}))
    """, {"HOME": str(tmp_path)})
    assert "monarch-import" in seen["threads"] and seen["second"] <= 1
    assert seen["env"]["HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"] == "500ms"
    assert seen["env"]["MONARCH_FILE_LOG"]  # bounded before Monarch read it
    assert len(seen["loaded"]) == 4


def test_a_module_that_fails_to_import_fails_in_the_caller():
    seen = run("""
        import json
        from monarch_operator.launcher.session import earlyimport
        earlyimport.start(["no_such_module_for_the_launcher"])
        earlyimport.finish()
        try:
            import no_such_module_for_the_launcher  # noqa: F401
        except ModuleNotFoundError as error:
            print(json.dumps({"caller": str(error)}))
    """)
    assert "no_such_module_for_the_launcher" in seen["caller"]


def test_finish_without_start_sets_monarch_s_environment():
    seen = run("""
        import json, os
        os.environ.pop("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", None)
        from monarch_operator.launcher.session import earlyimport
        earlyimport.finish()
        print(json.dumps({"poll": os.environ.get("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY")}))
    """)
    assert seen["poll"] == "500ms"
