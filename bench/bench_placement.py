"""Decision cost per extent of every placement policy at 256, 4,096 and 65,536 zones, in one run.

For each zone count and policy: a ZoneTable is prefilled to a steady state (80 % of the zones full
with mixed live/dead bytes and reclaim steps, the active budget open, the rest empty), then
``place`` is timed for a stream of extents (keep-latest saves, a few permanent ones, 5 % GC copies)
whose decisions are applied as the store applies them (finish, write, and untimed resets that keep
empty zones available).  Only ``place`` is timed (``time.perf_counter_ns``).

Two configurations: the device limits of a ZN540-like drive (14 active zones, one kept for the
journal, as the store does) and an unlimited device where a sixteenth of the zones are open, which
is where an index over open zones matters.

``--compare`` instead replays one TorchTitan ``keep_latest_k=10`` trace (the project's generator,
Llama-3-8B FSDP on 8 ranks, a save every 500 steps) through the real store on a payload-free
MemoryDevice sized for a space pressure (peak live bytes / data capacity, 2 GC-reserve zones on top)
and prints each policy's WAF, GC bytes, dead-space-time and unused capacity side by side.

Usage: ``python bench/bench_placement.py [--json out.json] [--quick]`` (``make bench-placement``);
``python bench/bench_placement.py --compare [--pressure 0.9] [--steps 50000]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from retainz.hint import Hint, lifetime_class  # noqa: E402
from retainz.placement import POLICIES, ExtentRequest, ZoneTable, make_allocator  # noqa: E402
from retainz.zoned.model import ZoneCond  # noqa: E402

MiB = 1 << 20
SIZES = (256, 4096, 65536)
INTERVAL, K = 500, 10


def prefill(n: int, max_active: int, n_open: int, seed: int) -> ZoneTable:
    rnd = random.Random(seed)
    t = ZoneTable({z: MiB for z in range(n)}, max_active=max_active,
                  reserved_active=1 if max_active else 0)
    now = 100 * INTERVAL
    t.now = now
    n_full = int(n * 0.8)
    for z in range(n_full + n_open):
        r = float("inf") if rnd.random() < 0.05 else float(now + rnd.randint(0, K) * INTERVAL)
        step = int(now - INTERVAL * rnd.randint(0, K)) if r != float("inf") else now
        w = MiB if z < n_full else rnd.randint(1, MiB - 1)
        t.on_write(z, w, reclaim_step=r, lifetime=lifetime_class(r, step), step=step)
        dead = rnd.randint(0, w - 1)
        if dead:
            t.on_kill(z, dead)
    return t


def requests(count: int, seed: int):
    rnd = random.Random(seed)
    now = 100 * INTERVAL
    for i in range(count):
        if i % 16 == 0:
            now += INTERVAL
        gen = f"g{now}"
        r = float("inf") if rnd.random() < 0.05 else float(now + K * INTERVAL)
        gc = rnd.random() < 0.05
        step = now - rnd.randint(1, K) * INTERVAL if gc else now
        yield ExtentRequest(nbytes=256 * 1024, generation=gen, step=step, now=now, gc=gc,
                            hint=Hint(reclaim_step=r, lifetime=lifetime_class(r, step),
                                      actual_reclaim_step=r),
                            pending=0 if gc else rnd.randint(0, 4) * MiB)


def bench_one(policy: str, n: int, max_active: int, n_open: int, count: int) -> float:
    """Mean ``place`` time (microseconds) over ``count`` applied decisions."""
    t = prefill(n, max_active, n_open, seed=n)
    a = make_allocator(policy)
    a.bind(t)
    t.first_empty()   # untimed: drop the prefill's lazily deleted entries from the empty-zone heap
    rnd = random.Random(1)
    total = 0
    for req in requests(count, seed=2):
        t.now = req.now
        t0 = time.perf_counter_ns()
        d = a.place(req)
        total += time.perf_counter_ns() - t0
        for f in d.finish:
            t.on_finish(f)
        if d.zone is not None:
            s = t[d.zone]
            t.on_write(d.zone, min(req.nbytes, s.remaining), reclaim_step=d.reclaim_step,
                       lifetime=req.hint.lifetime, step=req.now)
        while t.n_empty < max(4, n // 64):   # untimed: deletions reset zones
            z = rnd.randrange(n)
            s = t[z]
            if s.cond != ZoneCond.EMPTY:
                if s.live:
                    t.on_kill(z, s.live)
                t.on_reset(z)
    return total / count / 1000


def torchtitan_events(steps: int, layout: str):
    """``(events, peak live bytes)`` of a generated TorchTitan keep_latest_k=10 trace, with each
    save's actual deletion step attached for the oracle."""
    from retainz.trace.generate import generate_trace

    tr = generate_trace(layout, "torchtitan:interval=500,keep_latest_k=10", steps)
    deleted = {e.gen: e.step for e in tr.events if e.type == "delete"}
    events, live, peak = [], {}, 0
    for e in tr.events:
        if e.type == "save":
            hint = replace(e.hint, actual_reclaim_step=deleted.get(e.gen))
            events.append(("save", f"g{e.gen}", e.step, [s.nbytes for s in e.shards], hint))
            live[e.gen] = e.nbytes
            peak = max(peak, sum(live.values()))
        elif e.type == "delete":
            events.append(("delete", f"g{e.gen}", e.step))
            live.pop(e.gen)
    return events, peak


def compare(pressure: float, steps: int, layout: str) -> dict:
    from retainz.zoned import Geometry, MemoryDevice

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.placement_driver import replay_store

    events, peak = torchtitan_events(steps, layout)
    # The ZN540 zone (2 GiB, 1,077 MiB capacity, 14 active) scaled by 1/4, as the recorded manifests use
    # for this layout: the device then has the 32 zones upstream ZenFS needs (ZENFS_MIN_ZONES).
    cap = 1077 * MiB // 4
    data_zones = -(-int(peak / pressure) // cap) + 2  # + GC reserve
    geom = Geometry(nr_zones=data_zones + 3, zone_size=512 * MiB, zone_capacity=cap,
                    block_size=4096, max_open=14, max_active=14)
    print(f"\n## {layout}, torchtitan keep_latest_k=10, {steps} steps, peak live "
          f"{peak / 2**30:,.0f} GiB, pressure {pressure}: {data_zones} data zones of 269.25 MiB\n")
    print("| policy | WAF | GC GiB | dead-space-time (TiB-steps) | unused GiB (finished) | "
          "unused (TiB-steps) | resets | capacity stop | decisions | us/decision |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    out = {}
    for policy in sorted(POLICIES):
        try:
            m, log, stop = replay_store(policy, events, MemoryDevice(geom, payload=False))
        except ValueError as e:                       # a policy that refuses the device (zenfs < 32 zones)
            print(f"| {policy} | refused: {e} |", flush=True)
            continue
        out[policy] = dict(m, stop_step=stop)
        us = m["decision_cpu_seconds"] / max(m["decisions"], 1) * 1e6
        print(f"| {policy} | {m['waf']:.3f} | {m['gc_bytes'] / 2**30:,.0f} | "
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
