"""The FDP FTL model (retainz.fdp.ftl): its maps and counters stay consistent under any mix of writes,
deallocates and RUH Updates, isolation holds, the byte interface refuses what the model cannot represent,
and the analytic module gives the published reference values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retainz.errors import ReclaimGroupFullError
from retainz.fdp import analytic
from retainz.fdp.ftl import FlashGeometry, FlashTranslationLayer, RuhType

PPR = 8


def small(handles=("II", "PI", "II"), rus=24, logical=100, victim="greedy", gc_copies_to="gc_ru", rgs=1):
    return FlashTranslationLayer(FlashGeometry(4096, 4, 2, rus, rgs), logical, handles, victim=victim,
                                 gc_copies_to=gc_copies_to)


def isolation_holds(ftl: FlashTranslationLayer) -> None:
    """Every valid page of a PI handle's RU was written by that handle; II RUs hold only II handles' data."""
    for ru in range(ftl.geometry.nr_rus):
        seg = ftl.p2l[ru * PPR:(ru + 1) * PPR]
        writers = set(ftl._writer[seg[seg >= 0]].tolist())
        dom = int(ftl.ru_domain[ru])
        if dom >= 0:
            assert writers <= {dom}, (ru, dom, writers)
        else:
            assert all(ftl.handles[h] is RuhType.INITIALLY_ISOLATED for h in writers), (ru, writers)


ops = st.lists(st.one_of(
    st.tuples(st.just("w"), st.integers(0, 2), st.lists(st.integers(0, 99), min_size=1, max_size=40)),
    st.tuples(st.just("d"), st.integers(0, 99), st.integers(1, 30)),
    st.tuples(st.just("u"), st.integers(0, 2)),
), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=ops, victim=st.sampled_from(["greedy", "fifo"]), gc=st.sampled_from(["gc_ru", "host_ru"]))
def test_maps_and_counters_stay_consistent(ops, victim, gc):
    ftl = small(victim=victim, gc_copies_to=gc)
    live: dict[int, int] = {}
    for op in ops:
        if op[0] == "w":
            ftl.write_pages(np.array(op[2]), op[1])
            live.update({lpn: op[1] for lpn in op[2]})
        elif op[0] == "d":
            lo, n = op[1], min(op[2], 100 - op[1])
            ftl.deallocate_pages(np.arange(lo, lo + n))
            for lpn in range(lo, lo + n):
                live.pop(lpn, None)
        else:
            ftl.ruh_update(op[1])
        ftl.check()
        isolation_holds(ftl)
    s = ftl.stats
    assert ftl.valid_pages == len(live)
    assert sorted(np.flatnonzero(ftl.l2p >= 0).tolist()) == sorted(live)
    assert s.media_bytes_written == s.host_bytes_written + s.media_reallocated_bytes + s.padding_bytes
    assert s.media_bytes_erased == s.ru_erases * ftl.geometry.ru_bytes
    assert sum(s.host_bytes_by_handle) == s.host_bytes_written
    assert sum(s.relocated_bytes_by_handle) == s.media_reallocated_bytes


def test_a_repeated_lpn_in_one_write_keeps_the_last_copy():
    ftl = small(handles=("II",))
    ftl.write_pages(np.array([5, 6, 5, 5]))
    assert ftl.valid_pages == 2
    assert ftl.l2p[5] == 3 + ftl.l2p[6] - 1  # page 3 of the RU: the last of the three writes of LPN 5
    assert ftl.stats.host_bytes_written == 4 * 4096
    ftl.check()


def test_sequential_overwrite_never_copies_and_erases_whole_rus():
    ftl = small(handles=("II",), rus=20, logical=64)
    for _ in range(10):
        ftl.write(0, 64 * 4096)
    s = ftl.stats
    assert s.waf == 1.0 and s.media_reallocated_events == 0
    assert s.ru_erases > 0 and s.media_bytes_erased == s.ru_erases * 8 * 4096


def test_ruh_update_charges_the_unwritten_remainder_like_qemu():
    ftl = small(handles=("II",))
    ftl.write_pages(np.arange(3))
    ftl.ruh_update(0)
    ftl.ruh_update(0)  # nothing open: no second event
    s = ftl.stats
    assert (s.ru_not_fully_written_events, s.padding_bytes) == (1, 5 * 4096)
    assert s.media_bytes_written == 8 * 4096 and s.host_bytes_written == 3 * 4096
    ftl.write_pages(np.array([10]))
    assert ftl.l2p[10] // PPR != ftl.l2p[0] // PPR  # the next write starts a fresh RU


def test_pi_copies_stay_in_their_handle_and_ii_copies_mix():
    rng = np.random.default_rng(3)
    for kind, mixes in (("PI", False), ("II", True)):
        ftl = small(handles=(kind, kind), rus=40, logical=200)
        for _ in range(200):
            ftl.write_pages(rng.integers(0, 40, 8), 0)
            ftl.write_pages(rng.integers(40, 200, 2), 1)
        isolation_holds(ftl)
        mixed = 0
        for ru in range(ftl.geometry.nr_rus):
            seg = ftl.p2l[ru * PPR:(ru + 1) * PPR]
            mixed += len(set(ftl._writer[seg[seg >= 0]].tolist())) > 1
        assert (mixed > 0) is mixes, kind


def test_reclaim_groups_keep_their_own_data():
    ftl = small(handles=("II",), rus=(12, 30), logical=120, rgs=1)
    assert ftl.geometry.nr_rgs == 2 and ftl.geometry.rg_first_ru == (0, 12)
    rng = np.random.default_rng(4)
    for _ in range(100):
        ftl.write_pages(rng.integers(0, 30, 4), 0, 0)
        ftl.write_pages(rng.integers(30, 120, 4), 0, 1)
    ftl.check()
    assert np.all(ftl.l2p[:30] < 12 * PPR) and np.all(ftl.l2p[30:] >= 12 * PPR)


def test_a_group_full_of_valid_data_is_a_clear_error():
    # one RG of 14 RUs, the namespace fits; writing it all through RG 0 of a two-RG device does not
    ftl = small(handles=("II",), rus=(14, 40), logical=300)
    with pytest.raises(ReclaimGroupFullError, match="reclaim group 0") as e:
        ftl.write_pages(np.arange(300), 0, 0, unique=True)
    assert e.value.rg == 0


@pytest.mark.parametrize("call, match", [
    (lambda f: f.write(100, 4096), "whole 4096-byte pages"),
    (lambda f: f.write(0, 1000), "whole 4096-byte pages"),
    (lambda f: f.write(99 * 4096, 2 * 4096), "namespace end"),
    (lambda f: f.write_pages(np.array([100])), "outside the namespace"),
    (lambda f: f.write_pages(np.array([1]), handle=3), "placement handle 3"),
    (lambda f: f.write_pages(np.array([1]), rg=1), "reclaim group 1"),
    (lambda f: f.deallocate(0, 0), "whole 4096-byte pages"),
])
def test_bad_requests_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call(small())


def test_a_namespace_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        small(logical=24 * PPR)
    with pytest.raises(ValueError, match="'greedy' or 'fifo'"):
        small(victim="lru")
    with pytest.raises(ValueError, match="'gc_ru' or 'host_ru'"):
        small(gc_copies_to="frontier")
    with pytest.raises(ValueError, match="multiple of 512"):
        FlashGeometry(1000, 4, 2, 10)


def test_statistics_window():
    ftl = small(handles=("II",))
    ftl.write_pages(np.arange(50))
    before = ftl.stats.copy()
    ftl.write_pages(np.arange(10))
    d = ftl.stats.minus(before)
    assert d.host_bytes_written == 10 * 4096 and d.host_bytes_by_handle == [10 * 4096]
    assert math.isnan(small().stats.waf)


@pytest.mark.parametrize("sf, eq4, eq12", [(0.07, 7.32, 6.60), (0.10, 5.18, 4.82), (0.20, 2.69, 2.60),
                                           (0.28, 1.99, 1.94)])
def test_analytic_reference_values(sf, eq4, eq12):
    alpha = analytic.alpha_of_spare_factor(sf)
    assert round(analytic.fifo_waf(alpha), 2) == eq4
    assert round(analytic.greedy_waf(alpha, 64), 2) == eq12
    # Eq. 14 with r = f is Eq. 4; CacheLib's Theorem 1 is Eq. 4 at alpha = S_P-SOC / S_SOC
    assert analytic.fifo_hot_cold_waf(alpha, 0.5, 0.5) == pytest.approx(analytic.fifo_waf(alpha), rel=1e-9)
    assert analytic.cachelib_soc_dlwa(1.0, alpha) == pytest.approx(analytic.fifo_waf(alpha), rel=1e-9)


def test_analytic_hot_cold_values():
    a = analytic.alpha_of_spare_factor(0.07)
    # recomputed with scipy.optimize.fsolve on Eq. 14 (and / k for Eq. 16)
    assert analytic.fifo_hot_cold_waf(a, 0.8, 0.2) == pytest.approx(7.681674586904342, rel=1e-9)
    assert analytic.greedy_hot_cold_waf(a, 128, 0.8, 0.2) == pytest.approx(7.301916419449876, rel=1e-9)
    best, p = analytic.greedy_two_pool_optimal(a, 128, 0.8, 0.2)
    assert best < analytic.greedy_two_pool_waf(p - 0.05, a, 128, 0.8, 0.2)
    assert best < analytic.greedy_two_pool_waf(p + 0.05, a, 128, 0.8, 0.2)
    assert analytic.fifo_waf(1.3) == pytest.approx(2.364, abs=5e-4)  # Xiang & Kurkoski's 2.36 at OP 0.3
    assert analytic.lambert_w0(1.0) == pytest.approx(0.5671432904097838, rel=1e-12)  # the omega constant
    with pytest.raises(ValueError):
        analytic.fifo_waf(1.0)


def test_peak_valid_pages_is_the_fullest_moment():
    """The most pages valid at once after any host write (how close the FTL came to full), kept as a running
    count that check() compares with the map."""
    ftl = small(handles=("II",))
    ftl.write_pages(np.arange(10))
    ftl.deallocate_pages(np.arange(5))
    ftl.write_pages(np.arange(3))
    ftl.write_pages(np.arange(8, 10))          # overwrites: no new valid page
    assert (ftl.valid_pages, ftl.peak_valid_pages) == (8, 10)
    ftl.check()
    ftl.write_pages(np.arange(20, 40))
    assert ftl.peak_valid_pages == 28
    ftl.check()
