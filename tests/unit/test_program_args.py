"""Field case C29: a program's own arguments are checked before any host is touched. The
guide's old command gave examples/rl_kl a positional ``20`` it does not take; it was refused
only after the meshes had started. Now the target module's ``parse_args(argv)`` sees them first
(no sshd runs on the host given here: any attempt to reach it would fail differently)."""

from __future__ import annotations

import pytest

from monarch_operator.launcher.cli import run_main

FLAGS = ["--hosts", "127.0.0.9", "--slots-per-host", "2", "--trainer-hosts", "1", "--colocate",
         "--ref-hosts", "1"]


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_refused_program_arguments_stop_the_run_before_any_host(capsys, dry_run):
    extra = ["--dry-run"] if dry_run else []
    code = run_main([*FLAGS, *extra, "rl_kl.controller:main", "20"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "unrecognized arguments: 20" in err, err  # argparse's own words and usage
    assert "its arguments 20 were refused by rl_kl.controller.parse_args" in err, err
    assert "no host was contacted" in err and "pre-flight" not in err, err


def test_arguments_the_program_takes_pass_the_check(capsys):
    assert run_main([*FLAGS, "--dry-run", "rl_kl.controller:main", "--steps", "20"]) == 0, \
        capsys.readouterr().err


def test_a_module_without_parse_args_is_not_checked(tmp_path, monkeypatch, capsys):
    (tmp_path / "bare_program.py").write_text("def main(job):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run_main([*FLAGS, "--dry-run", "bare_program:main", "anything", "goes"]) == 0, \
        capsys.readouterr().err
