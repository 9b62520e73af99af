"""The regime map: cells, outcomes, margins, bins and claims, on hand-made records."""

from __future__ import annotations

import pytest

from retainz.analysis.records import Runs
from retainz.analysis.regimes import cells, ratio_bin, regime_claims, regime_figure, regime_map

GIB = 1 << 30


def rec(policy, waf, stop=None, pressure=0.9, experiment="uncertain", tenants=None, cap=GIB, gens=10,
        save=GIB, rule="lightning:every_n_train_steps=500,save_top_k=3,metric=plateau"):
    inputs = {"layout": "smollm2-135m-dcp", "rule": rule, "steps": 1000, "policy": policy, "pressure": pressure,
              "zone_size": cap, "zone_capacity": cap, "max_active": 14, "max_open": 14, "reserve_zones": 4,
              "seed": 0, "zone_map": False, "verify_summaries": False, "trace_seed": 0, "scale": "1",
              "zones": None, "device": "memory"}
    if tenants:
        inputs["tenants"] = tenants
    return {"id": f"{experiment}-{policy}-{pressure}-{cap}-{rule[:5]}", "tags": {"experiment": experiment, "label": None},
            "inputs": inputs, "capacity_stop_step": stop,
            "metrics": {"waf": waf, "host_bytes": save * gens, "generations_committed": gens}}


def test_ratio_bins():
    assert [ratio_bin(x) for x in (0.1, 0.5, 1.9, 2.0, 7.9, 8.0, 30)] == \
        ["<0.5", "0.5-2", "0.5-2", "2-8", "2-8", ">=8", ">=8"]


def test_cells_are_judged_against_the_best_completing_practical_policy():
    recs = [
        # p 0.8: RetainZ 1.00 vs greedy 1.30 / dedicated 1.05 (best): win by 0.05
        rec("retainz", 1.00, pressure=0.8), rec("greedy", 1.30, pressure=0.8), rec("dedicated", 1.05, pressure=0.8),
        rec("oracle", 0.90, pressure=0.8),            # not practical: ignored
        # p 0.9: RetainZ 1.10 vs dedicated 1.09: tie; greedy stops
        rec("retainz", 1.10), rec("greedy", 1.0, stop=500), rec("dedicated", 1.09),
        # p 0.95: RetainZ stops, greedy completes: lose (stop)
        rec("retainz", 1.0, stop=700, pressure=0.95), rec("greedy", 1.5, pressure=0.95),
        rec("dedicated", 1.0, stop=300, pressure=0.95),
    ]
    cs = {c.pressure: c for c in cells(Runs(recs, [], "t"))}
    assert (cs[0.8].outcome, cs[0.8].reason, cs[0.8].best) == ("win", "waf", "dedicated")
    assert cs[0.8].margin == pytest.approx(0.05)
    assert (cs[0.9].outcome, cs[0.9].best) == ("tie", "dedicated") and cs[0.9].margin == pytest.approx(-0.01)
    assert (cs[0.95].outcome, cs[0.95].reason, cs[0.95].margin) == ("lose", "stop", None)
    assert {c.ratio for c in cs.values()} == {1.0}
    out = []
    regime_claims(Runs(recs, [], "t"), out)
    got = {c["id"]: c["value"] for c in out}
    assert got["regime.cells"] == 3 and (got["regime.wins"], got["regime.ties"], got["regime.losses"]) == (1, 1, 1)
    assert got["regime.stops_where_another_completes"] == 1
    assert got["regime.max_gap_to_best"] == 0.01
    assert got["regime.t1.r0.5-2.p0.8.waf_margin"] == 0.05
    # stop pressure: RetainZ first stops at 0.95, greedy at 0.9, dedicated (the best other) at 0.95
    assert got["regime.t1.r0.5-2.stop_pressure_margin"] == 0.0
    recs[-1] = rec("dedicated", 1.0, pressure=0.95)          # dedicated never stops: 0.95 - 1.0
    out = []
    regime_claims(Runs(recs, [], "t"), out)
    assert {c["id"]: c["value"] for c in out}["regime.t1.r0.5-2.stop_pressure_margin"] == -0.05


def test_tenants_and_save_size_bin_the_cells(tmp_path):
    ten = [{"layout": "a", "rule": "b", "offset": 0}, {"layout": "a", "rule": "c", "offset": 5}]
    recs = [rec("retainz", 1.0, experiment="multitenant", tenants=ten, cap=GIB // 16),
            rec("zenfs", 1.2, experiment="multitenant", tenants=ten, cap=GIB // 16),
            rec("retainz", 1.0, cap=4 * GIB), rec("retainz-nohint", 1.0, cap=4 * GIB),
            rec("retainz", 1.0, experiment="pressure"), rec("greedy", 2.0, experiment="pressure")]  # not mapped
    regs = regime_map(Runs(recs, [], "t"))
    assert [(g.tenants, g.ratio_bin, g.pressure, g.count("win"), g.count("tie")) for g in regs] == \
        [(1, "<0.5", 0.9, 0, 1), (2, ">=8", 0.9, 1, 0)]
    from retainz.analysis.figures import setup_style

    setup_style()
    paths = regime_figure(Runs(recs, [], "t"), str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["regimes.pdf", "regimes.png"]
    assert all((tmp_path / n).stat().st_size > 1000 for n in ("regimes.pdf", "regimes.png"))
    assert regime_figure(Runs(recs[-2:], [], "t"), str(tmp_path / "none")) == []
