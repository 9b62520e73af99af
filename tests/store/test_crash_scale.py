"""Issue 15 item 8: the lane's power-cut campaigns cover at least ``RETAINZ_CRASH_POINTS`` (10,000)
distinct power-cut points, split evenly over every workload of ``WORKLOADS`` (a workload added there
is picked up by itself): clean and torn cuts (each zone keeps a block prefix of its unflushed
writes), every unflushed write kept, every one dropped, and the mixes between.  Each campaign's
count and failures are printed in the terminal summary (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

from retainz.testing.crashtest import WORKLOADS, campaign_series, distinct_points, lane_budget

#: Distinct power-cut points of this lane (over all workloads); raise it for a long run.
LANE_POINTS = int(os.environ.get("RETAINZ_CRASH_POINTS", "10000"))


@pytest.mark.slow
@pytest.mark.parametrize("name", WORKLOADS)
def test_power_cut_campaigns_at_scale(name, crash_ledger):
    target = lane_budget(LANE_POINTS)
    reports = campaign_series(name, target)
    crash_ledger.append((f"{name} at scale (seeds {reports[0].seed}..{reports[-1].seed})", reports))
    failures = [f"seed {r.seed}: {f}" for r in reports for f in r.failures]
    assert failures == []
    assert distinct_points(reports) >= target
    states: dict[str, int] = {}
    for r in reports:
        for kind, n in r.states.items():
            states[kind] = states.get(kind, 0) + n
    # every cut leaves its two extremes (all unflushed writes kept, none), torn prefixes between
    assert states["all kept"] == states["none kept"] == sum(r.write_boundaries for r in reports)
    assert states["partial"] > 0
    assert len({r.write_boundaries for r in reports} | {sum(r.classes.values()) for r in reports}) > 1


def test_distinct_points_count_a_repeated_campaign_once():
    a = campaign_series("basic", 1, first_seed=0)
    b = campaign_series("basic", 1, first_seed=0)
    assert len(a) == len(b) == 1 and a[0].points > 0
    assert distinct_points(a + b) == distinct_points(a) == a[0].points


def test_every_seed_scripts_a_different_workload():
    from retainz.testing.crashtest import workload

    for name in WORKLOADS:
        scripts = {repr(workload(name, seed)) for seed in range(6)}
        assert len(scripts) == 6, name
