"""Which environment variables the launcher passes to its workers over ssh.

sshd starts every session with a clean environment (``PATH`` from the server's defaults, none of
the launcher's variables), so a variable set where ``monarch-launch`` runs, such as
``NCCL_DEBUG`` or ``HF_HOME``, would not reach the workers. The launcher therefore prefixes the
remote command with ``env KEY=VALUE ...`` built from:

1. the allow-list below, matched against the launcher's own environment;
2. ``--env KEY=VALUE`` (set explicitly) and ``--env KEY`` (copied from the launcher's
   environment even if it is not on the allow-list), applied last.

Only the variables the loader and interpreter need before Python starts (:data:`COMMAND_LINE_ENV`:
``PATH``, ``LD_LIBRARY_PATH``, ``PYTHONPATH``, ``VIRTUAL_ENV``) travel on the ssh command line.
Every other variable (tokens such as ``HF_TOKEN`` or an ``--env WANDB_API_KEY``) would be
readable by any user in ``ps`` there, so it travels on the pre-flight's ssh stdin instead, into
a file only the login user can read (mode 0600), which the worker loads and deletes when it
starts: see :func:`private_env_path`.

``CUDA_VISIBLE_DEVICES`` is never copied: GPU sets are per host and per role, chosen by the
placement plan. ``sshd``'s ``AcceptEnv``/``SendEnv`` is not used because it needs a server-side
setting that preallocated machines rarely have.

Monarch's own log file: every Monarch process (client, worker, proc) appends its internal log to
``/tmp/<user>/monarch_log[_<MONARCH_LOG_SUFFIX>].log`` (torchmonarch 0.7.0,
``hyperactor_telemetry::log_file_path``; the directory is fixed), at level ``info`` unless
``MONARCH_FILE_LOG`` says otherwise, and never rotates it. The launcher and its workers default
``MONARCH_FILE_LOG`` to :data:`MONARCH_FILE_LOG_DEFAULT` and, before Monarch starts, rename a
file grown past :data:`MONARCH_LOG_ROTATE_BYTES` to ``<file>.1``: see :func:`bound_monarch_log`.
"""

from __future__ import annotations

import fnmatch
import os
import pwd
import re
import shlex
from collections.abc import Iterable, Mapping, MutableMapping

# Names or fnmatch patterns copied from the launcher's environment to every worker.
ALLOWED_ENV = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "OMP_NUM_THREADS",
    "NCCL_*",
    "CUDA_*",
    "HF_*",
    "TORCH_*",
    "GLOO_*",
    "HYPERACTOR_*",
    "MONARCH_FILE_LOG",
    "MONARCH_LOG_SUFFIX",
    # Which job and run this is, set by the operator on its launcher pod (field case C21;
    # issue 22 item 5: a rank's experiment-tracking run is named and grouped by them).
    "MONARCH_JOB_NAME",
    "MONARCH_JOB_NAMESPACE",
    "MONARCH_JOB_UID",
    "MONARCH_ATTEMPT",
    "MONARCH_RESTART_COUNT",
    "MONARCH_MAX_RESTARTS",
)
# Needed before the worker's Python starts, so they are set on the remote command line.
COMMAND_LINE_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV")
# Chosen per role by the placement plan, never inherited from the launcher's machine.
NEVER_COPIED = frozenset({"CUDA_VISIBLE_DEVICES"})

# Monarch's file log level unless the user sets MONARCH_FILE_LOG (debug, info, warn, error).
# Monarch's own default, info, logs every actor and proc state change; warn keeps the problems
# (measured: a two-host SPMD run over loopback ssh wrote 107 KB at info, 9 KB at warn).
MONARCH_FILE_LOG_DEFAULT = "warn"
# Monarch's log file is renamed to "<file>.1" (replacing it) when bigger than this at start-up.
MONARCH_LOG_ROTATE_BYTES = 16 * 1024 * 1024

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvSpecError(ValueError):
    """A ``--env`` item is malformed; the message names the item and the rule."""


def parse_env_items(items: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Parse ``--env`` items: ``KEY=VALUE`` sets a value, ``KEY`` copies the launcher's value.

    Args:
        items: the flag values in command-line order; a later item for the same key wins.
        environ: the launcher's environment, for bare ``KEY`` items.

    Returns:
        ``{KEY: VALUE}``.

    Raises:
        EnvSpecError: a key that is not a shell variable name (``[A-Za-z_][A-Za-z0-9_]*``),
            or a bare ``KEY`` that is not set in the launcher's environment.
    """
    result: dict[str, str] = {}
    for item in items:
        key, has_value, value = item.partition("=")
        if not _NAME.match(key):
            raise EnvSpecError(
                f"--env {item!r}: {key!r} is not a variable name (letters, digits and '_', not "
                "starting with a digit)"
            )
        if not has_value:
            if key not in environ:
                raise EnvSpecError(
                    f"--env {key}: not set in the launcher's environment; use --env {key}=VALUE"
                )
            value = environ[key]
        result[key] = value
    return result


def worker_environment(
    environ: Mapping[str, str], extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Return the variables every worker gets: allow-listed ones from ``environ``, then ``extra``.

    Args:
        environ: the launcher's environment (``os.environ``).
        extra: explicit values from ``--env``; they override and may name any variable.

    Returns:
        ``{KEY: VALUE}`` sorted by key, so the remote command line is stable.
    """
    chosen = {
        key: value
        for key, value in environ.items()
        if key not in NEVER_COPIED
        and any(fnmatch.fnmatchcase(key, pattern) for pattern in ALLOWED_ENV)
    }
    chosen.update(extra or {})
    return dict(sorted(chosen.items()))


def env_prefix(variables: Mapping[str, str]) -> str:
    """Return ``env K1=V1 K2=V2 `` (shell-quoted, trailing space) or ``""`` for no variables.

    ``env`` rather than bare ``K=V`` assignments, so that the prefix also works when the login
    shell is not POSIX (csh, fish).
    """
    if not variables:
        return ""
    assignments = " ".join(shlex.quote(f"{key}={value}") for key, value in variables.items())
    return f"env {assignments} "


def split_environment(variables: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split worker variables into ``(command line, private)``; see the module doc.

    Returns:
        The :data:`COMMAND_LINE_ENV` variables, and all others.
    """
    public = {key: value for key, value in variables.items() if key in COMMAND_LINE_ENV}
    private = {key: value for key, value in variables.items() if key not in COMMAND_LINE_ENV}
    return public, private


def private_env_path(run_id: str, address: str) -> str:
    """The remote file (``~``-relative) holding one worker's private variables for one run.

    One file per run and address: loopback test hosts share a home directory.
    """
    return f"~/.cache/monarch-launch/env-{run_id}-{address}.json"


def monarch_log_path(user: str, suffix: str = "") -> str:
    """The file Monarch (torchmonarch 0.7.0) writes its internal log to on a machine.

    Args:
        user: the login name of the process's user (``monarch`` when empty, as Monarch does).
        suffix: ``MONARCH_LOG_SUFFIX``; Monarch inserts it as ``_<suffix>``.
    """
    return f"/tmp/{user or 'monarch'}/monarch_log{'_' + suffix if suffix else ''}.log"


def rotate_log(path: str, limit_bytes: int) -> bool:
    """Rename ``path`` to ``path.1`` (replacing it) when it is bigger than ``limit_bytes``.

    Processes still writing to it keep writing to ``path.1``; the next process starts a new file.

    Returns:
        True when the file was rotated; False when it was small enough, missing or not ours.
    """
    try:
        if os.path.getsize(path) <= limit_bytes:
            return False
        os.replace(path, path + ".1")
    except OSError:
        return False
    return True


def bound_monarch_log(environ: MutableMapping[str, str]) -> None:
    """Bound Monarch's log file for this process and the processes it starts.

    Sets ``MONARCH_FILE_LOG`` to :data:`MONARCH_FILE_LOG_DEFAULT` unless it is set, and rotates
    the file (:func:`rotate_log`). Call it before Monarch is first imported: Monarch reads its
    log settings when its Rust extension loads.

    Args:
        environ: the environment to update (``os.environ``).
    """
    environ.setdefault("MONARCH_FILE_LOG", MONARCH_FILE_LOG_DEFAULT)
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # no passwd entry (some containers): Monarch's own name is unknown too
        return
    path = monarch_log_path(user, environ.get("MONARCH_LOG_SUFFIX", ""))
    rotate_log(path, MONARCH_LOG_ROTATE_BYTES)
