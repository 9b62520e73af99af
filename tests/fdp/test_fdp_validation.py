"""The FTL model's validation table at CI size (``make ftl-validate`` runs it at full size; docs/fdp.md).

Tolerances (relative to the analytic value): 3 % for Desnoyers Eqs. 4, 12, 14 and 20-22 and CacheLib's
Theorem 1; 5 % for Eq. 16 at r 0.8 / f 0.2 and 15 % at r 0.9 / f 0.1 (Eq. 16 carries uniform traffic's
greedy correction to skewed traffic and overestimates there); exactly 1.00 for whole-RU invalidation;
rules (II above PI, rising without separation) where no closed form exists.  About 20 s on one core.
"""

from __future__ import annotations

import pytest

from retainz.fdp.validation import SIZES, markdown, rows


@pytest.fixture(scope="module")
def table():
    return rows(SIZES["small"])


def test_every_row_is_within_its_tolerance(table):
    bad = [r for r in table if not r.ok]
    assert not bad, markdown(bad)


def test_the_table_covers_every_case(table):
    groups = {r.group for r in table}
    for needle in ("uniform, greedy, Np 64", "uniform, FIFO", "uniform, greedy, Sf 0.10", "hot/cold, one pool, FIFO",
                   "hot/cold, one pool, greedy", "two pools", "whole-RU", "CacheLib", "II vs PI"):
        assert any(needle in g for g in groups), needle
    sources = {r.source for r in table}
    assert {"Desnoyers Eq. 4", "Desnoyers Eq. 12", "Desnoyers Eq. 14", "Desnoyers Eq. 16",
            "Desnoyers Eqs. 20-22", "exact"} <= sources


def test_greedy_approaches_eq4_as_pages_per_block_grow(table):
    sweep = [r for r in table if r.group == "uniform, greedy, Sf 0.10"]
    assert [r.model for r in sweep] == sorted(r.model for r in sweep)
    assert sweep[-1].model == pytest.approx(5.18, rel=0.035)  # Eq. 4 at Sf 0.10, Np 256


def test_whole_ru_invalidation_is_exactly_one(table):
    whole = [r for r in table if r.group.startswith("whole-RU")]
    assert len(whole) == 2 and all(r.model == 1.0 for r in whole)


def test_cachelib_mix_separation_holds_one_and_mixing_climbs(table):
    mix = [r for r in table if r.group.startswith("CacheLib")]
    sep = [r.model for r in mix if "separate" in r.case]
    one = [r.model for r in mix if "one handle" in r.case]
    assert max(sep) < 1.05
    assert one[-1] > 2.5 and one == sorted(one)
