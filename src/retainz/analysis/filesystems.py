"""The file-system comparison (experiment ``filesystems``, experiments/filesystems.json): btrfs and f2fs
zoned against the RetainZ store on the same QEMU NVMe ZNS namespace, from the run records alone.

* ``filesystems.pdf``: per retention rule, (a) device write amplification (device bytes written /
  checkpoint bytes) and (b) the fill level each system reached before its first ENOSPC - the most live
  checkpoint bytes it held, of the raw namespace - against pressure (peak live bytes / raw namespace
  capacity, the dotted line: what the trace needs); hatched bars are runs that stopped at ENOSPC, a
  vertical "n/a" marks a system with no run there (ZenFS-Alloc on a namespace of fewer than 32 zones);
* ``filesystems.md``: the comparison table (README, the issue's closing note);
* claims ``filesystems.*`` (:func:`filesystem_claims`).

The fleet mix (experiment ``fleet-filesystems``, experiments/fleet-filesystems.json) runs one fleet trace
on each system several times (``rerun``): guest figures vary run to run, so every figure there is the
median over the reruns with its range.

* ``fleet_filesystems.pdf``: per system, every run's device WAF and the fill it reached, the median
  marked (:func:`fleet_filesystems_figure`);
* ``fleet_filesystems.md``: per system the median and range of each measure (:func:`fleet_filesystems_table`);
* claims ``fleetfs.*`` (:func:`fleet_filesystem_claims`).
"""

from __future__ import annotations

import os
from collections import Counter

from retainz.analysis.claims import add_claim
from retainz.analysis.records import Runs, rule_family, rule_rank, slug

__all__ = ["EXPERIMENT", "FLEET_EXPERIMENT", "system_key", "system_name", "filesystems_figure", "filesystems_table",
           "write_table", "filesystem_claims", "fleet_filesystems_figure", "fleet_filesystems_table", "write_fleet_table",
           "fleet_filesystem_claims"]

EXPERIMENT = "filesystems"
#: The fleet mix on each system, rerun (module docstring).
FLEET_EXPERIMENT = "fleet-filesystems"
#: (system key, display name, color, hatch-free marker) in display order.
SYSTEMS = [("retainz", "RetainZ", "#1f4e9c"), ("zenfs", "Store + ZenFS-Alloc", "#c0392b"),
           ("greedy", "Store + greedy log", "#8c8c8c"), ("btrfs", "btrfs zoned", "#e6a23c"),
           ("btrfs-reclaim", "btrfs zoned, reclaim 51 %", "#b5651d"), ("f2fs", "f2fs zoned", "#4f9fd8")]


def system_key(rec: dict) -> str:
    """``retainz`` / ``zenfs`` / ``greedy`` (the store with that placement policy), ``btrfs``,
    ``btrfs-reclaim`` (a tuned bg_reclaim_threshold), ``f2fs``."""
    system = rec["inputs"]["system"]
    name, _, opts = system.partition(":")
    if name == "retainz":
        return rec["inputs"]["policy"].partition(":")[0]
    if name == "btrfs" and "bg_reclaim_threshold" in opts:
        return "btrfs-reclaim"
    return name


def system_name(key: str) -> str:
    return next((n for k, n, _ in SYSTEMS if k == key), key)


def _rank(key: str) -> int:
    keys = [k for k, _, _ in SYSTEMS]
    return keys.index(key) if key in keys else len(keys)


def _records(runs: Runs) -> list[dict]:
    return [r for r in runs.of(EXPERIMENT) if r["inputs"].get("system")]


def _reached(rec: dict) -> float:
    """The most live bytes the system held (all committed) before any ENOSPC, of the raw namespace."""
    return rec["metrics"]["peak_fill"]


def filesystems_figure(runs: Runs, out_dir: str) -> list[str]:
    """``filesystems.pdf``/``.png`` (module docstring); nothing when there are no such records."""
    import matplotlib.pyplot as plt

    from retainz.analysis.figures import COLUMN_WIDTH, save

    recs = _records(runs)
    if not recs:
        return []
    rules = sorted({r["inputs"]["rule"] for r in recs}, key=rule_rank)
    keys = sorted({system_key(r) for r in recs}, key=_rank)
    pressures = sorted({r["inputs"]["pressure"] for r in recs})
    fig, axes = plt.subplots(2, len(rules), figsize=(2 * COLUMN_WIDTH, 3.4), squeeze=False, sharey="row")
    width = 0.8 / len(keys)
    missing = set()                       # systems without a run at some (rule, pressure)
    for col, rule in enumerate(rules):
        for row, metric in enumerate(("device_waf", "reached")):
            ax = axes[row][col]
            for k_i, key in enumerate(keys):
                color = next((c for k, _, c in SYSTEMS if k == key), "#555555")
                for p_i, p in enumerate(pressures):
                    rs = [r for r in recs if r["inputs"]["rule"] == rule and r["inputs"]["pressure"] == p
                          and system_key(r) == key]
                    x = p_i + (k_i - (len(keys) - 1) / 2) * width
                    if len(rs) != 1:
                        missing.add(key)
                        ax.text(x, 0.01, "n/a", ha="center", va="bottom", fontsize=3.5, color=color,
                                rotation=90, transform=ax.get_xaxis_transform())  # x in data, y in axes units
                        continue
                    r = rs[0]
                    stopped = r["metrics"]["enospc_step"] is not None
                    v = r["metrics"]["device_waf"] if metric == "device_waf" else _reached(r)
                    ax.bar(x, v, width, color=color,
                           hatch="////" if stopped else None, edgecolor="white" if stopped else color,
                           linewidth=0.3, label=system_name(key) if (p_i == 0 and col == 0 and row == 0) else None)
            if metric == "reached":
                for p_i, p in enumerate(pressures):
                    ax.plot([p_i - 0.45, p_i + 0.45], [p, p], color="black", linewidth=0.6, linestyle=":")
            ax.set_xticks(range(len(pressures)))
            ax.set_xticklabels([f"{p:g}" for p in pressures])
            ax.grid(axis="y", alpha=0.3)
            if row == 0:
                ax.set_title(rule_family(rule))
            else:
                ax.set_xlabel("pressure (peak live / raw namespace)")
            if col == 0:
                ax.set_ylabel("device WAF" if row == 0 else "fill reached (of raw)")
    top = max(r["metrics"]["device_waf"] for r in recs)
    bottom = 0.95 if all(r["metrics"]["device_waf"] >= 0.95 for r in recs) else 0
    axes[0][0].set_ylim(bottom, top + (top - bottom) * 0.05)
    axes[1][0].set_ylim(0, 1.0)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=len(keys), frameon=False, loc="upper center", fontsize=5.5)
    note = "hatched: stopped at ENOSPC; dotted: fill the trace needs"
    if missing:
        note += "; n/a: not run" + (" (upstream ZenFS refuses a namespace of fewer than 32 zones)"
                                  if missing == {"zenfs"} else "")
    fig.text(0.99, 0.005, note, ha="right", fontsize=5)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return save(fig, out_dir, "filesystems")


def filesystems_table(runs: Runs) -> str:
    """The comparison as a Markdown table ('' without records).  Save throughput is relative to the
    RetainZ store with RetainZ placement on the same rule and pressure (TCG: ratios only)."""
    recs = _records(runs)
    if not recs:
        return ""
    lines = ["| rule | pressure | system | device WAF | ENOSPC step | fill asked at ENOSPC | most held | zone resets "
             "| save throughput vs RetainZ | read back |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    recs = sorted(recs, key=lambda r: (rule_rank(r["inputs"]["rule"]), r["inputs"]["pressure"], _rank(system_key(r))))
    for r in recs:
        m = r["metrics"]
        base = [b for b in recs if b["inputs"]["rule"] == r["inputs"]["rule"]
                and b["inputs"]["pressure"] == r["inputs"]["pressure"] and system_key(b) == "retainz"]
        ratio = (m["save_throughput"] / base[0]["metrics"]["save_throughput"]
                 if len(base) == 1 and m["save_throughput"] and base[0]["metrics"]["save_throughput"] else None)
        lines.append("| " + " | ".join([
            rule_family(r["inputs"]["rule"]), f"{r['inputs']['pressure']:g}", system_name(system_key(r)),
            f"{m['device_waf']:.3f}", "-" if m["enospc_step"] is None else str(m["enospc_step"]),
            "-" if m["enospc_fill"] is None else f"{m['enospc_fill']:.2f}", f"{m['peak_fill']:.2f}",
            str(m["zone_resets"]), "-" if ratio is None else f"{ratio:.2f}",
            f"{m['bytes_verified'] / 2**20:,.0f} MiB ok" if m["verify_ok"] else "FAILED"]) + " |")
    return "\n".join(lines) + "\n"


def _write_markdown(text: str, out_dir: str, name: str) -> list[str]:
    """``text`` as ``out_dir/name``; nothing for an empty text (no records).  Returns the paths written."""
    if not text:
        return []
    p = os.path.join(out_dir, name)
    with open(p, "w", encoding="utf-8") as f:
        f.write(text)
    return [p]


def write_table(runs: Runs, out_dir: str) -> list[str]:
    """``filesystems.md`` in ``out_dir`` (nothing without records)."""
    return _write_markdown(filesystems_table(runs), out_dir, "filesystems.md")


def filesystem_claims(runs: Runs, out: list) -> None:
    """Claims ``filesystems.*``: per rule and system the lowest pressure with an ENOSPC, the device WAF
    and the fill reached at the lowest pressure; over all runs, how many completed and how many read
    back correctly."""
    recs = _records(runs)
    if not recs:
        return
    for rule in sorted({r["inputs"]["rule"] for r in recs}, key=rule_rank):
        rr = [r for r in recs if r["inputs"]["rule"] == rule]
        low = min(r["inputs"]["pressure"] for r in rr)
        for key in sorted({system_key(r) for r in rr}, key=_rank):
            ks = [r for r in rr if system_key(r) == key]
            cid = f"filesystems.{slug(rule.partition(':')[0])}.{key}"
            name = f"{system_name(key)} / {rule_family(rule)}"
            stops = sorted(r["inputs"]["pressure"] for r in ks if r["metrics"]["enospc_step"] is not None)
            add_claim(out, f"{cid}.enospc_pressure_min", stops[0] if stops else None, 2, ks,
                   f"lowest pressure at which {name} hit ENOSPC on the guest namespace (null: none up to "
                   f"{max(r['inputs']['pressure'] for r in ks):g})")
            at = [r for r in ks if r["inputs"]["pressure"] == low]
            if len(at) == 1:
                add_claim(out, f"{cid}.device_waf_p{low:g}", at[0]["metrics"]["device_waf"], 3, at,
                       f"device write amplification of {name} at pressure {low:g}")
                add_claim(out, f"{cid}.fill_reached_p{low:g}", _reached(at[0]), 2, at,
                       f"most live checkpoint bytes {name} held (of the raw namespace) before any ENOSPC at "
                       f"pressure {low:g}")
    add_claim(out, "filesystems.runs", len(recs), 0, recs, "file-system comparison runs recorded")
    add_claim(out, "filesystems.runs_completed", sum(r["metrics"]["enospc_step"] is None for r in recs), 0, recs,
           "file-system comparison runs that completed their trace without ENOSPC")
    add_claim(out, "filesystems.runs_read_back_ok", sum(bool(r["metrics"]["verify_ok"]) for r in recs), 0, recs,
           "file-system comparison runs whose every surviving checkpoint read back correctly")


def _fleet_records(runs: Runs) -> dict[str, list[dict]]:
    """The fleet-mix records by system key, in display order."""
    recs = [r for r in runs.of(FLEET_EXPERIMENT) if r["inputs"].get("system")]
    by: dict[str, list[dict]] = {}
    for r in sorted(recs, key=lambda r: (_rank(system_key(r)), r["inputs"].get("rerun", 0))):
        by.setdefault(system_key(r), []).append(r)
    return by


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _range(values: list[float], fmt: str) -> str:
    """``median (min-max)`` of ``values``; the median alone for one value."""
    med = format(_median(values), fmt)
    if len(values) == 1:
        return med
    return f"{med} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def _throughput_ratios(by: dict[str, list[dict]], key: str) -> list[float]:
    """Each run's save throughput over the median of the store's (RetainZ placement) runs."""
    base = [r["metrics"]["save_throughput"] for r in by.get("retainz", []) if r["metrics"]["save_throughput"]]
    if not base:
        return []
    b = _median(base)
    return [r["metrics"]["save_throughput"] / b for r in by[key] if r["metrics"]["save_throughput"]]


def fleet_filesystems_figure(runs: Runs, out_dir: str) -> list[str]:
    """``fleet_filesystems.pdf``/``.png``: (a) device WAF and (b) the fill reached before any stop (of the
    raw namespace; dotted: what the fleet needs), one dot per run, a bar at each system's median; a hollow
    dot is a run that stopped before the trace's end (ENOSPC, or the file system forced read-only).
    Nothing without records."""
    import matplotlib.pyplot as plt

    from retainz.analysis.figures import COLUMN_WIDTH, save

    by = _fleet_records(runs)
    if not by:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(2 * COLUMN_WIDTH, 1.9))
    for ax, (metric, label) in zip(axes, (("device_waf", "device WAF"), ("fill", "fill reached (of raw)")), strict=True):
        for x, (key, rs) in enumerate(by.items()):
            color = next((c for k, _, c in SYSTEMS if k == key), "#555555")
            values = [r["metrics"]["device_waf"] if metric == "device_waf" else _reached(r) for r in rs]
            for k, (r, v) in enumerate(zip(rs, values, strict=True)):
                stopped = r["metrics"]["enospc_step"] is not None
                ax.plot(x + (k - (len(rs) - 1) / 2) * 0.12, v, "o", markersize=3, color=color,
                        markerfacecolor="none" if stopped else color)
            ax.plot([x - 0.3, x + 0.3], [_median(values)] * 2, color=color, linewidth=1.2)
        if metric == "fill":
            ax.axhline(next(iter(by.values()))[0]["inputs"]["pressure"], color="black", linewidth=0.6, linestyle=":")
            ax.set_ylim(0, 1)
        ax.set_xticks(range(len(by)))
        ax.set_xticklabels([system_name(k) for k in by], fontsize=6)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.text(0.99, 0.005, "one dot per run, bar: median; hollow: stopped early (ENOSPC or read-only); dotted: fill the fleet needs",
             ha="right", fontsize=5)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return save(fig, out_dir, "fleet_filesystems")


def fleet_filesystems_table(runs: Runs) -> str:
    """The fleet mix on each system as Markdown ('' without records): a line naming the fleet and the
    namespace, then per system the number of runs and, for each measure, the median over the runs with
    the range in brackets.  Device WAF's spread is (max - min) / median.  "stopped" counts the runs that
    ended before the trace did, with each errno the replay got (ENOSPC; EROFS or EIO when the file system
    gave up, the kernel's reason in the record's ``kernel_errors``) and the step.  Save throughput is each
    run's over the median of the store's runs (TCG: ratios only)."""
    by = _fleet_records(runs)
    if not by:
        return ""
    first = next(iter(by.values()))[0]
    i, m = first["inputs"], first["metrics"]
    fleet = i["fleet"]
    lines = [f"Fleet: mean concurrency {fleet['concurrency']:g}, churn {fleet['churn']:g}, seed {i['trace_seed']}, "
             f"{i['steps']:,} steps, shards scaled by {i['scale']}; namespace {m['namespace_zones']} zones of "
             f"{i['zone_size'] / 2**20:g} MiB (capacity {i['zone_capacity'] / 2**20:g} MiB), pressure "
             f"{i['pressure']:g} (peak live {m['trace_peak_live_bytes'] / 1e9:.1f} GB, "
             f"{m['trace_bytes'] / 1e9:.1f} GB saved).", "",
             "| system | runs | device WAF | WAF spread | device GB written | stopped | most held (of raw) "
             "| zone resets | save throughput vs RetainZ | read back |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, rs in by.items():
        ms = [r["metrics"] for r in rs]
        waf = [x["device_waf"] for x in ms]
        ratios = _throughput_ratios(by, key)
        ok = sum(bool(x["verify_ok"]) for x in ms)
        lines.append("| " + " | ".join([
            system_name(key), str(len(rs)), _range(waf, ".4f"),
            f"{(max(waf) - min(waf)) / _median(waf):.2%}",
            _range([x["device_bytes_written"] / 1e9 for x in ms], ".2f"),
            _stops(ms),
            _range([x["peak_fill"] for x in ms], ".3f"), _range([x["zone_resets"] for x in ms], ",.0f"),
            _range(ratios, ".2f") if ratios else "-",
            f"{ok} of {len(rs)} ok" if ok == len(rs) else f"{len(rs) - ok} of {len(rs)} FAILED"]) + " |")
    return "\n".join(lines) + "\n"


def _stops(ms: list[dict]) -> str:
    """``none`` or ``2 of 3: EROFS x2, step 8,700 (8,675-8,728)``: the runs that stopped, their errnos
    (ENOSPC when the record names none) and the step of the stop."""
    stopped = [x for x in ms if x["enospc_step"] is not None]
    if not stopped:
        return "none"
    errnos = Counter(x.get("stop_errno") or "ENOSPC" for x in stopped)
    named = ", ".join(f"{e} x{n}" for e, n in sorted(errnos.items()))
    return f"{len(stopped)} of {len(ms)}: {named}, step {_range([x['enospc_step'] for x in stopped], ',.0f')}"


def write_fleet_table(runs: Runs, out_dir: str) -> list[str]:
    """``fleet_filesystems.md`` in ``out_dir`` (nothing without records)."""
    return _write_markdown(fleet_filesystems_table(runs), out_dir, "fleet_filesystems.md")


def fleet_filesystem_claims(runs: Runs, out: list) -> None:
    """Claims ``fleetfs.*``: per system the runs, the median device WAF with its minimum and maximum,
    the runs that stopped before the trace's end (any errno) and the median fill reached; over all runs,
    how many read back correctly."""
    by = _fleet_records(runs)
    for key, rs in by.items():
        name = system_name(key)
        waf = [r["metrics"]["device_waf"] for r in rs]
        add_claim(out, f"fleetfs.{key}.runs", len(rs), 0, rs, f"fleet-mix runs of {name}")
        add_claim(out, f"fleetfs.{key}.device_waf_median", _median(waf), 4, rs,
                  f"median device write amplification of {name} on the fleet mix")
        add_claim(out, f"fleetfs.{key}.device_waf_min", min(waf), 4, rs,
                  f"lowest device write amplification of {name} over its fleet-mix runs")
        add_claim(out, f"fleetfs.{key}.device_waf_max", max(waf), 4, rs,
                  f"highest device write amplification of {name} over its fleet-mix runs")
        add_claim(out, f"fleetfs.{key}.stopped_runs", sum(r["metrics"]["enospc_step"] is not None for r in rs), 0,
                  rs, f"fleet-mix runs of {name} that stopped before the trace's end (ENOSPC, or the file "
                      f"system forced read-only)")
        add_claim(out, f"fleetfs.{key}.fill_reached_median", _median([_reached(r) for r in rs]), 3, rs,
                  f"median of the most live checkpoint bytes {name} held (of the raw namespace) before any stop")
    every = [r for rs in by.values() for r in rs]
    if every:
        add_claim(out, "fleetfs.runs_read_back_ok", sum(bool(r["metrics"]["verify_ok"]) for r in every), 0, every,
                  "fleet-mix runs whose every surviving checkpoint read back correctly")
