"""Retention rules driven as their runtimes drive them.

Expected tables are written out by hand from each runtime's documented semantics
(retainz.retention.rules docstring: the versions read), not computed by the code under test.
"""

from __future__ import annotations

import math

import pytest

from retainz.hint import Hint, Lifetime, class_bounds, lifetime_class
from retainz.retention import (
    NEVER,
    AfterNewer,
    AtStep,
    Permanent,
    PlannedSave,
    SaveSchedule,
    Timing,
    Uncertain,
    committed_steps,
    drive,
    parse_condition,
    parse_rule,
    parse_step,
)
from retainz.retention.base import EmpiricalLifetimes


def run(spec: str, steps: int, *, seed: int = 0, crash_every: int | None = None):
    return list(drive(parse_rule(spec).start(steps, seed=seed), crash_every=crash_every))


def existing_after_each_step(actions) -> dict[int, set[str]]:
    """Names of committed, undeleted generations once all actions of a step are done."""
    live: dict[int, str] = {}
    committed: set[int] = set()
    out: dict[int, set[str]] = {}
    for a in actions:
        if a.kind == "save":
            live[a.gen] = a.name
        elif a.kind == "commit":
            committed.add(a.gen)
        elif a.kind in ("delete", "crash"):
            live.pop(a.gen)
        out[a.step] = {n for g, n in live.items() if g in committed}
    return out


def predicted_vs_actual(actions):
    """(predicted reclaim step, actual delete step or inf) for every committed generation."""
    pred = {a.gen: a.hint.reclaim_step for a in actions if a.kind == "save"}
    actual = {a.gen: a.step for a in actions if a.kind == "delete"}
    committed = [a.gen for a in actions if a.kind == "commit"]
    return [(pred[g], actual.get(g, NEVER)) for g in committed]


def steps_of(names):
    return {int(n.rsplit("-", 1)[-1]) if "-" in n else n for n in names}


# -- step parser -------------------------------------------------------------------------------------

@pytest.mark.parametrize("cid, step", [
    ("step-500", 500), ("/ckpt/run1/step-0", 0), ("outputs/step-12/", 12), ("step-007", 7),
    ("iter_0001000", 1000), ("save/iter_0000123", 123), ("iter_12345678", 12345678),
    ("checkpoint-500", 500), ("out/checkpoint-1", 1), ("global_step500", 500), ("a/b/global_step7", 7),
])
def test_parse_step_accepts_the_four_naming_schemes(cid, step):
    assert parse_step(cid) == step


@pytest.mark.parametrize("cid", [
    "", "/", "step-", "step-abc", "step--5", "step-+5", "step-5.tmp", "step-10-unfinished", "xstep-10",
    "step-10 ", " step-10", "step_10", "Step-10", "step-１２", "step-١٢", "iter_", "iter_12a", "iter-0001",
    "checkpoint-", "checkpoint-12/extra", "checkpoint_12", "global_step", "global_step-5", "global_step5x",
    "step-10/.metadata", "last.ckpt", "epoch=0-step=500.ckpt", "500", "step-" + "9" * 19, "step-10//",
    "step-10\n",
])
def test_parse_step_refuses_everything_else(cid):
    assert parse_step(cid) is None


def test_parse_step_uses_the_last_path_component_only():
    assert parse_step("step-10/checkpoint-20") == 20
    assert parse_step("checkpoint-20/junk") is None


def test_committed_steps_never_counts_incomplete_generations():
    ids = ["step-30", "step-10", "step-20", "junk", "step-40"]
    assert committed_steps(ids, {"step-10", "step-30", "junk"}) == [(10, "step-10"), (30, "step-30")]


# -- parsing rules -------------------------------------------------------------------------------------

def test_parse_rule_examples_from_the_issue():
    r = parse_rule("torchtitan:interval=500,keep_latest_k=10,async=true")
    assert (r.interval, r.keep_latest_k, r.async_mode) == (500, 10, True)
    r = parse_rule("megatron:save_interval=1000,retain_interval=5000,non_persistent_interval=100,non_persistent=local")
    assert (r.save_interval, r.retain_interval, r.non_persistent_interval, r.non_persistent) == (1000, 5000, 100, "local")
    assert parse_rule("megatron:save_interval=1000,non_persistent_interval=100").non_persistent == "global"
    r = parse_rule("lightning:every_n_train_steps=500,save_top_k=3,metric=synthetic")
    assert (r.every_n_train_steps, r.save_top_k, r.metric) == (500, 3, "synthetic")
    r = parse_rule("hf:save_steps=500,save_total_limit=3")
    assert (r.save_steps, r.save_total_limit, r.metric) == (500, 3, None)
    r = parse_rule("orbax:latest=3,every_steps=10000")
    assert (r.latest, r.every_steps, r.save_interval_steps) == (3, 10000, 1)


@pytest.mark.parametrize("spec", [
    "torchtitan:interval=500,keep_latest_k=10,async=true", "megatron:save_interval=1000,retain_interval=5000",
    "lightning:every_n_train_steps=5,save_top_k=2,save_last=true", "lightning:every_n_train_steps=5,metric=none",
    "hf:save_steps=7,save_total_limit=2,metric=synthetic", "accelerate:save_steps=3,total_limit=4",
    "orbax:latest=3,every_steps=100,save_interval_steps=10",
])
def test_spec_round_trips(spec):
    r = parse_rule(spec)
    assert parse_rule(r.spec()) == r


@pytest.mark.parametrize("spec, fragments", [
    ("nosuch:x=1", ["unknown retention rule 'nosuch'", "torchtitan", "megatron", "lightning", "hf", "orbax"]),
    ("", ["empty retention rule", "torchtitan"]),
    ("torchtitan:interval=500,keep=3", ["unknown key 'keep'", "interval (int)", "keep_latest_k (int)", "async (bool)"]),
    ("torchtitan:interval=five", ["key interval expects int, got 'five'"]),
    ("torchtitan:async=maybe", ["key async expects bool"]),
    ("torchtitan:interval=5,interval=6", ["key interval given twice"]),
    ("torchtitan:interval", ["expected key=value"]),
    ("torchtitan:keep_latest_k=1", ["keep_latest_k=1 is rejected"]),
    ("torchtitan:keep_latest_k=-2", ["cannot be negative"]),
    ("torchtitan:interval=0", ["interval must be >= 1"]),
    ("megatron:retain_interval=5000", ["missing save_interval"]),
    ("megatron:save_interval=1000,retain_interval=1500", ["must be a multiple of save_interval"]),
    ("megatron:save_interval=1000,non_persistent=local", ["non_persistent needs non_persistent_interval"]),
    ("megatron:save_interval=10,non_persistent_interval=2,non_persistent=both", ["must be one of global, local"]),
    ("lightning:every_n_train_steps=5,save_top_k=3,metric=none", ["needs a monitored metric"]),
    ("lightning:every_n_train_steps=5,mode=avg", ["must be one of min, max"]),
    ("hf:save_total_limit=0", ["save_total_limit must be >= 1"]),
    ("accelerate:total_limit=2", ["missing save_steps"]),
])
def test_parse_rule_errors_say_what_is_valid(spec, fragments):
    with pytest.raises(ValueError) as e:
        parse_rule(spec)
    for f in fragments:
        assert f in str(e.value)


# -- TorchTitan --------------------------------------------------------------------------------------

TT_K3 = {  # keep_latest_k=3, interval=10, 100 steps: step -> steps on disk after it
    10: {10}, 20: {10, 20}, 30: {10, 20, 30}, 40: {20, 30, 40}, 50: {30, 40, 50}, 60: {40, 50, 60},
    70: {50, 60, 70}, 80: {60, 70, 80}, 90: {70, 80, 90}, 100: {70, 80, 90, 100},
}


@pytest.mark.parametrize("async_mode", ["false", "true"])
def test_torchtitan_keep_latest_3_table(async_mode):
    acts = run(f"torchtitan:interval=10,keep_latest_k=3,async={async_mode}", 100)
    got = {s: steps_of(n) for s, n in existing_after_each_step(acts).items()}
    assert got == TT_K3


def test_torchtitan_sync_predicted_reclaim_equals_actual_deletion():
    acts = run("torchtitan:interval=10,keep_latest_k=3", 100)
    pairs = predicted_vs_actual(acts)
    assert pairs == [(40, 40), (50, 50), (60, 60), (70, 70), (80, 80), (90, 90),
                     (NEVER, NEVER), (NEVER, NEVER), (NEVER, NEVER), (NEVER, NEVER)]


def test_torchtitan_sync_deletes_after_the_new_save_commits():
    acts = run("torchtitan:interval=10,keep_latest_k=3", 100)
    kinds = [(a.kind, a.step) for a in acts if a.step == 40]
    assert kinds == [("save", 40), ("commit", 40), ("delete", 40)]


def test_torchtitan_async_deletes_before_the_new_save_commits():
    acts = run("torchtitan:interval=10,keep_latest_k=3,async=true", 100)
    for i, a in enumerate(acts):
        if a.kind == "delete":
            same = [(b.kind, b.step) for b in acts if b.step == a.step]
            assert same == [("save", a.step), ("delete", a.step), ("commit", a.step)]
            assert acts[i - 1].kind == "save" and acts[i + 1].kind == "commit"
    assert sum(a.kind == "delete" for a in acts) == 6
    assert {parse_condition(a.hint.condition).timing for a in acts if a.kind == "save" and a.cls == "interval"} == {Timing.AFTER_DISPATCH}


def test_torchtitan_final_step_is_permanent_model_only_and_never_deleted():
    for steps in (95, 100):  # off and on the interval
        acts = run("torchtitan:interval=10,keep_latest_k=2", steps)
        final = [a for a in acts if a.kind == "save" and a.step == steps]
        assert len(final) == 1 and final[0].cls == "final" and final[0].model_only
        assert parse_condition(final[0].hint.condition) == Permanent("final")
        assert final[0].hint.reclaim_step == math.inf
        assert final[0].hint.lifetime == Lifetime.EXTREME
        assert all(not (a.kind == "delete" and a.gen == final[0].gen) for a in acts)
    # the last step's save does not purge: two interval saves plus the final one survive
    assert steps_of(existing_after_each_step(acts)[100]) == {80, 90, 100}


def test_torchtitan_keep_all():
    acts = run("torchtitan:interval=10,keep_latest_k=0", 50)
    assert not [a for a in acts if a.kind == "delete"]
    assert all(a.hint.reclaim_step == math.inf for a in acts if a.kind == "save")


def test_torchtitan_purges_by_parsed_step_number_not_by_save_order():
    from retainz.retention.base import Gen

    session = parse_rule("torchtitan:interval=10,keep_latest_k=2").start(60)
    # a rolled-back run (load_step) left a higher-numbered checkpoint behind
    session.live.append(Gen(100, "step-90", 90, "interval", committed=True))
    acts = list(drive(session))
    deletes = [(a.step, a.name) for a in acts if a.kind == "delete"]
    # the newer but lower-numbered checkpoints go first; step-90 survives every purge
    assert deletes == [(20, "step-10"), (30, "step-20"), (40, "step-30"), (50, "step-40")]


@pytest.mark.parametrize("spec, steps, cls, older_higher, newer_lower, deletes", [
    ("torchtitan:interval=10,keep_latest_k=2", 60, "interval", "step-90", "step-5",
     [(10, "step-5"), (20, "step-10"), (30, "step-20"), (40, "step-30"), (50, "step-40")]),
    ("hf:save_steps=10,save_total_limit=2", 40, "checkpoint", "checkpoint-90", "checkpoint-5",
     [(10, "checkpoint-5"), (20, "checkpoint-10"), (30, "checkpoint-20"), (40, "checkpoint-30")]),
    ("accelerate:save_steps=10,total_limit=2", 40, "checkpoint", "checkpoints/checkpoint_9", None,
     [(20, "checkpoints/checkpoint_0"), (30, "checkpoints/checkpoint_1"), (40, "checkpoints/checkpoint_2")]),
    ("orbax:latest=2,save_interval_steps=10", 40, "step", "90", "5",
     [(10, "5"), (20, "10"), (30, "20"), (40, "30")]),
    ("megatron:save_interval=100,non_persistent_interval=2", 8, "non_persistent",
     "non_persistent/iter_0000090", "non_persistent/iter_0000001",
     [(2, "non_persistent/iter_0000001"), (4, "non_persistent/iter_0000002"),
      (6, "non_persistent/iter_0000004"), (8, "non_persistent/iter_0000006")]),
], ids=["torchtitan", "hf", "accelerate", "orbax", "megatron-global"])
def test_purge_order_is_the_step_in_the_name_not_the_save_order(spec, steps, cls, older_higher, newer_lower,
                                                                  deletes):
    """Every rule that deletes by step: two checkpoints whose save order and step disagree.  One
    saved before this run (the lowest generation number) at a higher step than any of it (a rolled-
    back run left it), one saved after (the highest generation number) at a lower step.  Sorting by
    step keeps the first through every purge and deletes the second first; sorting by save order would
    do the opposite.  Expected deletions worked out by hand from each runtime's rule."""
    from retainz.retention.base import Gen

    session = parse_rule(spec).start(steps)
    number = parse_step if not spec.startswith("accelerate") else (lambda n: int(n.rsplit("_", 1)[1]))
    session.live.append(Gen(-1, older_higher, number(older_higher) if cls != "step" else int(older_higher),
                            cls, committed=True))
    if newer_lower is not None:
        session.live.append(Gen(10**6, newer_lower, number(newer_lower) if cls != "step" else int(newer_lower),
                                cls, committed=True))
    acts = list(drive(session))
    assert [(a.step, a.name) for a in acts if a.kind == "delete"] == deletes
    assert older_higher not in {a.name for a in acts if a.kind == "delete"}


# -- Megatron ----------------------------------------------------------------------------------------

def test_megatron_retain_interval_table_and_exact_prediction():
    acts = run("megatron:save_interval=10,retain_interval=30", 100)
    got = {s: {int(n[5:]) for n in names} for s, names in existing_after_each_step(acts).items()}
    assert got == {10: {10}, 20: {20}, 30: {30}, 40: {30, 40}, 50: {30, 50}, 60: {30, 60}, 70: {30, 60, 70},
                   80: {30, 60, 80}, 90: {30, 60, 90}, 100: {30, 60, 90, 100}}
    for pred, actual in predicted_vs_actual(acts):
        assert pred == actual
    conds = {a.step: parse_condition(a.hint.condition) for a in acts if a.kind == "save"}
    assert conds[30] == Permanent("retain_interval") and conds[40] == AfterNewer(1, "persistent", Timing.AFTER_COMMIT)


def test_megatron_retain_deletes_only_after_the_new_one_commits():
    acts = run("megatron:save_interval=10,retain_interval=30", 50)
    assert [(a.kind, a.name) for a in acts if a.step == 20] == [
        ("save", "iter_0000020"), ("commit", "iter_0000020"), ("delete", "iter_0000010")]


def test_megatron_end_of_training_save_when_not_on_the_interval():
    acts = run("megatron:save_interval=10,retain_interval=30", 45)
    saves = [a.name for a in acts if a.kind == "save"]
    assert saves[-1] == "iter_0000045"
    assert steps_of_megatron(existing_after_each_step(acts)[45]) == {30, 45}


def steps_of_megatron(names):
    return {int(n.rsplit("_", 1)[-1]) for n in names}


def test_megatron_without_retain_keeps_every_persistent_checkpoint():
    acts = run("megatron:save_interval=10", 50)
    assert not [a for a in acts if a.kind == "delete"]
    assert {parse_condition(a.hint.condition) for a in acts if a.kind == "save"} == {Permanent("keep_all")}


def test_megatron_non_persistent_global_deletes_before_the_next_save_starts():
    acts = run("megatron:save_interval=10,non_persistent_interval=2", 20)
    np_on_disk = {s: steps_of_megatron(n for n in names if n.startswith("non_persistent/"))
                  for s, names in existing_after_each_step(acts).items()}
    assert np_on_disk == {2: {2}, 4: {2, 4}, 6: {4, 6}, 8: {6, 8}, 10: {6, 8}, 12: {8, 12}, 14: {12, 14},
                          16: {14, 16}, 18: {16, 18}, 20: {16, 18}}
    for i, a in enumerate(acts):
        if a.kind == "delete":  # the next save starts only after the delete
            nxt = next(b for b in acts[i + 1:] if b.kind != "delete")
            assert (nxt.kind, nxt.step, nxt.cls) == ("save", a.step, "non_persistent")
    for pred, actual in predicted_vs_actual([a for a in acts if a.cls == "non_persistent"]):
        assert pred == actual  # checkpoint j goes at the second-next non-persistent save
    hint2 = next(a.hint for a in acts if a.kind == "save" and a.step == 2)
    assert parse_condition(hint2.condition) == AfterNewer(2, "non_persistent", Timing.BEFORE_SAVE)
    assert hint2.reclaim_step == 6 and hint2.lifetime == Lifetime.SHORT
    hint8 = next(a.hint for a in acts if a.kind == "save" and a.step == 8)
    assert hint8.reclaim_step == 14  # the persistent save at 10 does not count


def test_megatron_non_persistent_local_deletes_older_after_commit():
    acts = run("megatron:save_interval=10,non_persistent_interval=2,non_persistent=local", 14)
    assert [(a.kind, a.name) for a in acts if a.step == 4] == [
        ("save", "local/iter_0000004"), ("commit", "local/iter_0000004"), ("delete", "local/iter_0000002")]
    np_on_disk = {s: steps_of_megatron(n for n in names if n.startswith("local/"))
                  for s, names in existing_after_each_step(acts).items()}
    assert np_on_disk == {2: {2}, 4: {4}, 6: {6}, 8: {8}, 10: {8}, 12: {12}, 14: {14}}
    for pred, actual in predicted_vs_actual([a for a in acts if a.cls == "non_persistent"]):
        assert pred == actual


# -- Lightning -----------------------------------------------------------------------------------------

@pytest.fixture
def metric_file(tmp_path):
    p = tmp_path / "val_loss.txt"
    p.write_text("# step value\n10 5.0\n20 4.0\n30,4.5\n40 6.0\n\n50 3.0\n60 4.2\n70 2.0\n")
    return str(p)


def test_lightning_top2_by_metric_file(metric_file):
    acts = run(f"lightning:every_n_train_steps=10,save_top_k=2,metric={metric_file}", 60)
    saved = [a.step for a in acts if a.kind == "save"]
    assert saved == [10, 20, 30, 50]  # 40 (6.0) and 60 (4.2) never enter the top 2
    on_disk = {s: {int(n.split("=")[-1].split(".")[0]) for n in names}
               for s, names in existing_after_each_step(acts).items()}
    assert on_disk == {10: {10}, 20: {10, 20}, 30: {20, 30}, 50: {20, 50}}
    assert [(a.kind, a.step) for a in acts if a.step == 30] == [("save", 30), ("commit", 30), ("delete", 30)]
    h30 = parse_condition(next(a.hint for a in acts if a.kind == "save" and a.step == 30).condition)
    assert isinstance(h30, Uncertain) and h30.earliest == 40  # rank 2 of 2: one better save evicts it
    h20 = parse_condition(next(a.hint for a in acts if a.kind == "save" and a.step == 20).condition)
    assert h20.earliest == 40  # rank 1 of 2: two better saves needed


def test_lightning_uncertain_earliest_beyond_the_run_is_never(metric_file):
    acts = run(f"lightning:every_n_train_steps=10,save_top_k=2,metric={metric_file}", 60)
    h50 = parse_condition(next(a.hint for a in acts if a.kind == "save" and a.step == 50).condition)
    assert h50.earliest == math.inf and h50.probability == 0.0


def test_lightning_metric_file_missing_a_step_names_it(metric_file):
    with pytest.raises(ValueError, match="no value for step 80"):
        parse_rule(f"lightning:every_n_train_steps=10,save_top_k=2,metric={metric_file}").start(80)


def test_lightning_without_monitor_keeps_the_latest_one_and_last_ckpt():
    acts = run("lightning:every_n_train_steps=10,save_top_k=1,metric=none,save_last=true", 40)
    on_disk = existing_after_each_step(acts)
    assert on_disk[40] == {"epoch=0-step=40.ckpt", "last.ckpt"}
    assert sum(1 for a in acts if a.kind == "save" and a.name == "last.ckpt") == 4
    for pred, actual in predicted_vs_actual(acts):
        assert pred == actual
    # the new last.ckpt commits before the old one goes (atomic replace)
    assert [(a.kind, a.name) for a in acts if a.step == 20][-3:] == [
        ("save", "last.ckpt"), ("commit", "last.ckpt"), ("delete", "last.ckpt")]


def test_lightning_synthetic_metric_is_seeded():
    a = run("lightning:every_n_train_steps=10,save_top_k=3", 3000, seed=1)
    b = run("lightning:every_n_train_steps=10,save_top_k=3", 3000, seed=1)
    c = run("lightning:every_n_train_steps=10,save_top_k=3", 3000, seed=2)
    assert a == b
    assert [x.step for x in a if x.kind == "save"] != [x.step for x in c if x.kind == "save"]
    live = existing_after_each_step(a)
    assert max(len(v) for v in live.values()) == 3


def test_plateau_metric_has_the_published_shape():
    from retainz.retention.metrics import plateau_loss

    steps = list(range(500, 50001, 500))
    a, b, c = plateau_loss(steps, 1), plateau_loss(steps, 1), plateau_loss(steps, 2)
    assert a == b and a.values != c.values and a.source == "plateau:seed=1"
    v = a.values
    # learning-rate drops at 50 % and 75 %: the loss falls by about `drop` (0.12) across each
    for at in (25000, 37500):
        before = sum(v[s] for s in steps if at - 2500 <= s < at) / 5
        after = sum(v[s] for s in steps if at <= s < at + 2500) / 5
        assert 0.06 < before - after < 0.25
    # a plateau: within the stable phase the trend is far smaller than the noise
    plateau = [v[s] for s in steps if 15000 <= s < 25000]
    assert max(plateau) - min(plateau) < 0.15
    assert v[500] - v[50000] > 1.0        # the power-law decay from the start
    # noise is autocorrelated (AR(1), phi 0.8): neighbouring residuals agree in sign more than not
    flat = [v[s] for s in steps if 15000 <= s < 25000]
    d = [x - sum(flat) / len(flat) for x in flat]
    assert sum(1 for x, y in zip(d, d[1:], strict=False) if x * y > 0) > len(d) // 2


def test_lightning_top_k_on_the_plateau_metric():
    acts = run("lightning:every_n_train_steps=500,save_top_k=3,metric=plateau", 50000, seed=0)
    live = existing_after_each_step(acts)
    assert max(len(v) for v in live.values()) == 3
    saves = [x for x in acts if x.kind == "save"]
    # on the plateaus fewer evaluations enter the top 3 than the 100 of the run
    assert 20 < len(saves) < 100
    assert parse_rule("hf:save_steps=500,save_total_limit=3,metric=plateau").metric == "plateau"


# -- HF Trainer / Accelerate ---------------------------------------------------------------------------

def test_hf_save_total_limit_table_and_exact_prediction():
    acts = run("hf:save_steps=10,save_total_limit=2", 55)
    got = {s: steps_of(n) for s, n in existing_after_each_step(acts).items()}
    assert got == {10: {10}, 20: {10, 20}, 30: {20, 30}, 40: {30, 40}, 50: {40, 50}, 55: {50, 55}}
    for pred, actual in predicted_vs_actual(acts):
        assert pred == actual
    assert [(a.kind, a.step) for a in acts if a.step == 30] == [("save", 30), ("commit", 30), ("delete", 30)]


def test_hf_keeps_the_best_checkpoint(tmp_path):
    p = tmp_path / "eval_loss.txt"
    p.write_text("10 1.0\n20 2.0\n30 3.0\n40 0.5\n50 0.9\n60 2.0\n70 2.0\n")
    acts = run(f"hf:save_steps=10,save_total_limit=2,metric={p}", 70)
    got = {s: steps_of(n) for s, n in existing_after_each_step(acts).items()}
    assert got == {10: {10}, 20: {10, 20}, 30: {10, 30}, 40: {30, 40}, 50: {40, 50}, 60: {40, 60}, 70: {40, 70}}
    assert all(isinstance(parse_condition(a.hint.condition), Uncertain) for a in acts if a.kind == "save")


def test_hf_limit_one_keeps_two_when_the_best_is_old(tmp_path):
    p = tmp_path / "m.txt"
    p.write_text("10 1.0\n20 2.0\n30 3.0\n")
    acts = run(f"hf:save_steps=10,save_total_limit=1,metric={p}", 30)
    assert {s: steps_of(n) for s, n in existing_after_each_step(acts).items()} == {10: {10}, 20: {10, 20}, 30: {10, 30}}


def test_accelerate_deletes_before_the_new_save():
    acts = run("accelerate:save_steps=10,total_limit=2", 50)
    assert [(a.kind, a.name) for a in acts if a.step == 30] == [
        ("delete", "checkpoints/checkpoint_0"), ("save", "checkpoints/checkpoint_2"), ("commit", "checkpoints/checkpoint_2")]
    on_disk = existing_after_each_step(acts)
    assert on_disk[50] == {"checkpoints/checkpoint_3", "checkpoints/checkpoint_4"}
    for pred, actual in predicted_vs_actual(acts):
        assert pred == actual


# -- Orbax ---------------------------------------------------------------------------------------------

def test_orbax_latest_n_or_every_n_steps():
    acts = run("orbax:latest=2,every_steps=30,save_interval_steps=10", 70)
    got = {s: {int(n) for n in names} for s, names in existing_after_each_step(acts).items()}
    assert got == {10: {10}, 20: {10, 20}, 30: {20, 30}, 40: {30, 40}, 50: {30, 40, 50}, 60: {30, 50, 60},
                   70: {30, 60, 70}}
    for pred, actual in predicted_vs_actual(acts):
        assert pred == actual
    assert parse_condition(next(a.hint.condition for a in acts if a.kind == "save" and a.step == 30)) == Permanent("every_steps")


# -- crashes ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["torchtitan:interval=10,keep_latest_k=3", "torchtitan:interval=10,keep_latest_k=3,async=true",
                                  "megatron:save_interval=10,retain_interval=30,non_persistent_interval=5",
                                  "hf:save_steps=10,save_total_limit=2", "accelerate:save_steps=10,total_limit=2"])
def test_crashed_saves_are_abandoned_and_repeated(spec):
    clean = run(spec, 100)
    crashy = run(spec, 100, crash_every=3)
    crashes = [a for a in crashy if a.kind == "crash"]
    assert len(crashes) == len([a for a in clean if a.kind == "save"]) // 3
    commits = [a.name for a in crashy if a.kind == "commit"]
    assert commits == [a.name for a in clean if a.kind == "commit"]  # every planned save commits once
    abandoned = {a.gen for a in crashes}
    assert not [a for a in crashy if a.kind in ("commit", "delete") and a.gen in abandoned]
    for c in crashes:  # the same name is saved again right after, under a new generation
        i = crashy.index(c)
        again = next(a for a in crashy[i:] if a.kind == "save")
        assert again.name == c.name and again.gen > c.gen
    # what is on disk at the end is the same
    assert existing_after_each_step(crashy)[100] == existing_after_each_step(clean)[100]


# -- conditions and classes ----------------------------------------------------------------------------

def test_lifetime_class_bounds():
    short, medium = class_bounds(10)   # a runtime saving every 10 steps
    assert (short, medium) == (20, 200)
    assert lifetime_class(None, 100, short=short, medium=medium) == Lifetime.NOT_SET
    assert lifetime_class(120, 100, short=short, medium=medium) == Lifetime.SHORT
    assert lifetime_class(121, 100, short=short, medium=medium) == Lifetime.MEDIUM
    assert lifetime_class(300, 100, short=short, medium=medium) == Lifetime.MEDIUM
    assert lifetime_class(301, 100, short=short, medium=medium) == Lifetime.LONG
    assert lifetime_class(math.inf, 100, short=short, medium=medium) == Lifetime.EXTREME
    with pytest.raises(ValueError):
        class_bounds(0)


def test_lifetime_classes_of_runtime_defaults():
    def classes(spec, steps):
        return {a.hint.lifetime for a in run(spec, steps) if a.kind == "save" and a.hint.reclaim_step < NEVER}
    assert classes("torchtitan:interval=500,keep_latest_k=10", 20000) == {Lifetime.MEDIUM}
    assert classes("torchtitan:interval=500,keep_latest_k=2", 5000) == {Lifetime.SHORT}
    assert classes("torchtitan:interval=10,keep_latest_k=25", 1000) == {Lifetime.LONG}


def test_schedule_nth_after_merges_classes():
    sched = SaveSchedule(tuple(PlannedSave(s, c, str(s)) for s, c in [(2, "a"), (4, "b"), (6, "a"), (8, "b")]))
    assert sched.nth_after(2, "a", 1) == 6
    assert sched.nth_after(2, "a", 2) == NEVER
    assert sched.nth_after(2, ("a", "b"), 2) == 6
    assert sched.nth_after(0, "b", 2) == 8


def test_condition_predictions_and_json():
    sched = SaveSchedule(tuple(PlannedSave(s, "x", str(s)) for s in (10, 20, 30)))
    assert AfterNewer(2, "x").predict(10, sched) == 30
    assert AtStep(77).predict(10, sched) == 77
    assert Permanent("final").predict(10, sched) == math.inf
    assert Uncertain(20, 0.8, 40.0).predict(10, sched) == 40.0
    assert Uncertain(20, 0.2, 40.0).predict(10, sched) == math.inf
    assert Uncertain(20, 0.8, None).predict(10, sched) is None
    assert Uncertain(math.inf, 0.0).to_json() == {"kind": "uncertain", "earliest": "inf", "probability": 0.0,
                                                   "expected": None, "basis": ""}
    assert AfterNewer(3, "interval", Timing.BEFORE_SAVE).describe() == "after_newer:k=3,of_class=interval,timing=before_save"


def test_empirical_lifetimes_learn_from_the_past_only():
    est = EmpiricalLifetimes()
    first = est.estimate("r1", 10, 30)
    assert first.expected is None and first.probability == 0.5
    est.admit(1, "r1", 10)
    est.retire(1, 40)  # lived 30 steps
    est.admit(2, "r1", 20)
    u = est.estimate("r1", 50, 60)
    assert u.expected == 80 and u.probability == pytest.approx(2 / 4)
    assert est.estimate("r1", 50, 100).expected == 100  # never earlier than the earliest possible step


# -- online hints ----------------------------------------------------------------------------------------

EXACT = ["torchtitan:interval=10,keep_latest_k=3", "torchtitan:interval=10,keep_latest_k=2,async=true",
         "megatron:save_interval=10,retain_interval=30,non_persistent_interval=3",
         "megatron:save_interval=10,non_persistent_interval=4,non_persistent=local",
         "hf:save_steps=10,save_total_limit=2", "accelerate:save_steps=10,total_limit=3",
         "orbax:latest=2,every_steps=30,save_interval_steps=5", "lightning:every_n_train_steps=10,metric=none,save_last=true"]


@pytest.mark.parametrize("spec", EXACT)
def test_save_hint_equals_the_hint_of_the_driven_run(spec):
    from retainz.retention import save_hint

    rule = parse_rule(spec)
    for a in run(spec, 95):
        if a.kind == "save":
            assert save_hint(rule, a.step, total_steps=95, cls=a.cls) == a.hint, (a.step, a.cls)


@pytest.mark.parametrize("spec", EXACT)
def test_save_hint_without_a_known_end_matches_a_long_run(spec):
    from retainz.retention import save_hint

    rule = parse_rule(spec)
    for a in run(spec, 3000):
        if a.kind == "save" and 200 <= a.step <= 2000:
            assert save_hint(rule, a.step, cls=a.cls) == a.hint, (a.step, a.cls)


def test_save_hint_gives_the_one_hint():
    from retainz.retention import save_hint

    tt = parse_rule("torchtitan:interval=500,keep_latest_k=10")
    assert save_hint(tt, 1000) == Hint(6000, 3, "after_newer:k=10,of_class=interval,timing=after_commit")
    assert save_hint(tt, 1234) == Hint(math.inf, 5, "permanent:reason=final")  # off-interval: the last step
    mg = parse_rule("megatron:save_interval=1000,retain_interval=5000")
    assert save_hint(mg, 5000).reclaim_step == math.inf
    assert save_hint(mg, 6000).reclaim_step == 7000
    top = save_hint(parse_rule("lightning:every_n_train_steps=500,save_top_k=3"), 1500)
    assert top.reclaim_step is None and top.lifetime == 0 and top.condition.startswith("uncertain:earliest=3000")


def test_a_resumed_run_plans_saves_from_its_first_step():
    s = parse_rule("megatron:save_interval=10,non_persistent_interval=4").start(40, first_step=21)
    assert [(p.step, p.cls) for p in s.schedule.saves] == [(24, "non_persistent"), (28, "non_persistent"),
                                                           (30, "persistent"), (32, "non_persistent"),
                                                           (36, "non_persistent"), (40, "persistent")]
    acc = parse_rule("accelerate:save_steps=10").start(40, first_step=25)
    assert [p.name for p in acc.schedule.saves] == ["checkpoints/checkpoint_2", "checkpoints/checkpoint_3"]
    with pytest.raises(ValueError, match="first_step"):
        parse_rule("hf").start(10, first_step=11)


def test_megatron_schedule_is_linear_in_saves_not_steps():
    """A huge interval (a live run's adapter may pass one) must not walk every training step."""
    import signal

    def _timeout(*_):
        raise TimeoutError("Megatron.start walked every step")

    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(20)
    try:
        rule = parse_rule("megatron:save_interval=1000000000,retain_interval=5000000000,"
                          "non_persistent_interval=300000000")
        session = rule.start(10**12)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    steps = [p.step for p in session.schedule.saves]
    classes = {p.step: p.cls for p in session.schedule.saves}
    assert len([s for s in steps if classes[s] == "persistent"]) == 1000
    assert steps == sorted(steps) and len(steps) == len(set(steps))
    assert classes[3 * 10**9] == "persistent" and classes[300000000] == "non_persistent"
    assert all(s % 10**9 == 0 for s in steps if classes[s] == "persistent")


# -- the metric series the metric rules read ---------------------------------------------------------------
def _trend(s, last, floor=2.0, scale=2.5, alpha=0.76, tau_frac=0.02, drops=(0.5, 0.75), drop=0.12):
    tau = max(1.0, tau_frac * last)
    return floor + scale * (1.0 + s / tau) ** -alpha + drop * sum(1 for f in drops if s < f * last)


def test_plateau_metric_without_noise_or_spikes_is_its_documented_trend():
    from retainz.retention.metrics import plateau_loss

    steps = [0, 10, 25, 50, 60, 75, 90, 100]           # drops at 50 and 75: a drop's own step is after it
    v = plateau_loss(steps, 3, noise=0.0, spike_rate=0.0).values
    assert list(v) == steps
    assert all(v[s] == pytest.approx(_trend(s, 100), abs=1e-12) for s in steps)
    assert v[50] - v[60] == pytest.approx(_trend(50, 100) - _trend(60, 100))
    assert plateau_loss([], 0).values == {}
    # white noise (phi 0) is allowed; with phi 1 the first draw (mean 0, sd noise) stays
    assert len(plateau_loss(steps, 3, phi=0.0, spike_rate=0.0).values) == len(steps)
    held = plateau_loss(steps, 5, phi=1.0, noise=0.01, spike_rate=0.0).values
    residual = {round(held[s] - _trend(s, 100), 12) for s in steps}
    assert len(residual) == 1 and abs(residual.pop()) < 0.05


def test_plateau_spikes_are_rare_by_default_and_pile_up_when_frequent():
    from retainz.retention.metrics import plateau_loss

    steps = list(range(0, 100_000, 1000))
    v = plateau_loss(steps, 1, noise=0.0).values
    x = [v[s] - _trend(s, steps[-1]) for s in steps]
    assert 0 <= sum(1 for a, b in zip(x, x[1:], strict=False) if b > a + 1e-12) < 10
    v = plateau_loss(steps, 1, noise=0.0, spike_rate=1.0).values
    assert max(v[s] - _trend(s, steps[-1]) for s in steps) > 0.15      # decaying spikes add up


@pytest.mark.parametrize("text, message", [
    ("# loss\n0 2.5\n5 x\n", ":3: expected an integer step and a number, got '5 x'"),
    ("0 2.5\n1 2 3\n", ":2: expected 'STEP VALUE', got '1 2 3'"),
    ("0 2.5\n0 2.4\n", ":2: step 0 is not after step 0"),
    ("0 2.5\n1 inf\n", ":2: value 'inf' is not finite"),
    ("# nothing\n", ": no metric values"),
])
def test_metric_file_errors_name_the_file_and_line(tmp_path, text, message):
    from retainz.retention.metrics import load_metric_file

    p = tmp_path / "m.txt"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_metric_file(str(p))
    assert str(e.value) == f"{p}{message}"


def test_metric_file_starts_at_step_zero_and_records_its_path(tmp_path):
    from retainz.retention.metrics import load_metric_file

    p = tmp_path / "m.txt"
    p.write_text("0 2.5\n10, 2.25\n", encoding="utf-8")            # a comma separates too
    s = load_metric_file(str(p))
    assert s.values == {0: 2.5, 10: 2.25} and s.source == str(p)


# -- Accelerate: run bounds, the first save and the condition each save carries ---------------------------------
def test_accelerate_run_bounds_are_checked():
    rule = parse_rule("accelerate:save_steps=10")
    with pytest.raises(ValueError, match=r"^a run needs at least 1 training step, got 0$"):
        rule.start(0)
    with pytest.raises(ValueError, match=r"^first_step must be in 0\.\.10, got 11$"):
        rule.start(10, first_step=11)


def test_accelerate_saves_from_step_one_with_the_condition_of_its_limit():
    acts = run("accelerate:save_steps=1", 3)
    assert [(a.step, a.hint.condition) for a in acts if a.kind == "save"] == [
        (s, Permanent("keep_all").describe()) for s in (1, 2, 3)]
    acts = run("accelerate:save_steps=10,total_limit=2", 30)
    assert {a.hint.condition for a in acts if a.kind == "save"} == {
        AfterNewer(2, "checkpoint", Timing.BEFORE_SAVE).describe()}


# -- HF Trainer: conditions and the best checkpoint's comparison -----------------------------------------------
def test_hf_conditions_without_a_limit_or_without_a_metric():
    acts = run("hf:save_steps=10", 30)
    assert {a.hint.condition for a in acts if a.kind == "save"} == {Permanent("keep_all").describe()}
    acts = run("hf:save_steps=10,save_total_limit=2", 30)
    assert {a.hint.condition for a in acts if a.kind == "save"} == {
        AfterNewer(2, "checkpoint", Timing.AFTER_COMMIT).describe()}


@pytest.mark.parametrize("values, greater, kept", [
    ("1.0 1.0 1.0", "false", {10: {10}, 20: {10, 20}, 30: {10, 30}}),    # a tie is not better: 10 stays best
    ("1.0 1.0 1.0", "true", {10: {10}, 20: {10, 20}, 30: {10, 30}}),
    ("1.0 2.0 3.0", "true", {10: {10}, 20: {20}, 30: {30}}),             # higher is better: the newest
    ("3.0 2.0 1.0", "false", {10: {10}, 20: {20}, 30: {30}}),
])
def test_hf_best_checkpoint_is_strictly_better(tmp_path, values, greater, kept):
    p = tmp_path / "m.txt"
    p.write_text("".join(f"{s} {v}\n" for s, v in zip((10, 20, 30), values.split(), strict=True)))
    acts = run(f"hf:save_steps=10,save_total_limit=1,metric={p},greater_is_better={greater}", 30)
    assert {s: steps_of(n) for s, n in existing_after_each_step(acts).items()} == kept


def test_committed_steps_skips_every_uncommitted_id_wherever_it_is_listed():
    ids = ["step-30", "step-10", "notes", "step-20"]
    assert committed_steps(ids, {"step-10", "step-20", "notes"}) == [(10, "step-10"), (20, "step-20")]


def test_hf_limits_without_a_best_and_above_two_are_kept_exactly(tmp_path):
    acts = run("hf:save_steps=10,save_total_limit=1", 40)
    assert {s: steps_of(n) for s, n in existing_after_each_step(acts).items()} == {
        10: {10}, 20: {20}, 30: {30}, 40: {40}}
    p = tmp_path / "m.txt"
    p.write_text("10 1.0\n20 2.0\n30 3.0\n40 4.0\n50 5.0\n")
    acts = run(f"hf:save_steps=10,save_total_limit=3,metric={p}", 50)
    assert steps_of(existing_after_each_step(acts)[50]) == {10, 40, 50}   # the best (10) and the 2 newest


# -- every rule: exact refusals, run bounds, the first save, the default seed, the canonical spec -----------------
@pytest.mark.parametrize("spec, message", [
    ("accelerate:save_steps=10,bogus=1",
     "retention rule accelerate: unknown key 'bogus'; valid keys: save_steps (int, required), total_limit (int)"),
    ("accelerate:save_steps=0", "retention rule accelerate: save_steps must be >= 1, got 0"),
    ("accelerate:save_steps=10,total_limit=0", "retention rule accelerate: total_limit must be >= 1, got 0"),
    ("hf:save_steps=0", "retention rule hf: save_steps must be >= 1, got 0"),
    ("torchtitan:interval=0", "retention rule torchtitan: interval must be >= 1, got 0"),
    ("torchtitan:interval=5,keep_latest_k=-1", "retention rule torchtitan: keep_latest_k cannot be negative"),
    ("torchtitan:interval=5,keep_latest_k=1", "retention rule torchtitan: keep_latest_k=1 is rejected (TorchTitan keeps "
     "at least 2 checkpoints, as the last one may be in the process of being saved)"),
    ("torchtitan:interval=5,interval=6", "retention rule torchtitan: key interval given twice"),
    ("", "empty retention rule; valid rules: torchtitan, megatron, lightning, hf, accelerate, orbax"),
    ("megatron:save_interval=0", "retention rule megatron: save_interval must be >= 1, got 0"),
    ("megatron:save_interval=10,retain_interval=0", "retention rule megatron: retain_interval must be >= 1, got 0"),
    ("megatron:save_interval=10,non_persistent_interval=0",
     "retention rule megatron: non_persistent_interval must be >= 1, got 0"),
    ("megatron:save_interval=10,non_persistent=global",
     "retention rule megatron: non_persistent needs non_persistent_interval"),
    ("megatron:retain_interval=5000", "retention rule megatron: missing save_interval; valid keys: save_interval "
     "(int, required), retain_interval (int), non_persistent_interval (int), non_persistent (str)"),
    ("hf:save_steps=5,save_total_limit=0", "retention rule hf: save_total_limit must be >= 1, got 0"),
    ("lightning:every_n_train_steps=0", "retention rule lightning: every_n_train_steps must be >= 1, got 0"),
    ("lightning:every_n_train_steps=5,save_top_k=-2", "retention rule lightning: save_top_k must be >= -1, got -2"),
    ("lightning:every_n_train_steps=5,save_top_k=2,metric=none",
     "retention rule lightning: save_top_k=2 needs a monitored metric (Lightning rejects save_top_k > 1 with "
     "monitor=None); use metric=synthetic or metric=FILE"),
    ("orbax:save_interval_steps=0", "retention rule orbax: save_interval_steps must be >= 1, got 0"),
    ("orbax:save_interval_steps=5,latest=0", "retention rule orbax: latest must be >= 1, got 0"),
    ("orbax:save_interval_steps=5,every_steps=0", "retention rule orbax: every_steps must be >= 1, got 0"),
])
def test_rule_refusals_are_one_exact_line(spec, message):
    with pytest.raises(ValueError) as e:
        parse_rule(spec)
    assert str(e.value) == message


@pytest.mark.parametrize("k", [-1, 0, 1])
def test_lightning_without_a_monitor_accepts_keep_all_none_and_one(k):
    spec = f"lightning:every_n_train_steps=5,save_top_k={k},metric=none"
    assert parse_rule(spec).spec() == spec + ",mode=min,save_last=false"


@pytest.mark.parametrize("spec, first_saves", [
    ("hf:save_steps=1", [1, 2, 3]), ("lightning:every_n_train_steps=1,save_top_k=-1,metric=none", [1, 2, 3]),
    ("orbax:save_interval_steps=1", [1, 2, 3]),
])
def test_rules_save_from_step_one_and_check_the_run_bounds(spec, first_saves):
    rule = parse_rule(spec)
    assert [a.step for a in drive(rule.start(3)) if a.kind == "save"] == first_saves
    with pytest.raises(ValueError, match=r"^a run needs at least 1 training step, got 0$"):
        rule.start(0)
    with pytest.raises(ValueError, match=r"^first_step must be in 0\.\.10, got 11$"):
        rule.start(10, first_step=11)


@pytest.mark.parametrize("spec", ["lightning:every_n_train_steps=10,save_top_k=3",
                                  "hf:save_steps=10,save_total_limit=2,metric=synthetic"])
def test_metric_rules_default_to_seed_zero(spec):
    rule = parse_rule(spec)

    def acts(**kw):
        return [(a.kind, a.step, a.name) for a in drive(rule.start(200, **kw))]

    assert acts() == acts(seed=0) != acts(seed=1)


def test_rule_spec_is_canonical_skips_unset_keys_and_writes_booleans_in_lower_case():
    assert parse_rule("orbax:save_interval_steps=5,every_steps=10").spec() == "orbax:every_steps=10,save_interval_steps=5"
    assert parse_rule("lightning:every_n_train_steps=5,save_last=true").spec() == (
        "lightning:every_n_train_steps=5,save_top_k=1,metric=synthetic,mode=min,save_last=true")


def test_synthetic_metric_is_its_documented_curve_plus_small_noise():
    from retainz.retention.metrics import synthetic_loss

    steps = list(range(0, 20000, 100))
    clean = synthetic_loss(steps, 4, noise=0.0)
    assert all(clean.values[s] == pytest.approx(1.8 + 3.0 / math.sqrt(1.0 + s / 2000.0), abs=1e-12) for s in steps)
    noisy = synthetic_loss(steps, 4)
    assert noisy.source == "synthetic:seed=4"
    residual = [noisy.values[s] - clean.values[s] for s in steps]
    assert max(abs(r) for r in residual) < 0.15 and abs(sum(residual) / len(residual)) < 0.01


@pytest.mark.parametrize("spec, conditions", [
    ("lightning:every_n_train_steps=5,save_top_k=-1,metric=none,save_last=true",
     {"last.ckpt": AfterNewer(1, "last", Timing.AFTER_COMMIT), "other": Permanent("keep_all")}),
    ("lightning:every_n_train_steps=5,save_top_k=1,metric=none", {"other": AfterNewer(1, "topk", Timing.AFTER_COMMIT)}),
    ("orbax:save_interval_steps=5", {"other": Permanent("keep_all")}),
    ("orbax:save_interval_steps=5,latest=2", {"other": AfterNewer(2, "step", Timing.AFTER_COMMIT)}),
])
def test_lightning_and_orbax_saves_carry_their_rules_condition(spec, conditions):
    got = {("last.ckpt" if a.name == "last.ckpt" else "other", a.hint.condition)
           for a in drive(parse_rule(spec).start(20)) if a.kind == "save"}
    assert got == {(k, c.describe()) for k, c in conditions.items()}


def test_save_hint_reads_no_metric_file_picks_the_named_class_and_checks_its_steps():
    from retainz.retention import save_hint

    # a metric file's values are never used for one save's hint: the file is not even opened
    on_file = parse_rule("lightning:every_n_train_steps=10,save_top_k=3,metric=/nonexistent/m.txt")
    synthetic = parse_rule("lightning:every_n_train_steps=10,save_top_k=3,metric=synthetic")
    assert save_hint(on_file, 50) == save_hint(synthetic, 50)
    # two saves at one step: each class gets its own condition (last.ckpt is the second planned)
    both = parse_rule("lightning:every_n_train_steps=10,save_top_k=3,metric=synthetic,save_last=true")
    assert save_hint(both, 50, cls="last").condition == AfterNewer(1, "last", Timing.AFTER_COMMIT).describe()
    assert save_hint(both, 50, cls="topk") == save_hint(both, 50) != save_hint(both, 50, cls="last")
    with pytest.raises(ValueError) as e:
        save_hint(synthetic, -1)
    assert str(e.value) == "step must be >= 0, got -1"
    with pytest.raises(ValueError) as e:
        save_hint(synthetic, 50, total_steps=40)
    assert str(e.value) == "step 50 is after the run's last step 40"


# -- conditions: both encodings round-trip every field type; refusals are one exact line ----------------------
@pytest.mark.parametrize("cond", [
    AfterNewer(2, ("a", "b"), Timing.AFTER_COMMIT), AfterNewer(1, "topk", Timing.BEFORE_SAVE),
    Uncertain(math.inf, 0.25, None, "x,y"), Uncertain(120.0, 0.5, 300.0, "empirical:key=1,n=2,retired=1"),
    AtStep(700), Permanent("keep_all"),
])
def test_conditions_round_trip_through_text_and_json(cond):
    from retainz.retention.conditions import condition_from_json

    assert parse_condition(cond.describe()) == cond
    assert condition_from_json(cond.to_json()) == cond


def _from_json(obj):
    from retainz.retention.conditions import condition_from_json

    return condition_from_json(obj)


@pytest.mark.parametrize("decode, given, message", [
    (_from_json, [1], "condition must be an object, got [1]"),
    (_from_json, {"kind": "nosuch"}, "unknown condition kind 'nosuch'; valid: after_newer, permanent, at_step, uncertain, until_durable"),
    (_from_json, {"kind": "at_step", "at": 5, "zz": 1}, "condition at_step: unknown field(s) zz; valid: at"),
    (_from_json, {"kind": "after_newer", "k": 1}, "condition after_newer: missing of_class, timing"),
    (_from_json, {"kind": "at_step", "at": "5"}, "condition at_step: at must be an integer, got '5'"),
    (_from_json, {"kind": "permanent", "reason": 5}, "condition permanent: reason must be a string, got 5"),
    (parse_condition, "nosuch:x=1",
     "condition 'nosuch:x=1': unknown kind 'nosuch'; valid: after_newer, permanent, at_step, uncertain, until_durable"),
    (parse_condition, "after_newer:k=1,timing=after_commit",
     "condition 'after_newer:k=1,timing=after_commit': expected of_class="),
    (parse_condition, "after_newer:k=1,of_class=a", "condition 'after_newer:k=1,of_class=a': expected timing="),
    (parse_condition, "at_step:at=x", "condition 'at_step:at=x': bad at 'x'"),
])
def test_condition_refusals_in_both_encodings(decode, given, message):
    with pytest.raises(ValueError) as e:
        decode(given)
    assert str(e.value) == message


@pytest.mark.parametrize("text, value", [("yes", True), ("no", False), ("1", True), ("0", False), ("TRUE", True)])
def test_rule_booleans_take_every_spelling(text, value):
    assert parse_rule(f"torchtitan:interval=5,async={text}").async_mode is value


def test_drive_refuses_a_crash_period_below_one_save():
    with pytest.raises(ValueError) as e:
        list(drive(parse_rule("torchtitan:interval=5").start(10), crash_every=0))
    assert str(e.value) == "crash_every must be >= 1 save, got 0"


def test_rule_keys_give_type_default_and_help():
    from retainz.retention.base import RULES, rule_keys

    assert rule_keys(RULES["orbax"])[2] == {
        "key": "save_interval_steps", "field": "save_interval_steps", "type": "int", "required": False, "default": 1,
        "help": "save when step % save_interval_steps == 0", "choices": None}
    assert rule_keys(RULES["accelerate"])[0]["default"] is None and rule_keys(RULES["accelerate"])[0]["required"]
