"""The mount's path -> generation mapping and commit points (no FUSE), and retention inference:
the rule ``--retention auto`` infers from each runtime's real save/delete sequence, and the
``retainz-inferred`` replay policy."""

from __future__ import annotations

import math

import pytest

from retainz import ids
from retainz.namespace import names as L
from retainz.retention.inference import RetentionInference
from retainz.retention.steps import parse_step
from retainz.trace.format import DeleteEvent, SaveEvent
from retainz.trace.generate import write_generated
from retainz.trace.io import TraceReader


@pytest.mark.parametrize("path, root", [
    ("run/checkpoint-500/model.safetensors", "run/checkpoint-500"),
    ("run/checkpoint-500/global_step500/mp_rank_00_model_states.pt", "run/checkpoint-500"),   # outermost
    ("save/iter_0001000/mp_rank_00/model_optim_rng.pt", "save/iter_0001000"),
    ("ds/global_step20/zero_pp_rank_0_mp_rank_00_optim_states.pt", "ds/global_step20"),
    ("hf/tmp-checkpoint-4/trainer_state.json", "hf/tmp-checkpoint-4"),
    ("titan/step-10/__0_0.distcp", "titan/step-10"),
    ("any/dir/.metadata", "any/dir"),                                  # DCP files: the fsspec rule
    ("save/latest_checkpointed_iteration.txt", None),
    ("lightning/epoch=0-step=8.ckpt", None),                           # a file: its own generation
    ("model.pt", None),
    ("step-10.pt/x", None),
])
def test_checkpoint_root(path, root):
    assert L.checkpoint_root(path) == root


def test_lightning_ckpt_directory_needs_to_be_a_directory():
    assert L.checkpoint_root("l/epoch=1-step=20.ckpt/checkpoint/mp_rank_00_model_states.pt",
                             lambda p: p == "l/epoch=1-step=20.ckpt") == "l/epoch=1-step=20.ckpt"
    assert parse_step("epoch=1-step=20.ckpt", file_names=True) == 20


def test_ids_round_trip_and_match_the_fsspec_ids():
    generation_for = L.generation_for  # the one implementation the fsspec face and the mount both call

    assert ids.dir_generation_id("ckpt/step-500") == generation_for("ckpt/step-500/.metadata")[0] == "ckpt%2Fstep-500"
    assert ids.file_generation_id("l/epoch=0-step=10.ckpt") == generation_for("l/epoch=0-step=10.ckpt")[0]
    for path in ("a/b c/d%e", "x/a..b", "we#ird/name"):
        for v in (0, 3):
            assert ids.parse_generation_id(ids.file_generation_id(path, v)) == ("file", path, v)
            assert ids.parse_generation_id(ids.dir_generation_id(path, v)) == ("dir", path, v)
    from retainz.store.format import check_id

    for rel in ("mp_rank_00/model_optim_rng.pt", "50%/a..b", ".metadata"):
        name = ids.shard_name(rel)
        check_id(name, "shard name")
        assert ids.shard_path(name) == rel and name != L.LAYOUT_SHARD
    assert ids.shard_name(".metadata") == ".metadata"


@pytest.mark.parametrize("directory, files, point", [
    ("m/iter_0000100", {"mp_rank_00/model_optim_rng.pt"}, "megatron-tracker"),
    ("m/iter_0000100", {"__0_0.distcp", ".metadata"}, "megatron-tracker"),   # torch_dist: metadata.json after
    ("d/global_step5", {"mp_rank_00_model_states.pt"}, "deepspeed-latest"),
    ("h/checkpoint-5", {"model.safetensors"}, "hf-trainer-state"),
    ("h/tmp-checkpoint-5", {"model.safetensors"}, "hf-rename"),
    ("t/step-5", {"__0_0.distcp"}, "dcp-metadata"),
    ("t/step-5", {"model.pt"}, "closed"),
])
def test_commit_point(directory, files, point):
    assert L.commit_point(directory, files) == point
    assert point in L.COMMIT_POINTS


def test_tracked_names():
    assert L.tracked_names("latest_checkpointed_iteration.txt", b"1000\n") == ["iter_0001000"]
    assert L.tracked_names("latest_checkpointed_iteration.txt", b"release") == []
    assert L.tracked_names("latest", b"global_step20") == ["global_step20"]
    assert L.tracked_names("other.txt", b"5") == []


def test_newest_version_wins():
    class G:
        def __init__(self, seq):
            self.commit_seq = seq

    a, b, c = G(3), G(7), G(5)
    best, stale = L.newest_versions([(a, "file", "x"), (b, "file", "x"), (c, "dir", "x")])
    assert best[("file", "x")] is b and best[("dir", "x")] is c and stale == [a]


def _events(tmp_path, rule: str, steps: int):
    path = str(tmp_path / "t.trace")
    write_generated(path, "smollm2-135m-dcp", rule, steps)
    with TraceReader(path) as r:
        return [ev for ev in r if isinstance(ev, (SaveEvent, DeleteEvent))]


@pytest.mark.parametrize("rule, name, describe", [
    ("torchtitan:interval=500,keep_latest_k=10", "keep_latest", "inferred:keep_latest:k=10,interval=500"),
    ("hf:save_steps=500,save_total_limit=2", "keep_latest", "inferred:keep_latest:k=2,interval=500"),
    ("megatron:save_interval=1000,retain_interval=5000", "retain_interval",
     "inferred:retain_interval:k=1,interval=1000,retain=5000"),
    ("lightning:every_n_train_steps=500,save_top_k=3,metric=synthetic", "top_k_like", None),
])
def test_inference_recognises_each_runtime_and_then_predicts_its_hints(tmp_path, rule, name, describe):
    """Fed the runtime's own save/delete sequence, the inference names the rule; once it has settled on
    the runtime's rule, its predicted reclaim step equals the exact hint of every later save (Megatron's
    retain interval shows only after the first retained save outlives its window)."""
    inf = RetentionInference()
    checked = 0
    for ev in _events(tmp_path, rule, 30_000):
        if isinstance(ev, SaveEvent):
            h = inf.hint("ckpt", ev.step)
            inf.observe_save("ckpt", str(ev.gen), ev.step)
            exact = ev.hint.reclaim_step if ev.hint is not None else None
            if exact == math.inf and h is not None and h.reclaim_step >= 30_000:
                continue        # the exact rule knows the run ends first (the last saves survive it)
            if h is not None and h.condition == describe and ev.hint is not None:     # once settled
                assert h.reclaim_step == exact, ev
                checked += 1
        else:
            inf.observe_delete(str(ev.gen), ev.step)
    got = inf.rule("ckpt")
    assert got is not None and got.name == name
    if describe:
        assert got.describe() == describe
        assert checked >= 15
    else:
        assert got.lifetime >= 500 and inf.hint("ckpt", 40_000).reclaim_step == 40_000 + got.lifetime


def test_inference_waits_for_evidence_and_keep_all():
    inf = RetentionInference()
    for i, step in enumerate(range(100, 500, 100)):
        inf.observe_save("a", f"s{step}", step)
        assert inf.hint("a", step + 100) is None          # no deletion yet, too few saves for keep_all
        if i == 2:
            inf.observe_delete("s100")
    for step in range(100, 3200, 100):
        inf.observe_save("b", f"s{step}", step)
    assert inf.rule("b") is None                        # 31 saves: could still be a long keep-latest window
    inf.observe_save("b", "s3200", 3200)
    assert inf.rule("b").name == "keep_all" and inf.hint("b", 3300).reclaim_step == math.inf
    inf.observe_abort("s3200")
    assert inf.summary()["b"]["saves"] == 31


def test_retainz_inferred_replay_matches_exact_hints_on_megatron(tmp_path):
    """On the recorded Megatron workload (retain_interval=5000), inferred hints run as exact ones do
    (no capacity stop, the same WAF), where no hints copy (WAF above 1) and hold more dead space."""
    from retainz.trace.replay import ReplayConfig, replay

    path = str(tmp_path / "m.trace")
    write_generated(path, "smollm2-135m-dcp", "megatron:save_interval=1000,retain_interval=5000", 50_000)
    r = {p: replay(path, ReplayConfig(policy=p, pressure=0.9, reserve_zones=4))
         for p in ("retainz", "retainz-inferred", "retainz-nohint")}
    assert r["retainz-inferred"]["policy"] == "retainz-inferred"
    assert r["retainz-inferred"]["capacity_stop_step"] is None and r["retainz"]["capacity_stop_step"] is None
    assert r["retainz-nohint"]["waf"] > r["retainz"]["waf"] + 0.01
    assert r["retainz-inferred"]["waf"] == pytest.approx(r["retainz"]["waf"])
    assert r["retainz-inferred"]["dead_space_byte_steps"] < r["retainz-nohint"]["dead_space_byte_steps"]


def test_inference_settles_at_its_third_deletion_and_reports_what_it_rests_on():
    from retainz.hint import Hint, Lifetime
    from retainz.retention.inference import InferredRule

    inf = RetentionInference()
    for step in range(100, 600, 100):                  # keep-latest-2 every 100 steps
        inf.observe_save("a", f"s{step}", step)
        if step >= 300:
            inf.observe_delete(f"s{step - 200}", step)
            assert (inf.rule("a") is None) == (step < 500)
    assert inf.rule("a") == InferredRule("keep_latest", 100, k=2, evidence=3)
    assert inf.summary() == {"a": {"rule": "inferred:keep_latest:k=2,interval=100", "saves": 5, "deletions": 3}}
    assert inf.hint("a", 600) == Hint(800, Lifetime.SHORT, "inferred:keep_latest:k=2,interval=100")
    inf.observe_delete("never-saved")                  # unknown keys are ignored
    inf.observe_abort("never-saved")
    assert inf.summary()["a"]["deletions"] == 3
    b = RetentionInference()
    for step in range(100, 3300, 100):
        b.observe_save("b", f"s{step}", step)
    assert b.rule("b") == InferredRule("keep_all", 100, evidence=32)
