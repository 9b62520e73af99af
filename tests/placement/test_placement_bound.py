"""The oracle control is a bound, and RetainZ never loses to a practical policy that completes (issue 40).

Saves in flight: keep-latest jobs saving at the same steps on few active zones (replay with time),
where RetainZ and the oracle used to give every in-flight save zones of its own and lose to the one
log.  Serialized: three SmolLM2-135M jobs on a ZN540-like device (TorchTitan keep 3, HF
save_total_limit 2, Orbax latest 2 plus every 5000; starts 0/100/150) at pressure 0.9, a loss that
remains (strict xfail: it flips when fixed).
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


@pytest.mark.xfail(strict=True, reason="known loss (docs/placement.md, 'A known loss'): the serialized "
                   "cost model prefers sharing a tail with an older zone; the fixes tried move recorded cases")
@pytest.mark.parametrize("intervals", [(500, 500, 1000), (1000, 250, 500)])
def test_three_smollm2_jobs_serialized_retainz_and_oracle_match_dedicated_zones(tmp_path, intervals):
    # now: (500, 500, 1000) RetainZ and oracle 1.037, (1000, 250, 500) both 1.113; dedicated 1.000
    path = _mix(tmp_path, intervals)
    waf = {}
    for policy in ("dedicated", "retainz", "oracle"):
        r = replay(path, ReplayConfig(policy=policy, pressure=0.9, reserve_zones=4, verify_payload=False))
        assert r["capacity_stop_step"] is None, policy
        waf[policy] = r["waf"]
    assert waf["dedicated"] == 1.0
    assert waf["retainz"] == 1.0 and waf["oracle"] == 1.0


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
