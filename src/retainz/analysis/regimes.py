"""The regime map: where RetainZ's placement pays off, ties, or loses, from run records alone.

A *cell* is one workload on one device at one pressure: every record of an experiment in
:data:`EXPERIMENTS` with the same inputs except the policy.  In a cell RetainZ (``retainz``) is compared
with the best *practical* other policy (:data:`PRACTICAL`: greedy log, no hints, ZenFS-Alloc,
dedicated zones; the oracle and the hint controls are not practical):

* **WAF margin** = best other's WAF - RetainZ's WAF, over the policies that complete the run (no
  capacity stop).  Positive: RetainZ writes less.  Outcome ``win`` (margin > :data:`TIE`), ``tie``
  (within it) or ``lose``.  RetainZ stopping where another completes is ``lose`` (``stop``); completing
  where every other stops is ``win`` (``others stop``; no margin).
* **Stop-pressure margin** (per workload and device, over its pressures) = the lowest pressure at which
  RetainZ stops - the best other's lowest stop pressure, a run that never stops counting as 1.0.
  Positive: RetainZ survives more pressure.

Cells are binned into *regimes*: tenants (jobs sharing the device: 1 or the ``tenants`` input's length)
x save size / zone capacity (:data:`RATIO_BINS`; the save size is the mean bytes per committed
generation of the cell's longest run) x pressure.  :func:`regime_map` tabulates them,
:func:`regime_figure` draws ``regimes.pdf`` (a heat map of the median WAF margin per regime, with the
win/tie/lose counts, beside the stop-pressure margin), and :func:`regime_claims` states them as claims
(``regime.*``).  Analysis never imports the store: records only.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from retainz.analysis.claims import add_claim
from retainz.analysis.records import Runs, base_policy, slug

__all__ = ["EXPERIMENTS", "PRACTICAL", "TIE", "RATIO_BINS", "Cell", "judge", "Regime", "cells", "regime_map",
           "regime_figure", "regime_claims", "ratio_bin"]

#: Experiments whose records form the map (the issue-13 manifests).
EXPERIMENTS = ("multitenant", "geometry", "uncertain")
#: The practical policies RetainZ is compared with (base names).
PRACTICAL = ("greedy", "retainz-nohint", "zenfs", "dedicated")
#: WAF difference counted as a tie.
TIE = 0.02
#: Upper edges of the save size / zone capacity bins (the last bin is open).
RATIO_BINS = (0.5, 2.0, 8.0)
_IGNORED = ("policy", "zone_map", "verify_summaries", "seed")
_PLURAL = {"win": "wins", "tie": "ties", "lose": "losses"}


def ratio_bin(ratio: float) -> str:
    """``"<0.5"``, ``"0.5-2"``, ``"2-8"`` or ``">=8"`` for a save size / zone capacity ratio."""
    lo = 0.0
    for hi in RATIO_BINS:
        if ratio < hi:
            return f"<{hi:g}" if lo == 0 else f"{lo:g}-{hi:g}"
        lo = hi
    return f">={lo:g}"


def _tenants(rec: dict) -> int:
    t = rec["inputs"].get("tenants")
    return len(t) if t else 1


def _completes(rec: dict) -> bool:
    return rec["capacity_stop_step"] is None


@dataclass
class Cell:
    """One workload, device and pressure, with RetainZ and the practical others.

    Attributes:
        experiment, tenants, ratio (save size / zone capacity), pressure: where it sits.
        retainz: RetainZ's record; others: the practical policies' records.
        outcome: ``win``, ``tie`` or ``lose``; reason: ``waf``, ``stop`` or ``others stop``.
        margin: best other's WAF - RetainZ's (both complete), else None.
        best: the best other's policy spec (None when none completes).
    """

    experiment: str
    tenants: int
    ratio: float
    pressure: float
    retainz: dict
    others: list[dict]
    outcome: str = ""
    reason: str = ""
    margin: float | None = None
    best: str | None = None

    @property
    def runs(self) -> list[dict]:
        return [self.retainz] + self.others


def judge(c: Cell) -> None:
    done = [r for r in c.others if _completes(r)]
    best = min(done, key=lambda r: (r["metrics"]["waf"], r["inputs"]["policy"])) if done else None
    c.best = best["inputs"]["policy"] if best else None
    if _completes(c.retainz):
        if best is None:
            c.outcome, c.reason = "win", "others stop"
            return
        c.margin = best["metrics"]["waf"] - c.retainz["metrics"]["waf"]
        c.outcome = "win" if c.margin > TIE else "lose" if c.margin < -TIE else "tie"
        c.reason = "waf"
    elif best is not None:
        c.outcome, c.reason = "lose", "stop"
    else:  # everyone stops: the later stop wins
        rz = c.retainz["capacity_stop_step"]
        other = max(r["capacity_stop_step"] for r in c.others)
        c.outcome = "win" if rz > other else "lose" if rz < other else "tie"
        c.reason = "all stop"


def cells(runs: Runs) -> list[Cell]:
    """Every cell with a RetainZ record and at least one practical other, judged (module docstring)."""
    groups: dict[str, list[dict]] = {}
    for r in runs.records:
        if r["tags"]["experiment"] not in EXPERIMENTS or r["inputs"].get("pressure") is None:
            continue
        key = repr(sorted((k, repr(v)) for k, v in r["inputs"].items() if k not in _IGNORED)
                   + [("experiment", r["tags"]["experiment"])])
        groups.setdefault(key, []).append(r)
    out = []
    for recs in groups.values():
        rz = [r for r in recs if r["inputs"]["policy"] == "retainz"]
        others = [r for r in recs if base_policy(r["inputs"]["policy"]) in PRACTICAL]
        if len(rz) != 1 or not others:
            continue
        longest = max(recs, key=lambda r: r["metrics"].get("generations_committed", 0))
        m = longest["metrics"]
        save = m["host_bytes"] / max(1, m.get("generations_committed", 0))
        ratio = save / longest["inputs"]["zone_capacity"]
        c = Cell(rz[0]["tags"]["experiment"], _tenants(rz[0]), ratio, rz[0]["inputs"]["pressure"], rz[0],
                 sorted(others, key=lambda r: r["inputs"]["policy"]))
        judge(c)
        out.append(c)
    out.sort(key=lambda c: (c.tenants, c.ratio, c.pressure, c.retainz["id"]))
    return out


@dataclass
class Regime:
    """The cells of one (tenants, ratio bin, pressure) regime and what they say.

    Attributes:
        tenants, ratio_bin, pressure: the regime.
        cells: its cells.
        wins, ties, losses: outcome counts.
        median_margin, worst_margin: over the cells with a WAF margin (None when none has one).
    """

    tenants: int
    ratio_bin: str
    pressure: float
    cells: list[Cell] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for c in self.cells if c.outcome == outcome)

    @property
    def margins(self) -> list[float]:
        return [c.margin for c in self.cells if c.margin is not None]

    @property
    def median_margin(self) -> float | None:
        return statistics.median(self.margins) if self.margins else None

    @property
    def worst_margin(self) -> float | None:
        return min(self.margins) if self.margins else None


def _bin_order(label: str) -> int:
    labels = [ratio_bin(x) for x in (0.0, *RATIO_BINS)]
    return labels.index(label)


def regime_map(runs: Runs) -> list[Regime]:
    """Cells binned into regimes, ordered by tenants, ratio bin and pressure."""
    bins: dict[tuple, Regime] = {}
    for c in cells(runs):
        k = (c.tenants, ratio_bin(c.ratio), c.pressure)
        bins.setdefault(k, Regime(*k)).cells.append(c)
    return [bins[k] for k in sorted(bins, key=lambda k: (k[0], _bin_order(k[1]), k[2]))]


def stop_pressure_margins(runs: Runs) -> dict[tuple[int, str], list[tuple[float, list[dict]]]]:
    """Per (tenants, ratio bin): for each workload and device swept over pressure, RetainZ's lowest stop
    pressure - the best practical other's (no stop counts as 1.0), with the records it comes from."""
    series: dict[str, list[Cell]] = {}
    for c in cells(runs):
        i = c.retainz["inputs"]
        key = repr(sorted((k, repr(v)) for k, v in i.items() if k not in _IGNORED + ("pressure",)))
        series.setdefault(key, []).append(c)
    out: dict[tuple[int, str], list] = {}
    for cs in series.values():
        if len({c.pressure for c in cs}) < 2:
            continue

        def first_stop(recs):
            stops = [r["inputs"]["pressure"] for r in recs if not _completes(r)]
            return min(stops) if stops else 1.0

        rz = first_stop([c.retainz for c in cs])
        pols = sorted({r["inputs"]["policy"] for c in cs for r in c.others})
        best = max(first_stop([r for c in cs for r in c.others if r["inputs"]["policy"] == p]) for p in pols)
        runs_used = [r for c in cs for r in c.runs]
        k = (cs[0].tenants, ratio_bin(statistics.median(c.ratio for c in cs)))
        out.setdefault(k, []).append((rz - best, runs_used))
    return out


def regime_figure(runs: Runs, out_dir: str) -> list[str]:
    """``regimes.pdf`` (and PNG): (a) median WAF margin per regime (rows: tenants x save/zone-capacity
    bin, columns: pressure; text: margin and win/tie/lose counts, ``stop`` where RetainZ stopped and
    another completed), (b) the stop-pressure margin per row.  Nothing is written without cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from retainz.analysis.figures import COLUMN_WIDTH, save

    regimes = regime_map(runs)
    if not regimes:
        return []
    rows = sorted({(g.tenants, g.ratio_bin) for g in regimes}, key=lambda k: (k[0], _bin_order(k[1])))
    cols = sorted({g.pressure for g in regimes})
    grid = np.full((len(rows), len(cols)), np.nan)
    text = [["" for _ in cols] for _ in rows]
    for g in regimes:
        i, j = rows.index((g.tenants, g.ratio_bin)), cols.index(g.pressure)
        m = g.median_margin
        if m is not None:
            grid[i, j] = m
        stop = any(c.reason == "stop" for c in g.cells)
        head = "stop" if stop and m is None else ("n/a" if m is None else f"{m:+.2f}")
        text[i][j] = f"{head}\n{g.count('win')}/{g.count('tie')}/{g.count('lose')}"
    spm = stop_pressure_margins(runs)
    side = np.full((len(rows), 1), np.nan)
    for i, k in enumerate(rows):
        if k in spm:
            side[i, 0] = statistics.median(m for m, _ in spm[k])
    lim = max(0.05, float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 0.05)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(2 * COLUMN_WIDTH, 0.45 * len(rows) + 1.0),
                                 gridspec_kw={"width_ratios": [len(cols), 1.2]})
    im = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=5)
    ylabels = [f"{t} job{'s' if t > 1 else ''}, save/zone {b}" for t, b in rows]
    ax.set_xticks(range(len(cols)), [f"{p:g}" for p in cols])
    ax.set_yticks(range(len(rows)), ylabels)
    ax.set_xlabel("space pressure")
    ax.set_title("(a) WAF margin of RetainZ over the best practical policy\n(median; wins/ties/losses)")
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    slim = max(0.05, float(np.nanmax(np.abs(side))) if np.isfinite(side).any() else 0.05)
    bx.imshow(side, cmap="RdBu", vmin=-slim, vmax=slim, aspect="auto")
    for i in range(len(rows)):
        v = side[i, 0]
        bx.text(0, i, "n/a" if math.isnan(v) else f"{v:+.2f}", ha="center", va="center", fontsize=5)
    bx.set_xticks([])
    bx.set_yticks([])
    bx.set_title("(b) stop-pressure\nmargin")
    return save(fig, out_dir, "regimes")


def regime_claims(runs: Runs, out: list) -> None:
    """Append the regime claims to ``out`` (the claims file format of :mod:`retainz.analysis.claims`):

    * ``regime.cells``, ``regime.wins``, ``regime.ties``, ``regime.losses``: counts over every cell;
    * ``regime.stops_where_another_completes``: cells where RetainZ stopped and a practical policy
      completed (the target is 0);
    * ``regime.max_gap_to_best``: the largest RetainZ WAF - best practical WAF over cells where both
      complete (the target is at most ``TIE``);
    * per regime ``regime.t<T>.r<bin>.p<P>.{waf_margin,wins,ties,losses}``;
    * per (tenants, bin) ``regime.t<T>.r<bin>.stop_pressure_margin`` (median over its sweeps).
    """
    all_cells = cells(runs)
    if not all_cells:
        return
    every = [r for c in all_cells for r in c.runs]
    add_claim(out, "regime.cells", len(all_cells), 0, every, "cells (workload x device x pressure) in the regime map")
    for o in ("win", "tie", "lose"):
        add_claim(out, f"regime.{_PLURAL[o]}", sum(1 for c in all_cells if c.outcome == o), 0, every,
               f"cells where RetainZ's outcome against the best practical policy is {o} (tie: within {TIE} WAF)")
    stops = [c for c in all_cells if c.reason == "stop"]
    add_claim(out, "regime.stops_where_another_completes", len(stops), 0, [r for c in stops for r in c.runs] or every,
           "cells where RetainZ hits a capacity stop and a practical policy completes the run")
    gaps = [c for c in all_cells if c.margin is not None]
    if gaps:
        worst = min(gaps, key=lambda c: c.margin)
        add_claim(out, "regime.max_gap_to_best", 0.0 - worst.margin + 0.0, 3, worst.runs,
               "largest RetainZ WAF minus the best completing practical policy's WAF over all cells")
    for g in regime_map(runs):
        rid = f"regime.t{g.tenants}.r{slug(g.ratio_bin.replace('<', 'lt').replace('>=', 'ge'))}.p{g.pressure:g}"
        used = [r for c in g.cells for r in c.runs]
        where = f"{g.tenants} job(s), save/zone capacity {g.ratio_bin}, pressure {g.pressure:g}"
        add_claim(out, f"{rid}.waf_margin", g.median_margin, 3, used,
               f"median WAF margin of RetainZ over the best practical policy: {where}")
        for o in ("win", "tie", "lose"):
            add_claim(out, f"{rid}.{_PLURAL[o]}", g.count(o), 0, used, f"cells where RetainZ {_PLURAL[o]}: {where}")
    for (t, b), ms in sorted(stop_pressure_margins(runs).items(), key=lambda kv: (kv[0][0], _bin_order(kv[0][1]))):
        rid = f"regime.t{t}.r{slug(b.replace('<', 'lt').replace('>=', 'ge'))}"
        add_claim(out, f"{rid}.stop_pressure_margin", statistics.median(m for m, _ in ms), 2,
               [r for _, rs in ms for r in rs],
               f"median over sweeps of RetainZ's lowest stop pressure minus the best practical policy's "
               f"(no stop = 1.0): {t} job(s), save/zone capacity {b}")
