"""``monarch-launch run TARGET [ARGS...]``: the user's own Monarch program on the job's meshes.

TARGET is one of

- ``package.module:function``: the launcher enters the job (pre-flight, workers, trainer and
  reference proc meshes) and calls ``function(job)`` with the entered
  :class:`launcher.programs.job.Job`;
- ``package.module``: run as ``__main__`` (``python -m`` style); the program builds its own job
  with ``Job.from_env()``;
- ``path/to/script.py``: run as ``__main__``, likewise.

The user's ARGS are in ``sys.argv[1:]`` (``sys.argv[0]`` is TARGET). A ``module:function``
target's module that defines ``parse_args(argv)`` (argparse's shape: it raises ``SystemExit``
on bad arguments) has ARGS checked by it before any host is touched (field case C29): bad
arguments end the run at once with argparse's message and status 2, not after the meshes
started. ``monarch-launch``'s own
host, placement and ssh flags reach ``Job.from_env()`` inside the program through
``MONARCH_LAUNCH_ARGS`` (a JSON list), so the program needs no flags of its own.

Exit status: 0 when the program returns; the code of ``SystemExit``; a failed rank's status
(:class:`launcher.programs.job.RankFailure`, e.g. 3 when a trainer rank exited with 3); the rules of
:mod:`launcher.exitcodes` for pre-flight failures and signals; 1 for any other exception (traceback
printed).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from monarch_operator.launcher import exitcodes
from monarch_operator.launcher.jobconfig import LAUNCH_ARGS_ENV
from monarch_operator.launcher.report import Reporter

if TYPE_CHECKING:
    from monarch_operator.launcher.programs.job import Job


class TargetError(ValueError):
    """TARGET cannot be loaded (no such module, file or function); the message says which."""


def load_target(target: str) -> tuple[str, Callable[..., Any] | None]:
    """Resolve TARGET without running it.

    Returns:
        ``("function", f)`` for ``module:function``, ``("module", None)`` for a module name,
        ``("script", None)`` for a ``.py`` path.

    Raises:
        TargetError: the module, file or function does not exist or is not callable.
    """
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            raise TargetError(f"{target}: no such script")
        return "script", None
    module_name, _, function_name = target.partition(":")
    if not module_name:
        raise TargetError(f"{target!r}: give 'module:function', 'module' or 'script.py'")
    if not function_name:
        if importlib.util.find_spec(module_name) is None:
            raise TargetError(f"{module_name}: no such module on this Python's path")
        return "module", None
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise TargetError(f"{module_name}: cannot import: {error}") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise TargetError(f"{target}: {module_name} has no function {function_name!r}")
    try:
        inspect.signature(function).bind(object())
    except TypeError:
        raise TargetError(
            f"{target}: {function_name} must take the entered job as its one argument, "
            f"as in 'def {function_name}(job)'"
        ) from None
    except ValueError:
        pass  # no signature to check (a builtin): let the call decide
    return "function", function


def check_program_args(target: str, function: Callable[..., Any] | None,
                       program_args: Sequence[str]) -> str | None:
    """Check the program's ARGS with its module's ``parse_args(argv)`` when it has one (see
    the module doc), before anything connects; argparse prints its own usage and error.

    Returns:
        None when they pass (or nothing checks them), else the reason for the usage error.
    """
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    parse_args = getattr(module, "parse_args", None)
    if function is None or not callable(parse_args):
        return None
    saved_argv = sys.argv
    sys.argv = [target, *program_args]
    try:
        parse_args(list(program_args))
    except SystemExit as stop:
        if stop.code not in (None, 0):
            shown = " ".join(program_args) or "(none)"
            return (f"{target}: its arguments {shown} were refused by "
                    f"{module.__name__}.parse_args (see above); no host was contacted")
    finally:
        sys.argv = saved_argv
    return None


def check_target(target: str, job: Job, reporter: Reporter,
                 program_args: Sequence[str] = ()) -> int:
    """``monarch-launch run --dry-run``: print the job's placement plan and resolve TARGET the
    way :func:`run_program` would (a ``module:function`` target's module is imported to find the
    function; a module or script is only located, never run); connect to nothing.

    Args:
        target: ``module:function``, ``module`` or a script path.
        job: the job built from the flags (not entered).
        reporter: where the plan and the result go.

    Returns:
        0 when TARGET resolves, 2 (:data:`launcher.exitcodes.USAGE`) with the reason when not.
    """
    _add_cwd_to_path()
    job.report_plan(essential=True)
    try:
        kind, function = load_target(target)
    except TargetError as error:
        return reporter.result(exitcodes.USAGE, str(error))
    refused = check_program_args(target, function, program_args)
    if refused is not None:
        return reporter.result(exitcodes.USAGE, refused)
    if not reporter.json_mode:
        print(f"target: {target} ({kind})", file=reporter.out, flush=True)
    return reporter.result(exitcodes.SUCCESS, None, dry_run=True, target=target, kind=kind)


def _add_cwd_to_path() -> None:
    """Importing the user's module can need the cwd (``python -m`` does the same)."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def run_program(
    target: str,
    program_args: Sequence[str],
    launch_args: Sequence[str],
    reporter: Reporter,
) -> int:
    """Run TARGET (see the module doc) and return the exit status.

    Args:
        target: ``module:function``, ``module`` or a script path.
        program_args: the program's own arguments (``sys.argv[1:]`` while it runs).
        launch_args: monarch-launch's host, placement and ssh flags, for ``Job.from_env()``.
        reporter: where the result and progress go.
    """
    from monarch_operator.launcher.programs.failures import report_failure
    from monarch_operator.launcher.programs.job import Job
    from monarch_operator.launcher.session.lifecycle import FaultRecorder

    _add_cwd_to_path()
    try:
        kind, function = load_target(target)
    except TargetError as error:
        return reporter.result(exitcodes.USAGE, str(error))
    refused = check_program_args(target, function, program_args)
    if refused is not None:
        return reporter.result(exitcodes.USAGE, refused)
    os.environ[LAUNCH_ARGS_ENV] = json.dumps(list(launch_args))
    saved_argv = sys.argv
    sys.argv = [target, *program_args]
    job: Job | None = None
    try:
        if kind == "function":
            assert function is not None
            # The function's module holds (or imports) the actors: every host must import it.
            job = Job.from_env(reporter=reporter, modules=(target.partition(":")[0],))
            with job:
                function(job)
        elif kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as stop:
        code = _system_exit_code(stop)
        return reporter.result(code, None if code == 0 else f"{target} exited with {code}")
    except BaseException as error:  # noqa: BLE001 - every failure is reported with its status
        if _is_launch_error(error):
            recorder = job.recorder if job is not None else FaultRecorder(reporter)
            return report_failure(error, recorder, reporter)
        reporter.warning("".join(traceback.format_exception(error)).rstrip())
        reason = f"{target} raised {type(error).__name__}: {error}"
        return reporter.result(exitcodes.FAILURE, reason)
    finally:
        sys.argv = saved_argv
    return reporter.result(exitcodes.SUCCESS)


def _system_exit_code(stop: SystemExit) -> int:
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code if 0 <= stop.code < 256 else exitcodes.FAILURE
    print(stop.code, file=sys.stderr)
    return exitcodes.FAILURE


def _is_launch_error(error: BaseException) -> bool:
    """Errors of the job itself (reported with their own status and reason)."""
    from monarch_operator.launcher.programs.job import RankFailure
    from monarch_operator.launcher.session.lifecycle import Terminated, WorkerLost
    from monarch_operator.launcher.session.preflight import PreflightError

    return isinstance(
        error, (RankFailure, PreflightError, Terminated, WorkerLost, KeyboardInterrupt)
    )
