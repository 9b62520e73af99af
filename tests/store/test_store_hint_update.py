"""A retention rule that changes (keep_latest_k 10 -> 3 on resume): ``Store.update_hint`` journals the
generation's new hint, the zones it holds alone take the new reclaim step, and a remount (clean or
after a crash) replays it identically."""

from __future__ import annotations

import pytest

from retainz.errors import GenerationNotFoundError, InjectedIOError, PowerCutError
from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice
from retainz.zoned.faulty import FaultyDevice

KiB = 1024
GEOM = Geometry(nr_zones=16, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=6,
                max_active=6)


def put(s, gid, step, reclaim, n=40 * KiB):
    w = s.begin_generation(gid, step, hint=Hint(reclaim_step=reclaim))
    w.write_shard("a", [bytes([step % 256]) * n])
    w.commit()
    return {e[0] for e in s.generation(gid).shards["a"].extents}


def test_the_new_hint_is_journaled_and_replayed_after_a_clean_reopen_and_a_crash():
    for crash in (False, True):
        dev = FaultyDevice(MemoryDevice(GEOM))
        s = Store.format(dev, policy="retainz")
        zones = put(s, "g10", 10, 1010, n=48 * KiB)
        put(s, "g20", 20, 1020)
        s.update_hint("g10", Hint(reclaim_step=40, condition="after 3 newer"), step=25)
        assert s.generation("g10").hint.reclaim_step == 40 and s.now == 25
        alone = [z for z in zones if len(s.catalog.zone_gens[z]) == 1]
        assert alone and all(s.table[z].reclaim_step == 40 for z in alone)
        attrs = {z: s.table[z].key() for z in zones}
        if crash:
            dev.cut_now()
            with pytest.raises(PowerCutError):
                s.close()                     # the sync record never lands
            dev.reboot()
        else:
            s.close()
        with Store.open(dev, policy="retainz") as back:
            h = back.generation("g10").hint
            assert (h.reclaim_step, h.condition) == (40, "after 3 newer")
            assert back.generation("g20").hint.reclaim_step == 1020
            assert {z: back.table[z].key() for z in zones} == attrs
            assert back.fsck().ok and back.table.key() == back.recompute_table().key()


def test_a_shared_zone_only_takes_a_later_reclaim_step():
    with Store.format(MemoryDevice(GEOM), policy="greedy") as s:
        z1 = put(s, "a", 1, 500, n=8 * KiB)
        z2 = put(s, "b", 2, 600, n=8 * KiB)
        shared = z1 & z2
        assert shared
        z = shared.pop()
        before = s.table[z].reclaim_step
        s.update_hint("a", Hint(reclaim_step=100))
        assert s.table[z].reclaim_step == before          # b still lives there until 600
        s.update_hint("a", Hint(reclaim_step=900))
        assert s.table[z].reclaim_step == 900
        assert s.table.key() == s.recompute_table().key()


def test_bad_updates_are_refused_and_change_nothing():
    with Store.format(MemoryDevice(GEOM)) as s:
        put(s, "g", 50, 100)
        key = s.table.key()
        with pytest.raises(ValueError, match="reclaim step 10 is before its own step 50"):
            s.update_hint("g", Hint(reclaim_step=10))
        with pytest.raises(GenerationNotFoundError):
            s.update_hint("nope", Hint(reclaim_step=100))
        assert s.generation("g").hint.reclaim_step == 100 and s.table.key() == key


def test_a_generation_being_written_takes_the_hint_with_its_commit():
    dev = MemoryDevice(GEOM)
    with Store.format(dev) as s:
        w = s.begin_generation("g", 5, hint=Hint(reclaim_step=500))
        w.write_shard("a", [b"x" * 1000])
        s.update_hint("g", Hint(reclaim_step=50))
        w.commit()
    with Store.open(dev) as s:
        assert s.generation("g").hint.reclaim_step == 50


def test_refusal_texts_and_a_reclaim_step_at_the_generations_own_step_is_taken():
    with Store.format(MemoryDevice(GEOM)) as s:
        zones = put(s, "g", 50, 100)
        with pytest.raises(GenerationNotFoundError, match=r"^no generation 'nope'$"):
            s.update_hint("nope", Hint(reclaim_step=100))
        with pytest.raises(ValueError, match=r"^generation 'g': reclaim step 49 is before its own step 50 \(a "
                                             r"generation cannot be retired before it is saved\)$"):
            s.update_hint("g", Hint(reclaim_step=49))
        s.update_hint("g", Hint(reclaim_step=50))           # retired the step it is saved: allowed
        assert s.generation("g").hint.reclaim_step == 50
        assert [s.table[z].reclaim_step for z in sorted(zones)] == [50] * len(zones)


def test_a_journal_write_that_fails_leaves_the_hint_and_every_zones_reclaim_step_as_before():
    dev = FaultyDevice(MemoryDevice(GEOM))
    with Store.format(dev, policy="retainz") as s:
        zones = put(s, "g", 10, 1010, n=48 * KiB)
        put(s, "h", 20, 1020)
        old = s.generation("g").hint
        steps = {z: s.table[z].reclaim_step for z in zones}
        key = s.table.key()
        assert set(steps.values()) == {1010}
        dev.fail("write")
        with pytest.raises(InjectedIOError):
            s.update_hint("g", Hint(reclaim_step=3000))
        assert s.generation("g").hint is old
        assert {z: s.table[z].reclaim_step for z in zones} == steps
        assert s.table.key() == key == s.recompute_table().key()
        s.update_hint("g", Hint(reclaim_step=3000))           # the next one lands
        assert {s.table[z].reclaim_step for z in zones if len(s.catalog.zone_gens[z]) == 1} == {3000}


def test_retainz_records_an_unknown_reclaim_step_as_the_generations_step_plus_the_unknown_lifetime():
    with Store.format(MemoryDevice(GEOM), policy="retainz") as s:
        zones = put(s, "g", 10, 1010, n=48 * KiB)
        s.update_hint("g", Hint(), step=12)
        assert s.generation("g").hint.reclaim_step is None
        assert {s.table[z].reclaim_step for z in zones} == {10 + 5000}
        assert s.table.key() == s.recompute_table().key()


def test_noisy_hints_are_drawn_once_per_generation_and_an_update_draws_the_same():
    """``retainz-noisy`` scales each generation's predicted lifetime by one seeded draw per
    generation: an update back to the hint a generation was written with gives its zones the reclaim
    step they were placed with."""
    with Store.format(MemoryDevice(GEOM), policy="retainz-noisy:error=0.5") as s:
        zones = put(s, "g", 10, 1010, n=48 * KiB)
        placed = {s.table[z].reclaim_step for z in zones}
        (r,) = placed
        assert r != 1010 and 10 + 500 <= r <= 10 + 1500
        s.update_hint("g", Hint(reclaim_step=2010))
        (r2,) = {s.table[z].reclaim_step for z in zones}
        assert r2 - 10 == pytest.approx(2 * (r - 10))       # the same draw scales the new lifetime
        s.update_hint("g", Hint(reclaim_step=1010))
        assert {s.table[z].reclaim_step for z in zones} == placed


@pytest.mark.parametrize("shard_open", [False, True])
def test_a_zone_shared_with_a_generation_being_written_only_takes_a_later_reclaim_step(shard_open):
    """Data of a generation being written (a closed shard, or one still open) shares the zone even
    though the catalog does not list it yet: a committed generation's new hint may only raise the
    zone's reclaim step until that writer ends."""
    g = Geometry(nr_zones=8, zone_size=2 << 20, zone_capacity=2 << 20, block_size=4096, max_open=4,
                 max_active=4)
    with Store.format(MemoryDevice(g), policy="greedy") as s:
        (z,) = put(s, "a", 1, 500, n=8 * KiB)
        w = s.begin_generation("b", 2, hint=Hint(reclaim_step=600))
        if shard_open:
            sh = w.open_shard("x")
            sh.write(bytes(1 << 20))                 # a full write buffer goes out at once
            assert set(sh.zone_bytes) == {z} and w.zone_bytes == {}
        else:
            w.write_shard("x", [bytes(1 << 20)])
            assert set(w.zone_bytes) == {z}
        assert s.table[z].reclaim_step == 600
        s.update_hint("a", Hint(reclaim_step=100))
        assert s.table[z].reclaim_step == 600
        w.abort()
        s.update_hint("a", Hint(reclaim_step=100))   # alone again: the zone takes it
        assert s.table[z].reclaim_step == 100
