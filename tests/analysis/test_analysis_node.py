"""The node placement map (experiment node, issue 40 item 5): cells, counts, capacity at WAF <= 1.02 and
the table, on hand-made records."""

from __future__ import annotations

import pytest

from retainz.analysis.nodemap import capacity, counts, mix_of, node_cells, node_claims, node_table, overlap_of
from retainz.analysis.records import Runs

MIB = 1 << 20
SUB = [{"model": "smollm2-135m", "gpus": 1, "weight": 1}]
WHOLE = [{"model": "pythia-1b", "gpus": 8, "weight": 1}, {"model": "llama3-70b", "gpus": 64, "weight": 1}]


def rec(policy, waf, occ=0.2, stop=None, jobs=SUB, wb=None, seed=0, label="zn540", save=27 * MIB, scale="1/64"):
    inputs = {"layout": "fleet:x", "rule": "fleet:y", "steps": 20000, "policy": policy, "occupancy": occ,
              "pressure": None, "zones": None, "zone_size": 32 * MIB, "zone_capacity": 17232 << 10, "max_active": 14,
              "max_open": 14, "reserve_zones": 4, "seed": 0, "zone_map": False, "verify_summaries": False,
              "trace_seed": seed, "scale": scale, "device": "memory",
              "fleet": {"fleet": 2, "gpus_per_node": 8, "jobs": jobs, "concurrency": 8, "churn": 16}}
    if wb is not None:
        inputs["write_bandwidth"] = wb
    return {"id": f"node-{policy}-{occ}-{seed}-{label}-{wb}-{jobs[0].get('async', False)}",
            "tags": {"experiment": "node", "label": label}, "inputs": inputs, "capacity_stop_step": stop,
            "metrics": {"waf": waf, "host_bytes": save * 10, "generations_committed": 10}}


def test_the_axes_come_from_the_inputs():
    assert mix_of(rec("retainz", 1.0)) == "sub-node"
    assert mix_of(rec("retainz", 1.0, save=14200 * MIB // 64)) == "sub-node large"      # 13 ZN540 zones a save
    assert mix_of(rec("retainz", 1.0, jobs=WHOLE)) == "whole-node"
    assert mix_of(rec("retainz", 1.0, jobs=SUB + WHOLE)) == "mixed"
    assert mix_of(rec("retainz", 1.0, jobs=SUB + [dict(WHOLE[0], weight=0)])) == "sub-node"   # weight 0: never drawn
    assert overlap_of(rec("retainz", 1.0)) == "serialized"
    assert overlap_of(rec("retainz", 1.0, wb="fleet")) == "concurrent"
    assert overlap_of(rec("retainz", 1.0, wb=64 * MIB, jobs=[dict(SUB[0], **{"async": True})])) == "async"


def _map():
    a = [dict(SUB[0], **{"async": True})]
    return [
        # serialized, 0.2: tie; 0.4: RetainZ wins by 0.05 (greedy 1.05 is the best that completes); 0.6: all stop
        rec("retainz", 1.0), rec("greedy", 1.0), rec("oracle", 1.0),
        rec("retainz", 1.0, 0.4), rec("greedy", 1.05, 0.4), rec("dedicated", 1.0, 0.4, stop=900), rec("oracle", 1.0, 0.4),
        rec("retainz", 1.0, 0.6, stop=100), rec("greedy", 1.0, 0.6, stop=120), rec("oracle", 1.0, 0.6, stop=99),
        # async, 0.2: RetainZ loses by 0.29; 0.4: RetainZ stops where greedy completes; 0.6: all stop
        rec("retainz", 1.294, jobs=a, wb="fleet"), rec("greedy", 1.004, jobs=a, wb="fleet"),
        rec("oracle", 1.0, jobs=a, wb="fleet"),
        rec("retainz", 1.0, 0.4, stop=500, jobs=a, wb="fleet"), rec("greedy", 1.01, 0.4, jobs=a, wb="fleet"),
        rec("retainz", 1.0, 0.6, stop=50, jobs=a, wb="fleet"), rec("greedy", 1.0, 0.6, stop=50, jobs=a, wb="fleet"),
    ]


def test_counts_split_wins_ties_losses_stops_and_cells_where_every_policy_stops():
    cells = node_cells(Runs(_map(), [], "t"))
    assert [(n.overlap, n.occupancy, n.cell.outcome) for n in cells] == [
        ("serialized", 0.2, "tie"), ("serialized", 0.4, "win"), ("serialized", 0.6, "lose"),
        ("async", 0.2, "lose"), ("async", 0.4, "lose"), ("async", 0.6, "tie")]
    assert cells[1].cell.margin == pytest.approx(0.05) and cells[1].cell.best == "greedy"
    assert counts(cells) == {"cells": 6, "wins": 1, "ties": 1, "losses": 1, "stops": 1, "all_stop": 2}
    assert counts([n for n in cells if n.overlap == "serialized"])["all_stop"] == 1
    out = []
    node_claims(Runs(_map(), [], "t"), out)
    got = {c["id"]: c["value"] for c in out}
    assert (got["node.run_cells"], got["node.wins"], got["node.ties"], got["node.losses"], got["node.stops"],
            got["node.all_stop"]) == (6, 1, 1, 1, 1, 2)
    assert (got["node.serialized.wins"], got["node.overlapped.losses"], got["node.overlapped.stops"]) == (1, 1, 1)
    assert got["node.async.run_cells"] == 3 and "node.concurrent.run_cells" not in got
    assert (got["node.max_waf_margin"], got["node.min_waf_margin"]) == (0.05, -0.29)


def test_capacity_is_the_highest_occupancy_held_at_waf_1_02_at_every_lower_level_too():
    cap = {(r["overlap"]): r for r in capacity(node_cells(Runs(_map(), [], "t")))}
    ser, asy = cap["serialized"], cap["async"]
    # serialized: RetainZ holds 0.4 (stops at 0.6); greedy's 1.05 at 0.4 is above 1.02, so it holds 0.2
    assert ser["policies"]["retainz"] == 0.4 and ser["policies"]["greedy"] == 0.2
    assert ser["policies"]["dedicated"] is None            # no record at 0.2 and a stop at 0.4: not even the lowest
    assert (ser["best_other"], ser["ratio"]) == ("greedy", 2.0)
    # async: RetainZ's 1.294 at the lowest level holds nothing; greedy holds 0.4
    assert asy["policies"]["retainz"] is None and asy["policies"]["greedy"] == 0.4 and asy["ratio"] is None
    # the median over seeds ranks a seed that holds nothing lowest
    two = _map() + [r for r in (rec("retainz", 1.0, seed=1), rec("greedy", 1.5, seed=1), rec("retainz", 1.3, seed=2),
                                rec("greedy", 1.0, seed=2))]
    ser = next(r for r in capacity(node_cells(Runs(two, [], "t"))) if r["overlap"] == "serialized")
    assert ser["seeds"] == 3 and ser["policies"]["retainz"] == 0.2 and ser["policies"]["greedy"] == 0.2


def test_the_table_lists_counts_capacity_cells_and_every_loss_with_each_policys_waf(tmp_path):
    (path,) = node_table(Runs(_map(), [], "t"), str(tmp_path))
    text = open(path).read()
    assert "| all | 6 | 1 | 1 | 1 | 1 | 2 |" in text
    assert "| with overlap (concurrent + async) | 3 | 0 | 0 | 1 | 1 | 1 |" in text
    assert "| sub-node | serialized | zn540 | 1 | 0.4 | - | 0.2 | 0.4 | greedy | 2.00 |" in text   # oracle last
    losses = text.split("## RetainZ's losses and stops")[1]
    assert "| node-retainz-0.2-0-zn540-fleet-True | sub-node | async | zn540 | 0.2 | 0 | 1.294 |" in losses
    assert "stop@500" in losses and "0.6" not in losses         # cells where every policy stops are not losses
    assert node_table(Runs([r for r in _map() if r["inputs"]["policy"] == "oracle"], [], "t"), str(tmp_path)) == []
