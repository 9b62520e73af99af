"""ZenFS-Alloc port: one table-driven test per rule of docs/zenfs-baseline.md."""

from __future__ import annotations

import pytest

from retainz.hint import Hint, Lifetime, lifetime_class
from retainz.placement import NO_SPACE, Decision, ExtentRequest, ZoneTable, make_allocator
from retainz.placement.zenfs import ZenFS, lifetime_diff, unused_zones
from retainz.zoned.model import ZoneCond

CAP = 100
NS, NO, SH, ME, LO, EX = Lifetime.NOT_SET, Lifetime.NONE, Lifetime.SHORT, Lifetime.MEDIUM, Lifetime.LONG, Lifetime.EXTREME


def table(*zones, max_active=0, reserved_active=0, cap=CAP) -> ZoneTable:
    """Zones from specs: ``None`` = empty; ``(written, live, lifetime)``; a 4th item ``"F"``
    finishes the zone."""
    t = ZoneTable({z: cap for z in range(len(zones))}, max_active=max_active,
                  reserved_active=reserved_active)
    for z, spec in enumerate(zones):
        if spec is None:
            continue
        written, live, lt, *full = spec
        t.on_write(z, written, reclaim_step=None, lifetime=lt, step=0)
        if written > live:
            t.on_kill(z, written - live)
        if full and t[z].cond != ZoneCond.FULL:
            t.on_finish(z)
    return t


def zenfs(t: ZoneTable, **params) -> ZenFS:
    a = ZenFS(**params)
    a.bind(t)
    return a


def req(lifetime: int, nbytes: int = 10, gc: bool = False) -> ExtentRequest:
    return ExtentRequest(nbytes=nbytes, generation="g", step=0, hint=Hint(lifetime=lifetime),
                         now=0, gc=gc)


# -- GetLifeTimeDiff: the whole table (rows: file hint, columns: zone hint) -------------------------
DIFF_TABLE = {
    NS: [0, 100, 100, 100, 100, 100],
    NO: [100, 0, 100, 100, 100, 100],
    SH: [100, 100, 50, 1, 2, 3],
    ME: [100, 100, 100, 50, 1, 2],
    LO: [100, 100, 100, 100, 50, 1],
    EX: [100, 100, 100, 100, 100, 50],
}


@pytest.mark.parametrize("file_lt, zone_lt, diff",
                         [(f, z, row[z]) for f, row in DIFF_TABLE.items() for z in range(6)])
def test_lifetime_diff_table(file_lt, zone_lt, diff):
    assert lifetime_diff(zone_lt, file_lt) == diff


# -- GetBestOpenZoneMatch -----------------------------------------------------------------------------
@pytest.mark.parametrize("zones, lt, expect", [
    # equal differences: the LAST zone scanned wins
    ([(10, 10, ME), (20, 20, ME), (30, 30, ME)], ME, (2, 50)),
    ([(10, 10, LO), (20, 20, EX), (30, 30, LO)], ME, (2, 1)),
    # the least difference wins over position
    ([(10, 10, LO), (20, 20, EX)], ME, (0, 1)),
    # a diff-100 zone is still returned (best starts at 100, condition <=)
    ([(10, 10, SH), (20, 20, NS)], LO, (1, 100)),
    # zones with no live data (all deleted, not empty: issue #34) are never candidates
    ([(10, 0, ME), (20, 20, EX)], ME, (1, 2)),
    ([(10, 0, ME)], ME, (None, 100)),
    # full zones and empty zones are never candidates
    ([(CAP, CAP, ME), None, (50, 50, LO, "F")], ME, (None, 100)),
    # unhinted files match only zones of the same value
    ([(10, 10, NO), (10, 10, NS), (10, 10, SH)], NS, (1, 0)),
])
def test_best_open_zone_match(zones, lt, expect):
    assert zenfs(table(*zones)).best_open_match(lt) == expect


@pytest.mark.parametrize("min_capacity, expect", [(0, (1, 1)), (5, (1, 1)), (6, (2, 2)), (40, (2, 2)),
                                                   (41, (0, 50)), (51, (None, 100))])
def test_best_open_zone_match_min_capacity(min_capacity, expect):
    # zone 0: ME, 50 left (diff 50); zone 1: LO, 5 left (diff 1); zone 2: EX, 40 left (diff 2)
    a = zenfs(table((50, 50, ME), (95, 95, LO), (60, 60, EX)))
    assert a.best_open_match(ME, min_capacity=min_capacity) == expect


# -- AllocateIOZone: reuse, tokens, empty zone, finish ----------------------------------------------
@pytest.mark.parametrize("zones, max_active, lt, expect", [
    # best < 50: reuse, even with the active budget spent (no token needed)
    ([(10, 10, LO), None], 1 + 2, ME, Decision(0, lifetime=ME)),
    # best == 50 with a free active token: drop the match, open the FIRST empty zone
    ([(10, 10, ME), None, None], 2 + 2, ME, Decision(1, lifetime=ME)),
    # best == 50 without a token: keep the match (relaxed rule, avoids a finish)
    ([(10, 10, ME), None], 1 + 2, ME, Decision(0, lifetime=ME)),
    # best == 100 without a token: finish the cheapest zone (least remaining), then open
    ([(10, 10, SH), (70, 70, SH), None], 2 + 2, ME, Decision(2, finish=(1,), lifetime=ME)),
    # FinishCheapestIOZone ties go to the FIRST zone
    ([(70, 70, SH), (70, 70, SH), None], 2 + 2, LO, Decision(2, finish=(0,), lifetime=LO)),
    # unlimited device (max_active 0): every zone can be active
    ([(10, 10, ME)] * 5 + [None], 0, ME, Decision(5, lifetime=ME)),
])
def test_allocate_io_zone(zones, max_active, lt, expect):
    t = table(*zones, max_active=max_active - 2 if max_active else 0,
              reserved_active=2 if max_active else 0)
    d = zenfs(t).place(req(lt))
    assert (d.zone, d.finish, d.lifetime) == (expect.zone, expect.finish, expect.lifetime)


def test_first_empty_zone_is_lowest_index_after_resets():
    t = table((CAP, CAP, ME), (CAP, CAP, ME), (CAP, CAP, ME), None)
    t.on_kill(2, CAP)
    t.on_reset(2)
    assert zenfs(t).place(req(ME)).zone == 2


@pytest.mark.parametrize("device_max, store_reserved, reserved_zones, budget", [
    (14, 2, 2, 12),   # store reserved as many as ZenFS would: same budget
    (14, 1, 2, 12),   # store reserved fewer: ZenFS's "device max - 2" still holds
    (14, 3, 2, 11),   # store reserved more: the table's budget caps it
    (14, 2, 0, 12),
    (0, 0, 2, 6),     # no device limit: nr_zones (6 data zones here)
])
def test_active_token_budget(device_max, store_reserved, reserved_zones, budget):
    t = table(*[None] * 6, max_active=max(0, device_max - store_reserved),
              reserved_active=store_reserved if device_max else 0)
    assert zenfs(t, reserved_zones=reserved_zones).active_budget == budget


def test_token_count_uses_open_zones_beyond_zenfs_budget():
    # the store allows 13 active data zones but ZenFS only 12: with 12 open, a 50-match is kept
    t = table(*([(10, 10, ME)] * 12 + [None]), max_active=13, reserved_active=1)
    assert zenfs(t).place(req(ME)) == Decision(11, lifetime=ME)


# -- the finish threshold -------------------------------------------------------------------------------
@pytest.mark.parametrize("thr, zones, finished", [
    (0, [(95, 95, ME), (99, 99, ME)], ()),             # disabled by default
    (10, [(95, 95, ME), (91, 91, LO), (90, 90, ME)], (0, 1)),  # remaining < 10 (strict)
    (10, [(95, 0, ME), None], (0,)),                   # also zones without live data
    (5, [(96, 96, EX), (94, 94, EX)], (0,)),
])
def test_apply_finish_threshold(thr, zones, finished):
    a = zenfs(table(*zones, None, None), finish_threshold=thr)
    assert tuple(a.finish_threshold_zones()) == finished
    assert a.place(req(EX)).finish[:len(finished)] == finished


def test_finished_zones_are_not_candidates():
    # zone 0 (diff 1) is finished by the threshold; the match falls to zone 1
    a = zenfs(table((95, 95, LO), (10, 10, EX), None), finish_threshold=10)
    assert a.place(req(ME)) == Decision(1, finish=(0,), lifetime=ME)


def test_finish_threshold_integer_arithmetic():
    # capacity 150, thr 5: limit 150*5//100 = 7; remaining 7 is not below it
    t = table((143, 143, ME), (144, 144, ME), cap=150)
    assert zenfs(t, finish_threshold=5).finish_threshold_zones() == [1]


# -- "Zone allocation failure" ----------------------------------------------------------------------
def test_allocation_failure_with_partly_filled_zones_that_have_space():
    # a token is free and zone 0 matches at 50 with 90 bytes left: ZenFS drops it, finds no
    # empty zone, and fails although 90+80 bytes are free in partly filled zones
    t = table((10, 10, ME), (20, 20, ME), (CAP, CAP, ME), max_active=12, reserved_active=2)
    assert t.free == 170
    assert zenfs(t).place(req(ME, nbytes=5)) == NO_SPACE


def test_allocation_failure_after_finishing_keeps_the_finish():
    # no token, best diff 100: the cheapest zone is finished, then no empty zone is found
    t = table((10, 10, SH), (70, 70, SH), (CAP, CAP, SH), max_active=2)
    d = zenfs(t, reserved_zones=0).place(req(LO))
    assert d == Decision(None, finish=(1,))


def test_q6_no_finishable_zone_reports_no_space():
    # device max_active 2, ZenFS reserves 2: budget 0; no open zone to finish -> no space, no spin
    t = table(None, None, max_active=1, reserved_active=1)
    a = zenfs(t)
    assert a.active_budget == 0
    assert a.place(req(ME)) == NO_SPACE


# -- ResetUnusedIOZones -------------------------------------------------------------------------------
def test_reset_unused_zones_includes_partly_written():
    t = table((10, 0, ME), (CAP, 0, ME), (50, 1, ME), None, (CAP, CAP, ME))
    assert unused_zones(t) == [0, 1]


def test_store_resets_unused_and_returns_the_active_resource():
    """A deletion that leaves a zone with no live data resets it (ResetUnusedIOZones), and the zone's
    active resource is free again: through the store, on a device of 8 data zones."""
    from retainz.store import Store
    from retainz.zoned import MemoryDevice
    from tests.store_events import BLOCK, geometry

    with Store.format(MemoryDevice(geometry(29, CAP, max_active=3), payload=False), policy="zenfs",
                      meta_zones=3) as s:
        assert s.allocator.active_budget == 2
        w = s.begin_generation("g", 0, hint=Hint(lifetime=ME))
        w.write_counted_shard("s", 30 * BLOCK)
        w.commit()
        assert len(s.table.open) == 1
        s.delete("g")
        assert len(s.table.open) == 0 and s.table.n_empty == 29 and s.metrics.resets == 1


# -- GC -------------------------------------------------------------------------------------------------
def gc_table(free_zones: int, full_live: list[int]) -> ZoneTable:
    return table(*([(CAP, live, ME) for live in full_live] + [None] * free_zones))


@pytest.mark.parametrize("free_zones, full_live, free_pct, threshold, victims", [
    # 3 of 10 zones free (30 %) > 20 %: no GC
    (3, [50] * 7, 30, None, []),
    # exactly 20 % free: GC runs with threshold 100: nothing has garbage > 100
    (2, [50, 50, 50, 50, 50, 50, 50, 50], 20, 100, []),
    # 10 % free: threshold 100 - 3*10 = 70; garbage 80 and 71 qualify, 70 does not, 100 does not
    (1, [20, 29, 30, 0, 50, 100, 100, 100, 100], 10, 70, [0, 1]),
    # 0 % free: threshold 40; garbage 60 qualifies, 40 does not; live < 1 % gives garbage 100
    (0, [40, 60, 0, 100, 100, 100, 100, 100, 100, 100], 0, 40, [0]),
])
def test_gc_start_level_slope_and_thresholds(free_zones, full_live, free_pct, threshold, victims):
    a = zenfs(gc_table(free_zones, full_live))
    assert a.gc_level() == (free_pct, threshold)
    assert a.gc_victims(reserve_zones=99) == victims


def test_gc_garbage_excludes_zones_below_one_percent_live():
    t = table((CAP, 0, ME), cap=1000)
    t.on_write(0, 900, reclaim_step=None, lifetime=ME, step=0)
    t.on_kill(0, 891)  # live 9 of 1000: garbage = 100 - 900 // 1000 = 100: never a victim
    assert zenfs(t).gc_victims(0) == []


def test_gc_ignores_open_zones():
    a = zenfs(table((50, 10, ME), *([(CAP, 10, ME)] * 9)))
    assert a.gc_level()[1] is not None
    assert 0 not in a.gc_victims(0)


@pytest.mark.parametrize("zones, nbytes, expect", [
    # only partly filled zones with live data and room for the whole extent; any difference
    ([(10, 10, SH), (60, 60, NS), None], 30, 1),
    ([(10, 10, SH), (80, 80, NS), None], 30, 0),
    # never an empty zone, never a zone without live data: the extent is skipped
    ([None, None], 10, None),
    ([(10, 0, ME), None], 10, None),
    ([(90, 90, ME), None], 20, None),
])
def test_gc_migration_only_into_partly_filled_zones(zones, nbytes, expect):
    d = zenfs(table(*zones)).place(req(ME, nbytes=nbytes, gc=True))
    assert d.zone == expect and d.finish == ()


def test_gc_migration_ignores_the_finish_threshold_and_tokens():
    a = zenfs(table((95, 95, SH), None, max_active=1, reserved_active=1), finish_threshold=10)
    assert a.place(req(ME, nbytes=5, gc=True)) == Decision(0, lifetime=ME)


# -- hints ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hint, lt", [
    (Hint(reclaim_step=None), NS),
    (Hint(reclaim_step=float("inf")), EX),
    (Hint(reclaim_step=1000.0), SH),
    (Hint(reclaim_step=1001.0), ME),
    (Hint(reclaim_step=10000.0), ME),
    (Hint(reclaim_step=10001.0), LO),
    (Hint(reclaim_step=5000.0, lifetime=LO), LO),   # the retention module's class wins
])
def test_lifetime_from_hint(hint, lt):
    a = ZenFS()
    assert a.lifetime_of(hint, 0) == lt
    assert lifetime_class(hint.reclaim_step, 0) in (NS, SH, ME, LO, EX)


def test_zone_lifetime_is_set_once_by_the_opener():
    """Through the store, with one ZenFS active token: SHORT data opens a zone; LONG data (difference
    100, no token) finishes it and opens the next; the first zone keeps the opener's class."""
    from retainz.store import Store
    from retainz.zoned import MemoryDevice
    from tests.store_events import BLOCK, geometry

    with Store.format(MemoryDevice(geometry(29, CAP, max_active=2), payload=False), policy="zenfs",
                      meta_zones=3) as s:
        assert s.allocator.active_budget == 1
        zone = {}
        for gen, r in (("a", 500.0), ("b", 50000.0)):       # SHORT, then LONG
            w = s.begin_generation(gen, 0, hint=Hint(reclaim_step=r))
            zone[gen] = w.write_counted_shard("s", 10 * BLOCK).extents[0][0]
            w.commit()
            if gen == "a":
                assert s.table[zone["a"]].lifetime == SH
        assert zone["b"] != zone["a"] and s.table[zone["a"]].cond == ZoneCond.FULL
        assert s.table[zone["a"]].lifetime == SH and s.table[zone["b"]].lifetime == LO


def test_registry_parameters():
    a = make_allocator("zenfs:finish_threshold=10,reserved_zones=1")
    assert (a.finish_threshold, a.reserved_zones) == (10, 1)


# -- the rules of the store around the allocator (docs/zenfs-baseline.md) ------------------------------
KiB, MiB = 1024, 1 << 20


def _geom(nr_zones, cap=48 * KiB, zone_size=64 * KiB, max_active=6):
    from retainz.zoned import Geometry

    return Geometry(nr_zones=nr_zones, zone_size=zone_size, zone_capacity=cap, block_size=4096,
                    max_open=max_active, max_active=max_active)


@pytest.mark.parametrize("policy", ["zenfs", "zenfs-nohint", "zenfs:migrate=all"])
def test_zenfs_refuses_a_device_of_fewer_than_32_zones(policy):
    """ZonedBlockDevice::Open: fewer than ZENFS_MIN_ZONES (32) zones, meta zones included, is refused,
    at format (nothing written) and at open with the policy named; 32 zones are accepted."""
    from retainz.store import Store
    from retainz.zoned import MemoryDevice

    dev = MemoryDevice(_geom(31), payload=False)
    with pytest.raises(ValueError, match=r"has 31 zones; ZenFS refuses fewer than 32 \(ZENFS_MIN_ZONES"):
        Store.format(dev, policy=policy)
    assert all(z.cond == ZoneCond.EMPTY for z in dev.report_zones())
    Store.format(dev, policy="greedy").close()
    with pytest.raises(ValueError, match="ZenFS refuses fewer than 32"):
        Store.open(dev, policy=policy)
    with Store.open(dev) as s:                     # the refusal left the store as it was
        assert s.policy == "greedy"
    with Store.format(MemoryDevice(_geom(32), payload=False), policy=policy) as s:
        assert s.allocator.name == policy.partition(":")[0]


def test_replay_refuses_a_zenfs_device_of_fewer_than_32_zones(tmp_path):
    from retainz.trace.replay import ReplayConfig, replay
    from tests.trace.test_replay import _trace

    t = _trace(tmp_path)
    with pytest.raises(ValueError, match="ZenFS refuses fewer than 32"):
        replay(t, ReplayConfig(policy="zenfs", zones=20, zone_size=64 << 10, zone_capacity=48 << 10))
    r = replay(t, ReplayConfig(policy="zenfs", zones=26, reserve_zones=3, zone_size=64 << 10, zone_capacity=48 << 10))
    assert r["geometry"]["nr_zones"] == 32


def test_only_sst_files_migrate_unless_migrate_all():
    """ZenFS::MigrateExtents moves only files whose name ends in .sst: a checkpoint shard in a GC
    victim stays, so the victim is not reset; ``migrate=all`` moves it."""
    from dataclasses import dataclass

    from retainz.store import Store
    from retainz.zoned import MemoryDevice

    assert ZenFS().migrates("000123.sst") and not ZenFS().migrates("__0_0.distcp")
    assert not ZenFS().migrates("model.sst.tmp") and ZenFS(migrate="all").migrates("__0_0.distcp")
    with pytest.raises(ValueError, match="migrate='some' is out of range; valid: sst or all"):
        make_allocator("zenfs:migrate=some")

    @dataclass
    class EagerZenFS(ZenFS):
        """ZenFS's placement and migration rules; GC victims by the base rule (any dead bytes)."""

        name = "test-eager-zenfs"

        def gc_victims(self, reserve_zones):
            return super(ZenFS, self).gc_victims(reserve_zones)

    out = {}
    for migrate in ("sst", "all"):
        with Store.format(MemoryDevice(_geom(32)), policy="greedy", gc_reserve_zones=0) as s:
            for gid, shards in (("g0", {"a.sst": 16, "b.distcp": 16}), ("g1", {"c.distcp": 16}),
                                ("g2", {"d.distcp": 8})):
                w = s.begin_generation(gid, 1)
                for name, kib in shards.items():
                    w.write_shard(name, [bytes([len(name)]) * (kib * KiB)])
                w.commit()
            victim = s.generation("g0").shards["a.sst"].extents[0][0]
            assert s.table[victim].cond == ZoneCond.FULL
            s.delete("g1")
            a = EagerZenFS(migrate=migrate)
            s.use_allocator(a)
            rep = s.gc(force=True)
            g0 = s.generation("g0")
            out[migrate] = ({n: sh.extents[0][0] != victim for n, sh in g0.shards.items()},
                            rep.extents_kept, rep.partial, s.table[victim].cond)
            assert b"".join(s.read_shard("g0", "b.distcp")) == bytes([8]) * (16 * KiB)
            assert s.table.key() == s.recompute_table().key()
    assert out["sst"] == ({"a.sst": True, "b.distcp": False}, 1, [victim], ZoneCond.FULL)
    assert out["all"] == ({"a.sst": True, "b.distcp": True}, 0, [], ZoneCond.EMPTY)


@pytest.mark.parametrize("policy, sticky", [("zenfs", True), ("zenfs-nohint", True), ("greedy", False)])
def test_a_payload_shard_keeps_its_zone_until_full(policy, sticky):
    """ZoneFile::AllocateNewZone runs on a file's first write and when its zone is full: a shard
    streamed in 1 MiB buffers costs one decision per zone it spans, as the same shard written whole
    on the payload-less device does; a policy that is not per-file is asked per buffer."""
    from retainz.store import Store
    from retainz.zoned import MemoryDevice

    geom = _geom(32, cap=2 * MiB + 512 * KiB, zone_size=4 * MiB)
    got = {}
    for payload in (True, False):
        with Store.format(MemoryDevice(geom, payload=payload), policy=policy) as s:
            spans = []
            for i, n in enumerate((6 * MiB, 3 * MiB + 4096, 512 * KiB)):
                before = s.metrics.decisions
                w = s.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=5000, lifetime=ME), declared_size=n)
                if payload:
                    sh = w.write_shard("s.distcp", (bytes(MiB) for _ in range(n // MiB)) if n % MiB == 0
                                       else iter([bytes(n)]))
                else:
                    sh = w.write_counted_shard("s.distcp", n)
                w.commit()
                spans.append((s.metrics.decisions - before, len({e[0] for e in sh.extents}), len(sh.extents)))
            got[payload] = spans
    for decisions, zones, extents in got[True]:
        assert decisions == (zones if sticky else extents)
    if sticky:
        assert [d for d, _, _ in got[True]] == [d for d, _, _ in got[False]]
        assert got[True][0][1] == 3          # 6 MiB over 2.5 MiB zones: 3 zones, 3 decisions
    else:
        assert got[True][0][0] > got[True][0][1]


def test_zenfs_has_no_admission_and_no_reserve():
    """ZenFS has no admission control: a generation larger than the free space is admitted, written
    until AllocateIOZone fails, and the stop is the allocation's; the store holds no reserve for it."""
    from retainz.errors import NoSpaceError
    from retainz.store import Store
    from retainz.zoned import MemoryDevice

    with Store.format(MemoryDevice(_geom(32), payload=False), policy="zenfs", gc_reserve_zones=4) as s:
        assert s.admission_reserve_zones == 0 and s.gc_reserve_zones == 4
        free = s.table.free
        w = s.begin_generation("big", 1, declared_size=2 * free)
        with pytest.raises(NoSpaceError) as e:
            for i in range(2 * free // (40 * KiB)):
                w.write_counted_shard(f"s{i}", 40 * KiB)
        assert e.value.cause == "allocation"
        st = e.value.state
        assert st["empty_zones"] == 0 and st["dead_bytes"] == 0
        assert st["open_free_bytes"] == sum(z.remaining for z in s.table.open.values())
        assert st["live_bytes"] >= s.table.live > 0     # the failed shard's bytes died after the refusal
    with Store.format(MemoryDevice(_geom(32), payload=False), policy="greedy", gc_reserve_zones=4) as s:
        assert s.admission_reserve_zones == 4
        with pytest.raises(NoSpaceError) as e:
            s.begin_generation("big", 1, declared_size=s.table.free)
        assert e.value.cause == "admission" and e.value.state["empty_zones"] == len(s.table)


def test_zenfs_nohint_files_share_not_set_zones():
    """Every zenfs-nohint file is Lifetime.NOT_SET: it fits any partly filled NOT_SET zone (difference 0)
    and opens no fresh zone while one has room; zenfs with an equal class (difference 50) takes a fresh
    zone per file while active tokens last."""
    from retainz.store import Store
    from retainz.zoned import MemoryDevice

    opened = {}
    for policy in ("zenfs", "zenfs-nohint"):
        with Store.format(MemoryDevice(_geom(32), payload=False), policy=policy) as s:
            for i in range(3):
                w = s.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=5000, lifetime=ME))
                w.write_counted_shard("s", 8 * KiB)
                w.commit()
            opened[policy] = sorted((z, s.table[z].lifetime) for z in s.table.open)
    assert [lt for _, lt in opened["zenfs"]] == [ME, ME, ME]
    assert [lt for _, lt in opened["zenfs-nohint"]] == [NS]


# -- edges of each rule (each one a mutant of the port survived without) -------------------------------
def test_class_bounds_are_the_policys_own_and_short_may_be_one():
    a = ZenFS(short=5, medium=50)
    assert [a.lifetime_of(Hint(reclaim_step=r), 100) for r in (105.0, 106.0, 150.0, 151.0)] == [SH, ME, ME, LO]
    assert ZenFS(short=1, medium=1).lifetime_of(Hint(reclaim_step=2.0), 0) == LO
    with pytest.raises(ValueError, match=r"^policy zenfs: short=0 is out of range; valid: an integer >= 1$"):
        ZenFS(short=0)


def test_a_zone_holding_one_live_byte_is_still_an_open_match():
    assert zenfs(table((10, 1, LO), None)).best_open_match(ME) == (0, 1)


def test_gc_migration_without_a_partly_filled_zone_is_exactly_no_space():
    assert zenfs(table(None, None)).place(req(ME, gc=True)) == NO_SPACE


def test_gc_migration_carries_the_reclaim_step():
    a = zenfs(table((10, 10, SH), None))
    r = ExtentRequest(nbytes=10, generation="g", step=0, hint=Hint(reclaim_step=700.0), now=0, gc=True)
    assert a.place(r) == Decision(0, reclaim_step=700.0, lifetime=SH)


def test_a_good_match_keeps_the_threshold_finishes():
    # zone 0 is finished by the threshold (5 left < 10); zone 1 matches at diff 1: both in one decision
    a = zenfs(table((95, 95, ME), (10, 10, LO), None), finish_threshold=10)
    assert a.place(req(ME)) == Decision(1, finish=(0,), lifetime=ME)


def test_threshold_finishes_free_active_tokens_before_the_cheapest_zone_is_finished():
    # budget 2, two open zones; the threshold finishes zone 0: one token is free, no other finish
    t = table((95, 95, SH), (10, 10, SH), None, max_active=2, reserved_active=2)
    assert zenfs(t, finish_threshold=10).place(req(LO)) == Decision(2, finish=(0,), lifetime=LO)


def test_finishing_the_cheapest_zones_takes_distinct_zones_until_a_token_is_free():
    # budget 2 with three open zones: zones 1 and 2 (least remaining) are finished, then zone 3 opened
    t = table((10, 10, SH), (80, 80, SH), (70, 70, SH), None, max_active=2, reserved_active=2)
    assert zenfs(t).place(req(LO)) == Decision(3, finish=(1, 2), lifetime=LO)


def test_q6_keeps_the_threshold_finishes():
    # budget 0 and the only open zone is finished by the threshold: no zone to finish, no space, but
    # the threshold's finish stands
    t = table((95, 95, SH), None, max_active=1, reserved_active=1)
    assert zenfs(t, finish_threshold=10).place(req(LO)) == Decision(None, finish=(0,))


def test_gc_level_of_an_empty_table_and_its_integer_percent():
    assert zenfs(ZoneTable({})).gc_level() == (100, None)
    # 1 of 6 zones free: 16 % (integer), threshold 100 - 3 * (20 - 16) = 88
    assert zenfs(gc_table(1, [50] * 5)).gc_level() == (16, 88)


def test_gc_garbage_uses_the_integer_live_percent():
    # capacity 1000, nothing free (threshold 40): live 595 is 59 % (garbage 41, a victim), live 600 is not
    t = table((1000, 595, ME, "F"), (1000, 600, ME, "F"), cap=1000)
    assert zenfs(t).gc_level() == (0, 40)
    assert zenfs(t).gc_victims(0) == [0]


def test_a_50_match_without_a_token_keeps_the_threshold_finishes():
    # zone 0 (5 left) is finished by the threshold; zone 1 matches at 50 and no token is free
    t = table((95, 95, ME), (10, 10, ME), None, max_active=1, reserved_active=2)
    assert zenfs(t, finish_threshold=10).place(req(ME)) == Decision(1, finish=(0,), lifetime=ME)


def test_gc_free_percent_rounds_down():
    # 199 of 1000 bytes free: 19 % (not 20 %), threshold 100 - 3 * 1 = 97
    assert zenfs(table((801, 801, ME), cap=1000)).gc_level() == (19, 97)


def test_the_active_limit_refusal_names_the_limit_and_the_source():
    from retainz.zoned import Geometry

    g = Geometry(nr_zones=32, zone_size=64 * KiB, zone_capacity=64 * KiB, block_size=4096, max_open=2, max_active=2)
    with pytest.raises(ValueError) as e:
        ZenFS().check_device(g)
    assert str(e.value) == ("policy zenfs: the device's active-zone limit (max_active 2) is too small for the "
                            "policy: ZenFS keeps reserved_zones=2 of it for itself and needs at least 3 "
                            "(max_nr_active_io_zones in ZonedBlockDevice::Open, fs/zbd_zenfs.cc)")
