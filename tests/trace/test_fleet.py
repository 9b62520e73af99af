"""The fleet workload generator (retainz.trace.fleet, `retainz trace fleet`): determinism, config
validation, traces that validate, and a small fleet replayed through the real store."""

from __future__ import annotations

import hashlib
import io
import json
import math
from fractions import Fraction

import pytest

from retainz.cli import main
from retainz.trace.fleet import (
    DEFAULT_CONFIG,
    DRIVES,
    FleetConfig,
    draw_jobs,
    node_layout,
    offered_jobs,
    place_on_node,
    write_fleet,
)
from retainz.trace.format import DeleteEvent, SaveEvent
from retainz.trace.io import TraceReader
from retainz.trace.layouts import get_layout

#: A small fleet: SmolLM2 and one-node Pythia jobs only, so a replay takes a second.
SMALL = {"steps": 20000, "concurrency": 3, "churn": 6, "interval": 500,
         "jobs": [{"model": "smollm2-135m", "gpus": 1, "weight": 3}, {"model": "pythia-1b", "gpus": 8, "weight": 1}]}


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_config_and_seed_give_the_same_bytes_and_another_seed_does_not(tmp_path):
    cfg = FleetConfig.from_json(SMALL)
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    write_fleet(str(a), cfg, seed=7)
    write_fleet(str(b), FleetConfig.from_json(json.loads(json.dumps(SMALL))), seed=7)
    write_fleet(str(c), cfg, seed=8)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def _reordered(obj):
    """``obj`` with every object's keys in reverse order (lists keep theirs)."""
    if isinstance(obj, dict):
        return {k: _reordered(obj[k]) for k in reversed(list(obj))}
    if isinstance(obj, list):
        return [_reordered(x) for x in obj]
    return obj


@pytest.mark.parametrize("seed", range(6))
def test_the_order_of_a_configs_keys_does_not_change_the_fleet(tmp_path, seed):
    """The runner stores a fleet config as canonical JSON (keys sorted); `retainz trace fleet` reads the
    default's order.  Both must draw the same jobs (the end causes were once drawn in key order, so a
    manifest's fleet and the CLI's differed: 21 jobs against 23)."""
    config = {**DEFAULT_CONFIG, **SMALL}
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_fleet(str(a), FleetConfig.from_json(config), seed=seed)
    write_fleet(str(b), FleetConfig.from_json(_reordered(config)), seed=seed)
    ja = [(j.start, j.end, j.cause, j.model) for j in draw_jobs(FleetConfig.from_json(config), seed)]
    jb = [(j.start, j.end, j.cause, j.model) for j in draw_jobs(FleetConfig.from_json(_reordered(config)), seed)]
    assert ja == jb and len({j[2] for j in ja}) > 1
    assert [line for line in a.read_text().splitlines()[1:]] == [line for line in b.read_text().splitlines()[1:]]


def test_cli_writes_the_same_trace_as_the_library(tmp_path):
    cfg_file = tmp_path / "fleet.json"
    cfg_file.write_text(json.dumps(SMALL))
    out = tmp_path / "cli.jsonl"
    assert main(["trace", "fleet", "--config", str(cfg_file), "--seed", "3", "-o", str(out)]) == 0
    lib = tmp_path / "lib.jsonl"
    write_fleet(str(lib), FleetConfig.from_json(SMALL), seed=3)
    assert _digest(out) == _digest(lib)
    assert main(["trace", "validate", str(out)]) == 0


@pytest.mark.parametrize("override, message", [
    ({"fleet": 3}, "fleet config: key 'fleet': format version must be 1 or 2, got 3"),
    ({"fleet": 1, "save_bandwidth": 10**9}, "key 'save_bandwidth': unknown key (a format 2 key: give \"fleet\": 2)"),
    ({"step_seconds": 0}, "key 'step_seconds': must be > 0 and <= 1e+06, got 0"),
    ({"placement": "fifo"}, "key 'placement': must be one of queue, elsewhere, got \"fifo\""),
    ({"jobs": [{"model": "llama3-8b", "gpus": 8, "weight": 1, "async": 1}]}, "entry 0: async must be true or false"),
    ({"fleet": 1, "jobs": [{"model": "llama3-8b", "gpus": 8, "weight": 1, "async": True}]},
     "key 'jobs': entry 0: unknown key 'async'"),
    ({"concurrency": 0}, "fleet config: key 'concurrency': must be > 0 and <= 1024, got 0"),
    ({"churn": "8"}, "fleet config: key 'churn': must be a number, got \"8\""),
    ({"steps": 1.5}, "fleet config: key 'steps': must be an integer, got 1.5"),
    ({"colour": 1}, "fleet config: key 'colour': unknown key"),
    ({"jobs": []}, "fleet config: key 'jobs': must be a non-empty list"),
    ({"jobs": [{"model": "gpt-9", "gpus": 1, "weight": 1}]}, "key 'jobs': entry 0: unknown model \"gpt-9\""),
    ({"jobs": [{"model": "smollm2-135m", "gpus": 4, "weight": 1}]}, "one-rank layout: gpus must be 1, got 4"),
    ({"jobs": [{"model": "llama3-8b", "gpus": 8}]}, "key 'jobs': entry 0: missing key 'weight'"),
    ({"jobs": [{"model": "llama3-8b", "gpus": 8, "weight": -1}]}, "weight must be a number >= 0, got -1"),
    ({"runtimes": [{"rule": "torchtitan:interval={interval},keep=3", "weight": 1}]}, "key 'runtimes': entry 0:"),
    ({"runtimes": [{"rule": "nosuch:x={interval}", "weight": 1}]}, "key 'runtimes': entry 0:"),
    ({"end": {"crashed": {"weight": 1, "linger": 0}}}, "key 'end': unknown cause \"crashed\""),
    ({"end": {"failed": {"weight": 1, "linger": -5}}}, "failed: linger must be a number of steps >= 0, got -5"),
    ({"interval_factors": [[0, 1]]}, "key 'interval_factors': must be a non-empty list of [factor > 0"),
    ({"scale": "2"}, "key 'scale': must be in (0, 1], got 2"),
])
def test_bad_config_fields_are_one_line_errors_with_exit_status_2(tmp_path, capsys, override, message):
    with pytest.raises(ValueError) as e:
        FleetConfig.from_json({**SMALL, **override})
    assert message in str(e.value) and "\n" not in str(e.value)
    cfg_file = tmp_path / "bad.json"
    cfg_file.write_text(json.dumps({**SMALL, **override}))
    assert main(["trace", "fleet", "--config", str(cfg_file), "-o", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "t.jsonl").exists()


def test_a_config_that_is_not_json_is_a_one_line_error(tmp_path, capsys):
    cfg_file = tmp_path / "bad.json"
    cfg_file.write_text("{concurrency: 4}")
    assert main(["trace", "fleet", "--config", str(cfg_file), "-o", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "fleet config is not valid JSON" in err and err.count("\n") == 1


def test_jobs_follow_the_config_little_law_and_end_causes():
    """The arrival process (format 2's jobs offered to the node, before placement; format 1's fleet)."""
    cfg = FleetConfig.from_json({**DEFAULT_CONFIG, "steps": 400000, "concurrency": 4, "churn": 10})
    jobs = offered_jobs(cfg, seed=1)
    # Little's law: mean running jobs = arrival rate x mean length; the job-steps over the horizon say it
    busy = sum(min(j.end, 400000) - j.start for j in jobs) / 400000
    assert 2.0 < busy < 4.5           # ended early (failed, preempted) jobs run less than planned
    planned = sum(j.planned for j in jobs) / len(jobs)
    assert 0.7 * cfg.mean_length < planned < 1.3 * cfg.mean_length
    share = {c: sum(j.cause == c for j in jobs) / len(jobs) for c in ("finished", "failed", "preempted")}
    ends = cfg.raw["end"]
    total = sum(e["weight"] for e in ends.values())
    for c in ("finished", "failed", "preempted"):   # the config's shares (Helios Figure 7(a) by default)
        assert abs(share[c] - ends[c]["weight"] / total) < 0.1
    for j in jobs:
        assert j.end == j.start + j.planned if j.cause == "finished" else j.start < j.end <= j.start + j.planned
        assert j.cleanup is None or j.cleanup >= j.end
        assert j.nodes == math.ceil(j.gpus / 8)


def test_node_layout_keeps_the_first_nodes_ranks_and_the_rankless_files():
    lay = node_layout(get_layout("llama3-70b-fsdp:ranks=64"), 64, 8)
    names = [s.name for s in lay.shards]
    assert names == [f"__{r}_0.distcp" for r in range(8)] + [".metadata"]
    assert lay.name == "llama3-70b-fsdp:ranks=64@node=0/8"
    full = get_layout("llama3-70b-fsdp:ranks=64")
    assert lay.total_bytes == sum(s.nbytes for s in full.shards if s.name in names)
    assert 100e9 < lay.total_bytes < 110e9      # 70.55e9 params x 12 B / 64 ranks x 8 ranks = 105.8 GB
    py = node_layout(get_layout("pythia-1b:dp=16"), 16, 8)
    assert sum(n.startswith("zero_pp_rank_") for n in (s.name for s in py.shards)) == 8
    assert "layer_00-model_00-model_states.pt" in {s.name for s in py.shards}
    one = get_layout("llama3-8b-fsdp:ranks=8")
    assert node_layout(one, 8, 8) is one


def test_every_checkpoint_a_job_leaves_is_deleted_at_its_cleanup_and_hints_are_the_runtimes(tmp_path):
    out = tmp_path / "f.jsonl"
    st = write_fleet(str(out), FleetConfig.from_json(SMALL), seed=2)
    with TraceReader(str(out)) as r:
        jobs = {j["job"]: j for j in r.header.layout["jobs"]}
        events = list(r)
    saves = [e for e in events if isinstance(e, SaveEvent)]
    assert st.saves == len(saves) and st.deletes == sum(isinstance(e, DeleteEvent) for e in events)
    assert st.jobs == len(jobs) > 5
    deleted = {e.gen: e.step for e in events if isinstance(e, DeleteEvent)}
    for s in saves:
        job = jobs[int(s.name.split(":")[0][1:])]
        assert job["start"] <= s.step < max(job["end"], job["start"] + 1) or s.step == job["end"]
        assert s.hint is not None                   # the runtime's own save-time hint
        if job["cleanup"] is not None:
            assert deleted[s.gen] <= job["cleanup"]  # nothing of a cleaned-up job survives
        else:
            assert s.gen not in deleted or deleted[s.gen] <= 20000


def test_a_small_fleet_replays_through_the_store(tmp_path):
    from retainz.trace.replay import ReplayConfig, replay

    out = tmp_path / "f.jsonl"
    st = write_fleet(str(out), FleetConfig.from_json(SMALL), seed=0)
    res = {p: replay(str(out), ReplayConfig(policy=p, pressure=0.9, reserve_zones=4, zone_size=512 << 20,
                                            zone_capacity=282_329_088, max_active=14, max_open=14))
           for p in ("retainz", "greedy")}
    for r in res.values():
        assert r["peak_live_bytes"] >= st.peak_live_bytes      # block-rounded
        assert r["peak_live_bytes"] < st.peak_live_bytes + st.saves * 70 * 4096
        assert r["generations_committed"] == st.saves
        assert r["host_bytes"] >= st.bytes_saved
        assert 0.85 < r["effective_pressure"] <= 0.9
        assert r["waf"] == pytest.approx((r["host_bytes"] + r["gc_bytes"]) / r["host_bytes"])
    assert res["retainz"]["capacity_stop_step"] is None
    assert 1.0 <= res["retainz"]["waf"] < 1.1


def _rec(policy, waf, *, seed=0, stop=None, conc=4, churn=16, p=0.9, geo="zn540"):
    return {"id": f"fleet-{policy}-{seed}-{conc}-{churn}-{p}-{geo}", "tags": {"experiment": "fleet", "label": geo},
            "inputs": {"policy": policy, "pressure": p, "trace_seed": seed,
                       "fleet": {"concurrency": conc, "churn": churn}},
            "capacity_stop_step": stop, "metrics": {"waf": waf, "peak_live_bytes": 2**40}}


def test_the_fleet_map_judges_each_seed_and_states_medians_spreads_and_counts(tmp_path):
    from retainz.analysis.fleetmap import fleet_claims, fleet_table, map_cells
    from retainz.analysis.records import Runs

    recs = [
        _rec("retainz", 1.0, seed=0), _rec("greedy", 1.3, seed=0), _rec("oracle", 0.9, seed=0),   # win +0.3
        _rec("retainz", 1.0, seed=1), _rec("greedy", 1.01, seed=1),                                # tie
        _rec("retainz", 1.2, seed=2, stop=40000), _rec("dedicated", 1.1, seed=2),                  # stop
        _rec("retainz", 1.0, p=0.7), _rec("greedy", 1.0, p=0.7),                                   # other cell: tie
    ]
    cells = map_cells(Runs(recs, [], "x"))
    assert [m.where for m in cells] == [(4, 16, 0.7, "zn540"), (4, 16, 0.9, "zn540")]
    hot = cells[1]
    assert sorted(c.outcome for c in hot.cells) == ["lose", "tie", "win"]
    assert hot.count("lose", "stop") == 1 and hot.margins == pytest.approx([0.3, 0.01])
    claims: list = []
    fleet_claims(Runs(recs, [], "x"), claims)
    got = {c["id"]: c["value"] for c in claims}
    assert got["fleet.cells"] == 2 and got["fleet.run_cells"] == 4
    assert (got["fleet.wins"], got["fleet.ties"], got["fleet.losses"]) == (1, 2, 1)
    assert got["fleet.stops_where_another_completes"] == 1
    assert got["fleet.max_waf_margin"] == 0.3 and got["fleet.min_waf_margin"] == 0.0
    assert got["fleet.c4.churn16.zn540.p0.9.median_waf_margin"] == 0.155
    assert got["fleet.c4.churn16.zn540.p0.9.waf_margin_spread"] == 0.29
    assert got["fleet.c4.churn16.zn540.p0.9.stops"] == 1
    (path,) = fleet_table(Runs(recs, [], "x"), str(tmp_path))
    row = [line for line in open(path) if line.startswith("| 4 | 16 | zn540 | 0.9 |")]
    assert row == ["| 4 | 16 | zn540 | 0.9 | 3 | +0.155 | +0.010..+0.300 | 1 | 1 | 1 | 1 | 1.000 | 1.100 | 1024 |\n"]


def test_zenfs_scans_of_the_open_zones_answer_as_upstreams_scan_of_every_zone(tmp_path, monkeypatch):
    """ZenFS-Alloc visits only the open zones (its speed-up for fleet-sized devices); a replay with the
    upstream-shaped scan over every zone, ascending, must give the same outcome, decision for decision."""
    from retainz.placement.zenfs import ZenFS
    from retainz.trace.replay import ReplayConfig, replay

    out = tmp_path / "f.jsonl"
    write_fleet(str(out), FleetConfig.from_json({**SMALL, "fleet": 1, "concurrency": 6}), seed=4)
    cfg = ReplayConfig(policy="zenfs", pressure=0.97, reserve_zones=4, zone_size=256 << 20, zone_capacity=256 << 20,
                       max_active=14, max_open=14)
    fast = replay(str(out), cfg)
    monkeypatch.setattr(ZenFS, "_open_ascending", lambda self: iter(self.table.zones.values()))
    full = replay(str(out), cfg)
    keys = ("host_bytes", "gc_bytes", "resets", "finishes", "dead_space_byte_steps", "unused_capacity_bytes",
            "capacity_stop_step", "decisions", "generations_committed")
    assert {k: fast[k] for k in keys} == {k: full[k] for k in keys}
    assert fast["decisions"] > 1000 and fast["zones"] > 32


@pytest.mark.parametrize("fleet, message", [
    ({"churn": -1}, "key 'fleet': fleet config: key 'churn': must be > 0"),
    ({"steps": 100}, "key 'fleet': give 'steps' as the case's own field"),
    ({"colour": 1}, "key 'fleet': fleet config: key 'colour': unknown key"),
])
def test_a_manifests_fleet_case_is_validated_and_named_by_its_whole_config(fleet, message):
    from retainz.experiments.manifest import ManifestError, expand

    base = {"manifest": "f", "format": 1, "defaults": {"layout": "smollm2-135m-dcp", "rule": "torchtitan",
            "steps": 20000, "policy": "retainz", "pressure": 0.9, "zone_size": "256MiB", "zone_capacity": "256MiB",
            "max_active": 14, "max_open": 14}, "blocks": [{"experiment": "fleet", "axes": {"fleet": [{"churn": 4}]}}]}
    (case,) = expand(base)
    assert case.inputs["fleet"]["churn"] == 4 and case.inputs["fleet"]["steps"] == 20000
    assert case.inputs["fleet"]["jobs"] == DEFAULT_CONFIG["jobs"] and "tenants" not in case.inputs
    assert case.inputs["layout"] == "fleet:concurrency=4,churn=4"
    assert case.trace.fleet is not None and case.trace.key() != expand({**base, "blocks": [
        {"experiment": "fleet", "axes": {"fleet": [{"churn": 5}]}}]})[0].trace.key()
    bad = {**base, "blocks": [{"experiment": "fleet", "axes": {"fleet": [fleet]}}]}
    with pytest.raises(ManifestError) as e:
        expand(bad)
    assert message in str(e.value) and "\n" not in str(e.value)


# --- format 2: the node, the save bandwidth, the drives, time-averaged occupancy -------------------------------

#: Format 1 configs and the sha256 of the traces they generated before format 2 existed (recorded with the
#: format 1 generator of main at ef69b09): format 1 must keep generating them byte for byte.
V1_RECORDED = [
    ({**SMALL, "fleet": 1}, 0, "d5793031b5386d8d77d1806307056a9ee438e996c032f102ba54ea0d37acac5e"),
    ({"fleet": 1, "steps": 20000, "concurrency": 4, "churn": 8, "scale": "1/1024"}, 1,
     "e53038202b701a4bbb5187553757da12ddc26bca0247d03e8320753939a2be0b"),
]


@pytest.mark.parametrize("config, seed, digest", V1_RECORDED)
def test_a_format_1_config_generates_the_fleet_it_always_did(tmp_path, config, seed, digest):
    out = tmp_path / "v1.jsonl"
    write_fleet(str(out), FleetConfig.from_json(config), seed=seed)
    assert _digest(out) == digest
    with TraceReader(str(out)) as r:
        assert "not_on_node" not in r.header.layout
        assert all("write_bandwidth" not in j for j in r.header.layout["jobs"])


def test_format_1_written_as_a_float_is_format_1(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_fleet(str(a), FleetConfig.from_json({**SMALL, "fleet": 1.0}), seed=0)
    write_fleet(str(b), FleetConfig.from_json({**SMALL, "fleet": 1}), seed=0)
    assert _digest(a) == _digest(b) == V1_RECORDED[0][2]


def test_format_2_is_the_default_and_draws_other_jobs_than_format_1(tmp_path):
    assert FleetConfig.from_json({}).raw["fleet"] == 2 and DEFAULT_CONFIG["fleet"] == 2
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_fleet(str(a), FleetConfig.from_json(SMALL), seed=0)
    write_fleet(str(b), FleetConfig.from_json({**SMALL, "fleet": 1}), seed=0)
    assert _digest(a) != _digest(b)


def _job(job, start, end, gpus):
    from retainz.trace.fleet import FleetJob

    return FleetJob(job, start, end - start, end, "finished", None, "x", gpus, -(-gpus // 8), "x", "x", 10, 0)


def test_the_node_takes_a_job_only_when_its_gpus_are_free_and_sends_the_rest_elsewhere():
    jobs = [_job(0, 0, 100, 1),        # on the node: 1 GPU used
            _job(1, 10, 500, 64),      # a whole-node job while a 1-GPU job runs: elsewhere
            _job(2, 20, 100, 4),       # 5 used
            _job(3, 30, 100, 4),       # 9 > 8: elsewhere
            _job(4, 40, 100, 3),       # 8 used: the node is full
            _job(5, 50, 60, 1),        # elsewhere (full)
            _job(6, 100, 400, 64),     # every job ended at 100: the empty node takes the 70B job, all 8 GPUs
            _job(7, 150, 160, 1),      # elsewhere: the whole-node job is alone on its node
            _job(8, 400, 450, 8)]      # the 70B job ended at 400: an 8-GPU job (one node) takes the node
    kept, elsewhere = place_on_node(jobs, 8, "elsewhere")
    assert [(j.job, j.start, j.gpus) for j in kept] == [(0, 0, 1), (1, 20, 4), (2, 40, 3), (3, 100, 64), (4, 400, 8)]
    assert [j.job for j in elsewhere] == [1, 3, 5, 7]
    # the initial jobs start staggered, not in arrival order: placement goes by start step
    kept, _ = place_on_node([_job(0, 30, 90, 8), _job(1, 5, 50, 1)], 8, "elsewhere")
    assert [(j.job, j.gpus) for j in kept] == [(0, 1)]


def test_the_queued_node_starts_jobs_first_come_first_served_when_their_gpus_are_free():
    from retainz.trace.fleet import FleetJob

    jobs = [_job(0, 0, 100, 1),        # starts at 0
            _job(1, 10, 500, 64),      # waits for the node to empty: job 0 ends at 100 -> runs 100..590
            _job(2, 20, 100, 4),       # behind the 70B job (first come, first served): starts at 590
            _job(3, 30, 100, 4),       # 590 too: 8 GPUs used
            _job(4, 40, 100, 1),       # waits for the first of jobs 2 and 3 to end: job 3 at 660
            FleetJob(5, 50, 10, 60, "failed", 1000, "x", 1, 1, "x", "x", 10, 0)]   # 660 too (6 used); cleanup moves
    kept, waiting = place_on_node(jobs, 8, "queue", horizon=2000)
    assert [(j.start, j.end) for j in kept] == [(0, 100), (100, 590), (590, 670), (590, 660), (660, 720),
                                                (660, 670)]
    assert kept[5].cleanup == 1000 + 610 and waiting == []
    kept, waiting = place_on_node(jobs, 8, "queue", horizon=600)   # jobs that would start at 600 or later
    assert len(kept) == 4 and [j.job for j in waiting] == [4, 5]
    assert kept[3].cleanup is None or kept[3].cleanup <= 600


def _overlap(a, b) -> bool:
    return a.start < b.end and b.start < a.end


@pytest.mark.parametrize("seed", range(3))
def test_a_70b_job_is_alone_on_its_nodes_device_and_sub_node_jobs_pack_up_to_8_gpus(seed):
    mixed = FleetConfig.from_json({"steps": 50000, "concurrency": 8, "churn": 8, "jobs": [
        {"model": "smollm2-135m", "gpus": 1, "weight": 8}, {"model": "llama3-70b", "gpus": 64, "weight": 1}]})
    jobs = draw_jobs(mixed, seed)
    big = [j for j in jobs if j.model == "llama3-70b"]
    assert big and len(jobs) < len(offered_jobs(mixed, seed))
    for b in big:
        assert b.nodes == 8 and b.layout == "llama3-70b-fsdp:ranks=64@node=0/8"
        assert [j.job for j in jobs if j is not b and _overlap(j, b)] == []
    # only 1-GPU jobs: at most 8 at once, and the node does fill up
    small = FleetConfig.from_json({"steps": 50000, "concurrency": 16, "churn": 8,
                                   "jobs": [{"model": "smollm2-135m", "gpus": 1, "weight": 1}]})
    jobs = draw_jobs(small, seed)
    at_start = [sum(1 for k in jobs if k.start <= j.start < k.end) for j in jobs]
    assert max(at_start) == 8
    st = write_fleet(io.StringIO(), small, seed)
    assert st.peak_jobs == 8 and st.not_on_node == len(offered_jobs(small, seed)) - len(jobs) > 0
    assert 7 < st.mean_node_gpus <= 8                 # the queue keeps the node full


def test_a_fleet_placed_elsewhere_records_the_jobs_its_node_did_not_run(tmp_path):
    cfg = FleetConfig.from_json({**SMALL, "concurrency": 12, "placement": "elsewhere"})
    offered, kept = offered_jobs(cfg, 3), draw_jobs(cfg, 3)
    out = tmp_path / "f.jsonl"
    st = write_fleet(str(out), cfg, seed=3)
    with TraceReader(str(out)) as r:
        assert r.header.layout["not_on_node"] == st.not_on_node == len(offered) - len(kept) > 0
        assert [(j["start"], j["end"]) for j in r.header.layout["jobs"]] == [(j.start, j.end) for j in kept]
    # placed elsewhere, a job keeps the step it arrived at; queued, a job may start later
    assert {(j.start, j.end) for j in kept} <= {(j.start, j.end) for j in offered}
    assert 0 < st.mean_node_gpus <= 8 and st.peak_jobs <= 8


def test_each_job_records_the_bytes_per_step_its_saves_are_written_at(tmp_path):
    cfg = FleetConfig.from_json({**SMALL, "jobs": [{"model": "smollm2-135m", "gpus": 1, "weight": 1},
                                                   {"model": "pythia-1b", "gpus": 8, "weight": 1, "async": True}]})
    jobs = draw_jobs(cfg, 0)
    sync = [j for j in jobs if not j.async_save]
    assert sync and all(j.write_bandwidth == 1_230_000_000 for j in sync)   # ZN540 1,230 MB/s x 1 s a step
    pythia = get_layout("pythia-1b:dp=8").total_bytes                        # 14.2 GB
    for j in (j for j in jobs if j.async_save):
        assert j.model == "pythia-1b" and j.write_bandwidth == -(-pythia // j.interval)   # paced to the next save
    scaled = FleetConfig.from_json({**SMALL, "scale": "1/1024", "save_bandwidth": 2_048_000, "step_seconds": 0.5})
    assert {j.write_bandwidth for j in draw_jobs(scaled, 0)} == {1000}     # 2,048,000 B/s x 0.5 s / 1024
    out = tmp_path / "f.jsonl"
    write_fleet(str(out), cfg, seed=0)
    with TraceReader(str(out)) as r:
        rec = r.header.layout
    assert [(j["write_bandwidth"], j["async_save"]) for j in rec["jobs"]] == [(j.write_bandwidth, j.async_save)
                                                                             for j in jobs]
    assert rec["config"]["save_bandwidth"] == 1_230_000_000 and rec["config"]["step_seconds"] == 1.0


def test_time_averaged_live_bytes_by_hand_and_the_device_it_sizes():
    from retainz.trace.format import Shard
    from retainz.trace.occupancy import live_byte_steps, mean_live_bytes, occupancy_data_zones

    def save(step, gen, nbytes):
        return SaveEvent(step, gen, f"g{gen}", "interval", (Shard("a", nbytes),))

    # gen 0: 1 block live over steps 0..49; gen 1: 2 blocks (4097 B -> 8192 B) over 25..99; gen 2 saved at
    # the horizon adds nothing: (4096 x 50 + 8192 x 75) / 100 = 8192 bytes on average
    events = [save(0, 0, 100), save(25, 1, 4097), DeleteEvent(50, 0), save(100, 2, 10**9)]
    assert live_byte_steps(events, 100) == 4096 * 50 + 8192 * 75
    assert mean_live_bytes(events, 100) == 8192
    assert mean_live_bytes(events, 100, block_size=1) == (100 * 50 + 4097 * 75) / 100
    assert occupancy_data_zones(8192, 0.5, 4096) == 4 and occupancy_data_zones(8193, 0.5, 4096) == 5
    with pytest.raises(ValueError, match="occupancy must be in"):
        occupancy_data_zones(8192, 1.5, 4096)
    with pytest.raises(ValueError, match="mean live 0 bytes"):
        occupancy_data_zones(0, 0.5, 4096)


def test_a_fleets_mean_live_bytes_is_the_step_by_step_average(tmp_path):
    """The fleet's time-averaged live bytes against a step-by-step count over a small fleet."""
    from retainz.trace.occupancy import mean_live_bytes

    cfg = FleetConfig.from_json({**SMALL, "steps": 6000, "concurrency": 2, "churn": 4, "scale": "1/4096"})
    out = tmp_path / "f.jsonl"
    st = write_fleet(str(out), cfg, seed=1)
    with TraceReader(str(out)) as r:
        events = list(r)
    per_step = [0] * 6000
    size = {}
    for ev in events:
        if isinstance(ev, SaveEvent):
            size[ev.gen] = sum(s.nbytes for s in ev.shards)
            for t in range(ev.step, 6000):
                per_step[t] += size[ev.gen]
        elif isinstance(ev, DeleteEvent):
            for t in range(ev.step, 6000):
                per_step[t] -= size[ev.gen]
    assert st.saves > 5 and st.deletes > 0
    assert st.mean_live_bytes == pytest.approx(sum(per_step) / 6000, rel=1e-12)
    assert max(per_step) == st.peak_live_bytes and st.mean_live_bytes < st.peak_live_bytes
    assert mean_live_bytes(events, 6000, block_size=1) == Fraction(sum(per_step), 6000)   # exact


@pytest.mark.parametrize("name", sorted(DRIVES))
def test_each_real_drive_is_a_device_the_store_accepts(name):
    from retainz.trace.replay import ReplayConfig

    d = DRIVES[name]
    cfg = ReplayConfig(zones=d["zones"] - 7, reserve_zones=4, meta_zones=3, zone_size=d["zone_size"],
                       zone_capacity=d["zone_capacity"], max_active=d["max_active"], max_open=d["max_open"])
    g = cfg.geometry(cfg.data_zones(0))
    assert g.nr_zones == d["zones"]
    assert 0.95e12 * int(name.split("-")[1][0]) < g.nr_zones * g.zone_capacity < 1.1e12 * int(name.split("-")[1][0])


def test_a_format_2_fleet_replays_through_the_store(tmp_path):
    from retainz.trace.replay import ReplayConfig, replay

    out = tmp_path / "f.jsonl"
    st = write_fleet(str(out), FleetConfig.from_json({**SMALL, "concurrency": 6}), seed=0)
    r = replay(str(out), ReplayConfig(policy="retainz", pressure=0.9, reserve_zones=4, zone_size=512 << 20,
                                      zone_capacity=282_329_088, max_active=14, max_open=14))
    assert r["generations_committed"] == st.saves > 10 and r["capacity_stop_step"] is None
    assert st.not_on_node > 0
