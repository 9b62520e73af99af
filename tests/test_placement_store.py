"""Every policy through the real store, on MemoryDevice and FileDevice (issue 5, "Done when")."""

from __future__ import annotations

import pytest

from retainz.placement import POLICIES
from retainz.zoned import FileDevice, Geometry, MemoryDevice
from tests.placement_driver import replay_store
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
    m, log, stop = replay_store(policy, events(), dev, payload=kind == "file")
    dev.close()
    assert stop is None, f"{policy} stopped at step {stop}"
    assert m["generations_committed"] == 40
    assert m["host_bytes"] == 40 * 40 * KiB
    assert m["decisions"] == len(log) > 40


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_store_verify_mode_gives_identical_decisions(policy):
    """The store's verify mode recomputes every summary from the catalog before each decision
    (raising if the cached ones differ) and restores the table from it: same decisions."""
    a = replay_store(policy, events(), MemoryDevice(GEOM, payload=False))
    b = replay_store(policy, events(), MemoryDevice(GEOM, payload=False), verify=True)
    assert repr(a[1]) == repr(b[1])
    strip = {"decision_cpu_seconds"}
    assert {k: v for k, v in a[0].items() if k not in strip} == \
        {k: v for k, v in b[0].items() if k not in strip}
