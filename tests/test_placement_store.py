"""Every policy through the real store, on MemoryDevice and FileDevice (issue 5, "Done when")."""

from __future__ import annotations

import pytest

from retainz.placement import POLICIES
from retainz.zoned import FileDevice, Geometry, MemoryDevice
from tests.store_events import run
from tests.test_placement_retainz import mixed_trace

KiB = 1024
GEOM = Geometry(nr_zones=40, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=6,
                max_active=6)


def events():
    """Keep the latest 3 saves plus every 4th permanently; 40 KiB saves in two shards."""
    return mixed_trace(saves=40, interval=100, size=40 * KiB, every=4, keep=3)


def device(kind, tmp_path):
    if kind == "memory":
        return MemoryDevice(GEOM, payload=False)
    return FileDevice.create(tmp_path / "dev.img", GEOM)


@pytest.mark.parametrize("kind", ["memory", "file"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_runs_through_the_store(policy, kind, tmp_path):
    dev = device(kind, tmp_path)
    r = run(policy, events(), device=dev, unit=1, payload=kind == "file")
    dev.close()
    m = r.metrics()
    assert r.stop is None, f"{policy} stopped at step {r.stop}"
    assert m["generations_committed"] == 40
    assert m["host_bytes"] == 40 * 40 * KiB
    assert m["decisions"] == len(r.decisions) > 40


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_store_verify_mode_gives_identical_decisions(policy):
    """The store's verify mode recomputes every summary from the catalog before each decision
    (raising if the cached ones differ) and restores the table from it: same decisions."""
    a = run(policy, events(), device=MemoryDevice(GEOM, payload=False), unit=1)
    b = run(policy, events(), device=MemoryDevice(GEOM, payload=False), unit=1, verify=True)
    assert repr(a.decisions) == repr(b.decisions)
    strip = {"decision_cpu_seconds"}
    assert {k: v for k, v in a.metrics().items() if k not in strip} == \
        {k: v for k, v in b.metrics().items() if k not in strip}
