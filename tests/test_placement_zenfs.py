"""ZenFS-Alloc port: one table-driven test per rule of upstream ZenFS's allocator (placement/zenfs.py docstring)."""

from __future__ import annotations

import pytest

from retainz.placement import NO_SPACE, Decision, ExtentRequest, Hint, ZoneTable, make_allocator
from retainz.placement.hints import (
    WLTH_EXTREME,
    WLTH_LONG,
    WLTH_MEDIUM,
    WLTH_NONE,
    WLTH_NOT_SET,
    WLTH_SHORT,
    lifetime_class,
)
from retainz.placement.zenfs import ZenFS, lifetime_diff, unused_zones
from retainz.zoned.model import ZoneCond
from tests.placement_driver import Driver, Gen

CAP = 100
NS, NO, SH, ME, LO, EX = WLTH_NOT_SET, WLTH_NONE, WLTH_SHORT, WLTH_MEDIUM, WLTH_LONG, WLTH_EXTREME


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


def test_driver_resets_unused_and_returns_the_active_resource():
    d = Driver("zenfs", zones=8, capacity=CAP, max_active=2, reserved_active=2)
    d.gens["g"] = Gen(0, Hint(lifetime=ME))
    d.write("g", 30)
    assert len(d.table.open) == 1
    d.delete("g")
    assert len(d.table.open) == 0 and d.table.n_empty == 8 and d.metrics()["resets"] == 1


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
    d = Driver("zenfs", zones=4, capacity=CAP, max_active=1, reserved_active=2)
    d.gens["a"] = Gen(0, Hint(reclaim_step=500.0))        # SHORT opens zone 0
    d.gens["b"] = Gen(0, Hint(reclaim_step=50000.0))      # LONG: diff 100, no token: finish 0
    d.write("a", 10)
    assert d.table[0].lifetime == SH
    d.write("b", 10)
    assert d.table[0].lifetime == SH and d.table[1].lifetime == LO


def test_registry_parameters():
    a = make_allocator("zenfs:finish_threshold=10,reserved_zones=1")
    assert (a.finish_threshold, a.reserved_zones) == (10, 1)
