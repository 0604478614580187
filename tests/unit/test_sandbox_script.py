"""The node agent's sandbox shell script: portable to dash whatever fds the agent holds."""

from __future__ import annotations

import re

import pytest

from monarch_operator.localcluster.sandbox import SANDBOX_SCRIPT, SandboxError, start


def test_sandbox_script_names_no_file_descriptor_by_variable_or_above_nine():
    # dash parses only single-digit fds in redirections ("Bad fd number" for 10<&-), and an fd
    # number handed over in a variable is whatever the agent happened to have free: >= 10 once
    # it tracks a few pods. The script takes its "go" on stdin instead.
    assert not re.search(r"[<>]&\s*\$|\$\{?\w+\}?[<>]|\d{2,}\s*[<>]|eval", SANDBOX_SCRIPT)


def test_sandbox_script_variables_cannot_clobber_the_containers_env():
    # The container's env is the script's environment: assigning `name=...` in the script
    # would change the pod's own variable `name` before the exec.
    code = "\n".join(line for line in SANDBOX_SCRIPT.splitlines()
                     if not line.lstrip().startswith("#")).replace("-o mode=", "-o ")
    assigned = set(re.findall(r"(?:^|[\s;])([A-Za-z_][A-Za-z0-9_]*)=", code))
    loop_vars = set(re.findall(r"\bfor ([A-Za-z_][A-Za-z0-9_]*)\b", code))
    assert {name for name in assigned | loop_vars
            if not name.startswith("__sb_")} <= {"IFS"}, assigned | loop_vars


def test_every_setpriv_exec_carries_the_privilege_options():
    # allowPrivilegeEscalation and capabilities must hold whether or not the user changes.
    execs = [line for line in SANDBOX_SCRIPT.splitlines() if "exec setpriv" in line]
    assert len(execs) == 3 and all("$__sb_privileges" in line for line in execs), execs


def test_privilege_options_must_be_plain_words(tmp_path):
    # They are split on spaces in the script: a glob character would expand there.
    with pytest.raises(SandboxError, match="privilege options must be plain words"):
        start(["true"], hostname="h", mounts=[], env={}, workdir=tmp_path,
              log_path=tmp_path / "log", name="main", privileges=["--bounding-set=-all,+*"])
