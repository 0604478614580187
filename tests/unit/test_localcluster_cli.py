"""``monarch-localcluster`` finds its state directory the same way from any working directory."""

from __future__ import annotations

from monarch_operator.localcluster import args, cli


def test_the_default_state_dir_does_not_depend_on_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("MONARCH_LOCALCLUSTER_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.default_state_dir() == args.REPO_ROOT / ".localcluster"
    assert cli.default_state_dir().is_absolute()
    monkeypatch.setenv("MONARCH_LOCALCLUSTER_DIR", "relative/state")
    assert cli.default_state_dir() == tmp_path / "relative" / "state"
