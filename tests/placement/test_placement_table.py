"""The zone table's bookkeeping and the base GC victim rule, at the unit level (gaps found by
mutation testing: ``make mutation``)."""

from __future__ import annotations

import pytest

from retainz.placement import ZoneTable, make_allocator
from retainz.zoned.model import ZoneCond


def table(n=8, cap=100, **kw) -> ZoneTable:
    return ZoneTable({z: cap for z in range(n)}, **kw)


def fill(t: ZoneTable, z: int, live: int, dead: int) -> None:
    """Write zone ``z`` full: ``live`` live bytes, then ``dead`` of them killed."""
    t.on_write(z, t[z].capacity, reclaim_step=1.0, lifetime=0, step=0)
    t.on_kill(z, t[z].capacity - live if dead is None else dead)


def test_finishing_an_empty_zone_takes_it_out_of_the_empty_set():
    t = table()
    assert t.is_empty(0) and t.n_empty == 8 and t.first_empty() == 0
    t.on_finish(0)
    assert not t.is_empty(0) and t.n_empty == 7 and t.first_empty() == 1
    assert list(t.empty_zones()) == list(range(1, 8)) and 0 not in t.empty_zones()
    assert t[0].cond == ZoneCond.FULL and t.unused == 100
    t.on_reset(0)
    assert t.is_empty(0) and t.first_empty() == 0 and t.unused == 0


def test_base_gc_collects_the_most_dead_full_zones_only_below_the_reserve():
    t = table(8)
    a = make_allocator("greedy")
    a.bind(t)
    fill(t, 0, 90, 10)
    fill(t, 1, 40, 60)
    fill(t, 2, 70, 30)
    fill(t, 3, 40, 60)             # ties zone 1: the lower index first
    fill(t, 4, 100, 0)             # full, nothing dead: never a victim
    t.on_write(5, 50, reclaim_step=1.0, lifetime=0, step=0)
    t.on_kill(5, 50)               # open, all dead: not full, not a victim
    assert t.n_empty == 2
    assert a.gc_victims(2) == []                  # the reserve holds
    assert a.gc_victims(3) == [1]                 # one short: the most dead
    assert a.gc_victims(4) == [1, 3]
    assert a.gc_victims(6) == [1, 3, 2, 0]        # every full zone with dead bytes, most dead first
    t.on_kill(4, 1)
    assert a.gc_victims(7) == [1, 3, 2, 0, 4]     # one dead byte is enough


@pytest.mark.parametrize("value, expect", [("true", True), ("TRUE", True), ("1", True), ("false", False),
                                           ("False", False), ("0", False)])
def test_registry_parses_booleans(value, expect):
    assert make_allocator(f"retainz:recompute={value}").recompute is expect


@pytest.mark.parametrize("value", ["yes", "2", "", "truee"])
def test_registry_refuses_other_booleans(value):
    with pytest.raises(ValueError, match=f"policy retainz: recompute={value!r} is not a bool"):
        make_allocator(f"retainz:recompute={value}")


def test_describe_lists_parameters_or_the_bare_name():
    assert make_allocator("greedy").describe() == "greedy"
    assert make_allocator("common:width=2").describe() == "common:width=2"
    a = make_allocator("common:width=2")
    a.bind(table())
    assert a.describe() == "common:width=2"                 # the bound table is no parameter


def test_a_new_table_is_at_step_zero_and_keeps_no_zone_for_the_store():
    t = table(5, max_active=4)
    assert (t.now, t.reserved_active) == (0, 0)
    a = make_allocator("zenfs")
    a.bind(t)
    assert a.active_budget == 2           # min(4, 4 + 0 - 2): nothing reserved by the store
    # RetainZ's GC window is measured from the table's step: 10 steps to the zone's reclaim step
    t.on_write(0, 100, reclaim_step=10.0, lifetime=0, step=0)
    t.on_kill(0, 90)
    fill(t, 1, 100, 0)                    # all live: no victim, but not empty (GC is not forced)
    r = make_allocator("retainz:wait_steps=9,wait_frac=0")
    r.bind(t)
    assert r.gc_victims(reserve_zones=4) == [0]


def test_garbage_written_as_garbage_counts_as_dead_in_the_zone_and_the_table():
    t = table()
    t.on_write(0, 30, reclaim_step=1.0, lifetime=0, step=0, live=False)
    t.on_write(0, 20, reclaim_step=1.0, lifetime=0, step=0, live=False)
    t.on_write(1, 5, reclaim_step=1.0, lifetime=0, step=0, live=False)
    assert (t[0].dead, t[0].live, t[1].dead, t.dead, t.live, t.written) == (50, 0, 5, 55, 0, 55)


def test_a_reclaim_step_update_reaches_the_zone_and_the_listeners():
    t = table()
    t.on_write(0, 10, reclaim_step=1.0, lifetime=0, step=0)
    seen = []
    t.listeners.append(lambda s: seen.append((s.index, s.reclaim_step)))
    t.on_reclaim_step(0, 7.0)
    assert t[0].reclaim_step == 7.0 and seen == [(0, 7.0)]


def test_resetting_a_full_zone_drops_its_live_bytes_from_the_totals():
    t = table()
    fill(t, 0, 60, 40)
    t.on_write(1, 10, reclaim_step=1.0, lifetime=0, step=0)
    t.on_reset(0)
    assert (t.live, t.dead, t.written, t.unused, t.n_empty) == (10, 0, 10, 0, 7)
    assert t[0].cond == ZoneCond.EMPTY and list(t.open) == [1]


def test_resetting_an_empty_zone_changes_nothing_and_notifies_no_one():
    t = table()
    seen = []
    t.listeners.append(seen.append)
    before = t.key()
    t.on_reset(3)
    assert t.key() == before and seen == []


def test_base_gc_never_names_a_full_zone_without_dead_bytes():
    t = table(4)
    a = make_allocator("greedy")
    a.bind(t)
    fill(t, 0, 100, 0)
    fill(t, 1, 70, 30)
    fill(t, 2, 100, 0)
    assert a.gc_victims(reserve_zones=4) == [1]


def test_a_table_without_zones_restores_to_nothing():
    t = ZoneTable({})
    t.restore([])
    assert (len(t), t.n_empty, t.first_empty(), t.free) == (0, 0, None, 0)
