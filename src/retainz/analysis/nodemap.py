"""The node placement map (experiment ``node``, docs/fleet.md "The node map"), from run records alone.

A *run cell* is one format-2 fleet (job mix, overlap, seed) on one geometry (the record's label) at one
time-averaged occupancy: the records that differ only in the policy.  Each is judged as the regime map
judges a cell (:func:`retainz.analysis.regimes.judge`: RetainZ against the best practical policy that
completes, a WAF margin beyond :data:`~retainz.analysis.regimes.TIE` a win or a loss; RetainZ stopping
where another completes is a loss counted as a stop; when every policy stops the later stop wins).

The axes are read from each record's inputs:

* **mix** (:func:`mix_of`): ``sub-node`` when every job class of the fleet uses fewer GPUs than the
  node has, ``whole-node`` when every class uses at least a node, else ``mixed``; ``sub-node large`` for
  a sub-node mix whose saves average at least two zones of the ZN540-like geometry.
* **overlap** (:func:`overlap_of`): ``serialized`` (no ``write_bandwidth``), ``concurrent`` (each job at
  a rate, its classes synchronous) or ``async`` (a class with ``"async": true``).
* **occupancy**: the asked time-averaged occupancy (``inputs.occupancy``).

The *capacity at WAF <= 1.02* of a policy on a (mix, overlap, geometry, seed) is the highest occupancy
level of the map at which it completes with WAF <= :data:`CAPACITY_WAF` at that level and at every
lower level (``None``: not even the lowest); the map reports its median over the seeds, and the ratio
RetainZ's / the best practical policy's, i.e. how much larger a device the best other policy needs to
hold the same fleet as well (> 1: RetainZ holds more).

:func:`node_claims` states the counts (``node.*``); :func:`node_table` writes ``node_map.md``.  Analysis
never imports the store: records only.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from retainz.analysis.claims import add_claim
from retainz.analysis.records import Runs, base_policy
from retainz.analysis.regimes import PRACTICAL, TIE, Cell, judge

__all__ = ["EXPERIMENT", "CAPACITY_WAF", "OVERLAPS", "mix_of", "overlap_of", "NodeCell", "node_cells", "counts",
           "capacity", "node_claims", "node_table"]

EXPERIMENT = "node"
#: The WAF a policy must stay at or below for the capacity figure (issue 40: "WAF <= 1.02").
CAPACITY_WAF = 1.02
#: Overlap levels in display order; "overlapped" in the counts is concurrent and async together.
OVERLAPS = ("serialized", "concurrent", "async")
_MIXES = ("sub-node", "sub-node large", "whole-node", "mixed")
#: Save size (mean bytes per committed generation) over the ZN540-like zone capacity from which a
#: sub-node mix counts as one of large saves.
_LARGE_SAVE_ZONES = 2.0
_ZN540_ZONE_CAPACITY_UNSCALED = 1077 << 20


def _scale(rec: dict) -> float:
    num, _, den = str(rec["inputs"]["scale"]).partition("/")
    return float(num) / float(den or 1)


def mix_of(rec: dict) -> str:
    """The job mix of a node record (module docstring): sub-node, sub-node large, whole-node or mixed."""
    f = rec["inputs"]["fleet"]
    per_node = f.get("gpus_per_node", 8)
    sub = [j["gpus"] < per_node for j in f["jobs"] if j["weight"] > 0]
    if all(sub):
        m = rec["metrics"]
        save = m["host_bytes"] / max(1, m.get("generations_committed", 0))
        large = save / (_ZN540_ZONE_CAPACITY_UNSCALED * _scale(rec)) >= _LARGE_SAVE_ZONES
        return "sub-node large" if large else "sub-node"
    return "whole-node" if not any(sub) else "mixed"


def overlap_of(rec: dict) -> str:
    """``serialized``, ``concurrent`` or ``async`` (module docstring)."""
    i = rec["inputs"]
    if i.get("write_bandwidth") is None:
        return "serialized"
    return "async" if any(j.get("async") for j in i["fleet"]["jobs"]) else "concurrent"


@dataclass
class NodeCell:
    """One judged run cell.

    Attributes:
        mix, overlap, geometry, occupancy, seed: where it sits.
        cell: the judged cell (RetainZ, the practical others, outcome, margin).
        oracle: the oracle's record, or None.
        save_zones: mean bytes per committed generation over the zone capacity (of the run that
            committed the most generations).
    """

    mix: str
    overlap: str
    geometry: str
    occupancy: float
    seed: int
    cell: Cell
    oracle: dict | None
    save_zones: float

    @property
    def where(self) -> tuple:
        return (self.mix, self.overlap, self.geometry, self.occupancy)

    @property
    def runs(self) -> list[dict]:
        return self.cell.runs + ([self.oracle] if self.oracle else [])

    @property
    def all_stop(self) -> bool:
        return all(r["capacity_stop_step"] is not None for r in self.cell.runs)


def _order(nc: NodeCell) -> tuple:
    return (_MIXES.index(nc.mix), OVERLAPS.index(nc.overlap), nc.geometry, nc.occupancy, nc.seed)


def node_cells(runs: Runs) -> list[NodeCell]:
    """Every judged run cell of the ``node`` experiment, ordered by mix, overlap, geometry, occupancy, seed."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs.records:
        if r["tags"]["experiment"] != EXPERIMENT or r["inputs"].get("fleet") is None:
            continue
        i = r["inputs"]
        key = (repr(sorted((k, repr(v)) for k, v in i.items() if k not in ("policy", "seed"))),
               r["tags"]["label"] or "")
        groups.setdefault(key, []).append(r)
    out = []
    for (_, label), recs in groups.items():
        rz = [r for r in recs if r["inputs"]["policy"] == "retainz"]
        others = sorted((r for r in recs if base_policy(r["inputs"]["policy"]) in PRACTICAL),
                        key=lambda r: r["inputs"]["policy"])
        if len(rz) != 1 or not others:
            continue
        longest = max(recs, key=lambda r: r["metrics"].get("generations_committed", 0))
        m = longest["metrics"]
        save = m["host_bytes"] / max(1, m.get("generations_committed", 0)) / longest["inputs"]["zone_capacity"]
        c = Cell(EXPERIMENT, 0, save, 0.0, rz[0], others)
        judge(c)
        oracle = next((r for r in recs if r["inputs"]["policy"] == "oracle"), None)
        out.append(NodeCell(mix_of(longest), overlap_of(rz[0]), label, rz[0]["inputs"]["occupancy"],
                            rz[0]["inputs"]["trace_seed"], c, oracle, save))
    out.sort(key=_order)
    return out


def counts(cells: list[NodeCell]) -> dict:
    """``{cells, wins, ties, losses, stops, all_stop}`` over ``cells``, five parts that sum to
    ``cells``: ``wins`` (margin above the tie, or RetainZ completing where every practical policy
    stops), ``ties``, ``losses`` (RetainZ completes with a WAF beyond the tie above the best practical
    policy's), ``stops`` (RetainZ stops where another practical policy completes) and ``all_stop``
    (RetainZ and every practical policy stop: the device is too small for the fleet; not judged)."""
    done = [n for n in cells if not n.all_stop]
    return {"cells": len(cells),
            "wins": sum(1 for n in done if n.cell.outcome == "win"),
            "ties": sum(1 for n in done if n.cell.outcome == "tie"),
            "losses": sum(1 for n in done if n.cell.outcome == "lose" and n.cell.reason == "waf"),
            "stops": sum(1 for n in done if n.cell.outcome == "lose" and n.cell.reason == "stop"),
            "all_stop": len(cells) - len(done)}


def _groups(cells: list[NodeCell]) -> list[tuple[str, list[NodeCell]]]:
    """The count rows: all, without overlap, with overlap (concurrent + async), and each level."""
    out = [("all", cells), ("without overlap (serialized)", [n for n in cells if n.overlap == "serialized"]),
           ("with overlap (concurrent + async)", [n for n in cells if n.overlap != "serialized"])]
    out += [(o, [n for n in cells if n.overlap == o]) for o in OVERLAPS[1:]]
    return [(name, cs) for name, cs in out if cs]


def _sustains(rec: dict | None) -> bool:
    return rec is not None and rec["capacity_stop_step"] is None and rec["metrics"]["waf"] <= CAPACITY_WAF + 1e-9


def capacity(cells: list[NodeCell]) -> list[dict]:
    """The capacity at WAF <= 1.02 (module docstring), one row per (mix, overlap, geometry): ``{mix,
    overlap, geometry, seeds, policies: {policy: median highest occupancy or None}, best_other: the
    practical policy with the highest median, ratio: RetainZ's / best_other's (None when either
    sustains no level)}``."""
    by: dict[tuple, dict[int, list[NodeCell]]] = {}
    for n in cells:
        by.setdefault((n.mix, n.overlap, n.geometry), {}).setdefault(n.seed, []).append(n)
    rows = []
    for (mix, overlap, geo), seeds in sorted(by.items(), key=lambda kv: (_MIXES.index(kv[0][0]),
                                                                         OVERLAPS.index(kv[0][1]), kv[0][2])):
        highest: dict[str, list[float | None]] = {}
        for seed_cells in seeds.values():
            seed_cells = sorted(seed_cells, key=lambda n: n.occupancy)
            policies = sorted({r["inputs"]["policy"] for n in seed_cells for r in n.runs})
            for p in policies:
                best = None
                for n in seed_cells:
                    rec = next((r for r in n.runs if r["inputs"]["policy"] == p), None)
                    if not _sustains(rec):
                        break
                    best = n.occupancy
                highest.setdefault(p, []).append(best)
        med = {p: _median_or_none(v) for p, v in highest.items()}
        others = {p: v for p, v in med.items() if base_policy(p) in PRACTICAL and v is not None}
        best_other = max(others, key=lambda p: (others[p], p)) if others else None
        rz, bo = med.get("retainz"), (others.get(best_other) if best_other else None)
        rows.append({"mix": mix, "overlap": overlap, "geometry": geo, "seeds": len(seeds), "policies": med,
                     "best_other": best_other, "ratio": (rz / bo) if rz and bo else None})
    return rows


def _median_or_none(values: list[float | None]) -> float | None:
    """The median with None ranked below every level (a seed that sustains nothing)."""
    ranked = sorted(values, key=lambda v: -1.0 if v is None else v)
    return ranked[(len(ranked) - 1) // 2]


def _where_id(n: NodeCell) -> str:
    return f"{n.mix.replace(' ', '-')}.{n.overlap}.{n.geometry}.o{n.occupancy:g}"


def node_claims(runs: Runs, out: list) -> None:
    """Append the ``node.*`` claims (nothing when the records hold no node experiment)."""
    cells = node_cells(runs)
    if not cells:
        return
    for name, cs in _groups(cells):
        key = {"all": "", "without overlap (serialized)": "serialized.",
               "with overlap (concurrent + async)": "overlapped."}.get(name, f"{name}.")
        c = counts(cs)
        runs_of = [r for n in cs for r in n.runs]
        add_claim(out, f"node.{key}run_cells", c["cells"], 0, runs_of, f"run cells ({name})")
        for k, word in (("wins", "RetainZ wins"), ("ties", "RetainZ ties"),
                        ("losses", "RetainZ completes with a WAF more than 0.02 above the best practical policy's"),
                        ("stops", "RetainZ stops where another practical policy completes"),
                        ("all_stop", "RetainZ and every practical policy stop (not judged)")):
            add_claim(out, f"node.{key}{k}", c[k], 0, runs_of, f"run cells ({name}) where {word}")
    margins = [n for n in cells if n.cell.margin is not None]
    if margins:
        hi = max(margins, key=lambda n: (n.cell.margin, n.cell.retainz["id"]))
        lo = min(margins, key=lambda n: (n.cell.margin, n.cell.retainz["id"]))
        add_claim(out, "node.max_waf_margin", hi.cell.margin, 3, hi.runs,
                  f"the largest WAF margin of any run cell ({_where_id(hi)}, seed {hi.seed})")
        add_claim(out, "node.min_waf_margin", lo.cell.margin, 3, lo.runs,
                  f"the smallest WAF margin of any run cell ({_where_id(lo)}, seed {lo.seed})")
    for row in capacity(cells):
        cid = f"node.capacity.{row['mix'].replace(' ', '-')}.{row['overlap']}.{row['geometry']}"
        rel = [r for n in cells if (n.mix, n.overlap, n.geometry) == (row["mix"], row["overlap"], row["geometry"])
               for r in n.runs]
        add_claim(out, f"{cid}.retainz", row["policies"].get("retainz"), 2, rel,
                  f"median highest occupancy RetainZ holds at WAF <= {CAPACITY_WAF} without a stop (null: none)")
        add_claim(out, f"{cid}.best_other", row["policies"].get(row["best_other"]) if row["best_other"] else None, 2,
                  rel, f"the same for the best practical policy ({row['best_other']})")
        add_claim(out, f"{cid}.ratio", row["ratio"], 3, rel,
                  "RetainZ's / the best practical policy's (> 1: the other needs a larger device)")


def _waf(rec: dict | None) -> str:
    if rec is None:
        return "-"
    return f"stop@{rec['capacity_stop_step']}" if rec["capacity_stop_step"] is not None else f"{rec['metrics']['waf']:.3f}"


def node_table(runs: Runs, out_dir: str) -> list[str]:
    """Write ``node_map.md``: the counts with and without overlap, the largest margins, the capacity
    at WAF <= 1.02 per mix, overlap and geometry, one row per map cell (median margin and spread over
    the seeds, counts, median WAFs, save size in zones), and every loss and stop of RetainZ with each
    policy's WAF.  Returns the paths written (none without node records)."""
    cells = node_cells(runs)
    if not cells:
        return []
    lines = ["# The node placement map", "",
             "From the run records alone (retainz.analysis.nodemap; docs/fleet.md, \"The node map\"). A run cell: "
             "one fleet, overlap, geometry, occupancy and seed; RetainZ against the best practical policy that "
             f"completes ({', '.join(PRACTICAL)}, with their parameters); tie within +-{TIE:g} WAF.", "",
             "## Counts", "",
             "| run cells | cells | wins | ties | losses (WAF) | stops where another completes | every policy stops |",
             "|---|---|---|---|---|---|---|"]
    for name, cs in _groups(cells):
        c = counts(cs)
        lines.append(f"| {name} | {c['cells']} | {c['wins']} | {c['ties']} | {c['losses']} | {c['stops']} "
                     f"| {c['all_stop']} |")
    margins = sorted((n for n in cells if n.cell.margin is not None), key=lambda n: n.cell.margin)
    if margins:
        lines += ["", "## Largest margins (best practical WAF - RetainZ WAF)", "",
                  "| margin | mix | overlap | geometry | occupancy | seed | RetainZ | best other |", "|---|---|---|---|---|---|---|---|"]
        pick = [n for n in margins[::-1] if n.cell.margin > 0][:5] + [n for n in margins if n.cell.margin < 0][:5]
        for n in pick:
            lines.append(f"| {n.cell.margin:+.3f} | {n.mix} | {n.overlap} | {n.geometry} | {n.occupancy:g} | {n.seed} "
                         f"| {_waf(n.cell.retainz)} | {n.cell.best} {_waf(_rec(n, n.cell.best))} |")
    lines += ["", f"## Capacity at WAF <= {CAPACITY_WAF}", "",
              "Median over the seeds of the highest occupancy a policy holds at WAF <= 1.02 without a stop (at "
              "that level and every lower one; - : not even the lowest level). Ratio: RetainZ's / the best "
              "practical policy's.", ""]
    cap = capacity(cells)
    pols = sorted({p for row in cap for p in row["policies"]},
                  key=lambda p: (p != "retainz", p == "oracle", p))
    lines.append("| mix | overlap | geometry | seeds | " + " | ".join(pols) + " | best other | ratio |")
    lines.append("|---" * (6 + len(pols)) + "|")
    for row in cap:
        vals = " | ".join("-" if row["policies"].get(p) is None else f"{row['policies'][p]:g}" for p in pols)
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        lines.append(f"| {row['mix']} | {row['overlap']} | {row['geometry']} | {row['seeds']} | {vals} "
                     f"| {row['best_other']} | {ratio} |")
    lines += ["", "## Map cells", "",
              "| mix | overlap | geometry | occupancy | seeds | save / zone | median margin | spread | wins | ties "
              "| losses | stops | all stop | RetainZ WAF (median) | best other WAF (median) | oracle WAF (median) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by: dict[tuple, list[NodeCell]] = {}
    for n in cells:
        by.setdefault(n.where, []).append(n)
    for where, ns in by.items():
        ms = [n.cell.margin for n in ns if n.cell.margin is not None]
        rz = [n.cell.retainz["metrics"]["waf"] for n in ns if n.cell.retainz["capacity_stop_step"] is None]
        best = [min(r["metrics"]["waf"] for r in n.cell.others if r["capacity_stop_step"] is None)
                for n in ns if any(r["capacity_stop_step"] is None for r in n.cell.others)]
        orc = [n.oracle["metrics"]["waf"] for n in ns if n.oracle and n.oracle["capacity_stop_step"] is None]
        c = counts(ns)
        med = f"{statistics.median(ms):+.3f}" if ms else "-"
        spread = f"{min(ms):+.3f}..{max(ms):+.3f}" if ms else "-"
        lines.append(f"| {where[0]} | {where[1]} | {where[2]} | {where[3]:g} | {len(ns)} "
                     f"| {statistics.median(n.save_zones for n in ns):.1f} | {med} | {spread} | {c['wins']} "
                     f"| {c['ties']} | {c['losses']} | {c['stops']} | {c['all_stop']} "
                     f"| {f'{statistics.median(rz):.3f}' if rz else 'stop'} "
                     f"| {f'{statistics.median(best):.3f}' if best else 'stop'} "
                     f"| {f'{statistics.median(orc):.3f}' if orc else 'stop'} |")
    bad = [n for n in cells if n.cell.outcome == "lose" and not n.all_stop]
    lines += ["", "## RetainZ's losses and stops", ""]
    if not bad:
        lines.append("None.")
    else:
        pols = sorted({r["inputs"]["policy"] for n in bad for r in n.runs}, key=lambda p: (p != "retainz", p))
        lines.append("| RetainZ case | mix | overlap | geometry | occupancy | seed | " + " | ".join(pols) + " |")
        lines.append("|---" * (6 + len(pols)) + "|")
        for n in bad:
            lines.append(f"| {n.cell.retainz['id']} | {n.mix} | {n.overlap} | {n.geometry} | {n.occupancy:g} | {n.seed} | "
                         + " | ".join(_waf(_rec(n, p)) for p in pols) + " |")
    path = os.path.join(out_dir, "node_map.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return [path]


def _rec(n: NodeCell, policy: str | None) -> dict | None:
    return next((r for r in n.runs if r["inputs"]["policy"] == policy), None)
