"""The node agent's sandbox shell script: portable to dash whatever fds the agent holds."""

from __future__ import annotations

import re

from monarch_operator.localcluster.sandbox import SANDBOX_SCRIPT


def test_sandbox_script_names_no_file_descriptor_by_variable_or_above_nine():
    # dash parses only single-digit fds in redirections ("Bad fd number" for 10<&-), and an fd
    # number handed over in a variable is whatever the agent happened to have free: >= 10 once
    # it tracks a few pods. The script takes its "go" on stdin instead.
    assert not re.search(r"[<>]&\s*\$|\$\{?\w+\}?[<>]|\d{2,}\s*[<>]|eval", SANDBOX_SCRIPT)
