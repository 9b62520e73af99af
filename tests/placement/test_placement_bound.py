"""The oracle control is a bound, and RetainZ never loses to a practical policy that completes (issue 40).

Saves in flight: keep-latest jobs saving at the same steps on few active zones (replay with time),
where RetainZ and the oracle used to give every in-flight save zones of its own and lose to the one
log.  Serialized: three SmolLM2-135M jobs on a ZN540-like device (TorchTitan keep 3, HF
save_total_limit 2, Orbax latest 2 plus every 5000; starts 0/100/150) at pressure 0.9, a loss under
the old open charge (``open_unused=true``) that the default removes.  Saves that take time: deletions after a slow save's
commit (three jobs of different save sizes; the node map's asynchronous sub-node cell, seed 0), losses
that remain (strict xfail).
"""

from __future__ import annotations

import pytest

from retainz.experiments.runner import scaled_layout
from retainz.trace.generate import write_generated
from retainz.trace.mix import mix
from retainz.trace.replay import ReplayConfig, replay


def _mix(tmp_path, intervals, steps=10000):
    tt, hf, orbax = intervals
    rules = [f"torchtitan:interval={tt},keep_latest_k=3", f"hf:save_steps={hf},save_total_limit=2",
             f"orbax:latest=2,every_steps=5000,save_interval_steps={orbax}"]
    paths = []
    for i, rule in enumerate(rules):
        paths.append(str(tmp_path / f"job{i}.jsonl"))
        write_generated(paths[-1], "smollm2-135m-dcp", rule, steps)
    out = str(tmp_path / "mix.jsonl")
    mix(paths, out, offsets=[0, 100, 150])
    return out


@pytest.mark.parametrize("intervals", [(500, 500, 1000), (1000, 250, 500)])
def test_three_smollm2_jobs_serialized_retainz_and_oracle_match_dedicated_zones(tmp_path, intervals):
    # Under the defaults (open_unused=false since issue 40): a zone opened for a known death is not
    # charged for the 505 MiB a 572 MiB tail leaves free, so tails stop joining (and splitting into)
    # other jobs' tail zones; at step 8150 no byte is dead and no GC runs.  Before (the old charge,
    # open_unused=true below): RetainZ and the oracle 1.037 and 1.113, dedicated zones 1.000.
    path = _mix(tmp_path, intervals)
    out = {}
    for policy in ("dedicated", "retainz", "oracle"):
        out[policy] = replay(path, ReplayConfig(policy=policy, pressure=0.9, reserve_zones=4, verify_payload=False))
        assert out[policy]["capacity_stop_step"] is None, policy
    assert out["dedicated"]["waf"] == 1.0
    for policy in ("retainz", "oracle"):
        assert out[policy]["waf"] == 1.0, policy
        assert out[policy]["gc_bytes"] == 0, policy


@pytest.mark.parametrize("intervals", [(500, 500, 1000), (1000, 250, 500)])
def test_three_smollm2_jobs_under_the_old_open_charge_lose_to_dedicated_zones(tmp_path, intervals):
    # The old rule (open_unused=true: every unfilled byte of a zone opened for the group charged
    # until its death) is what made the oracle lose here: tails joined other jobs' tail zones, four
    # full zones held 2,665 MiB dead at step 8150 and forced GC copied them (docs/placement.md, "The
    # open charge").  Kept so the reason for the default stays measured.
    path = _mix(tmp_path, intervals)
    for policy in ("retainz:open_unused=true", "oracle:open_unused=true"):
        r = replay(path, ReplayConfig(policy=policy, pressure=0.9, reserve_zones=4, verify_payload=False))
        assert r["capacity_stop_step"] is None, policy
        assert r["waf"] > 1.03, policy
        assert r["gc_bytes"] > 1 << 30, policy

# -- saves in flight (replay with time) ------------------------------------------------------------
SMALL = dict(zone_size=256 << 10, zone_capacity=192 << 10)     # the replay-with-time tests' zones


def _same_step_jobs(tmp_path, jobs, scale):
    """``jobs`` TorchTitan keep_latest_k=3 jobs saving every 100 steps at the same steps (SmolLM2-135M
    scaled by ``scale``: 104 KiB or 207 KiB a save, on 192 KiB zones)."""
    paths = []
    for i in range(jobs):
        paths.append(str(tmp_path / f"j{i}.jsonl"))
        write_generated(paths[-1], scaled_layout("smollm2-135m-dcp", scale), "torchtitan:interval=100,keep_latest_k=3",
                        3000)
    out = str(tmp_path / "mix.jsonl")
    mix(paths, out)
    return out


@pytest.mark.parametrize("jobs, scale", [(4, "1/16384"), (3, "1/8192")])
def test_groups_in_flight_that_die_together_share_zones_under_few_active_zones(tmp_path, jobs, scale):
    # Every job's save dies at the same step as the others' of that step.  Before: RetainZ never
    # joined a zone another save in flight was filling unless nothing else was possible, so at 4
    # active zones each save took zones of its own and the limit forced finishes and GC: (4 jobs)
    # RetainZ 1.513, oracle 1.591; (3 jobs, 207 KiB saves) RetainZ 1.102 and a capacity stop at
    # step 2712, oracle 1.171; the one log 1.000 in both (the oracle lost to RetainZ and to greedy).
    # Sharing a zone with groups in flight that die at the same step holds nothing dead.
    path = _same_step_jobs(tmp_path, jobs, scale)
    out = {}
    for policy in ("greedy", "retainz", "oracle"):
        out[policy] = replay(path, ReplayConfig(policy=policy, pressure=0.9, max_active=4, max_open=4,
                                                write_bandwidth=16 << 10, write_unit=4096, verify_payload=False,
                                                **SMALL))
        assert out[policy]["capacity_stop_step"] is None, policy
    assert out["retainz"]["overlapped_bytes"] > 0
    assert out["greedy"]["waf"] == 1.0
    assert out["retainz"]["waf"] == 1.0 and out["oracle"]["waf"] == 1.0


# -- saves that take time: a deletion waits for the commit of the save that triggers it ----------
_ASYNC_LOSS = ("known loss (docs/placement.md, 'A known loss: saves that take time'): a deletion after a slow "
               "save's commit comes that save's write time after the predicted step; an estimate of it from "
               "the group's progress fixed these cases but moved other node cells the wrong way")


def _async_mix(tmp_path):
    """Three TorchTitan jobs of different save sizes (SmolLM2-135M scaled 1/8192, 1/4096, 1/16384:
    207, 414 and 104 KiB) and retention (every 100 steps keep 3, every 100 keep 2, every 50 keep 4),
    all saving from step 0, each save written at 4 KiB a step: a save takes 26 to 104 steps, so each
    job's deletions come that much after their predicted step (the triggering save's), by a different
    amount per job."""
    jobs = [("1/8192", "torchtitan:interval=100,keep_latest_k=3"), ("1/4096", "torchtitan:interval=100,keep_latest_k=2"),
            ("1/16384", "torchtitan:interval=50,keep_latest_k=4")]
    paths = []
    for i, (scale, rule) in enumerate(jobs):
        paths.append(str(tmp_path / f"j{i}.jsonl"))
        write_generated(paths[-1], scaled_layout("smollm2-135m-dcp", scale), rule, 3000)
    out = str(tmp_path / "mix.jsonl")
    mix(paths, out)
    return out


@pytest.mark.xfail(strict=True, reason=_ASYNC_LOSS)
def test_a_deletion_after_a_slow_save_commits_is_placed_by_when_that_save_is_written(tmp_path):
    # now: RetainZ 1.229 with 23 finishes (1.202 with 9 under the old open charge, open_unused=true),
    # the oracle 1.000 (a zone log per job 1.275, the one log
    # 1.503): placed by the triggering save's step, which comes 26 to 104 steps before the deletion
    # depending on the job.  With the group's write time estimated from its progress: 1.013 (raw
    # estimate), 1.060 (rounded to a power of two steps).
    path = _async_mix(tmp_path)
    out = {}
    for policy in ("retainz", "oracle", "dedicated:by=job"):
        out[policy] = replay(path, ReplayConfig(policy=policy, pressure=0.9, max_active=4, max_open=4,
                                                reserve_zones=2, write_bandwidth=4 << 10, write_unit=4096,
                                                verify_payload=False, **SMALL))
        assert out[policy]["capacity_stop_step"] is None, policy
    assert out["retainz"]["overlapped_bytes"] > 0
    assert out["oracle"]["waf"] == 1.0
    assert out["retainz"]["waf"] < 1.1
    assert out["retainz"]["waf"] < out["dedicated:by=job"]["waf"]


def test_a_node_of_asynchronous_sub_node_jobs_retainz_does_not_lose_to_a_zone_log_per_job():
    # The node map's cell (experiments/node.json: sub-node jobs with asynchronous saves, ZN540-like
    # zones scaled 1/64, occupancy 0.6, fleet seed 0).  Under the old open charge (open_unused=true)
    # RetainZ 1.033 with 89 finishes, a zone log per job 1.001, the oracle 1.000; the default now
    # 1.0013 against 1.0014.
    import tempfile

    from retainz.experiments.manifest import expand
    from retainz.experiments.runner import RetainZBackend

    fleet = {"fleet": 2, "concurrency": 8, "churn": 16,
             "jobs": [{"model": "smollm2-135m", "gpus": 1, "weight": 1, "async": True}]}
    defaults = {"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=10", "steps": 20000,
                "reserve_zones": 4, "scale": "1/64", "write_unit": "1MiB", "fleet": fleet, "write_bandwidth": "fleet",
                "zone_size": "32MiB", "zone_capacity": "17232KiB", "max_active": 14, "max_open": 14,
                "occupancy": 0.6, "trace_seed": 0}
    cases = expand({"manifest": "t", "format": 1, "defaults": defaults,
                    "blocks": [{"experiment": "node", "axes": {"policy": ["retainz", "dedicated:by=job"]}}]})
    backend = RetainZBackend()
    with tempfile.TemporaryDirectory() as d:
        trace = f"{d}/trace.jsonl"
        backend.generate_trace(cases[0].trace, trace)
        waf = {}
        for c in cases:
            r = backend.replay(trace, c, d)
            assert r["capacity_stop_step"] is None, c.inputs["policy"]
            waf[c.inputs["policy"]] = r["waf"]
    assert waf["dedicated:by=job"] < 1.005
    assert waf["retainz"] <= waf["dedicated:by=job"]
