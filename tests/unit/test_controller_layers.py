"""The controller in one direction (issue 33 item 6): its stage folders import downward only.

Every module of ``monarch_operator/controller/`` is read with :mod:`ast` (nothing is imported),
by the same rule as the launcher's (``tests/layers.py``): every import counts, at module level,
inside a function, under ``if TYPE_CHECKING:``; relative ones are resolved.
"""

from __future__ import annotations

import ast
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

CONTROLLER = "monarch_operator.controller"

# The layers, lowest first: each a stage folder (or, for the entry points, modules). A module
# may import its own layer and the ones below, never one above.
#   spec:     admission: the spec as typed values, groups and roles, the run policy, settings.
#   builders: the desired children (pure), one module per kind; the job's SSH keys.
#   state:    what one pass knows and carries: status, attempts, readings of the children.
#   k8s:      the one layer that talks to the API, and the watches' cache.
#   release:  letting go of pods and children (stuck pods, suspension, clean-up).
#   judge:    an attempt's verdict and its ending (which lets go of its launcher: release).
#   kueue:    admission by Kueue (ends or releases a job it evicts: judge, release).
#   gate:     the children applied, then every worker Ready (ends an attempt that cannot start).
#   launch:   the launcher started and followed (judged by the judge).
#   engine:   the reconcile checklist over the stages, the passes, wake-ups, metrics.
#   leader:   leader election, beside the entry points (being added in its own folder).
#   entry:    the kopf handlers, ``monarch-operator`` itself and the package.
# The stages that end an attempt sit below those that start one: the gate and the launch call
# the judge to end an attempt, and the judge calls release to let its pods go.
LAYERS: dict[str, list[str]] = {
    "spec": ["spec", "spec.*"],
    "builders": ["builders", "builders.*"],
    "state": ["state", "state.*"],
    "k8s": ["k8s", "k8s.*"],
    "release": ["release", "release.*"],
    "judge": ["judge", "judge.*"],
    "kueue": ["kueue", "kueue.*"],
    "gate": ["gate", "gate.*"],
    "launch": ["launch", "launch.*"],
    "engine": ["engine", "engine.*"],
    "leader": ["leader", "leader.*"],
    "entry": ["handlers", "__main__", ""],  # "" is the package itself (controller/__init__.py)
}

# Layers that never talk to the API: no Kubernetes client, no kopf (docs/conventions: pure
# builders; only the k8s layer imports the client).
PURE = ("spec", "builders", "state")


def our_modules() -> dict[str, Path]:
    return {module_name(path): path
            for path in sorted((PACKAGE_ROOT / "controller").rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def layer_of(name: str) -> int:
    """The index of ``name``'s layer in :data:`LAYERS`.

    Raises:
        KeyError: the module is in no layer (a new folder or module must be given one).
    """
    return layer_index("" if name == CONTROLLER else name.removeprefix(CONTROLLER + "."),
                       LAYERS)


def absolute_imports(path: Path) -> set[str]:
    """Every module that ``path`` names in an absolute import (``import a.b``, ``from a.b
    import c``), anywhere in its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found


def test_every_module_has_a_layer() -> None:
    missing = unplaced(import_graph(), layer_of)
    assert not missing, "\n".join(missing)


def test_no_layer_imports_a_higher_one() -> None:
    upward = upward_imports(import_graph(), layer_of, list(LAYERS))
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_import_circle_in_the_controller() -> None:
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(
        "  " + " <-> ".join(component) for component in found)


def test_the_pure_layers_import_no_api_client() -> None:
    pure = {list(LAYERS).index(name) for name in PURE}
    found = [f"  {name} imports {target}"
             for name, path in our_modules().items() if layer_of(name) in pure
             for target in sorted(absolute_imports(path))
             if target.split(".")[0] in ("kopf", "kubernetes")]
    assert not found, "a pure layer imports an API client:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "target", "upward"),
    [
        ("monarch_operator.controller.release.release",
         "monarch_operator.controller.judge.verdicts", True),
        ("monarch_operator.controller.spec.spec",
         "monarch_operator.controller.k8s.cache", True),
        ("monarch_operator.controller.launch.launching",
         "monarch_operator.controller.judge.judging", False),
        ("monarch_operator.controller.handlers",
         "monarch_operator.controller.engine.passes", False),
    ],
)
def test_the_rule_sees_an_upward_import(source: str, target: str, upward: bool) -> None:
    assert bool(upward_imports({source: {target}}, layer_of, list(LAYERS))) is upward


def test_a_module_outside_every_folder_has_no_layer() -> None:
    assert unplaced([f"{CONTROLLER}.flat", f"{CONTROLLER}.spec.spec"], layer_of) == [
        f"{CONTROLLER}.flat is in no layer; add it to one"]
