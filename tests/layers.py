"""The import rule of a package's layers, read with :mod:`ast` (nothing is imported), shared by
the launcher's and the controller's tests (``tests/unit/test_launcher_layers.py``,
``tests/unit/test_controller_layers.py``).

Every import counts: at module level, inside a function (a lazy import still ties the two modules
together), under ``if TYPE_CHECKING:``; relative imports are resolved against the importing
module. ``from package import name`` is an edge to ``package.name`` when that is a module of
ours, else to ``package`` itself.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "operator" / "monarch_operator"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``name`` (at ``path``) imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            # "import a.b.c" names a.b.c; keep the longest prefix that is one of ours.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def layer_index(local: str, layers: dict[str, list[str]]) -> int:
    """The index in ``layers`` (name -> members, lowest first) of the layer that module
    ``local`` (its name inside the package) belongs to: a member is a module's name, or a
    folder's followed by ``.*`` for every module below it.

    Raises:
        KeyError: the module is in no layer (a new module must be given one).
    """
    for position, members in enumerate(layers.values()):
        for member in members:
            if local == member or (member.endswith(".*") and local.startswith(member[:-1])):
                return position
    raise KeyError(f"{local or '(the package)'} is in no layer; add it to one")


def unplaced(names: Iterable[str], layer_of: Callable[[str], int]) -> list[str]:
    """Each of ``names`` that is in no layer (``layer_of`` raises KeyError), in words."""
    missing = []
    for name in names:
        try:
            layer_of(name)
        except KeyError:
            missing.append(f"{name} is in no layer; add it to one")
    return missing


def upward_imports(graph: dict[str, set[str]], layer_of: Callable[[str], int],
                   layer_names: list[str]) -> list[str]:
    """Each import in ``graph`` of a module in a higher layer than the importer's, in words."""
    return [
        f"  {source} ({layer_names[layer_of(source)]}) imports {target} "
        f"({layer_names[layer_of(target)]})"
        for source, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(source)
    ]
