"""The house's floors (docs/architecture.md): a package imports only its own floor or lower ones.
Imports inside functions count; only ``if TYPE_CHECKING:`` blocks are exempt."""

from __future__ import annotations

from tests.test_import_cycles import SRC, import_graph

#: Floors, lowest first.
FLOORS = [
    {"errors", "hint", "spec"},
    {"zoned", "placement"},
    {"retention", "store"},
    {"testing", "trace"},
    {"integrations", "experiments", "vm"},
    {"mount", "analysis"},
    {"cli"},
]


def _violations(graph: dict[str, set[str]]) -> list[str]:
    floor = {name: i for i, names in enumerate(FLOORS) for name in names}
    out = []
    for mod, deps in graph.items():
        parts = mod.split(".")
        for d in deps:
            dparts = d.split(".")
            if len(parts) >= 2 and len(dparts) >= 2 and floor[dparts[1]] > floor[parts[1]]:
                out.append(f"{mod} -> {d}")
    return sorted(out)


def test_every_package_has_a_floor():
    pkg = SRC / "retainz"
    names = {p.name for p in pkg.iterdir() if (p / "__init__.py").exists()}
    names |= {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
    assert names - {"__main__"} <= set().union(*FLOORS), names - set().union(*FLOORS)


def test_no_package_imports_a_higher_floor():
    assert _violations(import_graph()) == []


def test_an_upward_import_is_caught():
    assert _violations({"retainz.store.x": {"retainz.cli.y"}, "retainz.cli.y": {"retainz.store.x"}}) == \
        ["retainz.store.x -> retainz.cli.y"]
