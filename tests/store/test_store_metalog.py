"""The metadata log (``store/metalog.py``): every record the store appends carries what recovery
needs (the logical time, the zone table's opening counter, the record's own fields), the snapshot
carries the committed state and the journal's own counters, and the journal's space budget counts
each committed generation's entry exactly."""

from __future__ import annotations

import pytest

from retainz.errors import NoSpaceError
from retainz.hint import Hint
from retainz.store import Store
from retainz.store.journal import scan
from retainz.store.records import (
    EXTENT_BYTES,
    SNAPSHOT_HEAD_BYTES,
    ZONE_ATTR_BYTES,
    Kind,
    decode,
    gen_entry_bytes,
    gen_entry_size,
    pack_zones,
    snapshot_zones,
)
from retainz.zoned import Geometry, MemoryDevice
from retainz.zoned.model import round_up

KiB = 1024
GEOM = Geometry(nr_zones=16, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=6,
                max_active=6)


def records(dev) -> list:
    """Every record of the device's journal chain, decoded (snapshot first)."""
    return [decode(p) for p in scan(dev).payloads]


def put(s: Store, gid: str, step: int, n: int = 20 * KiB, shards: int = 1, **kw):
    w = s.begin_generation(gid, step, hint=Hint(reclaim_step=step + 100), **kw)
    for i in range(shards):
        w.write_shard(f"shard-{i}", [bytes([step % 256]) * n])
    return w.commit()


def expect_stamped(rec, s: Store, kind: Kind) -> None:
    """``rec`` is a ``kind`` record stamped with the store's time and opening counter now."""
    assert rec.kind is kind
    assert (rec.now, rec.open_seq) == (s.now, s.table.open_seq)
    assert s.now > 0 and s.table.open_seq > 0        # so a missing or zero stamp cannot pass


def journal_counters(s: Store) -> dict:
    j = s.journal
    return {"journal_bytes": j.bytes_written, "journal_records": j.records, "rollovers": j.rollovers}


def test_every_record_kind_carries_its_fields_the_time_and_the_opening_counter():
    dev = MemoryDevice(GEOM)
    with Store.format(dev, policy="retainz") as s:
        g1 = put(s, "g1", 5, n=48 * KiB)                # fills a zone it holds alone
        rec = records(dev)[-1]
        expect_stamped(rec, s, Kind.COMMIT)
        assert [g.id for g in rec.gens] == ["g1"] and rec.gens[0].commit_seq == g1.commit_seq == 1
        assert (rec.replaces, list(rec.resets)) == (False, [])

        old_zones = sorted({e[0] for e in s.generation("g1").shards["shard-0"].extents})
        put(s, "g1", 9, n=30 * KiB, replace=True)       # one record retires the old version
        rec = records(dev)[-1]
        expect_stamped(rec, s, Kind.COMMIT)
        assert rec.replaces and sorted(rec.resets) == old_zones and s.now == 9

        s.update_hint("g1", Hint(reclaim_step=40), step=12)
        rec = records(dev)[-1]
        expect_stamped(rec, s, Kind.HINT)
        assert rec.hint == ("g1", Hint(reclaim_step=40)) and s.now == 12

        for i in range(3):
            put(s, f"h{i}", 13 + i, n=(30 if i != 1 else 100) * KiB)
        held = {g.id: {e[0] for sh in g.shards.values() for e in sh.extents} for g in s.generations()}
        alone = held["h1"] - set().union(*(z for gid, z in held.items() if gid != "h1"))
        assert alone and alone != held["h1"]             # a zone h1 holds alone, and a shared one
        s.delete("h1", step=20)
        rec = records(dev)[-1]
        expect_stamped(rec, s, Kind.DELETE)
        assert rec.deleted == "h1" and s.now == 20
        assert set(rec.resets) == alone                  # the zones h1 held alone are reset after it

        rep = s.gc(force=True)
        assert rep.victims
        rec = next(r for r in reversed(records(dev)) if r.kind is Kind.MOVE)
        assert (rec.now, rec.open_seq) == (20, s.table.open_seq)
        assert sorted(rec.resets) == sorted(rep.victims)
        moved = {(gid, name): ext for gid, name, ext in rec.moves}
        assert moved and all(tuple(map(tuple, s.generation(gid).shards[name].extents)) == ext
                             for (gid, name), ext in moved.items())
        counters = journal_counters(s)
    rec = records(dev)[-1]                               # the clean close's sync record
    assert rec.kind is Kind.SYNC and (rec.now, rec.open_seq) == (20, s.table.open_seq)
    assert {k: rec.metrics[k] for k in counters} == counters
    assert rec.metrics["generations_committed"] == s.metrics.generations_committed == 5


def test_a_rollover_snapshot_carries_the_time_the_counters_and_every_committed_generation():
    dev = MemoryDevice(GEOM)
    with Store.format(dev) as s:
        for i in range(4):
            put(s, f"g{i}", 10 + i)
        s.delete("g2", step=17)
        rolls = s.journal.rollovers
        s.journal.roll()                                 # what an append does when the zone is full
        head, *rest = records(dev)
        assert head.kind is Kind.SNAP and rest[-1].kind is Kind.SNAP_END
        assert (head.now, head.open_seq, head.commit_seq) == (17, s.table.open_seq, 4)
        assert rest[-1].count == 3
        ids = [g.id for r in rest if r.kind is Kind.GENS for g in r.gens]
        assert ids == ["g0", "g1", "g3"]
        # the snapshot's metrics are the journal's counters as they were when it was taken
        assert head.metrics["rollovers"] == rolls
        assert s.journal.rollovers == rolls + 1
    # a store reopened from the snapshot (and the sync record) resumes the same state
    with Store.open(dev) as s2:
        assert (s2.now, s2.table.open_seq, s2.catalog.commit_seq) == (17, s.table.open_seq, 4)
        assert [g.id for g in s2.generations()] == ["g0", "g1", "g3"]


def test_the_journal_counters_survive_a_mount_that_rolls_the_journal_over():
    """A mount that rolls over (here: a format version upgrade would, as does a torn tail) counts the
    roll in the metrics the next record journals, so a reopen resumes the journal's counters."""
    dev = MemoryDevice(GEOM)
    with Store.format(dev) as s:
        put(s, "g", 3)
    with Store.open(dev) as s:
        s.journal.roll()                                 # as recovery.mount does
        counters = journal_counters(s)
    rec = records(dev)[-1]
    assert rec.kind is Kind.SYNC
    assert {k: rec.metrics[k] for k in counters} == counters
    with Store.open(dev) as s:
        assert (s.metrics.journal_bytes, s.metrics.journal_records, s.metrics.rollovers) == (
            counters["journal_bytes"], counters["journal_records"], counters["rollovers"])


def entries(s: Store) -> list[int]:
    return [gen_entry_size(g) for g in s.generations()]


@pytest.mark.parametrize("declared", [0, 1, 4096, 48 * KiB, 48 * KiB + 1, 10 * 48 * KiB])
def test_the_estimate_of_a_new_generation_follows_its_extents_and_the_mean_entry(declared):
    dev = MemoryDevice(GEOM)
    with Store.format(dev) as s:
        extent = GEOM.zone_capacity
        first = 256 + len("new-gen") + EXTENT_BYTES * (-(-declared // extent) + 8)
        assert s.log.estimate("new-gen", declared, extent) == first
        assert s.log.estimate("n", declared, 7) == 257 + EXTENT_BYTES * (-(-declared // 7) + 8)
        put(s, "a", 1, n=100, shards=30)                # entries larger than the estimate
        put(s, "b", 2, n=100, shards=12)
        sizes = entries(s)
        assert sum(sizes) // 2 > first
        assert s.log.estimate("new-gen", declared, extent) == sum(sizes) // 2
        assert isinstance(s.log.estimate("new-gen", declared, extent), int)


def test_the_snapshot_budget_follows_commits_replacements_moves_and_deletions():
    """``need`` counts each committed generation's snapshot entry once, at its current size: the
    budget equals the one a store reopened from the journal computes from scratch."""
    dev = MemoryDevice(GEOM)
    with Store.format(dev) as s:
        put(s, "a", 1, n=100, shards=30)
        put(s, "b", 2, n=100, shards=3)
        put(s, "a", 3, n=100, shards=5, replace=True)   # the entry shrinks
        put(s, "c", 4, n=100, shards=20)
        s.delete("b", step=5)
        for i in range(4):                              # dead space beside live data: GC moves and re-tracks
            put(s, f"f{i}", 6 + i, n=20 * KiB)
        for i in (0, 2):
            s.delete(f"f{i}", step=10)
        assert s.gc(force=True).bytes_copied > 0
        s.log.forget("never-committed")                 # forgetting an unknown id changes nothing
        sizes = entries(s)
        extent = GEOM.zone_capacity
        assert s.log.estimate("x", 0, extent) == max(256 + 1 + EXTENT_BYTES * 8, sum(sizes) // len(sizes))
        live = s.log.need(100, [300])
    with Store.open(dev) as s2:
        assert s2.log.need(100, [300]) == live
        assert s2.log.estimate("x", 0, extent) == max(256 + 1 + EXTENT_BYTES * 8, sum(sizes) // len(sizes))


def test_a_commit_tracks_the_entry_it_journaled():
    with Store.format(MemoryDevice(GEOM)) as s:
        g = put(s, "a", 1, shards=2)
        assert s.log.track(g, gen_entry_bytes(g)) == gen_entry_size(g) == len(gen_entry_bytes(g)) + 1


def test_the_snapshot_bytes_needed_count_every_entry_in_flight_and_zone_with_slack():
    """``need``'s bytes: the head, every non-empty zone's attributes and 8 more, every committed
    entry, the estimates in flight and the new entry, all 12.5 % larger; and they bound what a
    rollover of the same state writes."""
    dev = MemoryDevice(GEOM)
    with Store.format(dev) as s:
        for i in range(5):
            put(s, f"g{i}", i + 1, n=100, shards=4 + 3 * i)
        t = s.table
        used = len(t) - t.n_empty
        assert used > 0
        gens = sum(entries(s)) + 700 + 300 + 5000
        nbytes, z = s.log.need(5000, [700, 300])
        assert nbytes == SNAPSHOT_HEAD_BYTES + (used + 8) * ZONE_ATTR_BYTES + gens + gens // 8
        assert sum(map(len, s.log.snapshot())) + 5000 <= nbytes
        # all of it fits one meta zone, but not with room for the next record (as large as the 5000-byte
        # entry) appended twice (format 5: 2 x 8 KiB): a second zone
        assert z == 2


def expected_zones(s: Store, extra: int, inflight: list[int]) -> int:
    """Meta zones ``need`` documents: the O(1) bound of the entries (12.5 % slack, one more record as
    large as the largest entry, both its copies), and when that exceeds half the meta zones and at most 4,096 entries
    are counted, the smaller exact packing of the same entries."""
    j, t = s.journal, s.table
    sizes = entries(s)
    zones = len(t) - t.n_empty + 8
    total = sum(sizes) + sum(inflight) + extra
    total += total // 8
    items = len(sizes) + len(inflight) + 1
    biggest = max(sizes + [extra])
    z = snapshot_zones(total, j.capacity, j.bs, items=items, biggest=biggest, zones=zones)
    if 2 * z > len(j.meta) and items <= 4096:
        exact = [n + n // 8 for n in sizes + inflight + [extra]]
        # the next record's two copies (format 5), each with its "cp":N, member
        z = min(z, pack_zones(exact, j.capacity, j.bs, zones=zones,
                              reserve=2 * round_up(max(biggest, 1024) + 7 + 8, j.bs)))
    return z


def small_journal_store() -> Store:
    """55 committed generations of 1 to 9 shards in 6 meta zones (the O(1) bound is loose there)."""
    dev = MemoryDevice(Geometry(nr_zones=40, zone_size=64 * KiB, zone_capacity=48 * KiB, max_open=3,
                                max_active=4))
    s = Store.format(dev, meta_zones=6)
    for i in range(55):
        w = s.begin_generation(f"g{i:03d}", i, hint=Hint(reclaim_step=i + 100))
        for k in range(1 + i % 9):
            w.write_shard(f"shard-{k}-" + "n" * 60, [b"x"])
        w.commit()
    return s


@pytest.mark.parametrize("inflight, extra", [
    ([], 16376), ([], 16389), ([], 36396),      # the new entry and the next record's reserve at a block edge
    ([15] * 100, 14543),                         # fractions of a byte of slack add up
    ([7] * 2000 + [8] * 2000, 100), ([7] * 300 + [8] * 300, 14490),
])
def test_the_exact_packing_counts_every_byte_of_slack_at_a_zone_edge(inflight, extra):
    """Where a few bytes decide whether the snapshot takes one more meta zone, ``need`` counts the
    12.5 % slack of every entry (whole bytes) and the next record's reserve exactly."""
    with small_journal_store() as s:
        assert s.log.need(extra, inflight)[1] == expected_zones(s, extra, inflight)


@pytest.mark.parametrize("inflight", [[], [600, 40_000], [1] * 4000, [1] * 4040, [1] * 4041, [1] * 4042])
def test_the_meta_zones_needed_take_the_exact_packing_when_the_bound_is_loose(inflight):
    """Small meta zones make the O(1) bound loose: ``need`` then packs the entries exactly (up to
    4,096 of them: here the committed 55, the estimates in flight and the new one)."""
    with small_journal_store() as s:
        # 4,088 and 4,090 bytes: the reserve for the next record is one or two blocks
        for extra in (300, 4088, 4090, 5000, 30_000):
            got = s.log.need(extra, inflight)[1]
            assert got == expected_zones(s, extra, inflight)
            m, free = len(s.journal.meta), len(s.journal.meta) - len(s.journal.chain)
            if 2 * got > m or got > free:                # refused: a rollover might not fit beside the chain
                with pytest.raises(NoSpaceError) as e:
                    s.log.check_room(extra, "it", inflight)
                assert e.value.cause == "journal" and e.value.needed == s.log.need(extra, inflight)[0]
                assert type(e.value.available) is int and e.value.available == min(m // 2, free) * s.journal.capacity
                assert f"keep room for 2 x {m // 2} ({free} free beside the current chain)" in str(e.value)
            else:
                s.log.check_room(extra, "it", inflight)
        loose = [s.log.need(e, inflight)[1] < expected_bound(s, e, inflight) for e in (300, 5000, 30_000)]
        if len(entries(s)) + len(inflight) + 1 <= 4096 and sum(inflight) < 10_000:
            assert any(loose)                           # the exact packing mattered here


def expected_bound(s: Store, extra: int, inflight: list[int]) -> int:
    j, t = s.journal, s.table
    sizes = entries(s)
    total = sum(sizes) + sum(inflight) + extra
    total += total // 8
    return snapshot_zones(total, j.capacity, j.bs, items=len(sizes) + len(inflight) + 1,
                          biggest=max(sizes + [extra]), zones=len(t) - t.n_empty + 8)
