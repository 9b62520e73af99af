"""Figures (matplotlib, Agg, DejaVu Serif, one paper column wide); each saved as PDF and as a PNG at
:data:`PNG_DPI`.

* ``pressure.pdf``: WAF against space pressure, one panel per workload (layout x retention rule), one
  line per policy, each with its own colour and marker, at its recorded value; a cross marks the lowest
  pressure at which a policy hit a capacity stop.  Policies often coincide (WAF 1.00): they are drawn as
  they are, on top of each other, over a grey band along the best WAF at each pressure (the policies
  within :data:`TIE_WAF` of it tie), and the number of policies on the band is written under it.
* ``mechanisms.pdf``: (a) CPU per extent against zone count: inside the allocator's decisions
  (RetainZ, ZenFS-Alloc) and for the whole replay (RetainZ with cached vs recomputed summaries),
  (b) WAF against hint precision for the workload and pressure named in its title, (c) WAF of RetainZ
  against common admission and dedicated zones across pressures (WAF at its recorded value, the axis
  in plain decimals).  Bars start at WAF 0, with the value written above each bar that is not 1.00.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from retainz.analysis.records import (  # noqa: E402
    POLICY_STYLE,
    Runs,
    base_policy,
    layout_name,
    layout_rank,
    policy_name,
    policy_rank,
    rule_family,
    rule_rank,
    zones_of,
)

__all__ = ["setup_style", "pressure_figure", "mechanisms_figure", "save", "COLUMN_WIDTH", "PNG_DPI",
           "TIE_WAF"]

#: One column of a two-column paper, inches.
COLUMN_WIDTH = 3.3
#: Resolution of the PNG copies (the PDFs are vector): 3.3 in -> ~990 pixels.
PNG_DPI = 300
#: Policies whose WAF is within this of the best at a pressure tie there (the band in ``pressure``).
TIE_WAF = 0.0005


def setup_style() -> None:
    plt.rcParams.update({
        "font.family": "serif", "font.serif": ["DejaVu Serif"], "font.size": 7, "axes.titlesize": 7,
        "axes.labelsize": 7, "legend.fontsize": 6, "xtick.labelsize": 6, "ytick.labelsize": 6,
        "lines.linewidth": 1.0, "lines.markersize": 3, "axes.linewidth": 0.6, "grid.linewidth": 0.4,
        "pdf.fonttype": 42, "savefig.dpi": 200, "axes.spines.top": False, "axes.spines.right": False,
    })


def save(fig, out_dir: str, name: str) -> list[str]:
    """Save ``fig`` as ``name.pdf`` and ``name.png``; returns the paths."""
    paths = []
    for ext in ("pdf", "png"):
        p = os.path.join(out_dir, f"{name}.{ext}")
        fig.savefig(p, bbox_inches="tight", pad_inches=0.02, dpi=PNG_DPI,
                    metadata={"CreationDate": None} if ext == "pdf" else None)
        paths.append(p)
    plt.close(fig)
    return paths


def _style(policy: str):
    return POLICY_STYLE.get(policy) or POLICY_STYLE.get(base_policy(policy), ("#555555", ".", "-"))


def pressure_figure(runs: Runs, out_dir: str) -> list[str]:
    """``pressure.pdf``/``.png`` (empty list when the records have no pressure sweep)."""
    recs = runs.of("pressure")
    if not recs:
        return []
    layouts = sorted(runs.values("pressure", "layout"), key=layout_rank)
    rules = sorted(runs.values("pressure", "rule"), key=rule_rank)
    policies = sorted({r["inputs"]["policy"] for r in recs}, key=policy_rank)
    nrow, ncol = len(layouts), len(rules)
    legend_cols = 4
    legend_h = 0.1 * -(-(len(policies) + 2) // legend_cols)   # inches: rows of the legend
    height = legend_h + 0.35 + 1.15 * nrow
    fig, axes = plt.subplots(nrow, ncol, figsize=(COLUMN_WIDTH, height), squeeze=False, sharex=True)
    handles = {}
    for i, layout in enumerate(layouts):
        for j, rule in enumerate(rules):
            ax = axes[i][j]
            running: dict[float, list[float]] = {}      # pressure -> WAF of every policy still running
            for pol in policies:
                rs = sorted((r for r in recs if r["inputs"]["layout"] == layout and r["inputs"]["rule"] == rule
                             and r["inputs"]["policy"] == pol), key=lambda r: r["inputs"]["pressure"])
                if not rs:
                    continue
                color, marker, ls = _style(pol)
                ok = [r for r in rs if r["capacity_stop_step"] is None]
                stopped = [r for r in rs if r["capacity_stop_step"] is not None]
                first_stop = min((r["inputs"]["pressure"] for r in stopped), default=None)
                ok = [r for r in ok if first_stop is None or r["inputs"]["pressure"] < first_stop]
                for r in ok:
                    running.setdefault(r["inputs"]["pressure"], []).append(r["metrics"]["waf"])
                (h,) = ax.plot([r["inputs"]["pressure"] for r in ok], [r["metrics"]["waf"] for r in ok],
                               color=color, marker=marker or ".", linestyle=ls, markerfacecolor="none",
                               markeredgewidth=0.7, zorder=3)
                handles.setdefault(pol, h)
                if first_stop is not None:
                    s = [r for r in stopped if r["inputs"]["pressure"] == first_stop][0]
                    ax.plot([first_stop], [s["metrics"]["waf"]], color=color, marker="X", markersize=5,
                            linestyle="none", markeredgewidth=0.3, markeredgecolor="white", zorder=4)
            ps = sorted(running)
            best = [min(running[p]) for p in ps]
            ax.plot(ps, best, color="#bbbbbb", linewidth=5, alpha=0.6, solid_capstyle="round", zorder=1)
            lo, hi = ax.dataLim.intervaly
            hi = max(hi, lo + 0.05)                          # a flat WAF = 1 stays readable
            pad = 0.08 * (hi - lo)
            ax.set_ylim(lo - 3.5 * pad, hi + pad)            # room for the tie counts under the band
            low = False
            for n, (p, b) in enumerate(zip(ps, best, strict=True)):
                ties = sum(1 for w in running[p] if w - b <= TIE_WAF)
                low = not low and n > 0 and p - ps[n - 1] < 0.04      # stagger counts of close pressures
                ax.annotate(str(ties), (p, b), xytext=(0, -11 if low else -5), textcoords="offset points",
                            ha="center", va="top", fontsize=4, color="#666666")
            ax.grid(True, alpha=0.4)
            ax.ticklabel_format(axis="y", useOffset=False)
            if i == 0:
                ax.set_title(rule_family(rule), pad=3)
            if i == nrow - 1:
                ax.set_xlabel("space pressure")
            if j == 0:
                ax.set_ylabel(f"{layout_name(layout)}\nWAF")
    (stop_handle,) = axes[0][0].plot([], [], color="#444444", marker="X", linestyle="none", markersize=5)
    (band_handle,) = axes[0][0].plot([], [], color="#bbbbbb", linewidth=5, alpha=0.6)
    labels = [policy_name(p) for p in handles] + ["capacity stop", "best (n tied)"]
    fig.legend(list(handles.values()) + [stop_handle, band_handle], labels, loc="upper center", ncol=legend_cols,
               frameon=False, bbox_to_anchor=(0.5, 1.0), handlelength=1.2, columnspacing=0.5,
               handletextpad=0.3, labelspacing=0.25, fontsize=5, borderaxespad=0.0)
    fig.tight_layout(rect=(0, 0, 1, 1 - legend_h / height), h_pad=0.6, w_pad=0.4)
    return save(fig, out_dir, "pressure")


def mechanisms_figure(runs: Runs, out_dir: str) -> list[str]:
    """``mechanisms.pdf``/``.png`` with whichever of its three panels the records support."""
    cost, hints, adm = runs.of("cost"), runs.of("hints"), runs.of("admission")
    panels = [p for p, rs in (("cost", cost), ("hints", hints), ("admission", adm)) if rs]
    if not panels:
        return []
    fig, axes = plt.subplots(len(panels), 1, figsize=(COLUMN_WIDTH, 1.55 * len(panels) + 0.1), squeeze=False)
    for ax, panel, letter in zip((a[0] for a in axes), panels, "abc", strict=False):
        if panel == "cost":
            # solid: CPU inside the allocator's decisions (replay's decision_cpu_seconds);
            # dashed/dotted: CPU of the whole replay (process time) per extent, cached vs recompute
            lines: dict[tuple, list] = {}
            for r in cost:
                n = r["metrics"]["decisions"]
                if not n:
                    continue
                pol, recompute = base_policy(r["inputs"]["policy"]), r["inputs"]["verify_summaries"]
                if not recompute:
                    lines.setdefault((pol, "decision"), []).append(
                        (zones_of(r), 1e6 * r["metrics"]["decision_cpu_seconds"] / n))
                if pol == "retainz":
                    lines.setdefault((pol, "recompute" if recompute else "replay"), []).append(
                        (zones_of(r), 1e6 * r["timing"]["cpu_seconds"] / n))
            names = {"decision": "decisions", "replay": "whole replay, cached summaries",
                     "recompute": "whole replay, recomputed summaries"}
            styles = {"decision": "-", "replay": ":", "recompute": "--"}
            for (pol, kind), pts in sorted(lines.items(), key=lambda kv: (policy_rank(kv[0][0]), kv[0][1])):
                pts.sort()
                color, marker, _ = _style(pol)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker,
                        linestyle=styles[kind], markerfacecolor="none",
                        label=f"{policy_name(pol)}: {names[kind]}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            xs = []
            for x in sorted({p[0] for pts in lines.values() for p in pts}):
                if not xs or x >= 1.5 * xs[-1]:              # ticks close on a log axis overlap
                    xs.append(x)
            ax.set_xticks(xs)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ys = [p[1] for pts in lines.values() for p in pts if p[1] > 0]
            if ys:
                ax.set_ylim(min(ys) / 2, max(ys) * 80)      # room for the legend above the data
            ax.set_xlabel("data zones")
            ax.set_ylabel("CPU per extent (µs)")
            ax.legend(frameon=False, loc="upper left", fontsize=5.5, ncol=1)
        elif panel == "hints":
            rules = sorted(runs.values("hints", "rule"), key=rule_rank)
            pols = sorted({r["inputs"]["policy"] for r in hints}, key=_hint_rank)
            width = 0.8 / max(1, len(rules))
            for k, rule in enumerate(rules):
                xs, ys, stops = [], [], []
                for x, pol in enumerate(pols):
                    r = runs.one("hints", rule=rule, policy=pol)
                    if r is not None:
                        xs.append(x + (k - (len(rules) - 1) / 2) * width)
                        ys.append(r["metrics"]["waf"])
                        stops.append(r["capacity_stop_step"])
                ax.bar(xs, ys, width=width * 0.92, color=["#1f4e9c", "#e6a23c", "#7fb7a4"][k % 3],
                       label=rule_family(rule))
                _bar_values(ax, xs, ys, stops)
            ax.set_xticks(range(len(pols)))
            ax.set_xticklabels([_hint_label(p) for p in pols], rotation=0)
            ax.set_ylabel("WAF")
            ax.set_ylim(0, 1.5 * max(r["metrics"]["waf"] for r in hints))   # room for labels and legend
            ax.set_xlabel("hint precision (RetainZ)")
            if len(rules) > 1:
                ax.legend(frameon=False, loc="upper left", ncol=len(rules))
        else:
            rules = sorted(runs.values("admission", "rule"), key=rule_rank)
            pols = sorted({r["inputs"]["policy"] for r in adm}, key=policy_rank)
            for pol in pols:
                for k, rule in enumerate(rules):
                    rs = sorted(runs.of("admission", rule=rule, policy=pol), key=lambda r: r["inputs"]["pressure"])
                    color, marker, _ = _style(pol)
                    xs = [r["inputs"]["pressure"] for r in rs]
                    if len(xs) == 1:
                        x = pols.index(pol) + 0.4 * k
                        ax.bar([x], [rs[0]["metrics"]["waf"]], width=0.36, color=color,
                               label=f"{policy_name(pol)}" + (f", {rule_family(rule)}" if len(rules) > 1 else ""))
                        _bar_values(ax, [x], [rs[0]["metrics"]["waf"]], [rs[0]["capacity_stop_step"]])
                        continue
                    ax.plot(xs, [r["metrics"]["waf"] for r in rs], color=color, marker=marker,
                            linestyle=["-", "--", ":"][k % 3], markerfacecolor="none",
                            label=f"{policy_name(pol)}, {rule_family(rule).split()[0]}")
                    stops = [r for r in rs if r["capacity_stop_step"] is not None]
                    ax.plot([r["inputs"]["pressure"] for r in stops], [r["metrics"]["waf"] for r in stops],
                            color=color, marker="X", markersize=5, linestyle="none", markeredgewidth=0.3,
                            markeredgecolor="white")
            if len(runs.values("admission", "pressure")) == 1:
                ax.set_ylim(0, 1.5 * max(r["metrics"]["waf"] for r in adm))
                ax.set_xticks(range(len(pols)))
                ax.set_xticklabels([policy_name(p) for p in pols])
                ax.set_xlabel(f"admission (pressure {runs.values('admission', 'pressure')[0]})")
                if len(rules) > 1:
                    ax.legend(frameon=False, loc="upper left", ncol=2)
            else:
                ax.set_xlabel("space pressure")
                ax.legend(frameon=False, loc="upper left", ncol=2)
                lo, hi = ax.dataLim.intervaly
                ax.set_ylim(lo - 0.1 * (hi - lo), hi + 0.45 * (hi - lo))   # room for the legend
                ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter(useOffset=False))
            ax.set_ylabel("WAF")
        ax.grid(True, alpha=0.4)
        title = {"cost": "allocation cost", "hints": "hint precision",
                 "admission": "common admission"}[panel]
        if panel in ("hints", "admission"):
            title += f": {_workload(runs, panel)}"
        ax.set_title(f"({letter}) {title}", loc="left", pad=2)
    fig.tight_layout(h_pad=0.8)
    return save(fig, out_dir, "mechanisms")


def _bar_values(ax, xs: list, ys: list, stops: list) -> None:
    """Write above each bar its WAF where it is not 1.00 (the bars start at 0) and the step of its
    capacity stop if it had one."""
    for x, y, stop in zip(xs, ys, stops, strict=True):
        text = "\n".join(([] if round(y, 2) == 1.0 else [f"{y:.2f}"])
                         + ([] if stop is None else [f"stop {stop / 1000:g}k"]))
        if text:
            ax.text(x, y, text, ha="center", va="bottom", fontsize=4.5, linespacing=1.0)


def _workload(runs: Runs, experiment: str) -> str:
    """The layouts of an experiment's records and, when it has one, its pressure, e.g. ``SmolLM2-135M,
    pressure 0.9`` (a pressure sweep is on the x axis instead)."""
    layouts = ", ".join(layout_name(v) for v in sorted(runs.values(experiment, "layout"), key=layout_rank))
    pressures = runs.values(experiment, "pressure")
    return layouts + (f", pressure {pressures[0]:g}" if len(pressures) == 1 else "")


def _hint_rank(policy: str) -> tuple:
    base, _, params = policy.partition(":")
    order = {"retainz": 0, "retainz-coarse": 1, "retainz-noisy": 2, "retainz-nohint": 9}
    err = 0.0
    if base == "retainz-noisy":
        kv = dict(p.split("=", 1) for p in params.split(",") if "=" in p)
        err = float(kv.get("error", 0))
    return (order.get(base, 5), err, policy)


def _hint_label(policy: str) -> str:
    base, _, params = policy.partition(":")
    if base == "retainz-noisy":
        kv = dict(p.split("=", 1) for p in params.split(",") if "=" in p)
        return f"±{kv.get('error', '?')}"
    return {"retainz": "exact", "retainz-coarse": "coarse", "retainz-nohint": "none"}.get(base, base)
