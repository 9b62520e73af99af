"""The fleet regime map (experiment ``fleet``, docs/fleet.md), from run records alone.

A *run cell* is one fleet (concurrency, churn, seed) on one device (geometry label) at one pressure:
the records that differ only in the policy.  Each is judged as the regime map judges a cell
(:func:`retainz.analysis.regimes.judge`: RetainZ against the best practical policy that completes;
win, tie, lose, and a stop where another completes counted apart).  A *map cell* gathers the seeds
of one (concurrency, churn, pressure, geometry): its median WAF margin with the spread (lowest and
highest over the seeds), and its counts of wins, ties, losses and stops.

:func:`fleet_claims` states them (``fleet.*``); :func:`fleet_table` renders the map as Markdown
(``fleet_map.md``).  Analysis never imports the store: records only.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

from retainz.analysis.claims import add_claim
from retainz.analysis.records import Runs, base_policy
from retainz.analysis.regimes import PRACTICAL, Cell, judge

__all__ = ["EXPERIMENT", "MapCell", "run_cells", "map_cells", "fleet_claims", "fleet_table"]

EXPERIMENT = "fleet"


def _where(rec: dict) -> tuple:
    f = rec["inputs"]["fleet"]
    return (f["concurrency"], f["churn"], rec["inputs"]["pressure"], rec["tags"]["label"] or "")


def run_cells(runs: Runs) -> list[tuple[tuple, int, Cell]]:
    """Every judged run cell: ``((concurrency, churn, pressure, geometry), seed, cell)``."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs.records:
        if r["tags"]["experiment"] != EXPERIMENT or r["inputs"].get("fleet") is None:
            continue
        groups.setdefault(_where(r) + (r["inputs"]["trace_seed"],), []).append(r)
    out = []
    for key, recs in sorted(groups.items(), key=lambda kv: repr(kv[0])):
        rz = [r for r in recs if r["inputs"]["policy"] == "retainz"]
        others = sorted((r for r in recs if base_policy(r["inputs"]["policy"]) in PRACTICAL),
                        key=lambda r: r["inputs"]["policy"])
        if len(rz) != 1 or not others:
            continue
        c = Cell(EXPERIMENT, 0, 0.0, rz[0]["inputs"]["pressure"], rz[0], others)
        judge(c)
        out.append((key[:4], key[4], c))
    return out


@dataclass
class MapCell:
    """One (concurrency, churn, pressure, geometry) over its seeds.

    Attributes:
        where: ``(concurrency, churn, pressure, geometry)``; cells: the seeds' judged cells.
    """

    where: tuple
    cells: list[Cell] = field(default_factory=list)

    def count(self, outcome: str, reason: str | None = None) -> int:
        return sum(1 for c in self.cells if c.outcome == outcome and (reason is None or c.reason == reason))

    @property
    def margins(self) -> list[float]:
        return [c.margin for c in self.cells if c.margin is not None]

    @property
    def runs(self) -> list[dict]:
        return [r for c in self.cells for r in c.runs]

    @property
    def outcome(self) -> str:
        """The seeds' majority outcome (``win``/``tie``/``lose``; ``mixed`` without a majority)."""
        n = len(self.cells)
        for o in ("win", "tie", "lose"):
            if self.count(o) * 2 > n:
                return o
        return "mixed"


def map_cells(runs: Runs) -> list[MapCell]:
    """The map cells, ordered by concurrency, churn, geometry, pressure."""
    cells: dict[tuple, MapCell] = {}
    for where, _, c in run_cells(runs):
        cells.setdefault(where, MapCell(where)).cells.append(c)
    return sorted(cells.values(), key=lambda m: (m.where[0], m.where[1], m.where[3], m.where[2]))


def _id(where: tuple) -> str:
    conc, churn, p, geo = where
    return f"fleet.c{conc:g}.churn{churn:g}.{geo.replace('/', '-')}.p{p:g}"


def fleet_claims(runs: Runs, out: list) -> None:
    """Append the ``fleet.*`` claims (nothing when the records hold no fleet experiment)."""
    cells = map_cells(runs)
    if not cells:
        return
    every = [r for m in cells for r in m.runs]
    seeds = [c for m in cells for c in m.cells]
    add_claim(out, "fleet.cells", len(cells), 0, every, "map cells (concurrency x churn x pressure x geometry)")
    add_claim(out, "fleet.run_cells", len(seeds), 0, every, "run cells (map cells x fleet seeds)")
    for o, word in (("win", "wins"), ("tie", "ties"), ("lose", "losses")):
        add_claim(out, f"fleet.{word}", sum(1 for c in seeds if c.outcome == o), 0, every,
                  f"run cells where RetainZ {word} (WAF margin beyond +-0.02, or completing where the others stop)")
    stops = [c for c in seeds if c.outcome == "lose" and c.reason == "stop"]
    add_claim(out, "fleet.stops_where_another_completes", len(stops), 0,
              [r for c in stops for r in c.runs] or every, "run cells where RetainZ stops and another policy completes")
    margins = [(c.margin, c) for c in seeds if c.margin is not None]
    if margins:
        hi = max(margins, key=lambda mc: (mc[0], mc[1].retainz["id"]))
        lo = min(margins, key=lambda mc: (mc[0], mc[1].retainz["id"]))
        add_claim(out, "fleet.max_waf_margin", hi[0], 3, hi[1].runs, "the largest WAF margin of any run cell")
        add_claim(out, "fleet.min_waf_margin", lo[0], 3, lo[1].runs, "the smallest WAF margin of any run cell")
    for m in cells:
        cid = _id(m.where)
        ms = m.margins
        add_claim(out, f"{cid}.median_waf_margin", statistics.median(ms) if ms else None, 3, m.runs,
                  "median over the seeds of best practical WAF - RetainZ WAF (null: no seed where both complete)")
        add_claim(out, f"{cid}.waf_margin_spread", (max(ms) - min(ms)) if ms else None, 3, m.runs,
                  "highest - lowest WAF margin over the seeds")
        for o, word in (("win", "wins"), ("tie", "ties"), ("lose", "losses")):
            add_claim(out, f"{cid}.{word}", m.count(o), 0, m.runs, f"seeds where RetainZ {word}")
        add_claim(out, f"{cid}.stops", m.count("lose", "stop"), 0, m.runs,
                  "seeds where RetainZ stops and another policy completes")


def _waf(rec: dict) -> str:
    return "stop" if rec["capacity_stop_step"] is not None else f"{rec['metrics']['waf']:.3f}"


def fleet_table(runs: Runs, out_dir: str) -> list[str]:
    """Write ``fleet_map.md``: one row per map cell (median margin, spread, counts, RetainZ's and the
    best practical policy's median WAF).  Returns the paths written (none without fleet records)."""
    cells = map_cells(runs)
    if not cells:
        return []
    lines = ["# The fleet regime map", "",
             "From the run records alone (retainz.analysis.fleetmap; docs/fleet.md). Margin: best practical "
             "WAF - RetainZ WAF over the seeds where both complete (median, and lowest..highest).", "",
             "| concurrency | churn | geometry | pressure | seeds | median margin | spread | wins | ties | losses "
             "| stops | RetainZ WAF (median) | best other WAF (median) | peak live GiB (median) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in cells:
        conc, churn, p, geo = m.where
        ms = m.margins
        rz = [c.retainz["metrics"]["waf"] for c in m.cells if c.retainz["capacity_stop_step"] is None]
        best = [min(r["metrics"]["waf"] for r in c.others if r["capacity_stop_step"] is None)
                for c in m.cells if any(r["capacity_stop_step"] is None for r in c.others)]
        peak = statistics.median(c.retainz["metrics"]["peak_live_bytes"] / 2**30 for c in m.cells)
        med = f"{statistics.median(ms):+.3f}" if ms else "-"
        spread = f"{min(ms):+.3f}..{max(ms):+.3f}" if ms else "-"
        rz_waf = f"{statistics.median(rz):.3f}" if rz else "stop"
        best_waf = f"{statistics.median(best):.3f}" if best else "stop"
        lines.append(f"| {conc:g} | {churn:g} | {geo} | {p:g} | {len(m.cells)} | {med} | {spread} | {m.count('win')} "
                     f"| {m.count('tie')} | {m.count('lose')} | {m.count('lose', 'stop')} | {rz_waf} | {best_waf} "
                     f"| {peak:.0f} |")
    path = os.path.join(out_dir, "fleet_map.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return [path]
