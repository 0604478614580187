"""Which variables cross ssh to the workers: the allow-list, --env items, the env prefix."""

from __future__ import annotations

import shlex

import pytest

from monarch_operator.launcher.environment import (
    EnvSpecError,
    env_prefix,
    parse_env_items,
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
