"""No import circles in the package: no two modules import each other, directly or around a loop.

Every ``import`` counts, at module level or inside a function (a lazy import is still an arrow);
only ``if TYPE_CHECKING:`` blocks are left out (they never run)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for p in (SRC / "retainz").rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    """The module a dotted import name lands in (``a.b.C`` -> ``a.b`` when ``a.b`` is a module)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the retainz modules it imports."""
    mods = _modules()
    graph = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        skip = {id(n) for node in ast.walk(tree)
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for n in ast.walk(node)}
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        deps = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                deps |= {_owner(a.name, mods) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                if base.split(".")[0] != "retainz":
                    continue
                deps |= {_owner(f"{base}.{a.name}", mods) for a in node.names}
        graph[m] = {d for d in deps if d and d.startswith("retainz") and d != m}
    return graph


def test_the_graph_sees_real_imports():
    g = import_graph()
    assert "retainz.trace.format" in g["retainz.trace.validate"]
    assert "retainz.store" in g["retainz.trace.replay"]          # a function-level import counts too


def test_no_import_cycles():
    try:
        list(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None
