"""Copying GC: what it moves, what it skips, what it never loses."""

from __future__ import annotations

import random

import pytest

from retainz.errors import ChecksumError, NoSpaceError, ZonedDeviceError
from retainz.hint import Hint, Lifetime
from retainz.store import Store
from retainz.store.catalog import Catalog
from retainz.store.types import GCReport, GenerationInfo, GenState, ShardInfo
from retainz.zoned import Geometry, MemoryDevice, ZoneCond
from retainz.zoned.faulty import FaultyDevice

KiB = 1024
GEOM = Geometry(nr_zones=14, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)


def data(i: int, n: int = 30 * KiB) -> bytes:
    return random.Random(i).randbytes(n)


def put(s, gid, step, blob):
    w = s.begin_generation(gid, step)
    w.write_shard("s", [blob])
    return w.commit()


def read(s, gid):
    return b"".join(s.read_shard(gid, "s"))


def test_gc_moves_live_extents_resets_victims_and_counts_bytes():
    with Store.format(MemoryDevice(GEOM)) as s:
        for i in range(4):
            put(s, f"g{i}", i, data(i))
        s.delete("g1")
        s.delete("g2")
        dead_before = s.table.dead
        victims = sorted(z.index for z in s.table if z.cond == ZoneCond.FULL and z.dead)
        rep = s.gc(force=True)
        assert sorted(rep.victims) == victims and rep.zones_reset == len(victims)
        assert rep.bytes_copied == s.metrics.gc_bytes > 0
        assert s.metrics.waf == (s.metrics.host_bytes + s.metrics.gc_bytes) / s.metrics.host_bytes
        for v in victims:
            assert s.table[v].cond == ZoneCond.EMPTY and s.device.zone(v).cond == ZoneCond.EMPTY
        assert s.table.dead < dead_before
        assert read(s, "g0") == data(0) and read(s, "g3") == data(3)
        assert s.fsck().ok and s.table.key() == s.recompute_table().key()
    assert s.metrics.gc_bytes == rep.bytes_copied


def test_admission_runs_gc_when_empty_zones_fall_below_the_reserve():
    with Store.format(MemoryDevice(GEOM), gc_reserve_zones=2) as s:
        assert s.gc().victims == []                    # plenty of empty zones: nothing to do
        for i in range(30):                            # a permanent 8 KiB save beside every
            put(s, f"p{i}", i, data(1000 + i, 8 * KiB))  # temporary 36 KiB one: zones mix them
            put(s, f"t{i}", i, data(i, 36 * KiB))
            if i >= 2:
                s.delete(f"t{i - 2}")
            assert s.table.n_empty >= 1
        assert s.metrics.gc_bytes > 0                  # GC ran at admission and kept the reserve
        assert {g.id for g in s.generations()} == {f"p{i}" for i in range(30)} | {"t28", "t29"}
        assert read(s, "t29") == data(29, 36 * KiB) and read(s, "p0") == data(1000, 8 * KiB)
        assert s.fsck().ok


def test_gc_never_collects_a_zone_holding_a_generation_being_written():
    with Store.format(MemoryDevice(GEOM)) as s:
        put(s, "old", 0, data(0, 20 * KiB))
        w = s.begin_generation("writing", 1)
        w.write_shard("s", [data(1, 28 * KiB)])     # fills the zone old started
        s.delete("old")
        z = w.gen.shards["s"].extents[0][0]
        assert s.table[z].cond == ZoneCond.FULL and s.table[z].dead
        rep = s.gc(force=True)
        assert z in rep.skipped and z not in rep.victims
        w.commit()
        assert read(s, "writing") == data(1, 28 * KiB)


def test_a_corrupt_extent_is_not_moved_and_gc_reports_it():
    inner = MemoryDevice(GEOM)
    dev = FaultyDevice(inner)
    with Store.format(dev) as s:
        put(s, "a", 0, data(0))
        put(s, "b", 1, data(1))
        s.delete("a")
        e = next(e for e in s.generation("b").shards["s"].extents if s.table[e[0]].dead)
        dev.corrupt(e[0] * GEOM.zone_size + e[1] + 100)
        rep = s.gc(force=True)
        assert e[0] in rep.skipped and "fails its crc32c" in rep.errors[0]
        assert s.generation("b").shards["s"].extents[0] == e or e in s.generation("b").shards["s"].extents
        with pytest.raises(ChecksumError):
            read(s, "b")
        dev.corruptions.clear()
        assert read(s, "b") == data(1)                 # nothing was lost by the failed move
        assert s.table.key() == s.recompute_table().key()


def test_gc_that_runs_out_of_space_gives_up_cleanly():
    g = Geometry(nr_zones=8, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                 max_active=4)
    with Store.format(MemoryDevice(g), gc_reserve_zones=0) as s:
        for i in range(5):                             # 5 data zones, each 44 KiB live + 4 KiB free
            put(s, f"g{i}", i, data(i, 44 * KiB))
        s.delete("g0")                                 # its zone: 4 KiB of g1 live, 44 KiB dead
        before = {gid: read(s, gid) for gid in (g.id for g in s.generations())}
        s.gc(force=True)
        assert {gid: read(s, gid) for gid in before} == before
        assert s.fsck().ok and s.table.key() == s.recompute_table().key()


def test_a_move_reindexes_only_the_zones_a_generation_leaves_or_enters():
    """The catalog's zone index after a GC move (``Catalog.replace_extents``): a generation leaves the
    zones none of its shards use any more, enters the new ones, and keeps its place among the
    generations of a zone it still uses (GC visits a zone's generations in that order).  Extent
    offsets are byte offsets, never zone numbers: an extent at byte 4096 of zone 5 says nothing
    about zone 4096."""
    cat = Catalog()

    def gen(gid, seq, **shards):
        return GenerationInfo(gid, seq, state=GenState.COMMITTED, commit_seq=seq,
                              shards={n: ShardInfo(n, 4096 * len(ext), None, ext) for n, ext in shards.items()})

    cat.add(gen("a", 1, s=((4096, 0, 4096, None), (5, 4096, 4096, None)), t=((6, 0, 4096, None),)))
    cat.add(gen("b", 2, s=((4096, 4096, 4096, None), (6, 4096, 4096, None))))
    old = cat.replace_extents("a", "s", ((4096, 0, 4096, None), (7, 0, 4096, None)))
    assert old == ((4096, 0, 4096, None), (5, 4096, 4096, None))
    assert cat.gens["a"].shards["s"].extents == ((4096, 0, 4096, None), (7, 0, 4096, None))
    assert {z: list(d) for z, d in cat.zone_gens.items()} == {4096: ["a", "b"], 6: ["a", "b"], 7: ["a"]}
    cat.replace_extents("b", "s", ((8, 0, 4096, None), (6, 4096, 4096, None)))
    assert {z: list(d) for z, d in cat.zone_gens.items()} == {4096: ["a"], 6: ["a", "b"], 7: ["a"], 8: ["b"]}
    cat.replace_extents("a", "t", ((8, 4096, 4096, None),))
    assert {z: list(d) for z, d in cat.zone_gens.items()} == {4096: ["a"], 6: ["b"], 7: ["a"], 8: ["b", "a"]}


def test_extents_of_shards_the_policy_does_not_migrate_stay_and_are_counted():
    """ZenFS's ``MigrateExtents`` moves only ``.sst`` files: in a victim holding a.sst, b and c of
    g0 and the first extent of g2's e (its second is in the next zone), only a.sst moves; the three
    others stay, counted and named, and the victim keeps them (not reset)."""
    from dataclasses import dataclass

    from retainz.placement.zenfs import ZenFS

    @dataclass
    class EagerZenFS(ZenFS):
        """ZenFS's placement and migration rules; GC victims by the base rule (any dead bytes)."""

        name = "eager-zenfs"

        def gc_victims(self, reserve_zones):
            return super(ZenFS, self).gc_victims(reserve_zones)

    g = Geometry(nr_zones=32, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3, max_active=4)
    with Store.format(MemoryDevice(g), policy="greedy", gc_reserve_zones=0) as s:
        for gid, shards in (("g0", {"a.sst": 8, "b.distcp": 8, "c.distcp": 8}), ("g1", {"d.distcp": 16}),
                            ("g2", {"e.distcp": 16})):
            w = s.begin_generation(gid, 1)
            for name, kib in shards.items():
                w.write_shard(name, [name.encode()[:1] * (kib * KiB)])
            w.commit()
        victim = s.generation("g0").shards["a.sst"].extents[0][0]
        assert [e[0] for e in s.generation("g2").shards["e.distcp"].extents] == [victim, victim + 1]
        assert s.table[victim].cond == ZoneCond.FULL
        s.delete("g1")
        s.use_allocator(EagerZenFS())
        rep = s.gc(force=True)
        assert (rep.victims, rep.partial, rep.skipped) == ([], [victim], [])
        assert (rep.extents_moved, rep.extents_kept, rep.extents_skipped, rep.zones_reset) == (1, 3, 0, 0)
        assert rep.errors == [f"zone {victim}: 3 extents not moved: policy eager-zenfs does not migrate their shards"]
        assert s.generation("g0").shards["a.sst"].extents[0][0] != victim
        assert s.table[victim].cond == ZoneCond.FULL and s.table[victim].live == 24 * KiB
        for gid, name, kib in (("g0", "a.sst", 8), ("g0", "b.distcp", 8), ("g0", "c.distcp", 8),
                               ("g2", "e.distcp", 16)):
            assert b"".join(s.read_shard(gid, name)) == name.encode()[:1] * (kib * KiB)
        assert s.table.key() == s.recompute_table().key()


def test_a_victim_failing_its_checksum_is_given_up_and_the_next_victim_still_moves():
    """Zone A holds c, a (deleted) and b (corrupt); zone B holds d, x (deleted) and y.  GC takes A
    first (more dead bytes): c is copied, b fails its crc32c, so A is given up: c stays where it
    was and its copy is dead.  B is then moved and reset.  The report says exactly that, and a
    reopen sees the same store."""
    dev = FaultyDevice(MemoryDevice(GEOM))
    s = Store.format(dev, policy="greedy", verify_summaries=True)    # every placement checks the table
    sizes = {"c": 8, "a": 32, "b": 8, "d": 8, "x": 24, "y": 16, "z": 8}
    for i, (gid, kib) in enumerate(sizes.items()):
        put(s, gid, i, data(100 + i, kib * KiB))
    ext = {gid: s.generation(gid).shards["s"].extents for gid in "cabdxyz"}
    za, zb, zc = ext["c"][0][0], ext["d"][0][0], ext["z"][0][0]
    assert [e[0][:2] for e in ext.values()] == [(za, 0), (za, 8 * KiB), (za, 40 * KiB), (zb, 0), (zb, 8 * KiB),
                                                (zb, 32 * KiB), (zc, 0)]
    s.delete("a")
    s.delete("x")
    b = ext["b"][0]
    dev.corrupt(b[0] * GEOM.zone_size + b[1] + 100)
    rep = s.gc(force=True)
    assert (rep.victims, rep.skipped, rep.partial, rep.zones_reset) == ([zb], [za], [], 1)
    assert (rep.extents_moved, rep.bytes_copied, s.metrics.gc_bytes) == (2, 24 * KiB, 24 * KiB)
    assert rep.errors == [f"zone {za}: generation 'b' shard 's': extent at zone {za} offset {40 * KiB} (8192 bytes) "
                          "fails its crc32c; not moved"]
    moved = {gid: s.generation(gid).shards["s"].extents for gid in "cbdyz"}
    assert moved["c"] == ext["c"] and moved["b"] == ext["b"] and moved["z"] == ext["z"]
    assert [e[:2] for e in moved["d"] + moved["y"]] == [(zc, 16 * KiB), (zc, 24 * KiB)]
    got = {z.index: (z.cond, z.written, z.live, z.dead) for z in s.table if z.written}
    assert got == {za: (ZoneCond.FULL, 48 * KiB, 16 * KiB, 32 * KiB),           # c's copy at zc+8 KiB: dead
                   zc: (ZoneCond.IMP_OPEN, 40 * KiB, 32 * KiB, 8 * KiB)}
    assert s.table.key() == s.recompute_table().key()
    dev.corruptions.clear()
    s.close()
    with Store.open(dev) as back:
        assert {gid: back.generation(gid).shards["s"].extents for gid in "cbdyz"} == moved
        assert {z.index: (z.cond, z.written, z.live, z.dead) for z in back.table if z.written} == got
        rep = back.gc(force=True)                  # readable now: A moves (c and b), counted on top
        assert (rep.victims, rep.bytes_copied, back.metrics.gc_bytes) == ([za], 16 * KiB, 40 * KiB)
        for i, (gid, kib) in enumerate(sizes.items()):
            if gid not in "ax":
                assert read(back, gid) == data(100 + i, kib * KiB)
        assert back.fsck().ok


NO_ROOM = Geometry(nr_zones=8, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3, max_active=4)
#: (generation, KiB) in commit order: zone A = g0 (deleted) g1 g2 g5, zone B = g6 (deleted) g7, g3 fills two
#: zones, g4 leaves 12 KiB of the last zone free.
NO_ROOM_GENS = [("g0", 16), ("g1", 8), ("g2", 16), ("g5", 8), ("g6", 16), ("g7", 32), ("g3", 96), ("g4", 36)]


def no_room_store(dev, **kw):
    s = Store.format(dev, gc_reserve_zones=0, policy="greedy", **kw)
    for i, (gid, kib) in enumerate(NO_ROOM_GENS):
        put(s, gid, i, data(i, kib * KiB))
    zone = {gid: s.generation(gid).shards["s"].extents[0][0] for gid, _ in NO_ROOM_GENS}
    assert (zone["g0"], zone["g6"], zone["g4"]) == (3, 4, 7) and zone["g5"] == 3 and zone["g7"] == 4
    s.delete("g0")
    s.delete("g6")
    return s


def zones_of(s) -> dict:
    return {z.index: (z.cond, z.written, z.live, z.dead) for z in s.table if z.written}


def test_extents_gc_has_no_room_for_stay_and_a_part_copy_is_undone():
    """GC of A copies g1 (8 KiB) into the last zone; g2 (16 KiB) gets its first 4 KiB placed, then no
    zone has room for the rest: that piece becomes dead and g2 stays, as do g5 and B's g7.  A and B
    are partial victims (not reset); every placement checks the table (verify_summaries)."""
    dev = MemoryDevice(NO_ROOM)
    s = no_room_store(dev, verify_summaries=True)
    before = {gid: s.generation(gid).shards["s"].extents for gid in ("g2", "g5", "g7")}
    rep = s.gc(force=True)
    assert (rep.victims, rep.skipped, rep.partial, rep.zones_reset) == ([], [], [3, 4], 0)
    assert (rep.extents_moved, rep.extents_skipped, rep.bytes_copied) == (1, 3, 8 * KiB)
    assert rep.errors == ["zone 3: 2 extents (24576 bytes) not moved: no space",
                          "zone 4: 1 extents (32768 bytes) not moved: no space"]
    assert s.generation("g1").shards["s"].extents[0][:3] == (7, 36 * KiB, 8 * KiB)
    assert {gid: s.generation(gid).shards["s"].extents for gid in before} == before
    got = zones_of(s)
    assert (got[3], got[4], got[7]) == ((ZoneCond.FULL, 48 * KiB, 24 * KiB, 24 * KiB),
                                        (ZoneCond.FULL, 48 * KiB, 32 * KiB, 16 * KiB),
                                        (ZoneCond.FULL, 48 * KiB, 44 * KiB, 4 * KiB))
    assert s.table.key() == s.recompute_table().key() and s.fsck().ok
    s.close()
    with Store.open(dev) as back:
        assert zones_of(back) == got
        for i, (gid, kib) in enumerate(NO_ROOM_GENS):
            if gid not in ("g0", "g6"):
                assert read(back, gid) == data(i, kib * KiB)


@pytest.mark.parametrize("op, after, last", [
    ("flush", 0, (ZoneCond.FULL, 48 * KiB, 36 * KiB, 12 * KiB)),       # after g2's undone piece
    ("write", 1, (ZoneCond.IMP_OPEN, 44 * KiB, 36 * KiB, 8 * KiB))])   # g2's piece never lands
def test_a_gc_pass_failing_part_way_undoes_every_copy(op, after, last):
    """The same pass, but the flush before its move record, or the write of g2's piece, fails:
    nothing moves, the copies made are dead in the last zone, the store is as consistent as before,
    and the next pass runs."""
    dev = FaultyDevice(MemoryDevice(NO_ROOM))
    s = no_room_store(dev)
    before = {gid: s.generation(gid).shards["s"].extents for gid, _ in NO_ROOM_GENS if gid not in ("g0", "g6")}
    table = zones_of(s)
    dev.fail(op, after=after)
    with pytest.raises(ZonedDeviceError, match=rf"^injected I/O error on {op}( \(zone 7\))?$"):
        s.gc(force=True)
    assert {gid: s.generation(gid).shards["s"].extents for gid in before} == before
    assert zones_of(s) == table | {7: last}
    assert s.table.key() == s.recompute_table().key() and s.collector.inflight == []
    rep = s.gc(force=True)                           # not left running
    assert rep.partial[:2] == [3, 4] and rep.errors[0].startswith("zone 3: ")
    assert s.table.key() == s.recompute_table().key()
    s.close()
    with Store.open(dev) as back:
        assert zones_of(back) == zones_of(s)
        assert back.fsck().ok


def test_a_write_error_copying_the_second_victim_undoes_both_victims_copies():
    """Victims A (c, a deleted, b) and B (d, x deleted, y); zone C is full of z, so the copies open
    an empty zone.  c, b and d are copied there, then y's copy fails: every copy of the pass is
    undone, and the zone holding only them is reset."""
    dev = FaultyDevice(MemoryDevice(GEOM))
    s = Store.format(dev, policy="greedy")
    sizes = {"c": 8, "a": 32, "b": 8, "d": 8, "x": 24, "y": 16, "z": 48}
    for i, (gid, kib) in enumerate(sizes.items()):
        put(s, gid, i, data(200 + i, kib * KiB))
    zone = {gid: s.generation(gid).shards["s"].extents[0][0] for gid in sizes}
    assert [zone[g] for g in "cabdxyz"] == [3, 3, 3, 4, 4, 4, 5]
    s.delete("a")
    s.delete("x")
    before = zones_of(s)
    assert 6 not in before
    dev.fail("write", after=3)
    with pytest.raises(ZonedDeviceError, match=r"^injected I/O error on write \(zone 6\)$"):
        s.gc(force=True)
    assert zones_of(s) == before and dev.zone(6).cond == ZoneCond.EMPTY
    assert {gid: s.generation(gid).shards["s"].extents[0][0] for gid in "cbdyz"} == {g: zone[g] for g in "cbdyz"}
    assert s.table.key() == s.recompute_table().key()
    rep = s.gc(force=True)
    assert (rep.victims, rep.extents_moved, rep.bytes_copied) == ([3, 4], 4, 40 * KiB)   # c, b, d, y
    for i, (gid, kib) in enumerate(sizes.items()):
        if gid not in "ax":
            assert read(s, gid) == data(200 + i, kib * KiB)
    s.close()


def test_a_shard_with_some_extents_moved_and_some_left_keeps_them_in_order():
    """g1's shard has three extents (1 MiB writes) in victim A; the last zone has room for the first
    one only (its copy fills the zone's free 1.5 MiB but for half a MiB, too little for the next).
    The shard's extent list then holds the copy, then the two extents left in A, in data order."""
    MiB = 1 << 20
    g = Geometry(nr_zones=9, zone_size=4 * MiB, zone_capacity=4 * MiB, block_size=4096, max_open=3, max_active=4)
    dev = MemoryDevice(g)
    s = Store.format(dev, gc_reserve_zones=0, policy="greedy")
    sizes = {"g0": MiB, "g1": 5 * MiB // 2, "g2": MiB // 2, "g3": 16 * MiB, "g4": 5 * MiB // 2}
    for i, (gid, n) in enumerate(sizes.items()):
        put(s, gid, i, data(300 + i, n))
    old = s.generation("g1").shards["s"].extents
    assert [e[:3] for e in old] == [(3, MiB, MiB), (3, 2 * MiB, MiB), (3, 3 * MiB, MiB // 2)]
    s.delete("g0")
    rep = s.gc(force=True)
    assert (rep.partial, rep.extents_moved, rep.extents_skipped, rep.bytes_copied) == ([3], 1, 3, MiB)
    assert rep.errors == [f"zone 3: 3 extents ({2 * MiB} bytes) not moved: no space"]
    new = s.generation("g1").shards["s"].extents
    assert new == ((8, 5 * MiB // 2, MiB, old[0][3]), old[1], old[2])
    assert read(s, "g1") == data(301, sizes["g1"])
    assert s.table.key() == s.recompute_table().key()
    s.close()
    with Store.open(dev) as back:
        assert back.generation("g1").shards["s"].extents == new and read(back, "g1") == data(301, sizes["g1"])
        assert back.fsck().ok


def test_an_unforced_pass_asks_the_policy_with_the_store_reserve_and_a_forced_one_with_every_zone():
    """greedy's rule collects only while fewer zones than the reserve are empty: with ten empty
    zones an unforced pass collects nothing; a forced one asks with a reserve of every data zone and
    takes the full zone holding dead bytes."""
    with Store.format(MemoryDevice(GEOM), policy="greedy", gc_reserve_zones=2) as s:
        put(s, "a", 0, data(0, 40 * KiB))
        put(s, "b", 1, data(1, 16 * KiB))                 # fills a's zone, 8 KiB into the next
        s.delete("a")
        z = s.generation("b").shards["s"].extents[0][0]
        assert s.table[z].cond == ZoneCond.FULL and s.table.n_empty == 9
        waiting = "GC collects only while fewer than 2 data zones are empty (the GC reserve), and 9 are"
        assert s.gc() == GCReport(reclaimable=40 * KiB, empty_zones=9, gc_reserve_zones=2, held_back=[z],
                                  held_back_live=8 * KiB, held_back_reclaimable=40 * KiB, waiting=waiting)
        rep = s.gc(force=True)
        assert rep.victims == [z] and rep.bytes_copied == 8 * KiB
        assert (rep.reclaimable, rep.held_back, rep.waiting) == (0, [], "")    # forced: nothing is held back


def test_an_unforced_pass_says_what_it_left_and_a_forced_pass_collects_exactly_that():
    """Issue 44.3: after a delete, reclaimable space sat in full zones and a plain ``gc`` collected
    nothing without a word.  The unforced pass now names the zones a forced pass would collect, their
    live bytes (the copy it costs) and reclaimable bytes, and why it waited; the forced pass then
    collects those zones and gives back those bytes."""
    with Store.format(MemoryDevice(GEOM), policy="greedy", gc_reserve_zones=2) as s:
        for i in range(6):
            put(s, f"g{i}", i, data(i, 40 * KiB))          # 40 KiB saves straddle 48 KiB zones
        s.delete("g1")
        s.delete("g3")
        full_dead = sorted(z.index for z in s.table if z.cond == ZoneCond.FULL and z.dead and z.live)
        rep = s.gc()
        assert rep.victims == [] and rep.bytes_copied == 0
        assert sorted(rep.held_back) == full_dead and len(full_dead) >= 2
        assert rep.held_back_live == sum(s.table[z].live for z in full_dead)
        assert rep.held_back_reclaimable == sum(s.table[z].dead for z in full_dead) == s.table.reclaimable
        assert rep.reclaimable == s.table.reclaimable and "the GC reserve" in rep.waiting
        forced = s.gc(force=True)
        assert sorted(forced.victims) == full_dead and forced.bytes_copied == rep.held_back_live
        assert s.table.reclaimable == 0 and s.gc().held_back == []
        for i in (0, 2, 4, 5):
            assert read(s, f"g{i}") == data(i, 40 * KiB)


def test_a_zone_holding_a_generation_being_written_is_not_held_back():
    """A full zone with dead bytes that also holds data of a generation still being written cannot be
    collected (forced or not), so the plain pass does not offer it."""
    with Store.format(MemoryDevice(GEOM), policy="greedy", gc_reserve_zones=2) as s:
        put(s, "x", 0, data(0, 16 * KiB))
        put(s, "a", 1, data(1, 16 * KiB))
        s.delete("a")                                      # 16 KiB dead beside x's 16 KiB, zone open
        z = s.generation("x").shards["s"].extents[0][0]
        w = s.begin_generation("b", 2)
        w.write_shard("s", [data(2, 40 * KiB)])            # fills that zone: full, dead bytes, being written
        assert z in w.zone_bytes
        assert s.table[z].cond == ZoneCond.FULL and s.table[z].dead == 16 * KiB
        assert z in s.allocator.gc_victims(len(s.table))   # the forced rule names it
        rep = s.gc()
        assert rep.held_back == [] and rep.reclaimable == 16 * KiB
        w.commit()
        assert s.gc().held_back == [z]


def test_a_pass_a_policy_never_runs_now_holds_nothing_back():
    """ZenFS's rule collects only at or below 20 % free space, forced or not: a plain pass then names
    nothing a forced pass would collect (no advice that ``--force`` cannot keep)."""
    geom = Geometry(nr_zones=40, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096)
    with Store.format(MemoryDevice(geom), policy="zenfs", gc_reserve_zones=2) as s:
        for i in range(4):
            put(s, f"g{i}", i, data(i, 40 * KiB))
        s.delete("g1")
        assert s.table.reclaimable > 0
        rep = s.gc()
        assert (rep.victims, rep.held_back, rep.waiting) == ([], [], "")
        assert rep.reclaimable == s.table.reclaimable and s.gc(force=True).victims == []


def test_zones_a_policy_names_that_gc_cannot_collect_are_skipped():
    """A policy may name anything: a meta zone (not a data zone), an open zone.  GC skips each
    (``GCReport.skipped``) and collects the rest."""
    from retainz.placement.greedy import Greedy

    class Named(Greedy):
        name = "named"
        victims: list = []

        def gc_victims(self, reserve_zones):
            return list(self.victims)

    with Store.format(MemoryDevice(GEOM), policy="greedy") as s:
        put(s, "a", 0, data(0, 40 * KiB))
        put(s, "b", 1, data(1, 16 * KiB))                 # a's zone full, b's tail in the next
        s.delete("a")
        full, part = (e[0] for e in s.generation("b").shards["s"].extents)
        assert (s.table[full].cond, s.table[full].dead, s.table[part].cond) == (ZoneCond.FULL, 40 * KiB,
                                                                                ZoneCond.IMP_OPEN)
        pol = Named()
        s.use_allocator(pol)
        pol.victims = [0, part, full]
        rep = s.gc(force=True)
        assert (rep.skipped, rep.victims) == ([0, part], [full])
        assert s.table[full].written == 0 and s.table[part].live == 16 * KiB
        assert read(s, "b") == data(1, 16 * KiB)
        assert s.table.key() == s.recompute_table().key()


def test_a_flush_failing_after_two_victims_were_copied_undoes_both():
    """The layout above; both victims are copied into the empty zone, then the flush before the move
    record fails: the copies of both victims are undone and that zone is reset."""
    dev = FaultyDevice(MemoryDevice(GEOM))
    s = Store.format(dev, policy="greedy")
    for i, (gid, kib) in enumerate({"c": 8, "a": 32, "b": 8, "d": 8, "x": 24, "y": 16, "z": 48}.items()):
        put(s, gid, i, data(200 + i, kib * KiB))
    s.delete("a")
    s.delete("x")
    before = zones_of(s)
    dev.fail("flush")
    with pytest.raises(ZonedDeviceError, match=r"^injected I/O error on flush$"):
        s.gc(force=True)
    assert zones_of(s) == before and dev.zone(6).cond == ZoneCond.EMPTY
    assert s.table.key() == s.recompute_table().key()
    s.close()


def test_a_placement_with_no_space_collects_capacity_lost_to_finishes_when_nothing_is_dead():
    # The write path's retry (a policy without admission: ZenFS) has the same precondition as
    # admission's GC: a pass runs when something is reclaimable, dead bytes or capacity lost to
    # finishes (ZoneTable.reclaimable), not only dead bytes.  ZenFS with a finish threshold of 60 %
    # (ApplyFinishThreshold) finishes every half-written zone at its next allocation: one-file zones
    # of 24 KiB live and 24 KiB unused, no dead byte; its GC (GCWorker: garbage 50 % above the threshold)
    # moves one of them into the one partly filled zone with room, and the file that found no zone
    # gets the reset one.
    geom = Geometry(nr_zones=40, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=14,
                    max_active=14)
    with Store.format(MemoryDevice(geom), policy="zenfs:finish_threshold=60") as s:
        w = s.begin_generation("a", 0, hint=Hint(lifetime=Lifetime.SHORT))
        w.write_shard("a.sst", [b"a" * (8 * KiB)])
        w.commit()
        for i in range(1, 36):
            w = s.begin_generation(f"g{i}", i, hint=Hint(lifetime=Lifetime.LONG))
            w.write_shard("l.sst", [data(i, 24 * KiB)])
            w.commit()
        t = s.table
        assert (t.n_empty, t.dead, t.unused, s.metrics.finishes) == (0, 0, 34 * 24 * KiB, 34)
        w = s.begin_generation("g36", 36, hint=Hint(lifetime=Lifetime.LONG))
        w.write_shard("l.sst", [data(36, 24 * KiB)])        # no zone: GC makes one
        w.commit()
        assert (s.metrics.gc_bytes, s.metrics.resets) == (24 * KiB, 1)
        assert s.fsck().ok and s.table.key() == s.recompute_table().key()
        assert all(b"".join(s.read_shard(f"g{i}", "l.sst")) == data(i, 24 * KiB) for i in range(1, 37))
        w = s.begin_generation("g37", 37, hint=Hint(lifetime=Lifetime.LONG))
        with pytest.raises(NoSpaceError) as e:                 # nothing left GC has room to move
            w.write_shard("l.sst", [data(37, 24 * KiB)])
        assert e.value.cause == "allocation" and e.value.state["dead_bytes"] == 0
