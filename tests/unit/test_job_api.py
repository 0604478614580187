"""Pure parts of the public job API: failures, exit records, flags from options, targets."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch_operator.launcher.programs.job import (
    RankFailure,
    argv_from_options,
    describe_exit_code,
)
from monarch_operator.launcher.programs.user import TargetError, load_target
from monarch_operator.launcher.session import exitrecords


def test_rank_failure_summary_and_signal() -> None:
    failure = RankFailure("trainer", 3, "w-1", 1, 137, describe_exit_code(137))

    assert failure.summary == (
        "trainer rank 3 (host w-1, local rank 1): was killed by signal 9 (exit 137)"
    )
    assert failure.signal == 9
    assert str(failure) == failure.summary


def test_rank_failure_survives_pickling_with_every_field() -> None:
    failure = RankFailure("ref", 0, "h", 0, 1, "raised ValueError: x", "Traceback...", "detail")

    copy = pickle.loads(pickle.dumps(failure))

    assert (copy.role, copy.rank, copy.host, copy.local_rank, copy.exit_code) == (
        "ref", 0, "h", 0, 1
    )
    assert (copy.what, copy.traceback, copy.detail, copy.signal) == (
        "raised ValueError: x", "Traceback...", "detail", None
    )


def test_exit_code_descriptions() -> None:
    assert describe_exit_code(3) == "exited with code 3"
    assert describe_exit_code(143) == "was killed by signal 15 (exit 143)"


def test_options_become_monarch_launch_flags() -> None:
    argv = argv_from_options(
        {
            "hostfile": Path("/h"),
            "trainer_hosts": 2,
            "colocate": True,
            "clean_stale": None,
            "env": {"A": "1", "B": "x y"},
            "hosts": ["a", "b"],
        }
    )

    assert argv == [
        "--hostfile", "/h", "--trainer-hosts", "2", "--colocate",
        "--env", "A=1", "--env", "B=x y", "--hosts", "a,b",
    ]
    assert argv_from_options({"colocate": False}) == ["--no-colocate"]
    with pytest.raises(TypeError, match="ssh_key"):
        argv_from_options({"ssh_key": {"not": "a path"}})


def test_exit_records_parse_sorted_and_deduplicated() -> None:
    late = '{"role": "trainer", "rank": 1, "host": "b", "local_rank": 0, "exit_code": 3, "time": 2.0}'
    early = '{"role": "trainer", "rank": 0, "host": "a", "local_rank": 0, "exit_code": 5, "time": 1.0}'

    records = exitrecords.parse_records("\n".join([late, "not json", early, late, "{}"]))

    assert [(r.rank, r.exit_code) for r in records] == [(0, 5), (1, 3)]


def test_record_path_names_run_role_and_rank() -> None:
    assert exitrecords.record_path("abc123", "ref", 7) == (
        "~/.cache/monarch-launch/exit-abc123-ref-7.json"
    )


def test_exit_recorder_writes_the_proc_record_and_forked_children_write_none(
    tmp_path: Path,
) -> None:
    # A proc that forks a child (as a data loader does): the child's os._exit(0) writes no
    # record; the proc's own os._exit(4) does, with its identity and code.
    script = textwrap.dedent(
        """
        import os
        from monarch_operator.launcher.session.exitrecords import install_exit_recorder
        install_exit_recorder("run1", "trainer", 2, "host-b", 1)
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        # The child's exit must have left nothing: 9 tells the test it did.
        record = os.path.expanduser("~/.cache/monarch-launch/exit-run1-trainer-2.json")
        os._exit(9 if os.path.exists(record) else 4)
        """
    )
    env = {**os.environ, "HOME": str(tmp_path)}

    result = subprocess.run([sys.executable, "-c", script], env=env, check=False)

    assert result.returncode == 4
    files = list((tmp_path / ".cache/monarch-launch").iterdir())
    assert [f.name for f in files] == ["exit-run1-trainer-2.json"]
    [record] = exitrecords.parse_records(files[0].read_text())
    assert (record.role, record.rank, record.host, record.local_rank, record.exit_code) == (
        "trainer", 2, "host-b", 1, 4
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:main", "no_such_module_xyz: cannot import"),
        ("no_such_module_xyz", "no_such_module_xyz: no such module"),
        ("json:no_such_function", "json has no function 'no_such_function'"),
        ("missing/train.py", "missing/train.py: no such script"),
        (":main", "give 'module:function', 'module' or 'script.py'"),
        ("json:JSONDecodeError", "JSONDecodeError must take the entered job as its one argument"),
    ],
)
def test_bad_targets_are_named(target: str, message: str) -> None:
    with pytest.raises(TargetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_target(target)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hostfile": "h", "colocte": True}, "unrecognized arguments: --colocte"),
        ({"hostfile": "h", "trainer_hosts": "two"}, "--trainer-hosts: invalid"),
        ({"hostfile": "h", "trainer_host": 2}, "unrecognized arguments: --trainer-host"),
        ({"hostfile": "h", "steps": 5}, "steps belong to the built-in example"),
    ],
)
def test_job_from_args_refuses_bad_options_with_an_exception(options, message) -> None:
    # In a notebook or driver: a UsageError naming the option, never usage text and exit.
    from monarch_operator.launcher.cli import UsageError
    from monarch_operator.launcher.programs.job import Job

    with pytest.raises(UsageError, match=message):
        Job.from_args(**options)


def test_good_targets_resolve(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")

    assert load_target("json:dumps")[0] == "function"
    assert load_target("json") == ("module", None)
    assert load_target(str(script)) == ("script", None)


def test_untested_monarch_versions_are_refused_with_the_supported_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from monarch_operator.launcher.session import monarch_compat

    monkeypatch.setattr(monarch_compat.importlib.metadata, "version", lambda _name: "0.9.1")
    monkeypatch.delenv("MONARCH_LAUNCH_ANY_MONARCH", raising=False)
    with pytest.raises(monarch_compat.MonarchVersionError, match=r"torchmonarch 0\.9\.1 .*0\.7\.x"):
        monarch_compat.check_version()
    monkeypatch.setenv("MONARCH_LAUNCH_ANY_MONARCH", "1")
    assert monarch_compat.check_version() == "0.9.1"


def test_run_dry_run_prints_the_plan_and_resolves_the_target_without_running_it(
    tmp_path: Path,
) -> None:
    # A script that would leave a file behind if it ran: a dry run must only locate it.
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    launch = [sys.executable, "-m", "monarch_operator.launcher.cli", "run"]
    hosts = ["--hosts", "node1,node2,node3", "--slots-per-host", "2", "--dry-run"]

    done = subprocess.run(
        [*launch, *hosts, str(script), "--lr", "0.1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert "mesh trainer: hosts=node1,node2 procs/host=2" in done.stdout
    assert f"target: {script} (script)" in done.stdout
    assert "dry run: plan only, nothing started" in done.stdout
    assert not marker.exists()

    done = subprocess.run(
        [*launch, *hosts, "--json", "no_such_module_xyz:main"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [event["event"] for event in events] == ["plan", "result"]
    assert events[0]["plan"]["meshes"][1]["hosts"] == ["node3"]
    assert "no_such_module_xyz: cannot import" in events[1]["reason"]
