"""The FDP experiment (experiment ``fdp``, docs/fdp.md "The experiment"), from run records alone.

A *cell* is one workload (fleet concurrency, churn and seed; zone size) at one pressure.  In a cell each
FDP record is one **placement** on a drive of one over-provisioning (the ``spare=`` of its ``fdp:`` device
spec):

* ``no-pid``: the host sends no placement identifier (``handles=1``);
* ``handle-per-job``, ``retainz``, ``oracle``: the store's policy (``dedicated:by=job``, ``retainz``,
  ``oracle``), one placement handle per active zone;

and each ZNS record (device ``memory``) is one of the same placements on a zoned drive.  Per record:

* **device WAF**: the FTL model's media bytes written over host bytes written (``metrics.fdp.device_waf``,
  log page 0x22's MBMW / HBMW); its parts: the bytes GC relocated (Media Reallocated) and the RUH Update
  padding, each over the host bytes written;
* **media per application byte**: everything the flash programs over the bytes the application saved:
  MBMW / ``host_bytes`` on FDP, (``host_bytes`` + ``gc_bytes`` + ``journal_bytes``) / ``host_bytes`` on ZNS
  (a zoned drive programs what it is sent);
* **flash**: the flash behind the namespace: reclaim units x RU bytes on FDP (the over-provisioning
  included), the zones' capacity on ZNS;
* the capacity stop, if any (a stopped run's WAF covers its steps before the stop).

:func:`fdp_claims` states them (``fdp.*``), :func:`fdp_table` writes ``fdp_map.md`` and
:func:`fdp_figure` ``fdp.pdf``.  Analysis never imports the store or the device: records only.
"""

from __future__ import annotations

import os
import statistics

from retainz.analysis.claims import add_claim
from retainz.analysis.records import GIB, Runs, base_policy

__all__ = ["EXPERIMENT", "PLACEMENTS", "placement", "spare", "media_per_app_byte", "fdp_cells", "fdp_claims",
           "fdp_table", "fdp_figure"]

EXPERIMENT = "fdp"
#: Placements in display order.
PLACEMENTS = ("no-pid", "handle-per-job", "retainz", "oracle")
#: End-to-end margins within this are ties (media bytes per application byte).
TIE = 0.005


def placement(rec: dict) -> str | None:
    """The record's placement (module docstring), or None for a policy the experiment does not name."""
    i = rec["inputs"]
    if "handles=1" in i["device"].split(":", 1)[-1].split(","):
        return "no-pid"
    if i["policy"] == "dedicated:by=job":
        return "handle-per-job"
    base = base_policy(i["policy"])
    return base if base in ("retainz", "oracle") else None


def spare(rec: dict) -> float | None:
    """The over-provisioning the record's ``fdp:`` device asked for (its ``spare=``; the device's default
    0.07 when absent), or None on ZNS."""
    dev = rec["inputs"]["device"]
    if not dev.startswith("fdp"):
        return None
    opts = dict(kv.split("=", 1) for kv in dev.partition(":")[2].split(",") if "=" in kv)
    return float(opts.get("spare", 0.07))


def media_per_app_byte(rec: dict) -> float | None:
    """Flash bytes programmed per application byte saved (module docstring); None with nothing saved."""
    m = rec["metrics"]
    if not m.get("host_bytes"):
        return None
    if "fdp" in m:
        return m["fdp"]["media_bytes_written"] / m["host_bytes"]
    return (m["host_bytes"] + m["gc_bytes"] + m.get("journal_bytes", 0)) / m["host_bytes"]


def _flash_gib(rec: dict) -> float:
    m = rec["metrics"]
    if "fdp" in m:
        return m["fdp"]["reclaim_units"] * m["fdp"]["ru_bytes"] / GIB
    g = m["geometry"]
    return g["nr_zones"] * g["zone_capacity"] / GIB


def _share(rec: dict, key: str) -> float:
    f = rec["metrics"]["fdp"]
    return f[key] / f["host_bytes_written"] if f["host_bytes_written"] else 0.0


def _workload(rec: dict) -> tuple:
    i = rec["inputs"]
    f = i.get("fleet") or {}
    return (f.get("concurrency"), f.get("churn"), i["trace_seed"], i["scale"], i["zone_capacity"])


def fdp_cells(runs: Runs) -> dict[tuple, dict]:
    """The ``fdp`` records by cell: ``{(workload, pressure): {"fdp": {(placement, spare): rec},
    "zns": {placement: rec}}}``, workload = (concurrency, churn, seed, scale, zone capacity)."""
    out: dict[tuple, dict] = {}
    for r in runs.records:
        if r["tags"]["experiment"] != EXPERIMENT or r["inputs"].get("pressure") is None:
            continue
        p = placement(r)
        if p is None:
            continue
        cell = out.setdefault((_workload(r), r["inputs"]["pressure"]), {"fdp": {}, "zns": {}})
        sp = spare(r)
        if sp is None:
            cell["zns"][p] = r
        else:
            cell["fdp"][(p, sp)] = r
    return dict(sorted(out.items(), key=lambda kv: (repr(kv[0][0]), kv[0][1])))


def _tag(cell_key: tuple) -> str:
    (conc, churn, seed, scale, cap), pressure = cell_key
    return f"c{conc:g}.s{seed}.z{cap >> 20}M.p{pressure:g}" if conc is not None else f"s{seed}.z{cap >> 20}M.p{pressure:g}"


def _stopped(rec: dict) -> bool:
    return rec["capacity_stop_step"] is not None


def fdp_claims(runs: Runs, out: list) -> None:
    """Append the ``fdp.*`` claims (nothing without ``fdp`` records): per cell, placement and
    over-provisioning the device WAF; per cell the runs with a capacity stop; per cell and placement on ZNS
    the media per application byte; over the whole sweep the largest share of host bytes GC relocated, the
    fullest the FTL came (``metrics.fdp.peak_valid_share``, when recorded), the
    largest spread of one placement's device WAF over the over-provisioning, and RetainZ against a handle
    per job (end-to-end, ties within :data:`TIE`, stops counted apart)."""
    cells = fdp_cells(runs)
    if not cells:
        return
    every = [r for c in cells.values() for r in (*c["fdp"].values(), *c["zns"].values())]
    fdp_recs = [r for c in cells.values() for r in c["fdp"].values()]
    add_claim(out, "fdp.cells", len(cells), 0, every, "cells of the FDP experiment (workload x pressure)")
    for key, c in cells.items():
        tag = _tag(key)
        for (p, sp), r in sorted(c["fdp"].items(), key=lambda kv: (PLACEMENTS.index(kv[0][0]), kv[0][1])):
            add_claim(out, f"fdp.{tag}.{p}.op{sp:g}.device_waf", r["metrics"]["fdp"]["device_waf"], 3, [r],
                      f"device WAF (MBMW / HBMW of the FTL model), {p}, OP {sp:g}, {tag}")
        cell_recs = [*c["fdp"].values(), *c["zns"].values()]
        add_claim(out, f"fdp.{tag}.stops", sum(_stopped(r) for r in cell_recs), 0, cell_recs,
                  f"runs of {tag} (FDP and ZNS) with a capacity stop")
        for p, r in sorted(c["zns"].items(), key=lambda kv: PLACEMENTS.index(kv[0])):
            add_claim(out, f"fdp.{tag}.zns.{p}.media_per_app_byte", media_per_app_byte(r), 3, [r],
                      f"ZNS: (host + GC + journal bytes) / application bytes, {p}, {tag}")
    add_claim(out, "fdp.max_relocated_share", max(_share(r, "media_reallocated_bytes") for r in fdp_recs), 4,
              fdp_recs, "the largest share of host bytes written that the drive's GC relocated, over every FDP run")
    add_claim(out, "fdp.max_padding_share", max(_share(r, "padding_bytes") for r in fdp_recs), 4, fdp_recs,
              "the largest RUH Update padding over host bytes written, over every FDP run")
    peaks = [r for r in fdp_recs if "peak_valid_share" in r["metrics"]["fdp"]]
    if peaks:
        add_claim(out, "fdp.max_peak_valid_share", max(r["metrics"]["fdp"]["peak_valid_share"] for r in peaks), 3,
                  peaks, "the fullest the FTL came: the most pages valid at once over the physical pages, over every "
                  "FDP run")
    spreads = []
    for c in cells.values():
        by_p: dict[str, list[float]] = {}
        for (p, _), r in c["fdp"].items():
            if not _stopped(r):
                by_p.setdefault(p, []).append(r["metrics"]["fdp"]["device_waf"])
        spreads += [max(v) - min(v) for v in by_p.values() if len(v) > 1]
    add_claim(out, "fdp.max_device_waf_spread_over_op", max(spreads) if spreads else None, 4, fdp_recs,
              "the largest difference between one placement's device WAF at two over-provisionings of one cell "
              "(runs that complete)")
    wins = ties = losses = stops = 0
    margins, pairs = [], []
    for c in cells.values():
        for (p, sp), rz in c["fdp"].items():
            job = c["fdp"].get(("handle-per-job", sp))
            if p != "retainz" or job is None:
                continue
            pairs += [rz, job]
            if _stopped(rz) or _stopped(job):
                if _stopped(rz) and not _stopped(job):
                    stops += 1
                    losses += 1
                elif _stopped(job) and not _stopped(rz):
                    wins += 1
                else:
                    ties += 1
                continue
            m = media_per_app_byte(job) - media_per_app_byte(rz)
            margins.append(m)
            wins += m > TIE
            losses += m < -TIE
            ties += abs(m) <= TIE
    for word, n in (("wins", wins), ("ties", ties), ("losses", losses)):
        add_claim(out, f"fdp.retainz_vs_per_job.{word}", n, 0, pairs,
                  f"cells x OP where RetainZ {word} against a handle per job (media per application byte, margin "
                  f"beyond +-{TIE}, or completing where the other stops)")
    add_claim(out, "fdp.retainz_vs_per_job.stops_where_per_job_completes", stops, 0, pairs,
              "cells x OP where RetainZ stops and a handle per job completes")
    add_claim(out, "fdp.retainz_vs_per_job.median_margin", statistics.median(margins) if margins else None, 3, pairs,
              "median of (handle per job - RetainZ) media per application byte, both complete")


def _cellstr(rec: dict | None) -> str:
    if rec is None:
        return "-"
    f = rec["metrics"]["fdp"]
    s = f"{f['device_waf']:.3f}"
    if f["media_reallocated_bytes"]:
        s += f" (GC {_share(rec, 'media_reallocated_bytes'):.1%})"
    if _stopped(rec):
        s += f", stop {rec['capacity_stop_step']:,}"
    return s


def fdp_table(runs: Runs, out_dir: str) -> list[str]:
    """Write ``fdp_map.md``: per cell and over-provisioning the device WAF of each placement (with the
    share GC relocated when not 0, and a capacity stop), the media per application byte, and per cell the
    ZNS runs.  Returns the paths written (none without ``fdp`` records)."""
    cells = fdp_cells(runs)
    if not cells:
        return []
    lines = ["# The FDP experiment: device WAF per placement, over-provisioning and pressure", "",
             "From the run records alone (retainz.analysis.fdpmap; docs/fdp.md). Device WAF: MBMW / HBMW of the "
             "FTL model (GC: bytes the drive's GC relocated over host bytes, shown when not 0); media/app: flash "
             "bytes programmed per application byte (store GC, journal and device together); flash: GiB behind the "
             "namespace; stop: the step of a capacity stop.", "",
             "| workload | pressure | OP | " + " | ".join(PLACEMENTS) + " | media/app " + " / ".join(PLACEMENTS)
             + " | flash GiB |",
             "|---|---|---|" + "---|" * len(PLACEMENTS) + "---|---|"]
    for key, c in cells.items():
        for sp in sorted({s for _, s in c["fdp"]}):
            recs = [c["fdp"].get((p, sp)) for p in PLACEMENTS]
            mpa = " / ".join("-" if r is None else f"{media_per_app_byte(r):.3f}" for r in recs)
            flash = next((f"{_flash_gib(r):.2f}" for r in recs if r is not None), "-")
            lines.append(f"| {_tag(key).rsplit('.p', 1)[0]} | {key[1]:g} | {sp:g} | "
                         + " | ".join(_cellstr(r) for r in recs) + f" | {mpa} | {flash} |")
        if c["zns"]:
            recs = [c["zns"].get(p) for p in PLACEMENTS]
            mpa = " / ".join("-" if r is None else f"{media_per_app_byte(r):.3f}"
                             + (f" (stop {r['capacity_stop_step']:,})" if _stopped(r) else "") for r in recs)
            flash = next((f"{_flash_gib(r):.2f}" for r in recs if r is not None), "-")
            lines.append(f"| {_tag(key).rsplit('.p', 1)[0]} | {key[1]:g} | ZNS | " + " | ".join(["-"] * len(PLACEMENTS))
                         + f" | {mpa} | {flash} |")
    path = os.path.join(out_dir, "fdp_map.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return [path]


def fdp_figure(runs: Runs, out_dir: str) -> list[str]:
    """``fdp.pdf`` (and PNG): media per application byte against pressure, one panel per over-provisioning,
    one line per placement on FDP (solid) and on ZNS (dashed, the same in every panel), a cross where a run
    stopped for capacity (its value over the steps before the stop); the first workload
    of the records (seed and fleet as in its cell key).  Returns the paths written (none without ``fdp``
    records)."""
    cells = fdp_cells(runs)
    if not cells:
        return []
    from retainz.analysis.figures import COLUMN_WIDTH, plt, save

    work = next(iter(cells))[0]
    mine = {k[1]: c for k, c in cells.items() if k[0] == work}
    ops = sorted({s for c in mine.values() for _, s in c["fdp"]})
    colors = {"no-pid": "#8c8c8c", "handle-per-job": "#e6a23c", "retainz": "#1f4e9c", "oracle": "#222222"}
    fig, axes = plt.subplots(1, len(ops), figsize=(COLUMN_WIDTH * 2, 1.8), sharey=True, squeeze=False)
    for ax, sp in zip(axes[0], ops, strict=True):
        for p in PLACEMENTS:
            for kind, ls in (("fdp", "-"), ("zns", "--")):
                got = [(pr, c[kind].get((p, sp) if kind == "fdp" else p)) for pr, c in sorted(mine.items())]
                pts = [(pr, r) for pr, r in got if r is not None and not _stopped(r)]
                if pts:
                    ax.plot([x for x, _ in pts], [media_per_app_byte(r) for _, r in pts], ls, marker="o",
                            color=colors[p], label=f"{p} ({'FDP' if kind == 'fdp' else 'ZNS'})")
                stops = [(pr, r) for pr, r in got if r is not None and _stopped(r)]
                if stops:  # a capacity stop: a cross at the value over the steps before it
                    ax.plot([x for x, _ in stops], [media_per_app_byte(r) for _, r in stops], "x", color=colors[p])
        ax.set_title(f"OP {sp:.0%}")
        ax.set_xlabel("pressure (peak live / capacity)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("flash bytes per app byte")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return save(fig, out_dir, "fdp")
