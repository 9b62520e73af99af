"""Decision cost per extent of every placement policy at 256, 4,096 and 65,536 zones, in one run.

Everything runs through the real store (:class:`retainz.store.Store`) on a payload-less
:class:`retainz.zoned.MemoryDevice` of 1 MiB zones.  For each zone count the store is prefilled
once to a steady state (80 % of the data zones full with mixed live/dead bytes and reclaim steps, the
open zones partly written, the rest empty): a scripted placement (:class:`_Prefill`, through
``Store.use_allocator``) puts each prefill generation's shards into the zones the plan names, and the
generations holding the dead bytes are deleted.  Each policy then opens the store on a copy of that
device (``Store.open(policy=...)``) and places a stream of keep-latest saves (16 shards of 256 KiB a
save, one save in 20 permanent; the save ``K`` saves back is deleted as each commits).  Before each
shard, while fewer than ``max(4, zones / 64)`` zones are empty, the prefill generations (earliest
reclaim step first), then the oldest saves, are deleted (untimed: deletions reset zones).  The
figure is the store's own measure, ``decision_cpu_seconds / decisions`` (``time.thread_time``
around every ``place`` call), over the stream.  The stream keeps empty zones above the store's GC
reserve, so the decisions timed are the saves' (the store's GC, when it runs, asks the same
``place``).

Two configurations: the device limits of a ZN540-like drive (14 active zones, one kept for the
journal, as the store does) and an unlimited device where a sixteenth of the zones are open, which
is where an index over open zones matters.

``--compare`` instead replays one TorchTitan ``keep_latest_k=10`` trace (the project's generator,
Llama-3-8B FSDP on 8 ranks, a save every 500 steps) with :func:`retainz.trace.replay.replay` on a
payload-free MemoryDevice sized for a space pressure (peak live bytes / data capacity, 2 GC-reserve
zones on top) and prints each policy's WAF, GC bytes, dead-space-time and unused capacity side by side.

Usage: ``python bench/bench_placement.py [--json out.json] [--quick]`` (``make bench-placement``);
``python bench/bench_placement.py --compare [--pressure 0.9] [--steps 50000]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from retainz.hint import Hint, lifetime_class  # noqa: E402
from retainz.placement import POLICIES, Decision  # noqa: E402
from retainz.placement.base import Allocator  # noqa: E402
from retainz.store import Store  # noqa: E402
from retainz.store.journal import default_meta_zones  # noqa: E402
from retainz.zoned import Geometry, MemoryDevice  # noqa: E402

MiB = 1 << 20
BLOCK = 4096
SIZES = (256, 4096, 65536)
INTERVAL, K = 500, 10
SHARD, SHARDS = 256 * 1024, 16


@dataclass
class _Prefill(Allocator):
    """The prefill's scripted placement: every extent goes to :attr:`zone` with :attr:`reclaim` as
    its reclaim step (the prefill sets both before each shard; a shard never spans zones).  No GC."""

    name = "bench-prefill"
    zone: int = -1
    reclaim: float | None = None

    def place(self, req):
        return Decision(self.zone, reclaim_step=self.reclaim)

    def gc_victims(self, reserve_zones):
        del reserve_zones  # Ignored: the prefill never collects.
        return []


#: (zones, max_active, open zones, seed) -> the prefilled device (never opened again: copied) and
#: its prefill generations.
_PREFILLED: dict[tuple[int, int, int, int], tuple[MemoryDevice, list[str]]] = {}


def prefilled(policy: str, n: int, max_active: int, n_open: int, seed: int) -> tuple[Store, list[str]]:
    """:func:`prefill`'s store with ``policy``, opened on a copy of a device prefilled once per
    arguments (a 65,536-zone prefill takes about 9 CPU-seconds, mostly journal rollovers; a copy and
    ``Store.open`` about 1.5 s)."""
    key = (n, max_active, n_open, seed)
    if key not in _PREFILLED:
        st, old = prefill(*key)
        st.close()
        _PREFILLED[key] = (st.device, old)
    dev, old = _PREFILLED[key]
    return Store.open(copy.deepcopy(dev), policy=policy), list(old)


def prefill(n: int, max_active: int, n_open: int, seed: int) -> tuple[Store, list[str]]:
    """A store on ``n`` data zones of 1 MiB (``max_active`` data zones active, 0 = unlimited) in the
    steady state of the module docstring, ``n_open`` zones partly written; returns it and its
    prefill generations, earliest reclaim step first (permanent ones left out: never deleted)."""
    rnd = random.Random(seed)
    limit = max_active + 1 if max_active else 0
    meta = default_meta_zones(n + 3, MiB, BLOCK, 2)      # the store's own count for such a device
    geom = Geometry(nr_zones=n + meta, zone_size=MiB, zone_capacity=MiB, block_size=BLOCK, max_open=limit,
                    max_active=limit)
    st = Store.format(MemoryDevice(geom, payload=False), meta_zones=meta)
    zones = sorted(st.table.zones)
    now = 100 * INTERVAL
    n_full = int(n * 0.8)
    groups: dict[tuple[int, float], list[tuple[int, int, int]]] = {}
    for i in range(n_full + n_open):
        r = float("inf") if rnd.random() < 0.05 else float(now + rnd.randint(0, K) * INTERVAL)
        step = int(now - INTERVAL * rnd.randint(0, K)) if r != float("inf") else now
        w = MiB // BLOCK if i < n_full else rnd.randint(1, MiB // BLOCK - 1)       # blocks
        groups.setdefault((step, r), []).append((zones[i], w, rnd.randint(0, w - 1)))
    pre = _Prefill()
    st.use_allocator(pre)
    for (step, r), plan in sorted(groups.items()):
        hint = Hint(reclaim_step=r, lifetime=lifetime_class(r, step), actual_reclaim_step=r)
        live = st.begin_generation(f"p{step}-{r}", step, hint=hint,
                                   declared_size=sum(w - d for _, w, d in plan) * BLOCK)
        dead = st.begin_generation(f"d{step}-{r}", step, hint=hint,
                                   declared_size=sum(d for *_, d in plan) * BLOCK)
        pre.reclaim = r
        for z, w, d in plan:
            pre.zone = z
            live.write_counted_shard(f"z{z}", (w - d) * BLOCK)
            if d:
                dead.write_counted_shard(f"z{z}", d * BLOCK)
        live.commit()
        dead.commit()
        st.delete(dead.id, step=step)       # a zone keeps at least one live block: never reset here
    older = sorted((r, step) for step, r in groups if r != float("inf"))
    return st, [f"p{step}-{r}" for r, step in older]


def bench_one(policy: str, n: int, max_active: int, n_open: int, count: int) -> float:
    """Mean decision time (microseconds, the store's ``decision_cpu_seconds / decisions``) over at
    least ``count`` decisions of ``policy`` on the prefilled store (see the module docstring)."""
    st, old = prefilled(policy, n, max_active, n_open, seed=n)
    st.table.first_empty()   # untimed: drop the prefill's lazily deleted entries from the empty-zone heap
    rnd = random.Random(2)
    m = st.metrics
    d0, t0 = m.decisions, m.decision_cpu_seconds
    floor = max(4, n // 64)
    now = 100 * INTERVAL
    saved: list[str] = []
    try:
        while m.decisions - d0 < count:
            now += INTERVAL
            r = float("inf") if rnd.random() < 0.05 else float(now + K * INTERVAL)
            w = st.begin_generation(f"g{now}", now, declared_size=SHARDS * SHARD,
                                    hint=Hint(reclaim_step=r, lifetime=lifetime_class(r, now),
                                              actual_reclaim_step=r))
            for i in range(SHARDS):
                while st.table.n_empty < floor and (old or saved):    # untimed: deletions reset zones
                    st.delete((old or saved).pop(0), step=now)
                w.write_counted_shard(f"s{i}", SHARD)
            w.commit()
            if r != float("inf"):
                saved.append(w.id)
            if len(saved) > K:
                st.delete(saved.pop(0), step=now)
    finally:
        st.close()
    return (m.decision_cpu_seconds - t0) / (m.decisions - d0) * 1e6


def compare(pressure: float, steps: int, layout: str) -> dict:
    """Every policy's replay metrics on one TorchTitan ``keep_latest_k=10`` trace (the module
    docstring); returns ``{policy: replay result}``."""
    from retainz.trace.generate import write_generated
    from retainz.trace.replay import ReplayConfig, replay, trace_stats

    # The ZN540 zone (2 GiB, 1,077 MiB capacity, 14 active) scaled by 1/4, as the recorded manifests use
    # for this layout: the device then has the 32 zones upstream ZenFS needs (ZENFS_MIN_ZONES).
    cap = 1077 * MiB // 4
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "torchtitan-k10.jsonl")
        write_generated(path, layout, "torchtitan:interval=500,keep_latest_k=10", steps)
        peak = trace_stats(path).peak_live_bytes
        print(f"\n## {layout}, torchtitan keep_latest_k=10, {steps} steps, peak live "
              f"{peak / 2**30:,.0f} GiB, pressure {pressure}: data zones of 269.25 MiB\n")
        print("| policy | data zones | WAF | GC GiB | dead-space-time (TiB-steps) | unused GiB (finished) | "
              "unused (TiB-steps) | resets | capacity stop | decisions | us/decision |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
        for policy in sorted(POLICIES):
            cfg = ReplayConfig(policy=policy, pressure=pressure, reserve_zones=2, meta_zones=3,
                               zone_size=512 * MiB, zone_capacity=cap, max_active=14, max_open=14)
            try:
                m = replay(path, cfg)
            except ValueError as e:                   # a policy that refuses the device (zenfs < 32 zones)
                print(f"| {policy} | refused: {e} |", flush=True)
                continue
            out[policy] = m
            stop = m["capacity_stop_step"]
            us = m["decision_cpu_seconds"] / max(m["decisions"], 1) * 1e6
            print(f"| {policy} | {m['zones']} | {m['waf']:.3f} | {m['gc_bytes'] / 2**30:,.0f} | "
                  f"{m['dead_space_byte_steps'] / 2**40:,.0f} | {m['unused_capacity_bytes'] / 2**30:,.0f} | "
                  f"{m['unused_capacity_byte_steps'] / 2**40:,.0f} | {m['resets']} | "
                  f"{stop if stop is not None else 'none'} | {m['decisions']} | {us:,.1f} |", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer decisions (a smoke test)")
    ap.add_argument("--compare", action="store_true", help="policy metrics on a TorchTitan trace")
    ap.add_argument("--pressure", type=float, default=0.9)
    ap.add_argument("--steps", type=int, default=50000)
    ap.add_argument("--layout", default="llama3-8b-fsdp:ranks=8")
    args = ap.parse_args(argv)
    if args.compare:
        res = compare(args.pressure, args.steps, args.layout)
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        return 0
    configs = [("ZN540-like: 14 active", 14, lambda n: 12),
               ("unlimited: zones/16 open", 0, lambda n: n // 16)]
    results: dict = {}
    for label, max_active, n_open in configs:
        print(f"\n## decision cost per extent (microseconds), {label}\n")
        print(f"| policy | {' | '.join(f'{n:,} zones' for n in SIZES)} |")
        print("|---|" + "---:|" * len(SIZES))
        for policy in sorted(POLICIES):
            row = []
            for n in SIZES:
                scan = policy == "zenfs"
                count = max(40, min(1500, 3_000_000 // n)) if scan else 1500
                if args.quick:
                    count = max(10, count // 20)
                us = bench_one(policy, n, max_active - 1 if max_active else 0, n_open(n), count)
                results.setdefault(label, {}).setdefault(policy, {})[n] = us
                row.append(f"{us:,.1f}")
            print(f"| {policy} | {' | '.join(row)} |", flush=True)
        r = results[label]
        ratio = r["retainz"][4096] / r["zenfs"][4096]
        growth = r["retainz"][65536] / r["retainz"][256]
        print(f"\nretainz / zenfs at 4,096 zones: {ratio:.3f}; retainz 65,536 / 256 zones: "
              f"{growth:.2f} (zone count x256); zenfs: {r['zenfs'][65536] / r['zenfs'][256]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
