"""The launcher in one direction (issue 23 item 4): no import circle, no layer importing upward.

Every module of ``monarch_operator/launcher/`` and the public ``monarch_operator/job.py`` is read
with :mod:`ast` (nothing is imported). Every import counts: at module level, inside a function
(a lazy import still ties the two modules together), under ``if TYPE_CHECKING:``; relative
imports are resolved against the importing module. ``from package import name`` is an edge to
``package.name`` when that is a module of ours, else to ``package`` itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layers import (
    PACKAGE_ROOT,
    cycles,
    imports_of,
    layer_index,
    module_name,
    unplaced,
    upward_imports,
)

LAUNCHER = "monarch_operator.launcher"
API = "monarch_operator.job"

# The layers, lowest first; a module may import its own layer and the ones below, never above.
#   base:          leaves every layer may use: exit statuses, the stop signal and stop request,
#                  the termination message, the reporter, progress reports and their writes,
#                  and how the process ends (processexit.py).
#   hosts:         hosts/ (host sources, placement): what the job runs on.
#   session:       session/ (pre-flight, ssh, workers, teardown): one Monarch session.
#   options:       the job's options as flags (options.py, sshflags.py, flagtypes.py) and the
#                  configuration made from them (jobconfig.py): the public API builds its
#                  configuration from them, the command lines add theirs.
#   programs:      programs/ (the job API's engine, the built-in example, SPMD, user programs).
#   api:           the public facades: monarch_operator.job and the package's lazy re-exports.
#   command lines: monarch-launch (cli.py, __main__), monarch-torchrun (spmd_cli.py), the
#                  attach-mode worker (attachworker.py).
LAYERS: dict[str, list[str]] = {
    "base": ["exitcodes", "stopguard", "stopsignal", "stoprequest", "termination", "report",
             "progress", "configmapwriter", "userentry", "processexit"],
    "hosts": ["hosts", "hosts.*"],
    "session": ["session", "session.*"],
    "options": ["options", "sshflags", "flagtypes", "jobconfig"],
    "programs": ["programs", "programs.*"],
    "api": [API, ""],  # "" is the package itself (launcher/__init__.py)
    "command lines": ["cli", "spmd_cli", "__main__", "attachworker"],
}


def our_modules() -> dict[str, Path]:
    paths = [*sorted((PACKAGE_ROOT / "launcher").rglob("*.py")), PACKAGE_ROOT / "job.py"]
    return {module_name(path): path for path in paths}


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def layer_of(name: str) -> int:
    """The index of ``name``'s layer in :data:`LAYERS`.

    Raises:
        KeyError: the module is in no layer (a new module must be given one).
    """
    local = name[len(LAUNCHER) + 1:] if name.startswith(LAUNCHER + ".") else (
        "" if name == LAUNCHER else name)
    return layer_index(local, LAYERS)


def test_every_module_has_a_layer() -> None:
    missing = unplaced(import_graph(), layer_of)
    assert not missing, "\n".join(missing)


def test_no_import_circle_in_the_launcher() -> None:
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(
        "  " + " <-> ".join(component) for component in found)


def test_no_layer_imports_a_higher_one() -> None:
    upward = upward_imports(import_graph(), layer_of, list(LAYERS))
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_the_public_api_does_not_import_the_command_lines() -> None:
    graph = import_graph()
    command_lines = {name for name in graph if layer_of(name) == list(LAYERS).index(
        "command lines")}
    reached, todo = set(), [API]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(graph[name])
    assert not reached & command_lines, sorted(reached & command_lines)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set(), "c": {"d"}, "d": {"c"}}, [["c", "d"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_circle_finder_finds_circles(graph, expected) -> None:
    assert cycles(graph) == expected


def test_the_graph_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from . import sibling\n"
        "def f():\n"
        "    from monarch_operator.launcher.programs import job\n"
        "    import monarch_operator.launcher.cli\n"
    )
    modules = {"monarch_operator.launcher.x.sibling", "monarch_operator.launcher.programs.job",
               "monarch_operator.launcher.cli", "monarch_operator.launcher.x.mod"}
    assert imports_of("monarch_operator.launcher.x.mod", source, modules) == {
        "monarch_operator.launcher.x.sibling", "monarch_operator.launcher.programs.job",
        "monarch_operator.launcher.cli"}
