"""The house's layers (docs/architecture.md, "Layers and their direction"): every import of a ``retainz``
module is checked against the table there, which declares for each package (or lab command module) the
packages it may import. Imports inside functions count; only ``if TYPE_CHECKING:`` blocks are exempt.
A sideways import (``placement -> retention``) fails as surely as an upward one."""

from __future__ import annotations

import graphlib
import re
from pathlib import Path

from tests.project.test_import_cycles import SRC, import_graph

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
ROW = re.compile(r"^\| (`[^|]+`) \| (product|lab) \|\s*([^|]*?)\s*\|")


def declared() -> tuple[dict[str, set[str]], dict[str, str]]:
    """The table: {unit: packages it may import}, {unit: wing}.  A unit is a package (``store``) or a
    command module (``cli.vm``); 'what `cli` may' in a row adds cli's own list."""
    allowed, wing = {}, {}
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if not m:
            continue
        units = re.findall(r"`([\w.]+)`", m[1])
        deps = set(re.findall(r"`([\w.]+)`", m[3]))
        if "what `cli` may" in m[3]:
            deps = (deps - {"cli"}) | allowed["cli"]
        for u in units:
            allowed[u], wing[u] = deps, m[2]
    return allowed, wing


def _unit(module: str, allowed: dict[str, set[str]]) -> str:
    """The table row a module falls under: the longest declared prefix (``retainz.cli.vm`` -> ``cli.vm``)."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in allowed:
            return ".".join(parts[:n])
    raise KeyError(module)


def violations(graph: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
    """Imports the table does not allow, as 'importer -> imported'."""
    out = []
    for mod, deps in graph.items():
        if mod == "retainz":
            continue
        src = _unit(mod, allowed)
        for d in deps:
            if d == "retainz":
                continue
            dst = d.split(".")[1]
            if dst != src.split(".")[0] and dst not in allowed[src]:
                out.append(f"{mod} -> {d}")
    return sorted(out)


def test_the_table_declares_every_package():
    allowed, _ = declared()
    pkg = SRC / "retainz"
    names = {p.name for p in pkg.iterdir() if (p / "__init__.py").exists()}
    names |= {p.stem for p in pkg.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert names == {u for u in allowed if "." not in u}
    for deps in allowed.values():
        assert deps <= set(allowed), deps - set(allowed)


def test_the_declared_direction_has_no_cycle():
    allowed, _ = declared()
    graphlib.TopologicalSorter({u: {d for d in ds if d != u.split(".")[0]} for u, ds in allowed.items()
                                if "." not in u}).static_order()


def test_the_product_never_imports_the_lab():
    allowed, wing = declared()
    leaks = {u: {d for d in ds if wing[d] == "lab"} for u, ds in allowed.items() if wing[u] == "product"}
    assert {u: d for u, d in leaks.items() if d} == {}


def test_every_import_follows_the_table():
    allowed, _ = declared()
    assert violations(import_graph(), allowed) == []


def test_a_planted_sideways_or_upward_import_is_caught():
    allowed, _ = declared()
    graph = import_graph()
    sideways = {**graph, "retainz.placement.greedy": graph["retainz.placement.greedy"] | {"retainz.retention.rules"}}
    upward = {**graph, "retainz.store.gc": graph["retainz.store.gc"] | {"retainz.cli.store"}}
    lab = {**graph, "retainz.trace.replay": graph["retainz.trace.replay"] | {"retainz.testing.crashtest"}}
    base = set(violations(graph, allowed))
    assert set(violations(sideways, allowed)) - base == {"retainz.placement.greedy -> retainz.retention.rules"}
    assert set(violations(upward, allowed)) - base == {"retainz.store.gc -> retainz.cli.store"}
    assert set(violations(lab, allowed)) - base == {"retainz.trace.replay -> retainz.testing.crashtest"}


def private_imports(sources: dict[str, str]) -> list[str]:
    """Imports of another module's private names (``from retainz.a import _x``, ``import retainz._a``
    from outside ``_a``'s package, a module's ``_x`` through ``import retainz.a as m; m._x``), as
    'importer: name'.  What two modules share is public in the module that owns it.  Dunder and enum
    ``_sunder_`` names are the language's, not private."""
    import ast

    out = []
    for mod, text in sources.items():
        tree = ast.parse(text)
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("retainz"):
                for a in node.names:
                    target = f"{node.module}.{a.name}"
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        out.append(f"{mod}: {target}")
                    aliases[a.asname or a.name] = target
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("retainz") and a.asname:
                        aliases[a.asname] = a.name
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    parts = name.split(".")
                    for i, part in enumerate(parts):
                        if part.startswith("_") and not part.startswith("__") and \
                                not mod.startswith(".".join(parts[:i]) + "."):
                            out.append(f"{mod}: {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in aliases and node.attr.startswith("_") and not node.attr.endswith("_"):
                out.append(f"{mod}: {aliases[node.value.id]}.{node.attr}")
    return sorted(set(out))


def test_no_module_imports_another_modules_private_names():
    from tests.project.test_import_cycles import _modules

    sources = {m: p.read_text(encoding="utf-8") for m, p in _modules().items()}
    assert private_imports(sources) == []


def test_a_planted_private_import_is_caught():
    planted = {"retainz.x.a": "from retainz.x.b import _helper\nimport retainz.y._hidden\n"
                              "from retainz.x import b as m\nm._state\n",
               "retainz.y._hidden.c": "from retainz.y._hidden import d\n"}
    assert private_imports(planted) == ["retainz.x.a: retainz.x.b._helper", "retainz.x.a: retainz.x.b._state",
                                        "retainz.x.a: retainz.y._hidden"]


# The faces (docs/architecture.md, "The jobs layer"): module prefix -> face. What two faces share lives in jobs/.
FACES = {"retainz.mount": "mount", "retainz.integrations.fsspec_fs": "fsspec",
         "retainz.integrations.fsspec_files": "fsspec", "retainz.integrations.dcp": "dcp",
         "retainz.integrations.retention_callbacks": "callbacks"}


def _face(module: str) -> str | None:
    for prefix, face in FACES.items():
        if module == prefix or module.startswith(prefix + "."):
            return face
    return None


def face_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one face into another face's modules, as 'importer -> imported'."""
    out = []
    for mod, deps in graph.items():
        src = _face(mod)
        for d in deps:
            dst = _face(d)
            if src and dst and dst != src:
                out.append(f"{mod} -> {d}")
    return sorted(out)


def test_every_integrations_module_is_a_face():
    names = {f"retainz.integrations.{p.stem}" for p in (SRC / "retainz" / "integrations").glob("*.py")
             if p.stem != "__init__"}
    assert names == {m for m in FACES if m.startswith("retainz.integrations.")}


def test_the_faces_are_siblings():
    assert face_crossings(import_graph()) == []


def test_a_planted_face_crossing_is_caught():
    graph = import_graph()
    planted = {**graph, "retainz.mount.fs": graph["retainz.mount.fs"] | {"retainz.integrations.fsspec_fs"},
               "retainz.integrations.dcp": graph["retainz.integrations.dcp"] | {"retainz.integrations.fsspec_files"}}
    assert face_crossings(planted) == ["retainz.integrations.dcp -> retainz.integrations.fsspec_files",
                                       "retainz.mount.fs -> retainz.integrations.fsspec_fs"]
