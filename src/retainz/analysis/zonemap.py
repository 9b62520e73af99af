"""``zonemap.pdf``: zones x steps, live/dead/unused, for two policies side by side.

Input: the ``zone_map`` a replay returns when asked (``docs/experiments.md``, format 1)::

    {"format": 1,
     "steps":  [s_0, ..., s_{B-1}],      # B <= 200 sample steps, increasing (state after step s_b)
     "zones":  Z,                        # data zones of the device
     "groups": G,                        # G <= 256 rows; row g covers zones [g*Z//G, (g+1)*Z//G)
     "live":   [[int]*G]*B,              # percent (0..100) of the row's zone capacity holding live data
     "dead":   [[int]*G]*B,              # ... dead data (deleted, not yet reset)
     "unused": [[int]*G]*B}              # ... capacity lost to early finishes (until reset)

The rest of a row (100 - live - dead - unused) is writable (free).  Each cell's colour mixes blue (live),
red (dead), grey (unused) and white (free) by those shares.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from retainz.analysis.figures import COLUMN_WIDTH, save  # noqa: E402
from retainz.analysis.records import Runs, base_policy, policy_name  # noqa: E402

__all__ = ["zone_map_image", "zonemap_figure", "pick_pair", "stop_label", "COLORS"]

COLORS = {"live": (0.12, 0.31, 0.61), "dead": (0.80, 0.20, 0.17), "unused": (0.62, 0.62, 0.62),
          "free": (1.0, 1.0, 1.0)}


def zone_map_image(zm: dict) -> np.ndarray:
    """RGB image, shape (groups, steps, 3): rows are zone groups (zone 0 at the top), columns samples."""
    live, dead, unused = (np.asarray(zm[k], dtype=float).T / 100.0 for k in ("live", "dead", "unused"))
    if live.shape != (zm["groups"], len(zm["steps"])):
        raise ValueError(f"zone map arrays are {live.shape}, expected groups x steps = "
                         f"({zm['groups']}, {len(zm['steps'])})")
    free = np.clip(1.0 - live - dead - unused, 0.0, 1.0)
    img = np.zeros(live.shape + (3,))
    for share, key in ((live, "live"), (dead, "dead"), (unused, "unused"), (free, "free")):
        img += share[..., None] * np.asarray(COLORS[key])
    return np.clip(img, 0.0, 1.0)


def pick_pair(runs: Runs) -> list[dict]:
    """The two records to show: the placement reference RetainZ and ZenFS-Alloc rows if they carry zone
    maps, else the first two records with zone maps (by policy)."""
    with_map = [r for r in runs.records if r.get("zone_map")]
    ref = [r for r in with_map if r["tags"]["experiment"] == "placement"] or with_map
    pair = []
    for pol in ("retainz", "zenfs"):
        pair += [r for r in ref if base_policy(r["inputs"]["policy"]) == pol][:1]
    if len(pair) < 2:
        pair = ref[:2]
    return pair


def stop_label(rec: dict) -> str:
    """`` (stop at 5,000: allocation)`` for a record with a capacity stop (its cause when recorded),
    else ``""``."""
    stop = rec.get("capacity_stop_step")
    if stop is None:
        return ""
    cause = rec.get("capacity_stop_cause")
    return f" (stop at {stop:,}" + (f": {cause})" if cause else ")")


def zonemap_figure(runs: Runs, out_dir: str) -> list[str]:
    """``zonemap.pdf``/``.png`` (empty list when no record has a zone map)."""
    pair = pick_pair(runs)
    if not pair:
        return []
    fig, axes = plt.subplots(1, len(pair), figsize=(COLUMN_WIDTH, 2.0), squeeze=False, sharey=False)
    for ax, r in zip(axes[0], pair, strict=True):
        zm = r["zone_map"]
        img = zone_map_image(zm)
        steps = zm["steps"]
        ax.imshow(img, aspect="auto", interpolation="nearest",
                  extent=(steps[0], steps[-1], zm["zones"], 0))
        ax.set_xlim(0, max(r["inputs"]["steps"] for r in pair))   # one time axis for both panels
        ax.set_title(policy_name(r["inputs"]["policy"]) + stop_label(r), pad=2)
        ax.set_xlabel("training step")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
        ax.xaxis.get_offset_text().set_fontsize(6)
    axes[0][0].set_ylabel("zone")
    handles = [Patch(facecolor=COLORS[k], edgecolor="#888888", linewidth=0.4, label=k)
               for k in ("live", "dead", "unused", "free")]
    fig.legend(handles=handles, loc="upper center", ncol=4, frameon=False, bbox_to_anchor=(0.5, 1.02))
    fig.tight_layout(rect=(0, 0, 1, 0.9), w_pad=0.6)
    return save(fig, out_dir, "zonemap")
