"""Megatron-LM / NVRx retention reproduced on the store (their code ships in no wheel): the same
save/purge sequence the runtime runs, and the generation sets after each step; plus the TorchTitan-style
KeepLatestK for ZonedStorageWriter users."""

from __future__ import annotations

import pytest

from retainz.integrations.retention_callbacks import (
    KeepLatestK,
    MegatronNonPersistentGlobal,
    MegatronNonPersistentLocal,
    MegatronRetainInterval,
)


@pytest.fixture
def new_store():
    from retainz.store import Store
    from retainz.zoned import Geometry, MemoryDevice

    stores = []

    def make():
        s = Store.format(MemoryDevice(Geometry(nr_zones=64, zone_size=64 << 10, zone_capacity=64 << 10)))
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


def _save(store, cb, step, **kw):
    gid = cb.generation_id(step, **kw)
    w = store.begin_generation(gid, step, hint=cb.hint(step))
    w.write_shard("model_optim_rng.pt", [bytes([step % 251]) * 5000])
    w.commit()
    return gid


def _steps(store):
    return sorted(g.step for g in store.generations())


def test_megatron_retain_interval(new_store):
    """--save-interval 100 --save-retain-interval 300: the latest plus every 300th; the previous
    checkpoint is deleted at finalize of the next (after it committed)."""
    store = new_store()
    cb = MegatronRetainInterval(100, 300)
    seen = {}
    for it in range(100, 1001, 100):
        assert cb.before_save(store, it) == []
        _save(store, cb, it)
        deleted = cb.after_commit(store, it)
        seen[it] = (_steps(store), deleted)
    assert seen == {
        100: ([100], []),
        200: ([200], ["iter_0000100"]),
        300: ([300], ["iter_0000200"]),
        400: ([300, 400], []),
        500: ([300, 500], ["iter_0000400"]),
        600: ([300, 600], ["iter_0000500"]),
        700: ([300, 600, 700], []),
        800: ([300, 600, 800], ["iter_0000700"]),
        900: ([300, 600, 900], ["iter_0000800"]),
        1000: ([300, 600, 900, 1000], []),
    }
    # hints from the project's retention rules: every 300th permanent, others die at the next save
    assert store.generation("iter_0000300").hint.reclaim_step == float("inf")
    assert store.generation("iter_0001000").hint.reclaim_step == 1100


@pytest.mark.parametrize("recover", [True, False])
def test_megatron_retain_interval_recovers_tracker_after_restart(new_store, recover):
    """Megatron reads ``prev`` from its tracker file on every finalize, restarted or not: a callback made
    afresh deletes the previous non-multiple once the next save commits, ``recover`` called or not."""
    store = new_store()
    cb = MegatronRetainInterval(100, 300)
    for it in (100, 200):
        _save(store, cb, it)
        cb.after_commit(store, it)
    restarted = MegatronRetainInterval(100, 300)
    if recover:
        assert restarted.recover(store) == 200
    _save(store, restarted, 300)
    assert restarted.after_commit(store, 300) == ["iter_0000200"]
    assert _steps(store) == [300]


def test_megatron_without_retain_interval_keeps_everything(new_store):
    store = new_store()
    cb = MegatronRetainInterval(100)
    for it in range(100, 501, 100):
        _save(store, cb, it)
        assert cb.after_commit(store, it) == []
    assert _steps(store) == [100, 200, 300, 400, 500]


def test_megatron_nonpersistent_global(new_store):
    """--non-persistent-save-interval 50 (--save-interval 100 takes its steps): before each new
    non-persistent save, keep the newest and delete the rest: two on disk in steady state."""
    store = new_store()
    cb = MegatronNonPersistentGlobal(50, save_interval=100)
    seen = {}
    for it in range(50, 451, 50):
        if not cb.is_save_step(it):
            continue
        deleted = cb.before_save(store, it)
        _save(store, cb, it)
        seen[it] = (_steps(store), deleted)
    assert seen == {
        50: ([50], []),
        150: ([50, 150], []),
        250: ([150, 250], ["non_persistent-iter_0000050"]),
        350: ([250, 350], ["non_persistent-iter_0000150"]),
        450: ([350, 450], ["non_persistent-iter_0000250"]),
    }
    assert store.generation("non_persistent-iter_0000450").hint.reclaim_step == 650


def test_megatron_nonpersistent_global_never_counts_an_inflight_save(new_store):
    """Only committed generations count: with the newest save still being written, the last
    committed one survives (Megatron, looking at directories, would keep the in-flight one instead)."""
    store = new_store()
    cb = MegatronNonPersistentGlobal(50)
    _save(store, cb, 50)
    _save(store, cb, 100)
    inflight = store.begin_generation(cb.generation_id(150), 150)
    inflight.write_shard("model_optim_rng.pt", [b"x" * 100])
    assert cb.before_save(store, 200) == ["non_persistent-iter_0000050"]
    assert _steps(store) == [100]
    inflight.abort()


def test_nvrx_local_checkpoints_on_two_ranks(new_store):
    """Per-rank iter_N_rank_local; after every rank committed the new iteration, all older iterations
    are unlinked on every rank; nothing is deleted while a rank has not committed."""
    stores = [new_store(), new_store()]
    cb = MegatronNonPersistentLocal(10, ranks=2)
    for it in (10, 20):
        for rank, s in enumerate(stores):
            _save(s, cb, it, rank=rank)
        cb.after_commit_all(stores, it)
        assert [_steps(s) for s in stores] == [[it], [it]]
    _save(stores[0], cb, 30, rank=0)                     # rank 1 has not finished iteration 30
    with pytest.raises(RuntimeError, match="rank 1 has not committed iteration 30: nothing is deleted"):
        cb.after_commit_all(stores, 30)
    assert [_steps(s) for s in stores] == [[20, 30], [20]]
    _save(stores[1], cb, 30, rank=1)
    assert cb.after_commit_all(stores, 30) == [["iter_0000020_0_local"], ["iter_0000020_1_local"]]
    assert stores[1].generation("iter_0000030_1_local").hint.reclaim_step == 40


def test_keep_latest_k_like_torchtitan(new_store):
    store = new_store()
    cb = KeepLatestK(2, interval=10)
    seen = {}
    for step in (10, 20, 30, 40):
        _save(store, cb, step)
        seen[step] = cb.after_commit(store, step)
    assert seen == {10: [], 20: [], 30: ["step-10"], 40: ["step-20"]}
    assert _steps(store) == [30, 40]
    with pytest.raises(ValueError, match="keep_latest_k=1 is rejected"):
        KeepLatestK(1)


def test_megatrons_purge_is_modelled_once(new_store):
    """The driven rule (traces), the DCP writer's enacted rule and the callbacks keep the same
    persistent iterations after every commit (one model: rules_megatron.retain_interval_retired)."""
    from retainz.retention.base import drive, parse_rule
    from retainz.retention.retire import retired_after_commit

    rule = parse_rule("megatron:save_interval=100,retain_interval=300")
    store, cb = new_store(), MegatronRetainInterval(100, 300)
    driven: set[str] = set()
    enacted: list[str] = []
    after: dict[int, tuple] = {}
    for a in drive(rule.start(1000)):
        if a.kind == "commit":
            driven.add(a.name)
            enacted.append(a.name)
            for gid in retired_after_commit(rule, [(n, n) for n in enacted]):
                enacted.remove(gid)
            _save(store, cb, a.step)
            cb.after_commit(store, a.step)
        elif a.kind == "delete":
            driven.discard(a.name)
        after[a.step] = (sorted(driven), sorted(enacted), sorted(g.id for g in store.generations()))
    assert all(d == e == c for d, e, c in after.values()), after
    assert after[1000][0] == ["iter_0000300", "iter_0000600", "iter_0000900", "iter_0001000"]
