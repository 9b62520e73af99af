"""Matched controls: each differs from ``retainz`` in exactly one thing; the registry parses specs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from retainz.hint import Hint, Lifetime
from retainz.placement import NO_SPACE, POLICIES, Decision, ExtentRequest, ZoneTable, make_allocator
from retainz.placement.hints import (
    class_reclaim_step,
    view_reclaim_step,
)
from retainz.placement.retainz import RetainZ
from tests.placement.test_placement_retainz import mixed_trace
from tests.store_events import keep_latest_trace, run

INF = math.inf


def req(r, step=1000, now=1000, gen="g1", actual=None, lifetime=0, nbytes=10):
    return ExtentRequest(nbytes=nbytes, generation=gen, step=step, now=now,
                         hint=Hint(reclaim_step=r, lifetime=lifetime, actual_reclaim_step=actual))


# -- registry ------------------------------------------------------------------------------------------
def test_every_policy_is_registered():
    assert set(POLICIES) == {"retainz", "retainz-nohint", "retainz-coarse", "retainz-noisy", "retainz-inferred",
                             "common", "dedicated", "greedy", "oracle", "zenfs", "zenfs-nohint"}
    for name in POLICIES:
        assert make_allocator(name).name == name


@pytest.mark.parametrize("spec, message", [
    ("bogus", "unknown policy 'bogus'; valid: common, dedicated, greedy, oracle, retainz, "
              "retainz-coarse, retainz-inferred, retainz-nohint, retainz-noisy, zenfs, zenfs-nohint"),
    ("retainz-noisy:sigma=1", "policy retainz-noisy has no parameter 'sigma'; valid: unknown_lifetime, "
                              "neighbors, wait_frac, wait_steps, recompute, uncertain_saves, open_unused, error, "
                              "seed"),
    ("greedy:x=1", "policy greedy has no parameter 'x'; valid: none"),
    ("zenfs:finish_threshold=ten", "policy zenfs: finish_threshold='ten' is not an integer"),
    ("retainz:recompute=maybe", "policy retainz: recompute='maybe' is not a bool"),
    ("retainz:neighbors", "policy retainz: expected key=value, got 'neighbors'"),
])
def test_registry_errors_list_valid_names(spec, message):
    with pytest.raises(ValueError) as e:
        make_allocator(spec)
    assert str(e.value) == message


@pytest.mark.parametrize("spec, message", [
    ("common:width=-1", "policy common: width=-1 is out of range; valid: an integer >= 0"),
    ("retainz:neighbors=-5", "policy retainz: neighbors=-5 is out of range; valid: an integer >= 1"),
    ("retainz:neighbors=0", "policy retainz: neighbors=0 is out of range; valid: an integer >= 1"),
    ("retainz:unknown_lifetime=0",
     "policy retainz: unknown_lifetime=0 is out of range; valid: an integer >= 1"),
    ("retainz:wait_frac=-0.5",
     "policy retainz: wait_frac=-0.5 is out of range; valid: a finite number >= 0"),
    ("retainz:wait_steps=-1", "policy retainz: wait_steps=-1 is out of range; valid: an integer >= 0"),
    ("oracle:neighbors=-1", "policy oracle: neighbors=-1 is out of range; valid: an integer >= 1"),
    ("retainz-noisy:error=-3",
     "policy retainz-noisy: error=-3.0 is out of range; valid: a finite number >= 0 and <= 1"),
    ("retainz-noisy:error=1.5",
     "policy retainz-noisy: error=1.5 is out of range; valid: a finite number >= 0 and <= 1"),
    ("retainz-coarse:short=0", "policy retainz-coarse: short=0 is out of range; valid: an integer >= 1"),
    ("retainz-coarse:short=100,medium=50",
     "policy retainz-coarse: medium=50 is out of range; valid: an integer >= 100"),
    ("zenfs:reserved_zones=-100",
     "policy zenfs: reserved_zones=-100 is out of range; valid: an integer >= 0"),
    ("zenfs:finish_threshold=101",
     "policy zenfs: finish_threshold=101 is out of range; valid: an integer >= 0 and <= 100"),
    ("zenfs:medium=-1", "policy zenfs: medium=-1 is out of range; valid: an integer >= 1000"),
    ("retainz:wait_frac=nan", "policy retainz: wait_frac='nan' is not a finite number"),
    ("retainz:wait_frac=inf", "policy retainz: wait_frac='inf' is not a finite number"),
    ("retainz-noisy:error=-inf", "policy retainz-noisy: error='-inf' is not a finite number"),
])
def test_registry_refuses_out_of_range_parameters(spec, message):
    with pytest.raises(ValueError) as e:
        make_allocator(spec)
    assert str(e.value) == message


def test_policies_validate_when_built_directly():
    with pytest.raises(ValueError, match=r"policy retainz: wait_frac=nan is out of range"):
        RetainZ(wait_frac=math.nan)
    edge = make_allocator("retainz-noisy:error=0,seed=-4")   # the bounds themselves are valid
    assert (edge.error, edge.seed) == (0.0, -4)
    assert make_allocator("retainz-noisy:error=1").error == 1.0
    assert make_allocator("zenfs:reserved_zones=0,finish_threshold=100").reserved_zones == 0
    assert make_allocator("common:width=1").width == 1


def test_registry_parses_parameters():
    a = make_allocator("retainz-noisy:error=0.25,seed=7")
    assert (a.error, a.seed) == (0.25, 7)
    assert a.describe() == ("retainz-noisy:unknown_lifetime=5000,neighbors=2,wait_frac=0.1,"
                            "wait_steps=0,recompute=False,uncertain_saves=True,open_unused=None,error=0.25,seed=7")


# -- the hint views --------------------------------------------------------------------------------------
@pytest.mark.parametrize("view, r, kw, expect", [
    ("exact", 6000.0, {}, 6000.0),
    ("none", 6000.0, {}, None),
    ("coarse", 6000.0, {}, 1000 + math.sqrt(1000 * 10000)),      # MEDIUM
    ("coarse", 1500.0, {}, 1500.0),                               # SHORT: 1000 + 1000/2
    ("coarse", 20000.0, {}, 41000.0),                             # LONG: 1000 + 4 * 10000
    ("coarse", INF, {}, INF),
    ("coarse", None, {}, None),
    ("oracle", 6000.0, {}, 6000.0),                               # no actual step: the prediction
    ("noisy", INF, {"error": 0.5}, INF),
    ("noisy", None, {"error": 0.5}, None),
    ("noisy", 6000.0, {"error": 0.0}, 6000.0),
])
def test_views(view, r, kw, expect):
    assert view_reclaim_step(req(r), view, **kw) == expect


def test_coarse_uses_the_hints_class_when_it_has_no_step():
    assert view_reclaim_step(req(None, lifetime=Lifetime.LONG), "coarse") == 41000.0
    assert class_reclaim_step(Lifetime.EXTREME, 5) == INF
    assert class_reclaim_step(Lifetime.MEDIUM, 0) == pytest.approx(3162.2776601683795)


def test_oracle_reads_the_actual_step():
    assert view_reclaim_step(req(6000.0, actual=7500.0), "oracle") == 7500.0


def test_noise_is_bounded_seeded_and_per_generation():
    seen = set()
    for g in range(50):
        v = view_reclaim_step(req(6000.0, gen=f"g{g}"), "noisy", error=0.5, seed=1)
        assert 1000 + 5000 * 0.5 <= v <= 1000 + 5000 * 1.5
        assert v == view_reclaim_step(req(6000.0, gen=f"g{g}", nbytes=99), "noisy", error=0.5, seed=1)
        seen.add(v)
    assert len(seen) == 50
    assert view_reclaim_step(req(6000.0), "noisy", error=0.5, seed=1) != \
        view_reclaim_step(req(6000.0), "noisy", error=0.5, seed=2)


# -- each hint control is retainz on its view, nothing else ---------------------------------------------
def twin_tables():
    out = []
    for _ in range(2):
        t = ZoneTable({z: 100 for z in range(8)}, max_active=3)
        t.on_write(0, 40, reclaim_step=3000.0, lifetime=0, step=0)
        t.on_write(1, 70, reclaim_step=6500.0, lifetime=0, step=500)
        t.on_write(2, 10, reclaim_step=INF, lifetime=0, step=500)
        out.append(t)
    return out


@pytest.mark.parametrize("spec", ["retainz-nohint", "retainz-coarse", "retainz-noisy:error=0.4,seed=3",
                                  "oracle"])
@pytest.mark.parametrize("r, actual", [(6000.0, 9000.0), (INF, INF), (2000.0, 1500.0), (None, None)])
def test_hint_control_is_retainz_on_its_view(spec, r, actual):
    control = make_allocator(spec)
    plain = RetainZ()
    tc, tp = twin_tables()
    control.bind(tc)
    plain.bind(tp)
    rq = req(r, actual=actual, nbytes=30)
    viewed = dataclasses.replace(rq, hint=Hint(reclaim_step=view_reclaim_step(
        rq, control.view, **control._view_kwargs())))
    assert control.place(rq) == plain.place(viewed)


@pytest.mark.parametrize("spec", ["retainz-noisy:error=0", "oracle"])
def test_controls_equal_retainz_when_their_view_is_exact(spec):
    # keep-latest: the actual deletion step is the prediction (or absent, at the end of the run)
    events = keep_latest_trace(saves=40, gen_bytes=250, shards=4, interval=100, k=3)
    kw = dict(zones=20, capacity=100, max_active=4)
    control, plain = run(spec, events, **kw), run("retainz", events, **kw)
    assert control.stop is plain.stop is None
    assert len(plain.decisions) > 40
    assert repr(control.decisions) == repr(plain.decisions)


# -- common, dedicated, greedy -------------------------------------------------------------------------
def zone_gens(d):
    """The generations each zone held between its opening and its reset (from the store's catalog)."""
    return list(d.zone_gens.values())


def test_dedicated_never_shares_a_zone():
    d = run("dedicated", mixed_trace(saves=30, size=90), zones=60, capacity=100, max_active=4)
    assert d.metrics()["stop_step"] is None
    assert zone_gens(d) and all(len(g) <= 1 for g in zone_gens(d))
    # the budget forces finishing partly used zones (an open zone is never full)
    assert d.metrics()["finishes"] == sum(len(dec.finish) for *_, dec in d.decisions) > 0


def test_common_spreads_every_generation_over_the_shared_zones():
    d = run("common", [ev for ev in mixed_trace(saves=4, size=90) if ev[0] == "save"], zones=20,
            capacity=100, max_active=3)
    assert len(d.store.table.open) == 3
    shared = [g for g in zone_gens(d) if len(g) > 1]
    assert len(shared) >= 2


def test_common_width_parameter():
    t = ZoneTable({z: 100 for z in range(8)})
    a = make_allocator("common:width=2")
    a.bind(t)
    assert a.place(req(5000.0)) == Decision(0, reclaim_step=5000.0)
    t.on_write(0, 10, reclaim_step=5000.0, lifetime=0, step=0)
    assert a.place(req(5000.0)).zone == 1
    t.on_write(1, 20, reclaim_step=5000.0, lifetime=0, step=0)
    assert a.place(req(9000.0)).zone == 0      # the most remaining capacity, whatever the step


def test_greedy_keeps_one_log():
    d = run("greedy", mixed_trace(saves=30, size=90), zones=40, capacity=100, max_active=4)
    assert d.metrics()["stop_step"] is None
    assert len(d.store.table.open) <= 1


@pytest.mark.parametrize("policy", ["common", "dedicated", "greedy"])
def test_sharing_controls_ignore_the_reclaim_step(policy):
    # the same bytes with different (or no) hints go to the same zones
    a = run(policy, mixed_trace(saves=20, size=90), zones=40, capacity=100, max_active=4)
    events = [ev if ev[0] == "delete" else (*ev[:4], Hint()) for ev in mixed_trace(saves=20, size=90)]
    b = run(policy, events, zones=40, capacity=100, max_active=4)
    assert [d[3].zone for d in a.decisions] == [d[3].zone for d in b.decisions]


@pytest.mark.parametrize("policy", ["greedy", "common", "dedicated", "zenfs", "retainz", "oracle"])
def test_every_decision_carries_the_generations_reclaim_step(policy):
    """The store records a decision's reclaim step as the zone's (and journals it): a policy whose view
    of the hint is exact must hand back the generation's own reclaim step on every branch (first
    extent, continuing a zone, opening one, finishing one)."""
    events = mixed_trace(saves=40)
    hints = {e[1]: e[4] for e in events if e[0] == "save"}
    d = run(policy, events, zones=29, capacity=64, max_active=4)   # 32 zones: ZenFS's minimum
    placed = [(g, dec) for g, _, gc, dec in d.decisions if not gc and dec.zone is not None]
    assert len(placed) > 90
    assert [(g, dec.reclaim_step) for g, dec in placed] == [(g, hints[g].reclaim_step) for g, _ in placed]
    assert {hints[g].reclaim_step for g, _ in placed} >= {INF, 300.0}


@pytest.mark.parametrize("max_active, width", [(0, 4), (3, 3), (6, 6)])
def test_common_width_defaults_to_the_active_budget_or_4_when_unlimited(max_active, width):
    t = ZoneTable({z: 100 for z in range(10)}, max_active=max_active)
    a = make_allocator("common")
    a.bind(t)
    zones = []
    for _ in range(8):
        z = a.place(req(5000.0)).zone
        t.on_write(z, 10, reclaim_step=5000.0, lifetime=0, step=0)
        zones.append(z)
    assert zones[:width] == list(range(width))           # opens up to the width ...
    assert set(zones[width:]) <= set(range(width))       # ... then only shares those


def test_common_breaks_a_tie_in_remaining_capacity_by_the_lowest_zone():
    t = ZoneTable({z: 100 for z in range(8)})
    a = make_allocator("common:width=3")
    a.bind(t)
    for z in (0, 1, 2):
        t.on_write(z, 30 if z == 0 else 10, reclaim_step=1.0, lifetime=0, step=0)
    assert a.place(req(1.0)).zone == 1                   # zones 1 and 2 tie with 90 left


def test_dedicated_finishes_exactly_enough_of_the_fullest_open_zones():
    """At the active budget a new generation's first zone needs one active resource: the open zone
    with the least remaining capacity goes (ties: lowest index), and only as many as needed."""
    t = ZoneTable({z: 100 for z in range(10)}, max_active=3)
    a = make_allocator("dedicated")
    a.bind(t)
    for i, used in enumerate((50, 20, 50)):
        d = a.place(req(1.0, gen=f"g{i}"))
        assert d == Decision(i, reclaim_step=1.0)
        t.on_write(i, used, reclaim_step=1.0, lifetime=0, step=0)
    d = a.place(req(2.0, gen="g3"))
    assert d == Decision(3, finish=(0,), reclaim_step=2.0)
    assert a.place(req(1.0, gen="g1")) == Decision(1, reclaim_step=1.0)   # g1 keeps its own zone


def test_dedicated_finishes_nothing_on_a_device_without_an_active_limit():
    t = ZoneTable({z: 100 for z in range(4)}, max_active=0)
    a = make_allocator("dedicated")
    a.bind(t)
    for i in range(3):
        assert a.place(req(1.0, gen=f"g{i}")) == Decision(i, reclaim_step=1.0)
        t.on_write(i, 10, reclaim_step=1.0, lifetime=0, step=0)


def test_greedy_with_every_zone_full_answers_exactly_no_space():
    t = ZoneTable({z: 100 for z in range(2)}, max_active=0)
    a = make_allocator("greedy")
    a.bind(t)
    for z in range(2):
        t.on_write(z, 100, reclaim_step=1.0, lifetime=0, step=0)
    assert a.place(req(5.0)) == NO_SPACE

def test_dedicated_forgets_a_zone_once_it_is_full_or_reset():
    t = ZoneTable({z: 100 for z in range(10)}, max_active=0)
    a = make_allocator("dedicated")
    a.bind(t)
    assert a.place(req(1.0, gen="g0")).zone == 0
    t.on_write(0, 100, reclaim_step=1.0, lifetime=0, step=0)     # full: g0 moves on
    assert a.place(req(1.0, gen="g0")).zone == 1
    t.on_write(1, 10, reclaim_step=1.0, lifetime=0, step=0)
    assert a.place(req(1.0, gen="g1")).zone == 2                  # g1 never shares g0's zone
    t.on_write(2, 10, reclaim_step=1.0, lifetime=0, step=0)
    assert a.place(req(1.0, gen="g0")).zone == 1                  # g0 still owns zone 1


def test_noisy_view_is_step_plus_lifetime_times_one_plus_the_generations_draw():
    import random

    eps = random.Random("3:g7").uniform(-0.5, 0.5)        # one draw per (seed, generation)
    assert view_reclaim_step(req(6000.0, gen="g7"), "noisy", error=0.5, seed=3) == 1000 + 5000 * (1 + eps)
    assert view_reclaim_step(req(1000.0, gen="g7"), "noisy", error=0.5, seed=3) == 1000.0   # no lifetime left
    assert view_reclaim_step(req(900.0, gen="g7"), "noisy", error=0.5, seed=3) == 1000.0    # overdue: now


def test_coarse_view_uses_the_given_class_bounds():
    from retainz.hint import lifetime_class

    r = req(1050.0, step=1000)
    custom = view_reclaim_step(r, "coarse", short=10, medium=100)
    assert custom == class_reclaim_step(lifetime_class(1050.0, 1000, short=10, medium=100), 1000,
                                        short=10, medium=100)
    assert custom != view_reclaim_step(r, "coarse")
    lt = req(None, step=1000, lifetime=Lifetime.MEDIUM)
    assert view_reclaim_step(lt, "coarse", short=10, medium=100) == class_reclaim_step(
        Lifetime.MEDIUM, 1000, short=10, medium=100) != view_reclaim_step(lt, "coarse")


def test_coarse_view_classifies_by_the_given_medium_bound_too():
    # lifetime 500 is LONG under medium=100 (the default bounds would call it MEDIUM)
    r = req(1500.0, step=1000)
    assert view_reclaim_step(r, "coarse", short=10, medium=100) == 1000 + 4.0 * 100


def test_view_defaults_are_no_noise_and_seed_zero():
    r = req(6000.0, gen="g7")
    assert view_reclaim_step(r, "noisy") == 6000.0                      # error defaults to 0: exact
    seeded = view_reclaim_step(r, "noisy", error=0.5, seed=0)
    assert view_reclaim_step(r, "noisy", error=0.5) == seeded != view_reclaim_step(r, "noisy", error=0.5, seed=1)


def test_no_noise_keeps_even_an_overdue_prediction():
    # error 0 returns the prediction itself, also one already behind the save's step
    assert view_reclaim_step(req(900.0, step=1000), "noisy", error=0.0, seed=3) == 900.0


def test_permanent_stays_permanent_under_any_noise():
    # an error above 1 could scale a lifetime by a negative factor; a permanent save is never drawn
    assert {view_reclaim_step(req(INF, gen=f"g{g}"), "noisy", error=3.0, seed=g) for g in range(40)} == {INF}

def test_unknown_view_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"^unknown hint view 'fuzzy'; valid: exact, none, coarse, noisy, oracle$"):
        view_reclaim_step(req(1.0), "fuzzy")


def test_dedicated_by_job_owner_is_the_job():
    """dedicated:by=job keys zones by the job (a fleet name's part before ':', else the series folder);
    by=generation (the default) keys them by the generation."""
    by_job = make_allocator("dedicated:by=job")
    assert by_job._owner_of("j3:step-500") == "j3" == by_job._owner_of("j3:step-1000")
    # replay's ids carry the trace's save counter (every id was its own "job" before)
    assert by_job._owner_of("00000012-j3:step-500") == "j3" == by_job._owner_of("00000040-j3:step-1000")
    assert by_job._owner_of("jobs%2Fa%2Fstep-500") == "jobs/a"
    assert by_job._owner_of("@run%2Flast.ckpt#2") == "run"
    assert make_allocator("dedicated")._owner_of("j3:step-500") == "j3:step-500"
    with pytest.raises(ValueError, match="by must be generation or job"):
        make_allocator("dedicated:by=rank")
