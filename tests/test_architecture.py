"""The import rules of the package layout, read from the source with ``ast``.

- The packages form layers, in ``LAYERS`` order: a module imports only from its own package and
  the ones listed before it (so the library never imports a stage, a study or the CLI).
- ``method/`` is pure torch: it imports only the standard library, torch, transformers and itself.
- No stage imports another stage; no module imports another module's private (``_``) names.
- The module import graph has no cycles (function-level imports included).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "rredcot"
LIBRARY = ("method", "infra", "data", "lm", "viz", "settings", "adapter")
# Bottom to top; the README's "Package layout" table shows the same order.
LAYERS = (*LIBRARY, "studies", "stages", "tools", "cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import in ``module``."""
    out = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                # `from rredcot.studies import mc` imports a module, not a name.
                out.append((sub, None, node.lineno) if sub in MODULES else (target, alias.name, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        targets = set()
        for target, _, _ in _imports(module):
            while target and target not in MODULES:  # rredcot.x.y.Name -> rredcot.x.y
                target = target.rpartition(".")[0]
            if target.startswith("rredcot") and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_layout_has_its_layers() -> None:
    layers = {_layer(m) for m in MODULES}
    assert set(LAYERS) == layers - {""}
    assert len(MODULES) > 50  # the walk found the package


def test_no_module_imports_private_names_of_another() -> None:
    bad = [
        f"{module}:{line} imports {name} from {target}"
        for module in MODULES
        for target, name, line in _imports(module)
        if target.startswith("rredcot")
        and name
        and name.startswith("_")
        and name != "__version__"
        and target != module
    ]
    assert not bad, "\n".join(bad)


def test_method_is_pure_torch() -> None:
    allowed = {"torch", "transformers", "rredcot"}
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for module in (m for m in MODULES if _layer(m) == "method"):
        for target, _, line in _imports(module):
            top = target.split(".")[0]
            if top in stdlib or top in allowed and (top != "rredcot" or _layer(target) == "method"):
                continue
            bad.append(f"{module}:{line} imports {target}")
    assert not bad, "\n".join(bad)
    # No config dicts or files in the method: nothing that reads YAML, JSON or the filesystem.
    for module in (m for m in MODULES if _layer(m) == "method"):
        tops = {target.split(".")[0] for target, _, _ in _imports(module)}
        assert not tops & {"yaml", "json", "pathlib", "os", "trl", "mlflow", "accelerate"}, module


def test_packages_import_only_the_layers_below_them() -> None:
    graph = _graph()
    bad = [
        f"{m} imports {t}"
        for m in graph
        for t in graph[m]
        if _layer(m) in LAYERS and _layer(t) in LAYERS and LAYERS.index(_layer(t)) > LAYERS.index(_layer(m))
    ]
    assert not bad, "\n".join(bad)


def test_the_library_never_imports_stages_studies_or_the_cli() -> None:
    graph = _graph()
    bad = [
        f"{m} imports {t}"
        for m in graph
        if _layer(m) in LIBRARY
        for t in graph[m]
        if _layer(t) in ("stages", "studies", "tools", "cli")
    ]
    assert not bad, "\n".join(bad)


def test_no_stage_imports_another_stage_and_studies_import_no_stage() -> None:
    graph = _graph()
    bad = [
        f"{m} imports {t}"
        for m in graph
        if _layer(m) in ("stages", "studies")
        for t in graph[m]
        if _layer(t) == "stages" and t != m
    ]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycles() -> None:
    # A package's __init__ re-exporting its own modules is not a cycle of the layout.
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in _graph().items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m) == "method"))
def test_method_modules_import_without_trl(module: str) -> None:
    """Importing the method core does not pull in TRL (checked in a fresh interpreter)."""
    import subprocess

    code = f"import sys, {module}; assert 'trl' not in sys.modules, sorted(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
