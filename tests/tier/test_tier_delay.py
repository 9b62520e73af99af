"""Keep until durable in the predicted reclaim step (docs/tiers.md, "The expected promotion delay"):
a generation the rule retires only once its promotion is verified dies locally at
``max(retirement, promotion finished)``, so its hint carries the expected promotion finish, from the
bandwidth the promoter measured (or its cap before any measurement) and the run's pace; placement
then groups it with the generations that really die with it."""

from __future__ import annotations

import math
import threading

import pytest

from retainz.hint import Hint, Lifetime
from retainz.retention import StepRate, UntilDurable, parse_condition, rule_hint, until_durable
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice

KiB = 1024


# -- retention: the prediction --------------------------------------------------------------------
RULE = "after_newer:k=2,of_class=interval,timing=after_commit"


@pytest.mark.parametrize("reclaim, durable, want", [
    (2000, 3999.2, 4000),        # the promotion outlasts the rule: it decides (whole steps)
    (5000, 4000, 5000),          # promoted before the rule retires it: the rule decides
    (4000, 4000, 4000),
    (math.inf, 9000, math.inf),  # permanent stays permanent
    (None, 4000, 4000),          # the rule cannot say when: the promotion is the one known bound
    (2000, None, 2000),          # no expectation (no bandwidth, no pace yet): the rule's hint
])
def test_until_durable_is_the_later_of_retirement_and_promotion(reclaim, durable, want):
    h = Hint(reclaim, Lifetime.SHORT if reclaim not in (None, math.inf) else Lifetime.NOT_SET, RULE,
             actual_reclaim_step=7000)
    out = until_durable(h, 1000, durable)
    assert out.reclaim_step == want and out.actual_reclaim_step == 7000
    if want == reclaim:
        assert out is h
    else:                                                       # the promotion decides, and says so
        assert out.kind == "until_durable"
        assert parse_condition(out.condition) == UntilDurable(want, RULE)
        assert parse_condition(parse_condition(out.condition).rule) == parse_condition(RULE)


def test_an_uncertain_death_the_promotion_outlasts_is_a_known_one():
    # a top-k save expected to be evicted at 3000 (or with no estimate) but promoted only at 9000 dies
    # at 9000: placement no longer treats it as uncertain (no zones kept apart for it)
    unc = "uncertain:earliest=2000,probability=0.9,expected=3000,basis=empirical"
    for reclaim in (3000, None):
        out = until_durable(Hint(reclaim, Lifetime.SHORT, unc), 1000, 9000)
        assert (out.reclaim_step, out.kind) == (9000, "until_durable")
    # evicted after the promotion: still uncertain
    late = Hint(20000, Lifetime.LONG, unc)
    assert until_durable(late, 1000, 9000) is late


def test_until_durable_reclassifies_the_longer_life_at_the_rules_bounds():
    h = rule_hint("torchtitan:interval=500,keep_latest_k=2", 1000)       # retired at 2000: SHORT
    assert (h.reclaim_step, h.lifetime) == (2000, Lifetime.SHORT)
    out = until_durable(h, 1000, 8000, short=1000, medium=10000)
    assert (out.reclaim_step, out.lifetime) == (8000, Lifetime.MEDIUM)
    # never a shorter class than the rule gave
    long = Hint(20000, Lifetime.LONG, "at_step:at=20000")
    assert until_durable(long, 1000, 25000).lifetime == Lifetime.LONG
    with pytest.raises(ValueError, match="NaN"):
        until_durable(h, 1000, float("nan"))


def test_step_rate_turns_seconds_into_steps_at_the_runs_pace():
    pace = StepRate(window=3)
    assert pace.steps_in(10.0) is None                         # one save: no pace yet
    pace.observe(500, 100.0)
    assert pace.steps_per_second() is None
    pace.observe(1000, 150.0)                                  # 500 steps in 50 s
    assert pace.steps_per_second() == 10.0 and pace.steps_in(30.0) == 300.0
    pace.observe(1500, 160.0)
    pace.observe(2000, 170.0)                                  # window 3: 1000 steps in 20 s
    assert pace.steps_per_second() == 50.0
    pace.observe(500, 300.0)                                   # a resumed run starts over
    assert pace.steps_in(1.0) is None
    assert pace.steps_in(None) is None
    with pytest.raises(ValueError):
        StepRate(window=1)


# -- placement: the generation lands with its real zone-mates ---------------------------------------
GEO = Geometry(nr_zones=12, zone_size=64 * KiB, zone_capacity=64 * KiB, block_size=4096, max_open=6,
               max_active=6)


def _zones(store, gid: str) -> set[int]:
    return {e[0] for s in store.generation(gid).shards.values() for e in s.extents}


def _put(store, gid: str, step: int, nbytes: int, hint: Hint) -> None:
    w = store.begin_generation(gid, step, hint=hint, declared_size=nbytes)
    w.write_counted_shard("model.bin", nbytes)
    w.commit()


@pytest.mark.parametrize("durable_step, mates", [(None, "a"), (4000, "b")])
def test_a_slow_promotion_predicts_a_later_death_and_groups_with_its_real_zone_mates(durable_step, mates):
    """``a`` dies at 2000, ``b`` at 4000, each filling 3/4 of a zone of its own.  ``x``'s rule retires it
    at 2000, but its promotion is expected to be verified only at 4000, so it really dies with ``b``.
    With the rule's hint alone it fills ``a``'s zone (and pins it from 2000 to 4000); with the expected
    promotion finish it fills ``b``'s."""
    store = Store.format(MemoryDevice(GEO, payload=False), meta_zones=2, policy="retainz")
    try:
        _put(store, "a", 1000, 48 * KiB, Hint(2000, Lifetime.SHORT, "after_newer:k=2"))
        _put(store, "b", 1000, 48 * KiB, Hint(4000, Lifetime.MEDIUM, "after_newer:k=6"))
        assert _zones(store, "a").isdisjoint(_zones(store, "b"))
        rule = Hint(2000, Lifetime.SHORT, "after_newer:k=2")
        hint = until_durable(rule, 1500, durable_step)
        _put(store, "x", 1500, 16 * KiB, hint)
        assert store.generation("x").hint.reclaim_step == (durable_step or 2000)
        assert _zones(store, "x") == _zones(store, mates)
    finally:
        store.close()


# -- the promoter: the expected delay, from the cap, then from what it measured ---------------------
pytest.importorskip("fsspec", reason="needs fsspec (the tier extra)")
from retainz.tier import MeasuredBandwidth, Promoter  # noqa: E402

TGEO = Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20, block_size=4096, max_open=6, max_active=6)


def _save(store, gid: str, step: int, n: int) -> None:
    w = store.begin_generation(gid, step)
    w.write_shard("model.bin", [bytes([step % 251]) * n])
    w.commit()


def test_measured_bandwidth_is_bytes_over_seconds_of_the_last_promotions():
    m = MeasuredBandwidth(window=2)
    assert m.rate() is None
    m.record(1000, 0.0)                   # no time passed: not a measurement
    m.record(0, 1.0)
    assert m.rate() is None
    m.record(1000, 1.0)
    m.record(3000, 1.0)
    assert m.rate() == 2000.0
    m.record(6000, 2.0)                   # window 2: (3000 + 6000) / 3 s
    assert m.rate() == 3000.0
    with pytest.raises(ValueError):
        MeasuredBandwidth(window=0)


def test_expected_delay_is_the_backlog_and_the_save_over_the_cap_then_the_measured_bandwidth(tmp_path, destination):
    dev = FileDevice.create(tmp_path / "dev.img", TGEO)
    store = Store.format(dev)
    t = [0.0]

    def sleep(s):
        t[0] += s

    url = destination.url
    try:
        for i, step in enumerate((10, 20, 30)):
            _save(store, f"step-{step}", step, 100_000 * (i + 1))
        p = Promoter(store, url, bandwidth=50_000, clock=lambda: t[0], sleep=sleep)
        assert p.expected_delay() is not None
        p.refresh()                                            # all three queued: 600,000 bytes
        # before any measurement: the cap; the new save taken as large as the newest (300,000)
        assert p.expected_delay() == (600_000 + 300_000) / 50_000
        assert p.expected_delay(0) == 600_000 / 50_000
        assert p.run_pending()
        # measured: each generation took its size over the cap, less the one-second burst
        rate = p.measured.rate()
        assert rate is not None and rate > 50_000
        assert p.expected_delay(100_000) == pytest.approx(100_000 / rate)      # nothing ahead any more
        assert Promoter(store, url).expected_delay() is None                  # no cap, nothing measured
    finally:
        store.close()
        dev.close()


# -- the DCP writer: the journaled hint carries the expected promotion finish -----------------------
def test_writer_hint_of_a_save_kept_until_durable_includes_the_expected_promotion_delay(tmp_path, monkeypatch,
                                                                                      destination):
    pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    import torch
    import torch.distributed.checkpoint as dcp

    import retainz.tier.promoter as promoter_mod
    from retainz.integrations.dcp import ZonedStorageWriter
    from retainz.jobs import stores

    fs = destination.faulty()
    fs.gate = threading.Event()                    # the destination stalls: nothing is measured
    real = promoter_mod.Destination
    monkeypatch.setattr(promoter_mod, "Destination", lambda url, **kw: real(url, storage_options=None, fs=fs))
    cap = 100_000
    w = ZonedStorageWriter(str(tmp_path / "dev.img"), retention="torchtitan:interval=10,keep_latest_k=2",
                           geometry=Geometry(nr_zones=12, zone_size=1 << 20, zone_capacity=1 << 20,
                                             block_size=4096, max_open=6, max_active=6),
                           promote=destination.url, promote_bandwidth=cap)
    clock = [0.0]
    w.clock = lambda: clock[0]
    try:
        for step in (10, 20, 30):
            clock[0] = step / 10.0                 # one save a second, 10 steps apart: 10 steps/s
            g = torch.Generator().manual_seed(step)
            dcp.save({"w": torch.randn(50_000, generator=g)}, storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")
        with stores.using(str(tmp_path / "dev.img")) as store:
            hints = {g.id: g.hint for g in store.generations()}
            sizes = {g.id: g.size for g in store.generations()}
    finally:
        fs.gate.set()
        w.close()
    rule = rule_hint("torchtitan:interval=10,keep_latest_k=2", 30)
    assert rule.reclaim_step == 50                                 # the rule alone: retired at step 50
    assert hints["step-10"].reclaim_step == 30                     # no pace yet at the first save
    # step-30 waits for step-10 and step-20 (stalled), then itself: at least their bytes over the cap
    least = 30 + 10 * (sizes["step-10"] + sizes["step-20"] + sizes["step-20"]) / cap
    assert hints["step-30"].reclaim_step >= least > 50
    cond = parse_condition(hints["step-30"].condition)
    assert cond == UntilDurable(hints["step-30"].reclaim_step, rule.condition)
