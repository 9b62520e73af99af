"""The regime map's promotion-delay axis (experiment ``tier``, docs/tiers.md), from run records alone.

A *cell* is one workload on one device at one pressure and one promotion bandwidth (the
``promote_bandwidth`` input, bytes per step; absent: instant, no promotion): the records that differ
only in the policy.  It is judged as the regime map judges a cell
(:func:`retainz.analysis.regimes.judge`: RetainZ against the best practical policy that completes;
win, tie or lose, a stop where another completes counted apart).  Two more things per cell:

* **the ablation**: RetainZ given the rule's hints alone (``promote_hint`` false), the same deferred
  deletions placed without the expected promotion finish; its WAF minus RetainZ's is what the
  delay-aware hint gains (positive: the hint helps);
* **the backlog's space**: the peak live bytes with deletions deferred over the rule's own peak
  (``metrics.promotion.peak_live_bytes_undeferred``).

:func:`tier_claims` states them per bandwidth (``tier.*``); :func:`tier_table` writes ``tier_map.md``.
Analysis never imports the store: records only.
"""

from __future__ import annotations

import os
import statistics

from retainz.analysis.claims import add_claim
from retainz.analysis.records import Runs, base_policy
from retainz.analysis.regimes import PRACTICAL, Cell, judge

__all__ = ["EXPERIMENT", "bandwidth_label", "tier_cells", "tier_claims", "tier_table"]

EXPERIMENT = "tier"
_IGNORED = ("policy", "promote_hint", "zone_map", "verify_summaries", "seed")


def bandwidth_label(bw: int | None) -> str:
    """``"instant"`` (no promotion) or ``"bw<MB per step>MB"`` (``bw1.5MB``): the claim id part."""
    return "instant" if bw is None else f"bw{bw / 1e6:g}MB"


def _waf(rec: dict | None) -> float | None:
    return None if rec is None or rec["capacity_stop_step"] is not None else rec["metrics"]["waf"]


def tier_cells(runs: Runs) -> list[tuple[Cell, dict | None, dict | None]]:
    """Every judged cell of the ``tier`` experiment, with its ablation record and oracle record (or
    None), ordered by bandwidth (instant first, then fastest to slowest), geometry, rule, pressure."""
    groups: dict[str, list[dict]] = {}
    for r in runs.records:
        if r["tags"]["experiment"] != EXPERIMENT or r["inputs"].get("pressure") is None:
            continue
        key = repr(sorted((k, repr(v)) for k, v in r["inputs"].items() if k not in _IGNORED)
                   + [("label", r["tags"]["label"])])
        groups.setdefault(key, []).append(r)
    out = []
    for recs in groups.values():
        hinted = [r for r in recs if r["inputs"].get("promote_hint", True)]
        rz = [r for r in hinted if r["inputs"]["policy"] == "retainz"]
        others = sorted((r for r in hinted if base_policy(r["inputs"]["policy"]) in PRACTICAL),
                        key=lambda r: r["inputs"]["policy"])
        if len(rz) != 1 or not others:
            continue
        ablation = next((r for r in recs if not r["inputs"].get("promote_hint", True)), None)
        oracle = next((r for r in hinted if r["inputs"]["policy"] == "oracle"), None)
        c = Cell(EXPERIMENT, 0, 0.0, rz[0]["inputs"]["pressure"], rz[0], others)
        judge(c)
        out.append((c, ablation, oracle))

    def order(item):
        i = item[0].retainz["inputs"]
        bw = i.get("promote_bandwidth")
        return (bw is not None, -(bw or 0), item[0].retainz["tags"]["label"] or "", i["rule"], i["pressure"])

    return sorted(out, key=order)


def _space(c: Cell) -> float | None:
    p = c.retainz["metrics"].get("promotion")
    return None if p is None else c.retainz["metrics"]["peak_live_bytes"] / p["peak_live_bytes_undeferred"]


def tier_claims(runs: Runs, out: list) -> None:
    """Append the ``tier.*`` claims (nothing when the records hold no ``tier`` experiment)."""
    cells = tier_cells(runs)
    if not cells:
        return
    every = [r for c, a, o in cells for r in c.runs + [x for x in (a, o) if x]]
    add_claim(out, "tier.cells", len(cells), 0, every, "cells (workload x geometry x pressure x promotion bandwidth)")
    by_bw: dict[str, list] = {}
    for item in cells:
        by_bw.setdefault(bandwidth_label(item[0].retainz["inputs"].get("promote_bandwidth")), []).append(item)
    for b, items in by_bw.items():
        cs = [c for c, _, _ in items]
        runs_b = [r for c, a, o in items for r in c.runs + [x for x in (a, o) if x]]
        add_claim(out, f"tier.{b}.cells", len(cs), 0, runs_b, f"cells at promotion bandwidth {b}")
        for o, word in (("win", "wins"), ("tie", "ties"), ("lose", "losses")):
            add_claim(out, f"tier.{b}.{word}", sum(1 for c in cs if c.outcome == o), 0, runs_b,
                      f"cells at {b} where RetainZ {word} against the best practical policy (WAF margin beyond "
                      "+-0.02, or completing where the others stop)")
        stops = [c for c in cs if c.outcome == "lose" and c.reason == "stop"]
        add_claim(out, f"tier.{b}.stops_where_another_completes", len(stops), 0,
                  [r for c in stops for r in c.runs] or runs_b, f"cells at {b} where RetainZ stops and another completes")
        ms = [c.margin for c in cs if c.margin is not None]
        add_claim(out, f"tier.{b}.median_waf_margin", statistics.median(ms) if ms else None, 3, runs_b,
                  f"median over the cells at {b} of best practical WAF - RetainZ WAF (both complete)")
        add_claim(out, f"tier.{b}.min_waf_margin", min(ms) if ms else None, 3, runs_b,
                  f"the smallest WAF margin at {b} (negative: RetainZ writes more)")
        gains = [(_waf(a) - _waf(c.retainz)) for c, a, _ in items
                 if _waf(a) is not None and _waf(c.retainz) is not None]
        ab = [r for c, a, _ in items if a for r in (a, c.retainz)]
        if ab:
            add_claim(out, f"tier.{b}.hint_gain_median", statistics.median(gains) if gains else None, 3, ab,
                      f"median at {b} of WAF with the rule's hints alone - WAF with the expected promotion finish "
                      "in the hints (RetainZ, both complete; positive: the delay-aware hint helps)")
            add_claim(out, f"tier.{b}.hint_gain_min", min(gains) if gains else None, 3, ab,
                      f"the smallest such difference at {b}")
            add_claim(out, f"tier.{b}.ablation_stops", sum(1 for _, a, _ in items if a and _waf(a) is None), 0, ab,
                      f"cells at {b} where RetainZ with the rule's hints alone stops")
        space = [s for s in (_space(c) for c in cs) if s is not None]
        if space:
            add_claim(out, f"tier.{b}.space_over_rule_max", max(space), 2, runs_b,
                      f"the largest peak live bytes with deletions deferred over the rule's own peak, at {b}")


def tier_table(runs: Runs, out_dir: str) -> list[str]:
    """Write ``tier_map.md``: one row per cell (RetainZ's WAF, the best practical policy, the margin and
    outcome, the ablation's and the oracle's WAF, the backlog's space).  Returns the paths written
    (none without ``tier`` records)."""
    cells = tier_cells(runs)
    if not cells:
        return []

    def w(rec):
        if rec is None:
            return "-"
        return f"stop {rec['capacity_stop_step']:,}" if rec["capacity_stop_step"] is not None \
            else f"{rec['metrics']['waf']:.3f}"

    lines = ["# The regime map's promotion-delay axis", "",
             "From the run records alone (retainz.analysis.tiermap; docs/tiers.md). Bandwidth in MB per step of "
             "logical time; margin: best practical WAF - RetainZ WAF (both complete); rule's hints: RetainZ "
             "placing by the rule's hints alone (the ablation); space: peak live with deletions deferred / the "
             "rule's own peak.", "",
             "| bandwidth | geometry | workload | pressure | RetainZ | best practical | margin | outcome "
             "| rule's hints | oracle | space |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, a, o in cells:
        i = c.retainz["inputs"]
        bw = i.get("promote_bandwidth")
        best = min((r for r in c.others if r["capacity_stop_step"] is None),
                   key=lambda r: (r["metrics"]["waf"], r["inputs"]["policy"]), default=None)
        best_s = f"{best['inputs']['policy']} {best['metrics']['waf']:.3f}" if best else "all stop"
        margin = f"{c.margin:+.3f}" if c.margin is not None else "-"
        s = _space(c)
        lines.append(f"| {'instant' if bw is None else f'{bw / 1e6:g}'} | {c.retainz['tags']['label'] or ''} "
                     f"| {i['rule']} | {i['pressure']:g} | {w(c.retainz)} | {best_s} | {margin} "
                     f"| {c.outcome} ({c.reason}) | {w(a)} | {w(o)} | {'-' if s is None else f'{s:.2f}'} |")
    path = os.path.join(out_dir, "tier_map.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return [path]
