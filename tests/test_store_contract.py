"""The store contract (retainz.store.contract): the store implements it, with the same signatures, and
the code outside the store (integrations, mount, CLI, replay, experiments, the guest lane) calls
nothing else on a store."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from retainz.store import GenerationWriter, ShardWriter, Store
from retainz.store.contract import CheckpointStore, GenerationWriting, ShardStream
from retainz.zoned import Geometry, MemoryDevice

SRC = Path(__file__).resolve().parents[1] / "src" / "retainz"
CALLERS = ["integrations", "mount", "cli", "trace", "experiments", "vm", "node"]


def _members(proto) -> set[str]:
    return {n for n in vars(proto) if not n.startswith("_")} | set(getattr(proto, "__annotations__", {}))


@pytest.mark.parametrize("proto, impl", [(CheckpointStore, Store), (GenerationWriting, GenerationWriter),
                                         (ShardStream, ShardWriter)])
def test_every_method_of_the_contract_has_the_same_signature_on_the_store(proto, impl):
    for name, member in vars(proto).items():
        if name.startswith("_") or not callable(member):
            continue
        mine = inspect.signature(getattr(impl, name))
        theirs = inspect.signature(member)
        assert list(mine.parameters) == list(theirs.parameters), f"{impl.__name__}.{name}: {mine} vs {theirs}"


def test_an_open_store_and_its_writers_are_instances_of_the_contract():
    with Store.format(MemoryDevice(Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20))) as s:
        assert isinstance(s, CheckpointStore)
        w = s.begin_generation("g", 1)
        assert isinstance(w, GenerationWriting)
        shard = w.open_shard("a")
        assert isinstance(shard, ShardStream)
        shard.write(b"abc")
        shard.close()
        w.commit()
        assert b"".join(s.read_shard("g", "a")) == b"abc"


def test_code_outside_the_store_calls_only_the_contract():
    allowed = _members(CheckpointStore)
    used: dict[str, set[str]] = {}
    for pkg in CALLERS:
        for path in (SRC / pkg).rglob("*.py"):
            for name in re.findall(r"(?:(?<=self\.)|(?<![\w.]))store\.([A-Za-z_]\w*)", path.read_text()):
                used.setdefault(name, set()).add(str(path.relative_to(SRC)))
    assert used, "the scan found no store calls: the pattern is broken"
    outside = {n: sorted(f) for n, f in used.items() if n not in allowed}
    assert not outside, f"store members used outside the contract: {outside}"
