"""RetainZ: the cost model, its index, GC victims, and decision equivalence under recomputation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retainz.hint import Hint
from retainz.placement import NO_SPACE, POLICIES, Decision, ExtentRequest, ZoneTable
from retainz.placement.retainz import UNCERTAIN_ZONE, Oracle, RetainZ
from retainz.zoned.model import DeviceInfo, Geometry
from tests.store_events import run

M = 1 << 20
INF = math.inf


def table(n=8, cap=100 * M, max_active=0):
    return ZoneTable({z: cap for z in range(n)}, max_active=max_active)


def put(t, z, nbytes, r, step=0, dead=0):
    t.on_write(z, nbytes, reclaim_step=r, lifetime=0, step=step)
    if dead:
        t.on_kill(z, dead)


def req(nbytes, r, now, step=None, pending=0, gen="g", gc=False, actual=None):
    return ExtentRequest(nbytes=nbytes, generation=gen, step=now if step is None else step,
                         hint=Hint(reclaim_step=r, actual_reclaim_step=actual), now=now,
                         pending=pending, gc=gc)


def bound(t, **kw):
    a = RetainZ(**kw)
    a.bind(t)
    return a


# -- the docstring's worked example ---------------------------------------------------------------
def test_worked_example():
    t = table()
    put(t, 0, 100 * M, 6000.0, step=1000)
    put(t, 1, 100 * M, 6000.0, step=1000)
    put(t, 2, 50 * M, 6000.0, step=1000)
    a = bound(t)
    assert a.join_cost(t[2], 6500.0, 250 * M, 1500) == (0, -200_000 * M)
    assert a.open_cost(100 * M, 6500.0, 250 * M, 1500) == (0, 0.0)
    assert a.place(req(250 * M, 6500.0, 1500)) == Decision(2, reclaim_step=6500.0)

    # the final, permanent save next to an open zone Y (R = 6500)
    t = table()
    put(t, 0, 60 * M, 6500.0, step=1500)
    a = bound(t)
    assert a.join_cost(t[0], INF, 40 * M, 50000)[0] == 60 * M
    assert a.place(req(40 * M, INF, 50000)) == Decision(1, reclaim_step=INF)
    put(t, 1, 40 * M, INF, step=50000)
    assert a.place(req(10 * M, INF, 50100)) == Decision(1, reclaim_step=INF)   # packs at cost 0


def test_equal_reclaim_steps_share():
    t = table()
    put(t, 0, 30 * M, 6000.0, step=1000)             # generation A, dies at 6000
    a = bound(t)
    d = a.place(req(30 * M, 6000.0, 1500, gen="B"))  # B, saved later, dies at the same step
    assert d == Decision(0, reclaim_step=6000.0)
    assert a.join_cost(t[0], 6000.0, 30 * M, 1500) == (0, 0.0)


@pytest.mark.parametrize("group, expect", [(30 * M, 0), (100 * M, 1)])
def test_zone_that_outlives_us_under_the_unused_capacity_charge(group, expect):
    # open_unused=true (the charge an estimated death always pays): Z dies at 9000; our 30 MiB die
    # at 6000: held 3,000 steps (90,000 MiB-steps) vs opening a zone our group leaves 70 MiB of
    # unused for 5,000 steps (350,000); a group that fills the new zone opens it at no cost
    t = table()
    put(t, 0, 30 * M, 9000.0, step=1000)
    a = bound(t, open_unused=True)
    assert a.join_cost(t[0], 6000.0, 30 * M, 1000) == (0, 90_000.0 * M)
    assert a.place(req(30 * M, 6000.0, 1000, pending=group - 30 * M)).zone == expect



@pytest.mark.parametrize("group", [30 * M, 100 * M])
def test_a_known_death_opens_rather_than_be_held(group):
    # the zone above under the defaults (open_unused=false): joining holds our 30 MiB dead 3,000
    # steps; opening holds nothing (the 70 MiB left free stay writable while the zone is open)
    t = table()
    put(t, 0, 30 * M, 9000.0, step=1000)
    a = bound(t)
    assert a.open_cost(100 * M, 6000.0, 30 * M, 1000, free=True) == (0, 0.0)
    assert a.place(req(30 * M, 6000.0, 1000, pending=group - 30 * M)).zone == 1
    # an estimated death (no hint step: 1000 + 5000) keeps the charge and joins as before
    assert a.place(req(30 * M, None, 1000, pending=group - 30 * M)).zone == (0 if group == 30 * M else 1)


@pytest.mark.parametrize("kind, spec, zone", [("memory", None, 1), ("linux", None, 1), ("fdp", None, 0),
                                              ("fdp-nvme", None, 0), ("fdp", False, 1), ("memory", True, 0)])
def test_the_open_charge_follows_the_device_unless_given(kind, spec, zone):
    # the zone above: a known death opens (free) on a zoned device and joins (charged: 90,000 against
    # 350,000 MiB-steps) on an FDP namespace, whose part-written RUs get padded; open_unused given wins
    t = table()
    put(t, 0, 30 * M, 9000.0, step=1000)
    a = bound(t) if spec is None else bound(t, open_unused=spec)
    a.use_device(DeviceInfo(geometry=Geometry(nr_zones=4, zone_size=100 * M, zone_capacity=100 * M), kind=kind))
    assert a.place(req(30 * M, 6000.0, 1000)).zone == zone


def test_only_a_certain_death_in_view_is_known():
    # an age estimate, a survivor's re-estimate and an uncertain condition's expected step are
    # estimates; the oracle's actual step is known whatever the condition
    a = bound(table(), uncertain_saves=False)
    assert a.viewed_reclaim(req(30 * M, 1500.0, 1000)) == (1500.0, True)
    assert a.viewed_reclaim(req(30 * M, None, 1000)) == (6000, False)
    assert a.viewed_reclaim(req(30 * M, 999.0, 1000, step=400)) == (1600, False)
    h = Hint(reclaim_step=1500.0, condition="uncertain:earliest=1500,probability=0.8,expected=1500,basis=x",
             actual_reclaim_step=2500.0)
    u = ExtentRequest(30 * M, "g", 1000, h, 1000)
    assert a.viewed_reclaim(u) == (1500.0, False)
    o = Oracle()
    o.bind(table())
    assert o.viewed_reclaim(u) == (2500.0, True)

# -- decisions at the active-zone limit -------------------------------------------------------------
def limit_table(q_written, q_reclaim):
    t = table(max_active=2)
    put(t, 0, 50 * M, INF)                        # P: permanent, 50 MiB free
    put(t, 1, q_written, q_reclaim)               # Q
    return t


def test_limit_finish_an_orphan_rather_than_hold_its_data():
    # Q is 95 % full of data dying at 1000; holding it to 6000 costs 95 MiB x 5,000 steps, while
    # finishing it wastes only capacity that nothing would use before 1000 anyway
    t = limit_table(95 * M, 1000.0)
    a = bound(t)
    assert a.join_cost(t[1], 6000.0, 200 * M, 900) == (0, 474_500.0 * M)
    assert a.finish_cost(t[1], 6000.0, 900) == (0, 0.0)
    assert a.finish_cost(t[0], 6000.0, 900) == (50 * M, 0.0)   # never finish the permanent zone
    assert a.place(req(200 * M, 6000.0, 900)) == Decision(2, finish=(1,), reclaim_step=6000.0)


def test_limit_fill_an_orphan_that_dies_late():
    t = limit_table(10 * M, 5500.0)
    a = bound(t)
    assert a.join_cost(t[1], 6000.0, 200 * M, 900) == (0, -409_000.0 * M)
    assert a.place(req(200 * M, 6000.0, 900)) == Decision(1, reclaim_step=6000.0)


def test_limit_nothing_but_bad_joins():
    t = table(n=2, max_active=2)
    put(t, 0, 50 * M, INF)
    put(t, 1, 50 * M, 1000.0)
    a = bound(t)
    assert a.place(req(10 * M, 6000.0, 900)) == Decision(1, reclaim_step=6000.0)
    assert a.place(req(10 * M, INF, 900)) == Decision(0, reclaim_step=INF)
    t.on_write(0, 50 * M, reclaim_step=INF, lifetime=0, step=0)
    t.on_write(1, 50 * M, reclaim_step=INF, lifetime=0, step=0)
    assert a.place(req(10 * M, INF, 900)) == NO_SPACE


def test_unknown_reclaim_step_is_estimated_and_recorded():
    t = table()
    a = bound(t, unknown_lifetime=3000)
    assert a.place(req(10 * M, None, 700)) == Decision(0, reclaim_step=3700)
    put(t, 0, 10 * M, None, step=700)
    assert a.zone_reclaim(t[0]) == 3700


# -- permanent data packs with permanent data (through the store) ------------------------------------
def mixed_trace(saves=60, interval=100, size=70, every=3, keep=2):
    """Keep the latest ``keep`` saves, plus every ``every``-th save permanently."""
    events = []
    for i in range(1, saves + 1):
        step = i * interval
        perm = i % every == 0
        r = INF if perm else float(step + keep * interval)
        events.append(("save", f"g{step}", step, [size // 2, size - size // 2],
                       Hint(reclaim_step=r, actual_reclaim_step=r)))
        old = step - keep * interval
        if old > 0 and (old // interval) % every:
            events.append(("delete", f"g{old}", step))
    return events


def test_permanent_packs_with_permanent():
    d = run("retainz", mixed_trace(), zones=40, capacity=100, max_active=6)
    assert d.metrics()["stop_step"] is None
    perm = {g.id for g in d.store.generations() if g.hint.reclaim_step == INF}
    assert len(perm) == 20
    assert d.zone_gens
    for gens in d.zone_gens.values():       # every zone, from its opening to its reset
        assert gens <= perm or not gens & perm, gens


# -- the reclaim-step index ----------------------------------------------------------------------------
R_VALUES = st.sampled_from([None, INF, 100.0, 200.0, 250.0, 300.0, 1000.0])
OPS = st.lists(st.tuples(st.sampled_from(["write", "kill", "finish", "reset", "place"]),
                         st.integers(0, 15), st.integers(1, 60), R_VALUES), max_size=60)


def brute_force(a: RetainZ, t: ZoneTable, rq: ExtentRequest) -> Decision:
    """Price every open zone, the first empty zone and every finish choice (no index)."""
    (r, known), now, group = a.viewed_reclaim(rq), rq.now, rq.nbytes + rq.pending
    options = []
    for s in t.open.values():
        zr = a.zone_reclaim(s)
        options.append(((a.join_cost(s, r, group, now), 0, 0.0 if zr == r else abs(zr - r), s.index),
                        Decision(s.index, reclaim_step=r)))
    e = t.first_empty()
    if e is not None:
        cost = a.open_cost(t[e].capacity, r, group, now, known and not a.open_unused)
        if not t.max_active or len(t.open) < t.max_active:
            options.append(((cost, 1, 0.0, e), Decision(e, reclaim_step=r)))
        else:
            need = len(t.open) - t.max_active + 1
            fin = sorted((a.finish_cost(s, r, now), s.remaining, s.index) for s in t.open.values())
            for c, _, _ in fin[:need]:
                cost = (cost[0] + c[0], cost[1] + c[1])
            options.append(((cost, 2, 0.0, e),
                            Decision(e, finish=tuple(z for *_, z in fin[:need]), reclaim_step=r)))
    return min(options, key=lambda o: o[0])[1] if options else NO_SPACE


@settings(max_examples=200, deadline=None)
@given(OPS, st.sampled_from([0, 3, 5]))
def test_index_matches_a_brute_force_scan(ops, max_active):
    t = table(n=16, cap=100, max_active=max_active)
    a, fresh, every = bound(t), bound(t, recompute=True), bound(t, neighbors=10 ** 6)
    now = 0
    for op, z, n, r in ops:
        now += 10
        s = t[z]
        if op == "write" and (s.remaining > 0) and (z in t.open or t.can_open):
            t.on_write(z, min(n, s.remaining), reclaim_step=r, lifetime=0, step=now)
        elif op == "kill" and s.live:
            t.on_kill(z, min(n, s.live))
        elif op == "finish" and z in t.open:
            t.on_finish(z)
        elif op == "reset":
            t.on_reset(z)
        elif op == "place":
            rq = req(n, r, now, step=now - 5)
            d = a.place(rq)
            assert d == fresh.place(rq)
            assert every.place(rq) == brute_force(every, t, rq)
            if len(t.open) <= a.neighbors:   # every open zone is a neighbour: same answer
                assert d == every.place(rq)
        assert a.index_keys() == sorted((a.zone_reclaim(s), z) for z, s in t.open.items())


# -- GC victims ------------------------------------------------------------------------------------------
def gc_table(n_empty):
    t = table(n=3 + n_empty, cap=100)
    put(t, 0, 100, 9000.0, step=0, dead=90)      # A: 10 live, dies far away
    put(t, 1, 100, 9000.0, step=0, dead=50)      # B: 50 live, dies far away
    put(t, 2, 100, 1010.0, step=0, dead=90)      # C: 10 live, dies 10 steps from now
    t.now = 1000
    return t


def test_gc_cost_benefit_and_waiting():
    a = bound(gc_table(n_empty=1))
    assert a.gc_victims(reserve_zones=1) == []
    assert a.gc_victims(reserve_zones=3) == [0, 1]         # C is left to die: waiting is free
    a = bound(gc_table(n_empty=0))
    assert a.gc_victims(reserve_zones=2) == [0, 1, 2]      # no reserve to wait on


def test_forced_gc_waits_on_no_zone():
    # forced (the store asks with every data zone as the reserve): C is collected too, last
    t = gc_table(n_empty=1)
    a = bound(t)
    assert a.gc_victims(reserve_zones=len(t)) == [0, 1, 2]


def test_overdue_zone_is_re_estimated_not_waited_on():
    # C's reclaim step (900) has passed with 10 live bytes left: its data outlived the prediction
    t = table(n=3, cap=100)
    put(t, 0, 100, 9000.0, step=0, dead=50)      # 50 live, dies far away
    put(t, 1, 100, 900.0, step=400, dead=90)     # overdue: 10 live, opened at 400
    t.now = 1000
    a = bound(t)
    # A ranks by (100-50)*(9000-1000)/50 = 8000; C, re-estimated at now + age = 1600, by
    # (100-10)*600/10 = 5400 (before the rule C counted as "about to reset" and was skipped)
    assert a.gc_victims(reserve_zones=2) == [0, 1]


def test_survivor_reclaim():
    from retainz.placement.retainz import survivor_reclaim

    assert survivor_reclaim(1000, 3000) == 5000
    assert survivor_reclaim(3000, 3000) == 3001
    # a GC copy of data past its prediction is placed by the re-estimate (and recorded so)
    t = table()
    a = bound(t)
    assert a.place(req(10 * M, 2500.0, 4000, step=1000, gc=True)).reclaim_step == 7000


def ureq(nbytes, r, now, step=None, gen="g", gc=False, pending=0):
    h = Hint(reclaim_step=r, condition="uncertain:earliest=1500,probability=0.8,expected=1500,basis=x")
    return ExtentRequest(nbytes=nbytes, generation=gen, step=now if step is None else step, hint=h, now=now,
                         pending=pending, gc=gc)


def test_uncertain_saves_share_no_zone():
    t = table()
    put(t, 0, 30 * M, 1500.0, step=500)           # another generation, same predicted step
    put(t, 1, 30 * M, 1500.0, step=1000)          # our own first extent (opened at our step)
    a = bound(t)
    assert a.place(ureq(30 * M, 1500.0, 1000)).zone == 1        # its own group only
    assert a.place(ureq(30 * M, 1500.0, 1200, step=1200)).zone == 2   # a later save: a new zone
    plain = bound(t, uncertain_saves=False)
    assert plain.place(ureq(30 * M, 1500.0, 1200, step=1200)).zone in (0, 1)  # the plain model shares
    # the zone an uncertain save opens is marked, and a save with a known death does not join it
    from retainz.placement.retainz import UNCERTAIN_ZONE

    fresh = table()
    a2 = bound(fresh)
    d = a2.place(ureq(30 * M, 1500.0, 1000))
    assert (d.zone, d.lifetime) == (0, UNCERTAIN_ZONE)
    fresh.on_write(0, 30 * M, reclaim_step=1500.0, lifetime=d.lifetime, step=1000)
    assert a2.place(req(30 * M, 1500.0, 1000, gen="known")).zone == 1              # not zone 0
    assert bound(fresh, uncertain_saves=False).place(req(30 * M, 1500.0, 1000)).zone == 0
    # without an empty zone the rule yields: the save shares rather than stopping
    full = table(n=2)
    put(full, 0, 30 * M, 1500.0, step=500)
    put(full, 1, 30 * M, 1500.0, step=600)
    assert bound(full).place(ureq(30 * M, 1500.0, 1200, step=1200)).zone in (0, 1)
    # GC copies of uncertain data, and the no-hint control, are not restricted
    assert a.place(ureq(30 * M, 1500.0, 1200, step=1000, gc=True)).zone in (0, 1)
    from retainz.placement.retainz import RetainZNoHint

    nohint = RetainZNoHint()
    nohint.bind(t)
    u = ureq(30 * M, 1500.0, 1200, step=1200)
    assert nohint.place(u) == nohint.place(req(30 * M, 1500.0, 1200)) == Decision(0, reclaim_step=6200)


def test_gc_prefers_permanent_zones_with_garbage():
    t = table(n=3, cap=100)
    put(t, 0, 100, 9000.0, dead=90)
    put(t, 1, 100, INF, dead=10)
    put(t, 2, 100, 9000.0, dead=20)
    t.now = 1000
    assert bound(t).gc_victims(reserve_zones=1) == [1, 0]



def test_finishing_a_zone_that_dies_with_the_data_holds_its_free_space_until_then():
    # the zone dies at 6000 like the new data: not an orphan, its 50 MiB stay unusable 900 -> 6000
    t = table()
    put(t, 0, 50 * M, 6000.0)
    assert bound(t).finish_cost(t[0], 6000.0, 900) == (0, 50 * M * 5100.0)


def test_candidates_are_the_nearest_on_each_side_of_the_reclaim_step():
    t = table()
    put(t, 0, 10, 100.0)
    put(t, 2, 10, 50.0)
    put(t, 3, 10, 200.0)
    a = bound(t, neighbors=1)
    assert [s.index for s in a.candidates(100.0)] == [2, 0]     # one below, then 100 itself and above


def test_equal_join_costs_go_to_the_zone_nearest_the_reclaim_step():
    # zone 0 (reclaim 0.5) and zone 1 (reclaim 1.0) both cost (0, 0.0) for 50 bytes dying at 1.0:
    # the zone whose reclaim step is exactly the data's wins over the lower index
    t = table(cap=100)
    put(t, 0, 10, 0.5)
    put(t, 1, 10, 1.0)
    a = bound(t)
    assert a.join_cost(t[0], 1.0, 50, 0) == a.join_cost(t[1], 1.0, 50, 0) == (0, 0.0)
    assert a.place(req(50, 1.0, 0)) == Decision(1, reclaim_step=1.0)


def test_gc_skips_open_zones_and_zones_with_no_live_or_no_dead_bytes():
    t = table(n=5, cap=100)
    put(t, 0, 50, 9000.0, dead=40)           # open, with garbage: never a victim
    put(t, 1, 100, 9000.0, dead=100)         # full, nothing live: the store resets it, GC has no work
    put(t, 2, 100, 9000.0)                   # full, all live: nothing to gain
    put(t, 3, 100, 9000.0, dead=90)          # the only victim
    t.now = 1000
    assert bound(t).gc_victims(reserve_zones=3) == [3]


def test_gc_keeps_scanning_past_a_zone_left_to_reset_itself():
    t = table(n=3, cap=100)
    put(t, 0, 100, 1010.0, dead=90)          # dies 10 steps from now: waited on
    put(t, 1, 100, 9000.0, dead=90)
    t.now = 1000
    assert bound(t).gc_victims(reserve_zones=2) == [1]


@pytest.mark.parametrize("opened, reclaim, wait_steps, victims", [
    (900, 1050.0, 0, [0]),     # 50 steps left, age 100: the window is 10 steps: collected
    (900, 1010.0, 0, []),      # 10 steps left = 10 % of its age: waited on (the bound is inclusive)
    (0, 1010.0, 10, []),       # 10 steps left = wait_steps: waited on
    (0, 1011.0, 10, [0]),
])
def test_gc_waiting_window_is_a_fraction_of_the_zones_age(opened, reclaim, wait_steps, victims):
    t = table(n=4, cap=100)                  # two empty zones, three wanted (not forced)
    put(t, 0, 100, reclaim, step=opened, dead=90)
    put(t, 1, 100, 9000.0)                   # all live: never a victim
    t.now = 1000
    assert bound(t, wait_steps=wait_steps, wait_frac=0.0 if wait_steps else 0.1).gc_victims(3) == victims


def test_gc_ranks_by_dead_byte_steps_per_live_byte():
    # A: 90 dead for 100 steps over 10 live (900); B: 10 dead for 1000 steps over 90 live (111)
    t = table(n=2, cap=100)
    put(t, 1, 100, 1100.0, dead=90)
    put(t, 0, 100, 2000.0, dead=10)
    t.now = 1000
    assert bound(t).gc_victims(reserve_zones=2) == [1, 0]


def test_gc_ranks_permanent_zones_by_dead_bytes_per_live_byte():
    t = table(n=2, cap=100)
    put(t, 0, 100, INF, dead=50)             # 50 dead per 50 live
    put(t, 1, 100, INF, dead=90)             # 90 dead per 10 live: first
    t.now = 1000
    assert bound(t).gc_victims(reserve_zones=2) == [1, 0]


def test_gc_stops_once_the_missing_empty_zones_are_regained():
    t = table(n=5, cap=100)
    for z in range(4):
        put(t, z, 100, 9000.0, dead=90)
    t.now = 1000
    # one empty zone, two wanted: 0.9 of a zone per victim, so two victims restore the reserve
    assert bound(t).gc_victims(reserve_zones=2) == [0, 1]


def test_held_counts_a_single_byte():
    from retainz.placement.retainz import held

    assert held(1, 0, 10) == (0, 10)
    assert held(1, 0, INF) == (1, 0.0)
    assert held(0, 0, 10) == held(5, 10, 10) == (0, 0.0)


def test_a_reclaim_step_equal_to_now_is_taken_as_given_and_recorded_so():
    a = bound(table())
    rq = req(10, 1000.0, 1000, step=400)
    assert a.reclaim_of(rq) == a.reclaim_step_of(rq) == 1000.0
    assert a.reclaim_step_of(req(10, 999.0, 1000, step=400)) == 1600      # overdue: now + age


def test_an_uncertain_save_takes_the_last_empty_zone_rather_than_share():
    t = table(n=2)
    put(t, 0, 30 * M, 1500.0, step=500)           # another generation's zone, same predicted step
    assert bound(t).place(ureq(30 * M, 1500.0, 1000)) == Decision(1, reclaim_step=1500.0,
                                                                   lifetime=UNCERTAIN_ZONE)


def test_a_known_death_skips_an_uncertain_zone_and_still_prices_the_next():
    t = table(n=3)
    t.on_write(0, 30 * M, reclaim_step=1400.0, lifetime=UNCERTAIN_ZONE, step=1000)   # an uncertain group
    put(t, 1, 30 * M, 1500.0, step=1000)
    # under the unused-capacity charge (open_unused=true) joining zone 1 is the least cost
    assert bound(t, open_unused=True).place(req(30 * M, 1450.0, 1000)) == Decision(1, reclaim_step=1450.0)


def test_equal_join_costs_prefer_the_zone_whose_reclaim_step_is_nearest():
    # both zones' reclaim steps have passed (priced from now alike); 500 is nearer 1500 than 100
    t = table(cap=100)
    put(t, 0, 10, 100.0)
    put(t, 1, 10, 500.0)
    a = bound(t, open_unused=True)    # opening is charged, so a join is chosen
    assert a.join_cost(t[0], 1500.0, 10, 1000) == a.join_cost(t[1], 1500.0, 10, 1000)
    assert a.place(req(10, 1500.0, 1000)) == Decision(1, reclaim_step=1500.0)


def test_at_the_limit_finishing_a_permanent_zone_costs_its_free_space_forever():
    t = table(max_active=1)
    put(t, 0, 50 * M, INF)                        # 50 MiB free, never reset
    a = bound(t)
    assert a.finish_cost(t[0], 6000.0, 900) == (50 * M, 0.0)
    # joining holds our 10 MiB forever; finishing wastes 50 MiB forever: join
    assert a.place(req(10 * M, 6000.0, 900)) == Decision(0, reclaim_step=6000.0)


def test_at_the_limit_the_finish_cost_adds_to_the_opening_cost():
    t = table(max_active=1)
    put(t, 0, 50 * M, 9000.0)                     # dies at 9000: finishing holds 50 MiB 1000 -> 9000
    a = bound(t)
    assert a.join_cost(t[0], 6000.0, 50 * M, 1000) == (0, 150_000.0 * M)
    assert a.open_cost(100 * M, 6000.0, 50 * M, 1000) == (0, 250_000.0 * M)
    assert a.finish_cost(t[0], 6000.0, 1000) == (0, 400_000.0 * M)
    assert a.place(req(50 * M, 6000.0, 1000)) == Decision(0, reclaim_step=6000.0)


def test_an_uncertain_save_opening_a_zone_at_the_limit_marks_it():
    t = table(max_active=1)
    put(t, 0, 30 * M, 1500.0, step=500)
    d = bound(t).place(ureq(30 * M, 1500.0, 1000))
    assert d == Decision(1, finish=(0,), reclaim_step=1500.0, lifetime=UNCERTAIN_ZONE)


def test_gc_waits_on_a_zone_whose_reclaim_step_is_now():
    t = table(n=4, cap=100)
    put(t, 0, 100, 1000.0, dead=90)               # resets at this very step
    put(t, 1, 100, 9000.0)                        # all live
    t.now = 1000
    assert bound(t).gc_victims(reserve_zones=3) == []


def test_at_the_limit_a_permanent_zone_nearly_full_is_finished_rather_than_join_another():
    # the nearest permanent zone would hold our 10 MiB forever; finishing the nearly full one wastes
    # only its last 1 MiB forever, and the opening's own cost is in steps, not forever
    t = table(max_active=3)
    put(t, 0, 50 * M, INF)
    put(t, 1, 50 * M, INF)
    put(t, 2, 99 * M, INF)
    a = bound(t, neighbors=1)
    assert [s.index for s in a.candidates(6000.0)] == [0]
    assert a.place(req(10 * M, 6000.0, 900)) == Decision(3, finish=(2,), reclaim_step=6000.0)

# -- equivalence: cached summaries, and decisions under recomputation ---------------------------------
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_recompute_mode_gives_identical_decisions(policy):
    """The store's verify mode rebuilds every summary from the catalog before each decision (raising
    if the cached ones differ) and decides on the rebuilt table: the same decisions, the same metrics."""
    kw = dict(zones=29, capacity=100, max_active=4)    # 32 zones with the journal's: ZenFS's minimum
    events = mixed_trace(saves=60, interval=100, size=90, every=4, keep=3)
    base = run(policy, events, **kw)
    again = run(policy, events, verify=True, **kw)
    assert repr(base.decisions) == repr(again.decisions)
    timing = {"decision_cpu_seconds"}
    assert {k: v for k, v in base.metrics().items() if k not in timing} == \
        {k: v for k, v in again.metrics().items() if k not in timing}
    assert base.metrics()["decisions"] == len(base.decisions) > 100
    for r in (base, again):                             # and the cached summaries end equal to the catalog's
        assert r.store.table.key() == r.store.recompute_table().key()


# -- saves in flight (issue 40) -----------------------------------------------------------------------
def in_flight(t, gen, z, nbytes, r, step=0):
    """Group ``gen`` is being written and has written ``nbytes`` into zone ``z`` so far."""
    t.on_group_begin(gen)
    put(t, z, nbytes, r, step=step)
    t.on_fill(z, gen)


def test_a_zone_an_older_group_in_flight_is_filling_is_not_left_over_capacity():
    # the worked example's zone Z, but g is still being written: its free 50 MiB are g's own next
    # bytes, not capacity that would stay unused, so g+1 gets no credit and opens its own zone
    t = table()
    in_flight(t, "g", 2, 50 * M, 6000.0, step=1000)
    a = bound(t)
    assert a.join_cost(t[2], 6500.0, 250 * M, 1500, filled=True) == (0, 25_000.0 * M)
    assert a.place(req(250 * M, 6500.0, 1500, gen="h")) == Decision(0, reclaim_step=6500.0)
    assert a.place(req(250 * M, 6000.0, 1500, gen="g")) == Decision(2, reclaim_step=6000.0)  # its own zone
    t.on_group_end("g")                               # g wrote its last byte: the credit is back
    assert t.filling == {} and t.writing == {}
    assert a.place(req(250 * M, 6500.0, 1500, gen="h")) == Decision(2, reclaim_step=6500.0)


def test_at_the_active_limit_groups_in_flight_share_with_the_nearest_reclaim_step():
    # every open zone is being filled by another group: the new group joins the one whose reclaim
    # step is nearest (the least delayed reclamation) rather than finish one of them
    t = table(max_active=3)
    in_flight(t, "a", 0, 50 * M, 6000.0)
    in_flight(t, "b", 1, 50 * M, 20000.0)
    in_flight(t, "c", 2, 50 * M, 3000.0)
    a = bound(t)
    assert a.place(req(250 * M, 6500.0, 1500, gen="h")) == Decision(0, reclaim_step=6500.0)
    assert a.place(req(250 * M, 19000.0, 1500, gen="h")) == Decision(1, reclaim_step=19000.0)


def test_at_the_active_limit_an_idle_zone_is_finished_before_one_a_group_is_filling():
    # both zones are orphans for data dying at 30000 (finish cost 0 for an idle one), but zone 0
    # is still being filled by group a: finishing it would waste what a is about to write
    t = table(max_active=2)
    in_flight(t, "a", 0, 50 * M, 6000.0)
    put(t, 1, 50 * M, 7000.0)
    a = bound(t)
    assert a.finish_cost(t[0], 30000.0, 1500, filled=True) == (0, 225_000.0 * M)
    assert a.finish_cost(t[1], 30000.0, 1500) == (0, 0.0)
    assert a.place(req(250 * M, 30000.0, 1500, gen="h")) == Decision(2, finish=(1,), reclaim_step=30000.0)


def test_gc_copies_do_not_join_a_zone_a_save_in_flight_is_filling():
    t = table()
    put(t, 1, 100 * M, 5500.0, dead=60 * M)           # the victim's group (dies at 5500)
    in_flight(t, "g", 2, 50 * M, 5000.0, step=1000)  # an older group still being written
    a = bound(t)
    d = a.place(req(40 * M, 5500.0, 1500, gen="old", gc=True))
    assert d.zone != 2


def test_a_group_in_flight_that_dies_at_the_same_step_is_joined_one_that_dies_far_apart_is_not():
    # g (dies at 6000) has written 10 MiB into zone 0 and has 240 MiB to come (its last request);
    # h (250 MiB) dies at 6000 too: sharing holds nothing dead, and the two tails become one
    # (u(500) = 0 against u(240) = 50 MiB of g's own), so h joins; dying at 16000 it would hold 250 MiB
    # of g's for 10,000 steps and opens instead.
    t = table()
    in_flight(t, "g", 0, 10 * M, 6000.0)
    a = bound(t)
    assert a.place(req(240 * M, 6000.0, 1000, gen="g")) == Decision(0, reclaim_step=6000.0)
    assert a.share_cost(t[0], 6000.0, 250 * M, 1000, "h") == (0, -50 * M * 5000.0)
    assert a.place(req(250 * M, 6000.0, 1000, gen="h")) == Decision(0, reclaim_step=6000.0)
    assert a.share_cost(t[0], 16000.0, 250 * M, 1000, "h") == (0, 240 * M * 10000.0 - 50 * M * 5000.0)
    assert a.place(req(250 * M, 16000.0, 1000, gen="h")) == Decision(1, reclaim_step=16000.0)
    t.on_group_end("g")
    assert a.place(req(250 * M, 6000.0, 1000, gen="h")).zone == 0    # a plain join again
