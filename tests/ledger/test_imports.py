"""The ledger's modules import one another without a cycle, and never the runtime or JAX.

Imports are read from the source (``ast``), those inside functions included: a function-level
import is still a dependency, merely a deferred one.
"""

from __future__ import annotations

import ast
import pathlib

import ledger

ROOT = pathlib.Path(ledger.__file__).parent
FORBIDDEN = ("runtime", "jax", "jaxlib")
"""Top-level packages the ledger must not import: the runtime builds on the ledger, and the ledger
tools and Beam workers run without JAX."""


def _modules() -> dict[str, pathlib.Path]:
    """``ledger.*`` module name -> its file (a package is its ``__init__.py``)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Every module ``module`` imports: ``from P import N`` counts as ``P.N`` when that is a
    known module, else as ``P``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return names


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: _imported(m, path, known) for m, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the graph's own modules, as ``[a, b, …, a]``, or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        if m in path:
            return [*path[path.index(m):], m]
        if m in done:
            return None
        path.append(m)
        for dep in sorted(graph[m] & graph.keys()):
            if dep != m and (found := visit(dep)) is not None:
                return found
        path.pop()
        done.add(m)
        return None

    for m in sorted(graph):
        if (found := visit(m)) is not None:
            return found
    return None


def test_the_graph_is_read_from_every_module():
    graph = _graph()
    assert {"ledger", "ledger.store", "ledger.codec", "ledger.events", "ledger.pipelines.rollouts"} <= graph.keys()
    assert "ledger.store" in graph["ledger.memory"] and "ledger.events" in graph["ledger.codec"]


def test_the_cycle_finder_finds_one():
    graph = {"a": {"b"}, "b": {"c", "x"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"os"}}) is None


def test_the_ledger_has_no_import_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "ledger import cycle: " + " -> ".join(cycle or ())


def test_the_ledger_imports_neither_the_runtime_nor_jax():
    bad = sorted(f"{m} imports {name}" for m, names in _graph().items() for name in names
                 if name.split(".")[0] in FORBIDDEN)
    assert not bad, "; ".join(bad)
