"""Replay's promotion delay (retainz.trace.promotion, ReplayConfig.promote_bandwidth): a FIFO queue at a
bandwidth in bytes per step, retirements deferred until the promotion is verified, fed to the real
store, so every policy and the oracle see the same deferred deletions and the practical policies'
hints carry the expected promotion finish."""

from __future__ import annotations

import math

import pytest

from retainz.cli import main
from retainz.hint import Hint
from retainz.store.store import Store
from retainz.trace.format import CommitEvent, DeleteEvent, SaveEvent, Shard
from retainz.trace.promotion import defer_retirements, promotion_finish
from retainz.trace.replay import ReplayConfig, read_events, replay
from tests.trace.test_replay import GEO, _strip, _trace


def _save(step, gen, n):
    return SaveEvent(step, gen, f"step-{step}", "interval", (Shard("a", n),), Hint(step + 20))


def _events():
    # three saves of 100 bytes, 10 steps apart; each deleted 20 steps after its save
    return [_save(0, 0, 100), CommitEvent(0, 0),
            _save(10, 1, 100), CommitEvent(10, 1),
            _save(20, 2, 100), CommitEvent(20, 2), DeleteEvent(20, 0),
            _save(30, 3, 100), CommitEvent(30, 3), DeleteEvent(30, 1),
            _save(40, 4, 100), CommitEvent(40, 4), DeleteEvent(40, 2)]


def test_the_queue_is_fifo_at_the_bandwidth():
    # 4 bytes a step: each 100-byte save takes 25 steps, longer than the 10 between saves
    assert promotion_finish(_events(), 4) == {0: 25.0, 1: 50.0, 2: 75.0, 3: 100.0, 4: 125.0}
    # fast enough: each finishes 1 step after its commit
    assert promotion_finish(_events(), 100) == {0: 1.0, 1: 11.0, 2: 21.0, 3: 31.0, 4: 41.0}
    for bad in (0, -1, 2.5, None):
        with pytest.raises(ValueError, match="promote_bandwidth"):
            promotion_finish(_events(), bad)


def test_deletions_wait_for_their_promotion_and_are_dropped_past_the_end():
    ev = _events()
    out, st = defer_retirements(ev, promotion_finish(ev, 4), 4)
    deletes = [(e.gen, e.step) for e in out if isinstance(e, DeleteEvent)]
    # gen 0 verified at 25: deleted at 25, after step 20's events, before step 30's; gen 1 at 50 and
    # gen 2 at 75 are past the last event (40): not deleted within the run
    assert deletes == [(0, 25)]
    assert [e.step for e in out] == sorted(e.step for e in out)
    i = next(k for k, e in enumerate(out) if isinstance(e, DeleteEvent))
    assert out[i - 1].step == 20 and out[i + 1].step == 30
    assert (st.deferred, st.dropped, st.max_delay_steps, st.mean_delay_steps) == (3, 2, 35.0, (5 + 20 + 35) / 3)
    assert st.max_lag_steps == 85.0                      # gen 4: committed at 40, verified at 125
    # nothing waits when promotion keeps ahead of the rule
    same, st = defer_retirements(ev, promotion_finish(ev, 100), 100)
    assert same == ev and st.deferred == st.dropped == 0


def test_a_deferred_deletion_lands_before_the_events_of_its_step():
    ev = _events()
    out, _ = defer_retirements(ev, {0: 29.2, 1: 11.0, 2: 21.0}, 5)
    assert [(type(e).__name__, e.step) for e in out][6:9] == [("DeleteEvent", 30), ("SaveEvent", 30),
                                                               ("CommitEvent", 30)]


@pytest.fixture
def recorded(monkeypatch):
    """What replay hands the store: (generation id, step, hint) of each save, (id, step) of each delete."""
    saves, deletes = [], []
    begin, delete = Store.begin_generation, Store.delete

    def rec_begin(self, gid, step, *a, hint=None, **kw):
        saves.append((gid, step, hint))
        return begin(self, gid, step, *a, hint=hint, **kw)

    def rec_delete(self, gid, *a, step=None, **kw):
        deletes.append((gid, step))
        return delete(self, gid, *a, step=step, **kw)

    monkeypatch.setattr(Store, "begin_generation", rec_begin)
    monkeypatch.setattr(Store, "delete", rec_delete)
    return saves, deletes


def test_every_policy_and_the_oracle_see_the_deferred_deletions(tmp_path, recorded):
    saves, deletes = recorded
    t = _trace(tmp_path, steps=400)              # keep 3 every 10 steps, ~105 KiB a save
    _, events = read_events(t)
    size = next(e.nbytes for e in events if isinstance(e, SaveEvent))
    bw = size // 25                               # a save takes 25 steps to promote: the backlog grows
    finish = promotion_finish(events, bw)
    deferred, _ = defer_retirements(events, finish, bw)
    want_deletes = [(e.step, e.gen) for e in deferred if isinstance(e, DeleteEvent)]
    assert len(want_deletes) < sum(isinstance(e, DeleteEvent) for e in events)    # some dropped
    actual = {e.gen: e.step for e in deferred if isinstance(e, DeleteEvent)}
    rule = {e.gen: e.hint.reclaim_step for e in events if isinstance(e, SaveEvent)}
    results = {}
    for policy in ("oracle", "retainz", "greedy"):
        saves.clear()
        deletes.clear()
        results[policy] = replay(t, ReplayConfig(policy=policy, zones=40, promote_bandwidth=bw, **GEO))
        assert [(s, int(g.split("-")[0])) for g, s in deletes] == want_deletes
        for gid, _step, hint in saves:
            g = int(gid.split("-")[0])
            assert hint.actual_reclaim_step == actual.get(g, math.inf)            # the oracle's death
            if rule[g] >= finish[g]:
                assert hint.reclaim_step == rule[g]                              # promoted before retired
            else:                                                                # the promotion decides
                assert (hint.reclaim_step, hint.kind) == (math.ceil(finish[g]), "until_durable")
    r = results["retainz"]["promotion"]
    assert r["bandwidth"] == bw and r["dropped"] > 0 and r["deferred"] > r["dropped"]
    assert r["hint"] is True and r["peak_live_bytes_undeferred"] < results["retainz"]["peak_live_bytes"]
    # the ablation: the same deletions, the rule's hints alone
    saves.clear()
    deletes.clear()
    replay(t, ReplayConfig(policy="retainz", zones=40, promote_bandwidth=bw, promote_hint=False, **GEO))
    assert [(s, int(g.split("-")[0])) for g, s in deletes] == want_deletes
    assert all(hint.reclaim_step == rule[int(gid.split("-")[0])] for gid, _, hint in saves)


def test_a_bandwidth_that_keeps_up_changes_nothing(tmp_path):
    t = _trace(tmp_path)
    base = replay(t, ReplayConfig(policy="retainz", pressure=0.8, **GEO))
    fast = replay(t, ReplayConfig(policy="retainz", pressure=0.8, promote_bandwidth=1 << 40, **GEO))
    p = fast.pop("promotion")
    assert p["deferred"] == 0 and p["max_lag_steps"] < 1
    assert _strip(fast) == _strip(base)


@pytest.mark.parametrize("kwargs, message", [
    ({"promote_bandwidth": 0}, "promote_bandwidth must be a positive"),
    ({"promote_bandwidth": 1.5}, "promote_bandwidth must be an integer"),
    ({"promote_hint": "no"}, "promote_hint must be true or false"),
])
def test_a_bad_promotion_setting_is_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as ei:
        ReplayConfig(policy="retainz", zones=4, **kwargs)
    assert "\n" not in str(ei.value)


def test_cli_takes_the_bandwidth_and_gives_it_back(tmp_path, capsys):
    cfg = ReplayConfig(policy="greedy", zones=40, promote_bandwidth=4096, promote_hint=False, **GEO)
    import argparse

    from retainz.cli.replay import config_from_args, register

    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    assert config_from_args(p.parse_args(["replay", "t", *cfg.cli_args()])) == cfg
    t = _trace(tmp_path)
    assert main(["replay", t, "--zones", "40", "--zone-size", "256KiB", "--zone-capacity", "192KiB",
                 "--max-active", "6", "--max-open", "6", "--promote-bandwidth", "0"]) == 2
    assert "argument --promote-bandwidth: '0' is zero: give a positive size" in capsys.readouterr().err   # the flag
