"""Which variables cross ssh to the workers: the allow-list, --env items, the env prefix."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from monarch_operator.launcher.session.environment import (
    MONARCH_FILE_LOG_DEFAULT,
    EnvSpecError,
    bound_monarch_log,
    env_prefix,
    monarch_log_path,
    parse_env_items,
    rotate_log,
    worker_environment,
)


def test_allow_list_copies_runtime_variables_and_nothing_else() -> None:
    environ = {
        "PATH": "/opt/venv/bin:/usr/bin",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "PYTHONPATH": "/src",
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "eth0",
        "CUDA_LAUNCH_BLOCKING": "1",
        "CUDA_VISIBLE_DEVICES": "3",
        "HF_HOME": "/data/hf",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "x",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "PYTHONPATHX": "no",
    }

    assert worker_environment(environ) == {
        "CUDA_LAUNCH_BLOCKING": "1",
        "HF_HOME": "/data/hf",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "eth0",
        "PATH": "/opt/venv/bin:/usr/bin",
        "PYTHONPATH": "/src",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


def test_explicit_items_override_and_may_name_any_variable() -> None:
    environ = {"PATH": "/usr/bin", "WANDB_API_KEY": "k"}

    extra = parse_env_items(["PATH=/custom", "WANDB_API_KEY", "EMPTY=", "A=b=c"], environ)

    assert extra == {"PATH": "/custom", "WANDB_API_KEY": "k", "EMPTY": "", "A": "b=c"}
    assert worker_environment(environ, extra)["PATH"] == "/custom"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("9LIVES=1", "'9LIVES' is not a variable name"),
        ("A-B=1", "'A-B' is not a variable name"),
        ("=1", "'' is not a variable name"),
        ("MISSING", "--env MISSING: not set in the launcher's environment"),
    ],
)
def test_bad_env_items_are_refused_naming_them(item: str, message: str) -> None:
    with pytest.raises(EnvSpecError, match=message):
        parse_env_items([item], {})


def test_env_prefix_is_shell_safe() -> None:
    variables = {"A": "x y", "B": "it's $HOME", "C": ""}

    prefix = env_prefix(variables)

    assert prefix.endswith(" ")
    assert shlex.split(prefix) == ["env", "A=x y", "B=it's $HOME", "C="]
    assert env_prefix({}) == ""


def test_monarch_log_path_is_monarchs() -> None:
    assert monarch_log_path("alice") == "/tmp/alice/monarch_log.log"
    assert monarch_log_path("alice", "run7") == "/tmp/alice/monarch_log_run7.log"
    assert monarch_log_path("") == "/tmp/monarch/monarch_log.log"


def test_a_log_over_the_limit_is_rotated_once(tmp_path: Path) -> None:
    log = tmp_path / "monarch_log.log"
    (tmp_path / "monarch_log.log.1").write_text("older")
    log.write_text("x" * 11)

    assert rotate_log(str(log), 10) is True
    assert not log.exists()
    assert (tmp_path / "monarch_log.log.1").read_text() == "x" * 11
    log.write_text("y" * 10)
    assert rotate_log(str(log), 10) is False
    assert log.read_text() == "y" * 10
    assert rotate_log(str(tmp_path / "missing.log"), 10) is False


def test_monarch_file_log_defaults_to_warn_and_a_users_level_wins() -> None:
    environ: dict[str, str] = {"MONARCH_LOG_SUFFIX": f"unit-{os.getpid()}-never-written"}
    bound_monarch_log(environ)
    assert environ["MONARCH_FILE_LOG"] == MONARCH_FILE_LOG_DEFAULT == "warn"

    environ = {"MONARCH_FILE_LOG": "debug", "MONARCH_LOG_SUFFIX": environ["MONARCH_LOG_SUFFIX"]}
    bound_monarch_log(environ)
    assert environ["MONARCH_FILE_LOG"] == "debug"


def test_monarch_log_settings_of_the_launcher_reach_the_workers() -> None:
    environ = {"MONARCH_FILE_LOG": "info", "MONARCH_LOG_SUFFIX": "x", "MONARCH_OTHER": "no"}

    assert worker_environment(environ) == {"MONARCH_FILE_LOG": "info", "MONARCH_LOG_SUFFIX": "x"}
