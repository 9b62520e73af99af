"""Store API: round trips, admission, bad input, format refusal, locking, concurrency, metrics."""

from __future__ import annotations

import random
import re
import threading

import pytest

from retainz.errors import (
    DeviceBusyError,
    ForeignDeviceError,
    GenerationExistsError,
    GenerationNotFoundError,
    InvalidIdError,
    NoPayloadError,
    NoSpaceError,
    ShardNotFoundError,
    ShardSizeError,
    StoreLockedError,
    SummaryMismatchError,
)
from retainz.hint import Hint
from retainz.placement.base import NO_SPACE, PERMANENT
from retainz.placement.greedy import Greedy
from retainz.store import GenState, Store
from retainz.store.format import SPARE, Superblock
from retainz.store.records import gen_entry_bytes
from retainz.store.store import superblock_zones
from retainz.zoned import FileDevice, Geometry, MemoryDevice, ZoneCond, ZoneOp
from retainz.zoned.faulty import FaultyDevice

KiB = 1024
GEOM = Geometry(nr_zones=16, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)


def blob(n: int, seed: int = 0) -> bytes:
    return random.Random(seed * 7919 + n).randbytes(n)


@pytest.fixture
def store():
    s = Store.format(MemoryDevice(GEOM))
    yield s
    s.close()


def put(store, gid, step, shards: dict[str, bytes], **kw):
    w = store.begin_generation(gid, step, **kw)
    for name, data in shards.items():
        w.write_shard(name, [data])
    return w.commit()


def read(store, gid, name) -> bytes:
    return b"".join(store.read_shard(gid, name))


def test_round_trip_streams_in_chunks_and_survives_reopen():
    dev = MemoryDevice(GEOM)
    data = blob(150_000)
    with Store.format(dev) as s:
        w = s.begin_generation("g1", 10, hint=Hint(reclaim_step=30, lifetime=2), declared_size=len(data))
        info = w.write_shard("model", (data[i:i + 7000] for i in range(0, len(data), 7000)))
        assert info.size == len(data) and len(info.extents) >= 4   # crosses zones (48 KiB each)
        assert all(e[2] <= 1 << 20 for e in info.extents)
        assert w.commit().state is GenState.COMMITTED
        assert read(s, "g1", "model") == data
    with Store.open(dev) as s:
        g = s.generation("g1")
        assert (g.step, g.hint.reclaim_step, g.hint.lifetime) == (10, 30, 2)
        assert read(s, "g1", "model") == data
        assert [c for c in s.read_shard("g1", "model")][0] == data[:len(next(s.read_shard("g1", "model")))]


def test_generations_sorted_by_step_then_id_and_only_committed(store):
    put(store, "b", 5, {"s": b"x"})
    put(store, "a", 5, {"s": b"y"})
    put(store, "c", 1, {"s": b"z"})
    w = store.begin_generation("inflight", 0)
    w.write_shard("s", [b"hidden"])
    assert [g.id for g in store.generations()] == ["c", "a", "b"]
    with pytest.raises(GenerationNotFoundError):
        store.generation("inflight")
    w.abort()
    assert w.state is GenState.ABORTED


def test_bad_ids_are_refused_with_invalid_id_error(store):
    for bad in ["", "a/b", "a\\b", "..", "x/../y", "a\x00b", "tab\there", "x" * 256, ".", "é" * 128]:
        with pytest.raises(InvalidIdError):
            store.begin_generation(bad, 1)
    w = store.begin_generation("ok", 1)
    with pytest.raises(InvalidIdError):
        w.write_shard("../escape", [b"x"])
    assert isinstance(InvalidIdError("x"), ValueError)
    store.begin_generation("é" * 127, 1).abort()   # 254 bytes: fine


def test_bad_sizes_and_steps(store):
    with pytest.raises(ValueError):
        store.begin_generation("g", -1)
    with pytest.raises(ValueError):
        store.begin_generation("g", 1, declared_size=-5)
    w = store.begin_generation("g", 1, declared_size=10_000)
    with pytest.raises(ValueError):
        w.write_shard("s", [b"x"], size=-1)
    with pytest.raises(ValueError):     # size without chunks on a payload device
        w.write_counted_shard("s", 100)
    with pytest.raises(ShardSizeError):
        w.write_shard("s", [b"x" * 200], size=100)
    with pytest.raises(ShardSizeError):
        w.write_shard("s", [b"x" * 50], size=100)
    with pytest.raises(ShardSizeError):  # past the declared size
        w.write_shard("big", [b"x" * 6000, b"y" * 6000])
    w.write_shard("s", [b"x" * 100], size=100)
    with pytest.raises(ValueError):
        w.write_shard("s", [b"again"])
    gen = w.commit()
    assert list(gen.shards) == ["s"]        # the failed shards left nothing behind
    assert store.table.key() == store.recompute_table().key()
    assert store.fsck().ok


def test_a_shard_larger_than_declared_loses_nothing_committed(store):
    put(store, "keep", 1, {"a": blob(30_000, 1)})
    w = store.begin_generation("over", 2, declared_size=40_000)
    with pytest.raises(ShardSizeError):
        w.write_shard("s", [blob(30_000), blob(30_000)])
    w.abort()
    assert [g.id for g in store.generations()] == ["keep"]
    assert read(store, "keep", "a") == store_bytes(store, "keep", "a")
    assert store.fsck().ok


def store_bytes(store, gid, name):
    return b"".join(store.read_shard(gid, name))


def test_duplicate_and_missing_generations(store):
    put(store, "g", 1, {"s": b"1"})
    with pytest.raises(GenerationExistsError):
        store.begin_generation("g", 2)
    w = store.begin_generation("h", 2)
    with pytest.raises(GenerationExistsError):
        store.begin_generation("h", 3)
    w.abort()
    with pytest.raises(GenerationNotFoundError) as e:
        store.delete("nope")
    assert isinstance(e.value, KeyError) and isinstance(e.value, FileNotFoundError)
    with pytest.raises(ShardNotFoundError):
        store.read_shard("g", "other")
    with pytest.raises(ValueError):
        w.commit()          # aborted


def test_admission_refuses_a_generation_that_cannot_fit_before_writing(store):
    free = store.df().free
    with pytest.raises(NoSpaceError) as e:
        store.begin_generation("huge", 1, declared_size=free)
    assert e.value.needed >= free and e.value.available < e.value.needed
    assert store.table.written == 0          # nothing was written
    w = store.begin_generation("fits", 1, declared_size=free // 2)
    with pytest.raises(NoSpaceError):        # the first writer's reservation counts
        store.begin_generation("second", 1, declared_size=free // 2)
    w.abort()
    store.begin_generation("second", 1, declared_size=free // 2).abort()


def test_admission_runs_gc_to_make_room():
    with Store.format(MemoryDevice(GEOM), gc_reserve_zones=1) as s:
        data = blob(40 * KiB)
        for i in range(8):
            put(s, f"g{i}", i, {"s": data})
            if i >= 2:
                s.delete(f"g{i - 2}")
        assert [g.id for g in s.generations()] == ["g6", "g7"]
        for i in range(8, 20):
            put(s, f"g{i}", i, {"s": data}, declared_size=len(data))
            s.delete(f"g{i - 2}")
        assert read(s, "g19", "s") == data and s.fsck().ok


def test_delete_resets_all_dead_zones_and_counts_the_rest_dead(store):
    a, b = blob(60 * KiB, 1), blob(20 * KiB, 2)
    put(store, "a", 1, {"s": a})
    put(store, "b", 2, {"s": b})
    zones_a = {e[0] for e in store.generation("a").shards["s"].extents}
    shared = zones_a & {e[0] for e in store.generation("b").shards["s"].extents}
    resets = store.metrics.resets
    store.delete("a", step=3)
    assert store.metrics.resets == resets + len(zones_a - shared)
    for z in zones_a - shared:
        assert store.table[z].cond == ZoneCond.EMPTY and store.device.zone(z).cond == ZoneCond.EMPTY
    for z in shared:
        assert store.table[z].dead > 0
    assert read(store, "b", "s") == b


def test_format_refuses_foreign_and_existing_stores(tmp_path):
    dev = MemoryDevice(GEOM)
    dev.write(5 * GEOM.zone_size, b"\x01" * 4096)
    with pytest.raises(ForeignDeviceError, match="does not recognise"):
        Store.format(dev)
    assert dev.zone(5).cond != ZoneCond.EMPTY      # nothing changed
    Store.format(dev, force=True).close()
    with pytest.raises(ForeignDeviceError, match="already holds a RetainZ store"):
        Store.format(dev)
    fresh = FileDevice.create(tmp_path / "d.img", GEOM)    # created, never formatted: empty
    Store.format(fresh).close()
    fresh.close()
    with pytest.raises(ForeignDeviceError):
        Store.open(MemoryDevice(GEOM))


def test_format_checks_geometry_and_policy():
    with pytest.raises(ValueError, match="unknown policy"):
        Store.format(MemoryDevice(GEOM), policy="nope")
    with pytest.raises(ValueError, match="meta_zones"):
        Store.format(MemoryDevice(GEOM), meta_zones=1)
    with pytest.raises(ValueError, match="zones"):
        Store.format(MemoryDevice(Geometry(nr_zones=5, zone_size=65536, zone_capacity=65536)))


def test_second_writer_gets_a_clear_error(tmp_path):
    dev = MemoryDevice(GEOM)
    s = Store.format(dev)
    with pytest.raises(StoreLockedError, match="already open"):
        Store.open(dev)
    s.close()
    Store.open(dev).close()
    fd = FileDevice.create(tmp_path / "d.img", GEOM)
    Store.format(fd).close()
    with pytest.raises(DeviceBusyError):    # another opener of the file: the device's flock
        FileDevice(tmp_path / "d.img")
    fd.close()


def test_overlapping_writers_and_a_reader_thread_sees_only_committed(store):
    a, b = blob(30 * KiB, 1), blob(30 * KiB, 2)
    wa = store.begin_generation("a", 1)
    wb = store.begin_generation("b", 2)
    seen: list[set] = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            ids = {g.id for g in store.generations()}
            for gid in ids:
                for name in store.generation(gid).shards:
                    assert b"".join(store.read_shard(gid, name))
            seen.append(ids)

    t = threading.Thread(target=reader)
    t.start()
    wa.write_shard("s", [a[:10000], a[10000:]])
    wb.write_shard("s", [b])
    wb.commit()
    wa.commit()
    stop.set()
    t.join()
    assert all(ids <= {"a", "b"} for ids in seen)
    assert read(store, "a", "s") == a and read(store, "b", "s") == b
    assert store.table.key() == store.recompute_table().key()


def test_payload_less_device_counts_extents_without_crc():
    g = Geometry(nr_zones=64, zone_size=1 << 20, zone_capacity=1 << 20)
    with Store.format(MemoryDevice(g, payload=False)) as s:
        w = s.begin_generation("g", 1, hint=Hint(reclaim_step=PERMANENT))
        info = w.write_counted_shard("s", 3_000_001)
        assert info.crc is None and all(e[3] is None for e in info.extents)
        assert sum(e[2] for e in info.extents) == 3_000_001 and len(info.extents) == 3
        w.commit()
        with pytest.raises(NoPayloadError):
            read(s, "g", "s")
        rep = s.fsck()
        assert rep.ok and rep.unverifiable_bytes == 3_000_001 and rep.bytes_verified == 0
        assert s.metrics.host_bytes == 3_002_368


def test_metrics_integrate_over_logical_time(store):
    put(store, "a", 0, {"s": blob(48 * KiB)})     # fills one zone exactly
    put(store, "b", 0, {"s": blob(4096)})         # b and c share the next zone
    put(store, "c", 0, {"s": blob(4096)})
    store.delete("b")
    assert store.table.dead == 4096 and store.metrics.dead_space_byte_steps == 0
    store.advance(10)
    store.advance(5)                               # time never goes back
    assert store.now == 10 and store.metrics.dead_space_byte_steps == 4096 * 10
    store.delete("c", step=12)                     # zone all dead: reset
    assert store.table.dead == 0 and store.metrics.dead_space_byte_steps == 4096 * 12
    m = store.metrics
    assert m.host_bytes == 48 * KiB + 2 * 4096 and m.gc_bytes == 0 and m.waf == 1.0
    assert m.peak_occupancy == 48 * KiB + 2 * 4096
    assert m.decisions == 3 and m.generations_committed == 3 and m.generations_deleted == 2
    assert m.resets == 1 and m.journal_records >= 5


def test_context_manager_commits_on_success_and_aborts_on_error(store):
    with store.begin_generation("ok", 1) as w:
        w.write_shard("s", [b"data"])
    assert store.generation("ok").state is GenState.COMMITTED
    with pytest.raises(RuntimeError):
        with store.begin_generation("bad", 2) as w:
            w.write_shard("s", [b"data"])
            raise RuntimeError("boom")
    assert [g.id for g in store.generations()] == ["ok"]
    assert store.table.key() == store.recompute_table().key()


def test_verify_summaries_mode_decides_exactly_as_the_cached_mode():
    def run(verify):
        dev = MemoryDevice(GEOM)
        with Store.format(dev, verify_summaries=verify) as s:
            for i in range(10):
                put(s, f"g{i}", i, {"a": blob(9000 + 3000 * i, i), "b": blob(5000, i)},
                    hint=Hint(reclaim_step=i + 3))
                if i >= 3:
                    s.delete(f"g{i - 3}", step=i)
                if i % 4 == 3:
                    s.gc(force=True)
            state = (s.table.key(), [(g.id, {n: sh.extents for n, sh in g.shards.items()})
                                     for g in s.generations()], s.metrics.decisions)
        return state, [(z.cond, z.wp) for z in dev.report_zones()]

    assert run(False) == run(True)


def test_read_shard_extent_gives_verified_random_access(store):
    data = blob(100 * KiB + 123, seed=7)  # spans three 48 KiB zones
    put(store, "g", 1, {"s": data})
    size = len(data)
    assert len(store.generation("g").shards["s"].extents) >= 3
    for pos in (0, 1, 48 * KiB - 1, 48 * KiB, 96 * KiB + 5, size - 1):
        start, ext = store.read_shard_extent("g", "s", pos)
        assert start <= pos < start + len(ext)
        assert ext == data[start:start + len(ext)]
    with pytest.raises(ValueError, match="outside"):
        store.read_shard_extent("g", "s", size)
    with pytest.raises(GenerationNotFoundError):
        store.read_shard_extent("nope", "s", 0)


def test_a_store_dropped_without_close_does_not_lock_a_later_device():
    """Path-less devices are tracked by identity only while their store is alive: an abandoned store
    must not make an unrelated later device (which may reuse its id()) look already open."""
    import gc

    from retainz.errors import StoreLockedError

    dev = MemoryDevice(GEOM)
    s = Store.format(dev)
    with pytest.raises(StoreLockedError, match="already open"):
        Store.open(dev)
    del s, dev
    gc.collect()
    for _ in range(50):  # new devices, some of which may reuse the freed id()
        d = MemoryDevice(GEOM)
        Store.format(d).close()


def test_df_reports_every_figure_of_a_known_state(store):
    """``df`` like ``zenfs df``: capacity, free, used (live), reclaimable (dead plus capacity lost to
    finishes), space amplification, the zone counts by state, generations, and what admission can
    still reserve (free less the GC reserve)."""
    empty = store.df()
    meta = empty.meta_zones
    data = GEOM.nr_zones - meta
    cap = data * GEOM.zone_capacity
    reserve = store.admission_reserve_zones * GEOM.zone_capacity
    assert 0 < meta < GEOM.nr_zones and reserve > 0
    assert (empty.capacity, empty.free, empty.used, empty.reclaimable, empty.space_amplification) == (cap, cap, 0, 0, 0.0)
    assert (empty.data_zones, empty.empty_zones, empty.open_zones, empty.full_zones, empty.generations) == (
        data, data, 0, 0, 0)
    assert (empty.admissible, empty.gc_reserve) == (cap - reserve, reserve)
    put(store, "a", 1, {"s": blob(40 * KiB)})               # 40 KiB in the first zone
    put(store, "b", 2, {"s": blob(20 * KiB)})               # fills it (8 KiB) and opens a second
    store.delete("a", step=3)                               # 40 KiB dead in the full zone
    (second,) = store.table.open
    store.write_path.zones.finish(second)                   # 36 KiB of its capacity lost
    df = store.df()
    assert (df.used, df.reclaimable) == (20 * KiB, 40 * KiB + 36 * KiB)
    assert df.free == cap - 2 * GEOM.zone_capacity and df.admissible == df.free - reserve
    assert df.space_amplification == pytest.approx(100.0 * 76 / 20)
    assert (df.data_zones, df.empty_zones, df.open_zones, df.full_zones, df.generations) == (data, data - 2, 0, 2, 1)
    w = store.begin_generation("c", 4, declared_size=4 * KiB)
    assert store.df().admissible == df.admissible - 4 * KiB and store.df().open_zones == 0
    w.write_shard("s", [blob(4 * KiB)])
    assert store.df().open_zones == 1 and store.df().full_zones == 2
    w.commit()
    assert store.df().generations == 2


def test_the_constructor_is_refused_with_the_two_ways_to_get_a_store():
    with pytest.raises(TypeError, match=r"^use Store\.format\(device\) or Store\.open\(device\)$"):
        Store(MemoryDevice(GEOM))


def test_repr_names_device_policy_generations_and_open_or_closed():
    s = Store.format(MemoryDevice(GEOM))
    put(s, "a", 1, {"s": blob(100)})
    dev = "MemoryDevice('memory', zones=16, zone_size=65536, zone_capacity=49152)"
    assert repr(s) == f"Store({dev}, policy='retainz', generations=1, open)"
    s.close()
    assert repr(s) == f"Store({dev}, policy='retainz', generations=1, closed)"


def test_format_reads_no_zone_that_has_nothing_written():
    """An explicitly opened zone with nothing written is not empty, but holds no superblock: format
    refuses the device as unrecognised without reading the zone (a drive may refuse reads of
    unwritten blocks: NVMe's Deallocated or Unwritten Logical Block Error)."""
    inner = MemoryDevice(GEOM)
    inner.zone_op(ZoneOp.OPEN, 0)
    dev = FaultyDevice(inner)
    dev.fail("read", zone=0, count=-1)
    assert superblock_zones(dev) == []
    with pytest.raises(ForeignDeviceError, match=r"^faulty\(memory\) holds data RetainZ does not recognise "
                                                 r"\(1 non-empty zones, first 0\); pass force=True "
                                                 r"to erase it$"):
        Store.format(dev)
    assert inner.zone(0).cond == ZoneCond.EXP_OPEN


def test_verify_summaries_refuses_a_decision_on_stale_cached_summaries():
    """In ``verify_summaries`` mode a cached summary that differs from the recomputation stops the
    next decision with the first eight zones that differ, and nothing is placed."""
    with Store.format(MemoryDevice(GEOM), verify_summaries=True) as s:
        put(s, "a", 1, {"s": blob(100)})
        key = s.table.key()
        stale = [z for z, summary in s.table.zones.items() if summary.written == 0][:9]
        assert len(stale) == 9
        for z in stale:
            s.table.zones[z].dead += 4096
        w = s.begin_generation("b", 2)
        with pytest.raises(SummaryMismatchError, match=r"^cached zone summaries differ from a recomputation in "
                                                       rf"zones \[{', '.join(map(str, stale[:8]))}\]$"):
            w.write_shard("s", [blob(100)])
        w.abort()
        for z in stale:
            s.table.zones[z].dead -= 4096
        assert s.table.key() == key == s.recompute_table().key()
        assert [g.id for g in s.generations()] == ["a"]


def small(nr_zones=16, zone_capacity=48 * KiB, max_open=3, max_active=4) -> MemoryDevice:
    return MemoryDevice(Geometry(nr_zones=nr_zones, zone_size=64 * KiB, zone_capacity=zone_capacity,
                                 block_size=4096, max_open=max_open, max_active=max_active), payload=False)


# each case makes its device when it runs: a device made at collection would carry one run's store into
# the next run of the same test (a rerun in one process)
@pytest.mark.parametrize("make, kw, text", [
    (lambda: small(), {"meta_zones": 1}, "meta_zones must be 2..64, not 1"),
    (lambda: small(80), {"meta_zones": 65}, "meta_zones must be 2..64, not 65"),
    (lambda: small(), {"gc_reserve_zones": -1}, "gc_reserve_zones cannot be negative (-1)"),
    (lambda: small(6), {"meta_zones": 2, "gc_reserve_zones": 3},
     "the device has 6 zones; a store needs at least 7 (2 meta, 3 GC reserve, 2 data)"),
    (lambda: small(zone_capacity=28 * KiB), {}, "zone capacity 28672 is under 8 blocks: too small for a journal"),
    (lambda: small(max_open=1, max_active=1), {}, "the device allows fewer than 2 active zones (one is the journal's)"),
])
def test_format_refuses_a_bad_layout_with_one_line_and_writes_nothing(make, kw, text):
    dev = make()
    with pytest.raises(ValueError, match="^" + re.escape(text) + "$"):
        Store.format(dev, **kw)
    assert all(z.cond == ZoneCond.EMPTY for z in dev.report_zones())


@pytest.mark.parametrize("make, kw", [
    (lambda: small(), {"meta_zones": 2}),
    (lambda: small(68), {"meta_zones": 64}),
    (lambda: small(), {"gc_reserve_zones": 0}),
    (lambda: small(7), {"meta_zones": 2, "gc_reserve_zones": 3}),
    (lambda: small(zone_capacity=32 * KiB), {"meta_zones": 2}),
    (lambda: small(max_open=2, max_active=2), {}),
    (lambda: small(max_open=0, max_active=0), {}),
])
def test_format_takes_every_layout_at_its_limits(make, kw):
    dev = make()
    with Store.format(dev, **kw) as s:
        for k, v in kw.items():
            assert getattr(s, k) == v
        assert s.fsck().ok and len(s.table.zones) == dev.geometry.nr_zones - s.meta_zones
    with Store.open(dev) as s:
        assert s.df().empty_zones == dev.geometry.nr_zones - s.meta_zones


def test_format_defaults_retainz_with_two_zones_of_gc_reserve_and_no_verification():
    """Defaults: retainz (lifetime-aware placement, issue 40), 2 zones of GC reserve, and decisions on the cached summaries as they are
    (no rebuild before each, after format or open: a summary changed behind the store's back stays)."""
    dev = small()
    with Store.format(dev) as s:
        assert (s.policy, s.gc_reserve_zones, s.meta_zones) == ("retainz", 2, 3)
        assert s.admission_reserve_zones == 2 and s.df().gc_reserve == 2 * 48 * KiB
        decide_on_a_stale_summary(s, "g")
    with Store.open(dev) as s:
        decide_on_a_stale_summary(s, "h")


def decide_on_a_stale_summary(s, gid):
    last = max(s.table.zones)
    s.table.zones[last].dead += 4096
    w = s.begin_generation(gid, 2)
    w.write_counted_shard("a", 8 * KiB)
    w.commit()
    assert s.table.zones[last].dead == 4096 and s.table.key() != s.recompute_table().key()
    s.table.zones[last].dead -= 4096
    assert s.table.key() == s.recompute_table().key()


def test_a_closed_store_refuses_every_operation_with_one_line():
    s = Store.format(MemoryDevice(GEOM))
    put(s, "g", 1, {"a": blob(100)})
    w = s.begin_generation("h", 2)
    s.close()
    assert w.state is GenState.ABORTED            # close aborted the open writer
    for op in (lambda: s.begin_generation("x", 3), lambda: s.delete("g"), lambda: s.gc(),
               lambda: s.update_hint("g", Hint()), s.fsck, w.commit):
        with pytest.raises(ValueError, match=r"^the store is closed$"):
            op()
    s.close()                                      # idempotent
    assert repr(s).endswith(", closed)") and s.metrics.generations_aborted == 1


def test_a_second_open_is_refused_and_a_failed_open_leaves_the_device_free():
    dev = MemoryDevice(GEOM)
    with pytest.raises(ForeignDeviceError) as failed:     # nothing on it yet (the error is kept alive)
        Store.open(dev)
    s = Store.format(dev)
    with pytest.raises(StoreLockedError, match=r"^memory: the store is already open in this process$"):
        Store.open(dev)
    with Store.format(MemoryDevice(GEOM)) as other:     # another device: its own store, open alongside
        assert other.uuid != s.uuid and repr(other).endswith("open)")
    s.close()
    assert failed.value is not None


def test_generation_refusals_name_the_generation_and_its_state(store):
    for size, shown in (("10", "'10'"), (-5, "-5"), (1.5, "1.5")):
        with pytest.raises(ValueError, match=rf"^declared_size must be a non-negative int, not {shown}$"):
            store.begin_generation("g", 1, declared_size=size)
    g = put(store, "g", 1, {"a": b""}, declared_size=0)      # an empty generation declares 0
    with pytest.raises(GenerationExistsError, match=r"^generation 'g' already exists \(to replace it at the new "
                                                    r"one's commit: replace=True, `retainz put --replace`\)$"):
        store.begin_generation("g", 2)
    w = store.begin_generation("h", 2)
    with pytest.raises(GenerationExistsError, match=r"^generation 'h' is being written$"):
        store.begin_generation("h", 3)
    for op in (lambda: store.generation("x"), lambda: store.delete("x")):
        with pytest.raises(GenerationNotFoundError, match=r"^no committed generation 'x'$"):
            op()
    w.abort()
    w.abort()                                      # a second abort is a no-op
    with pytest.raises(ValueError, match=r"^generation 'h' is aborted: cannot commit it$"):
        store.commit_writer(w)
    done = store.begin_generation("g", 2, replace=True)
    assert store.generation("g") is g              # the old one until the new one commits
    done.commit()
    with pytest.raises(ValueError, match=r"^generation 'g' is committed: cannot abort it$"):
        store.abort_writer(done)
    assert store.generation("g") is done.gen and g.state is GenState.DELETED


def test_metrics_count_generations_and_commits_are_numbered_in_order():
    dev = MemoryDevice(GEOM)
    with Store.format(dev) as s:
        for i in range(3):
            put(s, f"g{i}", i, {"a": blob(100, i)})
        s.begin_generation("x", 5).abort()
        s.begin_generation("y", 5).abort()
        s.delete("g0")
        m = s.metrics
        assert (m.generations_committed, m.generations_aborted, m.generations_deleted) == (3, 2, 1)
        assert [g.commit_seq for g in s.generations()] == [2, 3]
        put(s, "g3", 6, {"a": blob(100, 3)})
        assert s.generation("g3").commit_seq == 4
    with Store.open(dev) as s:
        assert [(g.id, g.commit_seq) for g in s.generations()] == [("g1", 2), ("g2", 3), ("g3", 4)]
        m = s.metrics
        assert (m.generations_committed, m.generations_aborted, m.generations_deleted) == (4, 2, 1)
        s.delete("g1")
        assert m.generations_deleted == 2


def long_named_shards(w, k: int) -> None:
    for j in range(k):
        w.write_shard(f"{j:02d}-" + "n" * 200, [])     # 215 bytes of catalog entry each, no data


def test_the_journal_estimate_counts_one_extent_per_mib_of_payload_or_per_zone_without():
    """``journal_estimate``: 256 bytes, the id, and ``EXTENT_BYTES`` (48) per extent of the declared
    size (1 MiB extents with payload, a zone each without) plus 8 (MetadataLog.estimate)."""
    g = Geometry(nr_zones=16, zone_size=512 * KiB, zone_capacity=512 * KiB, block_size=4096, max_open=3,
                 max_active=4)
    for payload, extents in ((True, 2), (False, 3)):
        with Store.format(MemoryDevice(g, payload=payload)) as s:
            w = s.begin_generation("g", 1, declared_size=1536 * KiB)
            assert w.journal_estimate == 256 + 1 + 48 * (extents + 8)
            assert s.begin_generation("undeclared", 1).journal_estimate == 256 + 10 + 48 * 8


def test_the_journal_refuses_what_it_could_not_roll_over_and_counts_other_writers_only():
    """Journal admission (MetadataLog.check_room) on 2 meta zones: a new generation is refused when
    the snapshot with it would need both; a commit is checked with the other writers' estimates,
    not its own (its entry replaces it).  4 shards a generation (16 before store format 5, whose
    journal keeps room for two copies of the next record beside the snapshot; 11 before format 6,
    whose chain zones keep two blocks of their 12 for the close record)."""
    with Store.format(MemoryDevice(GEOM), meta_zones=2) as s:
        for i in range(3):
            w = s.begin_generation(f"g{i}", i)
            assert w.journal_estimate == (256 + 2 + 48 * 8 if i == 0 else 890)   # then the mean entry
            long_named_shards(w, 4)
            w.commit()
        w = s.begin_generation("g3", 3)
        long_named_shards(w, 4)
        entry = len(gen_entry_bytes(w.gen)) + 1
        assert [s.log.need(entry, inflight)[1] for inflight in ([], [w.journal_estimate])] == [1, 2]
        w.commit()                 # fits one meta zone; with its own estimate counted too it would not
        text = ("generation 'g4': the journal is full: a snapshot with it would take 2 meta zones (7950 "
                "bytes); 2 meta zones of 49152 bytes keep room for 2 x 1 (1 free beside the current chain), "
                "so deletions can always be journaled; delete generations, or format with more meta zones")
        with pytest.raises(NoSpaceError, match="^" + re.escape(text) + "$") as e:
            s.begin_generation("g4", 4)
        assert (e.value.needed, e.value.available, e.value.cause) == (7950, 49152, "journal")
        assert e.value.state == s.stop_state() and e.value.state["empty_zones"] == len(s.table.zones)
        s.delete("g3")
        w = s.begin_generation("g3", 3)
        long_named_shards(w, 30)
        with pytest.raises(NoSpaceError, match=r"^commit of generation 'g3': the journal is full: a snapshot "
                                               r"with it would take 2 meta zones \(13237 bytes\); ") as e:
            w.commit()
        assert (e.value.needed, e.value.available, e.value.cause) == (13237, 49152, "journal")
        assert w.state is GenState.WRITING and w.gen.commit_seq == 0      # not committed, no number
        w.abort()
        assert [g.id for g in s.generations()] == ["g0", "g1", "g2"] and s.fsck().ok


@pytest.mark.parametrize("last, fits", [(77, True), (78, False)])
def test_a_commit_record_too_big_for_a_meta_zone_is_refused_before_it_is_appended(last, fits):
    """A commit record must leave 256 bytes of a meta zone's record room (``Journal.max_record``,
    20465 bytes here: both copies of the record (format 5) fit the zone's 48 KiB less two
    superblock blocks (format 3), each with a frame header and its ``"cp":N,`` member): 93 long
    shard names and a 77-character one make a record of 20209 bytes (committed); one more
    character is refused with the record's size, and nothing is written."""
    dev = MemoryDevice(GEOM)
    with Store.format(dev, meta_zones=8) as s:
        assert s.journal.max_record == 20465
        w = s.begin_generation("wide", 1)
        for j in range(93):
            w.write_shard(f"{j:03d}-" + "n" * 200, [])
        w.write_shard("z" * last, [])
        if fits:
            w.commit()
        else:
            written = s.journal.bytes_written
            with pytest.raises(NoSpaceError, match=r"^journal record of about 20210 bytes \(generation 'wide'\) "
                                                   r"does not fit a meta zone \(20465 bytes\)$") as e:
                w.commit()
            assert (e.value.needed, e.value.available, e.value.cause) == (20210, 20465, "journal")
            assert w.gen.commit_seq == 0 and s.journal.bytes_written == written
            w.abort()
    with Store.open(dev) as s:
        assert [(g.id, len(g.shards)) for g in s.generations()] == ([("wide", 94)] if fits else [])


def test_open_keeps_the_uuid_and_policy_and_checks_the_device_against_the_policy_asked_for():
    dev = MemoryDevice(GEOM)
    with Store.format(dev, policy="retainz") as s:
        uuid = s.uuid
        put(s, "g", 1, {"a": blob(100)})
    with Store.format(MemoryDevice(GEOM)) as other:
        assert other.uuid != uuid
    with Store.open(dev) as s:
        assert (s.uuid, s.policy, s.gc_reserve_zones, s.meta_zones) == (uuid, "retainz", 2, 3)
    with Store.open(dev, policy="greedy") as s:
        assert s.policy == "greedy" and s.allocator.name == "greedy"
    with pytest.raises(ValueError, match=r"^policy zenfs: the device has 16 zones; ZenFS refuses fewer than 32 "):
        Store.open(dev, policy="zenfs")
    with Store.open(dev) as s:                     # the refused open left nothing behind
        assert [g.id for g in s.generations()] == ["g"]


def test_gc_runs_the_unforced_rule_unless_forced(store):
    for i in range(4):                                          # two full zones, half of each dead
        put(store, f"g{i}", i, {"a": blob(24 * KiB, i)})
    store.delete("g0")
    store.delete("g2")
    rep = store.gc()                                            # enough zones are empty: nothing to do
    assert (rep.victims, rep.bytes_copied, store.table.dead) == ([], 0, 48 * KiB)
    rep = store.gc(force=True)
    assert (len(rep.victims), rep.bytes_copied, store.table.dead) == (2, 48 * KiB, 0)
    assert [read(store, g, "a") for g in ("g1", "g3")] == [blob(24 * KiB, 1), blob(24 * KiB, 3)]


def test_format_writes_the_first_journal_generation_in_zone_0():
    """The superblock ``format`` writes: sequence 1 (a rollover writes the next under 2), part 0,
    the store's uuid, layout and policy, twice (blocks 0 and 1 of zone 0, format 3); the store opens
    on that chain, and the other meta zones hold a spare superblock each (flag ``SPARE``, block 0)."""
    dev = MemoryDevice(GEOM)
    bs = GEOM.block_size
    with Store.format(dev, policy="retainz", gc_reserve_zones=3) as s:
        sb = Superblock.decode(dev.read(0, bs), GEOM)
        assert (sb.sequence, sb.part, sb.uuid, sb.meta_zones, sb.gc_reserve_zones, sb.policy, sb.flags) == (
            1, 0, s.uuid, s.meta_zones, 3, "retainz", 0)
        assert dev.read(bs, bs) == dev.read(0, bs)
        assert sb.geometry == GEOM and s.journal.sb.sequence == 1 and superblock_zones(dev) == [0, 1, 2]
        for z in (1, 2):
            spare = Superblock.decode(dev.read(z * GEOM.zone_size, bs), GEOM)
            assert (spare.flags & SPARE, spare.uuid, spare.sequence) == (SPARE, s.uuid, 1)
            assert dev.zone(z).cond == ZoneCond.FULL


class GreedyAfterGC(Greedy):
    """Greedy, but no space for new data while any zone holds dead bytes (a scripted policy)."""

    def place(self, req):
        if not req.gc and self.table.dead:
            return NO_SPACE
        return super().place(req)


def test_a_placement_without_space_runs_one_forced_gc_pass_and_asks_again(store):
    put(store, "a", 1, {"s": blob(24 * KiB, 1)})
    put(store, "b", 2, {"s": blob(24 * KiB, 2)})            # zone 3 full: a and b
    store.delete("a")
    assert store.table.dead == 24 * KiB
    store.use_allocator(GreedyAfterGC())
    put(store, "c", 3, {"s": blob(4 * KiB, 3)})              # no space until the pass frees zone 3
    assert (store.metrics.gc_bytes, store.table.dead, store.table[3].written) == (24 * KiB, 0, 0)
    assert [read(store, g, "s") for g in ("b", "c")] == [blob(24 * KiB, 2), blob(4 * KiB, 3)]
    assert store.fsck().ok


class OpCut:
    """A device whose ``n``-th operation (a write, zone reset, zone finish or flush) raises
    KeyboardInterrupt before it happens, every earlier one done (``mkfs --force`` killed there)."""

    def __init__(self, dev, n: int):
        self._dev, self.n, self.ops = dev, n, 0

    def __getattr__(self, name):
        return getattr(self._dev, name)

    def _op(self) -> None:
        if self.ops == self.n:
            raise KeyboardInterrupt
        self.ops += 1

    def write(self, offset, data):
        self._op()
        self._dev.write(offset, data)

    def reset_zone(self, z):
        self._op()
        self._dev.reset_zone(z)

    def finish_zone(self, z):
        self._op()
        self._dev.finish_zone(z)

    def flush(self):
        self._op()
        self._dev.flush()


FORMAT_GEOM = Geometry(nr_zones=12, zone_size=256 * KiB, zone_capacity=256 * KiB, block_size=4096, max_open=3,
                       max_active=4)


def _rolled_store(meta_zones: int, sequence: int) -> tuple[MemoryDevice, dict[str, bytes]]:
    """A store whose journal has rolled over to chain ``sequence`` (the previous chain kept as the
    snapshot's copy, spare superblocks in the other meta zones), holding live generations and
    deleted ones, with a save and a deletion after the last rollover (the two chains differ)."""
    dev = MemoryDevice(FORMAT_GEOM)
    live: dict[str, bytes] = {}
    with Store.format(dev, meta_zones=meta_zones) as s:
        for i in range(10_000):
            seq = s.journal.sb.sequence
            put(s, f"g{i}", i, {"a": blob(2 * KiB, i)})
            live[f"g{i}"] = blob(2 * KiB, i)
            if i >= 2:
                s.delete(f"g{i - 2}")
                del live[f"g{i - 2}"]
            if seq == sequence and s.journal.sb.sequence == seq:
                break
        assert s.journal.sb.sequence == sequence
    return dev, live


@pytest.mark.parametrize("meta_zones", [3, 5])
@pytest.mark.parametrize("sequence", [3, 4])    # the current chain after the previous one, and before it
def test_an_interrupted_format_force_never_leaves_a_store_that_is_not_one(meta_zones, sequence):
    """``mkfs --force`` killed before any of its device operations (zone resets, then the new chain's
    write, the spare superblocks, the flush), then the power cut (what was not flushed is lost; a reset
    or finish is durable on completion), leaves either the old store as it was (every live generation,
    nothing deleted back), or no store (``mkfs`` says it holds data RetainZ does not recognise:
    ``mkfs --force`` again), or the new empty one; never a half store that sends the user to ``fsck
    --repair`` ('spare superblocks but no journal chain': the spares' finishes were durable before
    the chain's write) or an older state of the journal (the previous chain, kept as a copy, standing
    in for a current chain already reset)."""
    outcomes = set()
    n = 0
    while True:
        dev, live = _rolled_store(meta_zones, sequence)
        cut = OpCut(dev, n)
        try:
            Store.format(cut, force=True).close()
            done = True
        except KeyboardInterrupt:
            done = False
            dev.power_loss()
        try:
            with Store.open(dev, readonly=True) as s:
                got = {g.id: read(s, g.id, "a") for g in s.generations()}
            assert got in (live, {}), n
            outcomes.add("old" if got else "new")
        except ForeignDeviceError as e:
            assert "holds no RetainZ store" in str(e), (n, e)
            assert superblock_zones(dev) == []
            if dev.report_used_zones():
                with pytest.raises(ForeignDeviceError, match="does not recognise"):
                    Store.format(dev)           # mkfs: nothing written without --force
            outcomes.add("none")
        if done:
            break
        n += 1
    assert outcomes == {"old", "none", "new"}


def test_an_empty_store_whose_meta_zones_hold_no_generation_says_so_instead_of_delete_generations():
    """Meta zones of 40 KiB (10 blocks): store format 6 keeps 2 of them for the close record, so on 3
    meta zones no generation's snapshot fits (the fresh-user trial: every put of an empty store was
    refused with "delete generations").  The refusal names the way out; 8 meta zones admit it."""
    g = Geometry(nr_zones=32, zone_size=64 * 1024, zone_capacity=40 * 1024, max_open=3, max_active=4)
    with Store.format(MemoryDevice(g), meta_zones=3) as s:
        with pytest.raises(NoSpaceError, match=r"the meta zones are too small for any generation: format "
                                               r"with more meta zones \(mkfs --meta-zones\) or larger zones$"):
            s.begin_generation("g0", 0)
    with Store.format(MemoryDevice(g), meta_zones=8) as s:
        w = s.begin_generation("g0", 0)
        w.write_shard("a", [b"x" * 100])
        w.commit()
        assert [x.id for x in s.generations()] == ["g0"]
