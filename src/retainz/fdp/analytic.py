"""Analytic write amplification of a page-mapped FTL: the closed forms the FTL model is validated against.

Notation (Desnoyers, "Analytic modeling of SSD write performance", SYSTOR'12, DOI 10.1145/2367589.2367603;
extended in ACM TOS 10(2), 2014): T physical pages, U user (logical) pages, spare factor
``Sf = (T - U) / T``, ``alpha = T / U = 1 / (1 - Sf)``, ``Np`` pages per erase unit (here: pages per
reclaim unit, the unit the FTL model cleans).  Traffic is uniform random single-page overwrites unless a
hot/cold split is given: a fraction ``r`` of the writes goes uniformly to a fraction ``f`` of the logical
pages, the rest uniformly to the remaining ``1 - f``.

Every function returns the write amplification A = media page writes / host page writes (>= 1).
Each carries the paper and equation number it implements; the reference values quoted in the docstrings
were recomputed with these functions (and, independently, with scipy's ``lambertw``/``fsolve``).
No scipy here: the principal branch of Lambert W and the root finders are a few lines of numpy-free
floating point.
"""

from __future__ import annotations

import math

__all__ = [
    "alpha_of_spare_factor",
    "lambert_w0",
    "fifo_waf",
    "greedy_waf",
    "fifo_hot_cold_waf",
    "greedy_hot_cold_waf",
    "greedy_two_pool_waf",
    "greedy_two_pool_optimal",
    "cachelib_soc_dlwa",
]


def alpha_of_spare_factor(spare_factor: float) -> float:
    """``alpha = T / U = 1 / (1 - Sf)`` (Desnoyers SYSTOR'12, section 3).  Raises ValueError outside 0 < Sf < 1."""
    if not 0.0 < spare_factor < 1.0:
        raise ValueError(f"spare factor must be in (0, 1), got {spare_factor}")
    return 1.0 / (1.0 - spare_factor)


def lambert_w0(z: float) -> float:
    """The principal branch W0 of Lambert's W (w * e**w = z) for real ``-1/e <= z``.

    Halley's iteration from the branch-point series (Corless et al., "On the Lambert W function", Adv.
    Comput. Math. 5, 1996, Eq. 4.22) near -1/e, or from log1p(z) elsewhere; converges to double precision in a
    handful of steps.  Raises ValueError for z < -1/e (no real value).
    """
    branch = -1.0 / math.e
    if z < branch - 1e-15:
        raise ValueError(f"lambert_w0 has no real value below -1/e: {z}")
    if z <= branch:
        return -1.0
    if z == 0.0:
        return 0.0
    if z < -0.25:
        p = math.sqrt(2.0 * (math.e * z + 1.0))
        w = -1.0 + p - p * p / 3.0 + 11.0 / 72.0 * p ** 3
    else:
        w = math.log1p(z) if z < 3.0 else math.log(z) - math.log(math.log(z))
    for _ in range(50):
        ew = math.exp(w)
        f = w * ew - z
        if f == 0.0:
            break
        wp1 = w + 1.0
        if wp1 == 0.0:
            break
        step = f / (ew * wp1 - (w + 2.0) * f / (2.0 * wp1))
        w -= step
        if abs(step) <= 1e-15 * (1.0 + abs(w)):
            break
    return w


def fifo_waf(alpha: float) -> float:
    """LRU (FIFO) cleaning under uniform random writes: ``A = alpha / (alpha + W0(-alpha e^-alpha))``.

    Desnoyers SYSTOR'12, Eq. 4; independent of pages per block.  The same closed form as the
    log-structured-array model (Menon) and CacheLib's Theorem 1 (:func:`cachelib_soc_dlwa`).
    Reference values: Sf 0.07 -> 7.32, 0.10 -> 5.18, 0.20 -> 2.69, 0.28 -> 1.99, 0.50 -> 1.26.
    Raises ValueError for alpha <= 1 (no spare space: A is unbounded).
    """
    if alpha <= 1.0:
        raise ValueError(f"alpha = T/U must exceed 1, got {alpha}")
    return alpha / (alpha + lambert_w0(-alpha * math.exp(-alpha)))


def _k(pages_per_block: int) -> float:
    """Desnoyers' greedy correction ``k = 1 + 1 / (2 Np)`` (SYSTOR'12, Eq. 12)."""
    if pages_per_block < 1:
        raise ValueError(f"pages per block must be >= 1, got {pages_per_block}")
    return 1.0 + 1.0 / (2.0 * pages_per_block)


def greedy_waf(alpha: float, pages_per_block: int) -> float:
    """Greedy cleaning under uniform random writes: ``A_greedy(alpha, Np) = A_LRU(k alpha) / k``, k = 1 + 1/(2 Np).

    Desnoyers SYSTOR'12, Eq. 12 (his approximation; it tends to Eq. 4 as Np grows).  Reference values at
    Np = 64: Sf 0.07 -> 6.60, 0.10 -> 4.82, 0.20 -> 2.60, 0.28 -> 1.94.
    """
    k = _k(pages_per_block)
    return fifo_waf(k * alpha) / k


def _check_split(r: float, f: float) -> None:
    if not (0.0 < r < 1.0 and 0.0 < f < 1.0):
        raise ValueError(f"hot/cold split needs 0 < r < 1 and 0 < f < 1, got r={r}, f={f}")


def fifo_hot_cold_waf(alpha: float, r: float, f: float) -> float:
    """LRU (FIFO) cleaning of one pool under hot/cold traffic: the root x > 1 of
    ``1 + r / (e^{(r/f) alpha/x} - 1) + (1-r) / (e^{((1-r)/(1-f)) alpha/x} - 1) = x``.

    Desnoyers SYSTOR'12, Eq. 14 (x is the write amplification; with r = f it reduces to Eq. 4).
    Solved by bisection: the left side minus x is positive at x = 1 and negative for large x.
    """
    _check_split(r, f)
    if alpha <= 1.0:
        raise ValueError(f"alpha = T/U must exceed 1, got {alpha}")
    hot, cold = r / f * alpha, (1.0 - r) / (1.0 - f) * alpha

    def g(x: float) -> float:
        return 1.0 + r / math.expm1(hot / x) + (1.0 - r) / math.expm1(cold / x) - x

    lo, hi = 1.0, 2.0
    while g(hi) > 0.0:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if g(mid) > 0.0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return 0.5 * (lo + hi)


def greedy_hot_cold_waf(alpha: float, pages_per_block: int, r: float, f: float) -> float:
    """Greedy cleaning of one pool under hot/cold traffic: Eq. 14 with the greedy correction,
    ``A = A_LRU_hc(k alpha) / k`` (Desnoyers SYSTOR'12, Eq. 16)."""
    k = _k(pages_per_block)
    return fifo_hot_cold_waf(k * alpha, r, f) / k


def greedy_two_pool_waf(p: float, alpha: float, pages_per_block: int, r: float, f: float) -> float:
    """Hot and cold data in separate greedy pools, a share ``p`` of the spare space in the hot pool:
    ``A = r A_g(alpha_h) + (1 - r) A_g(alpha_c)`` with ``alpha_h = (p (alpha-1) + f) / f`` and
    ``alpha_c = ((1-p)(alpha-1) + (1-f)) / (1-f)`` (Desnoyers SYSTOR'12, Eqs. 20, 21, 22; A_g is Eq. 12).
    Raises ValueError for p outside [0, 1]."""
    _check_split(r, f)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"spare share p must be in [0, 1], got {p}")
    alpha_h = (p * (alpha - 1.0) + f) / f
    alpha_c = ((1.0 - p) * (alpha - 1.0) + (1.0 - f)) / (1.0 - f)
    inf = float("inf")
    a_h = greedy_waf(alpha_h, pages_per_block) if alpha_h * _k(pages_per_block) > 1.0 else inf
    a_c = greedy_waf(alpha_c, pages_per_block) if alpha_c * _k(pages_per_block) > 1.0 else inf
    return r * a_h + (1.0 - r) * a_c


def greedy_two_pool_optimal(alpha: float, pages_per_block: int, r: float, f: float) -> tuple[float, float]:
    """The spare split p* that minimises Eq. 20 and the write amplification there, as ``(A, p*)``
    (Desnoyers SYSTOR'12, section 5: the optimal division of spare space between the hot and cold pools).
    Golden-section search on p in [0, 1] after a coarse scan (Eq. 20 is unimodal in p)."""
    grid = [i / 200 for i in range(1, 200)]
    vals = [greedy_two_pool_waf(p, alpha, pages_per_block, r, f) for p in grid]
    i = min(range(len(vals)), key=vals.__getitem__)
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    phi = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fa = greedy_two_pool_waf(a, alpha, pages_per_block, r, f)
    fb = greedy_two_pool_waf(b, alpha, pages_per_block, r, f)
    for _ in range(100):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - phi * (hi - lo)
            fa = greedy_two_pool_waf(a, alpha, pages_per_block, r, f)
        else:
            lo, a, fa = a, b, fb
            b = lo + phi * (hi - lo)
            fb = greedy_two_pool_waf(b, alpha, pages_per_block, r, f)
        if hi - lo < 1e-10:
            break
    p = 0.5 * (lo + hi)
    return greedy_two_pool_waf(p, alpha, pages_per_block, r, f), p


def cachelib_soc_dlwa(soc_bytes: float, soc_physical_bytes: float) -> float:
    """Device write amplification of CacheLib's small-object cache (uniform random bucket writes, greedy
    GC) in a placement handle of its own: ``DLWA = 1 / (1 - delta)`` where delta solves
    ``S_SOC / S_P-SOC = (delta - 1) / ln delta`` (Allison et al., EuroSys'25, Theorem 1 and Appendix A;
    S_P-SOC is the physical space the SOC's data can occupy: its own size plus the spare it may use).

    Equal to :func:`fifo_waf` at alpha = S_P-SOC / S_SOC (the paper's model is the large-block limit of
    Desnoyers' Eq. 4).  Solved by bisection on delta in (0, 1).  Raises ValueError unless
    0 < soc_bytes < soc_physical_bytes.
    """
    if not 0.0 < soc_bytes < soc_physical_bytes:
        raise ValueError(f"need 0 < SOC size < SOC physical space, got {soc_bytes}, {soc_physical_bytes}")
    ratio = soc_bytes / soc_physical_bytes
    lo, hi = 1e-300, 1.0 - 1e-16
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        # (delta - 1) / ln(delta) rises from 0 to 1 as delta goes from 0 to 1.
        if (mid - 1.0) / math.log(mid) < ratio:
            lo = mid
        else:
            hi = mid
    return 1.0 / (1.0 - 0.5 * (lo + hi))
