"""Trace-replay rate: extents placed per second through the real store (``make bench-replay``).

The instrument is :func:`retainz.trace.replay.replay` on a payload-less
:class:`~retainz.zoned.MemoryDevice` (the experiment default): trace parsing, admission, placement,
device writes, zone-table upkeep, commit and deletion records, resets, all on one core.

Workload (chosen so every generation has several shards and crosses many zones):

* trace: ``llama3-8b-fsdp:ranks=8`` (TorchTitan FSDP2 over 8 ranks: 8 DCP shards of ~12 GB and a
  2 MB ``.metadata``, 96.4 GB per save), ``torchtitan:interval=1,keep_latest_k=10``, 100,000
  steps: 100,000 generations, ~99,990 deletions, peak live 1.06 TB;
* device: 4,096 data zones (``--zones 4096``) of the ZN540 geometry replay uses by default (2 GiB
  zones, 1077 MiB capacity, 14 open / 14 active): 4.6 TB, so the trace runs at 23 % space
  pressure without GC and each generation is ~94 extents (9 shards cut at zone boundaries):
  ~9.4 million extents per policy.

``zenfs`` decides in O(zones) on purpose (its scans walk every zone, as upstream ZenFS does), so at
4,096 zones it places a few thousand extents per second; it runs on a prefix of the trace
(``--zenfs-steps``, default 1,000 generations) and its rate is reported for that prefix.

Rates are extents (``place`` calls = extents written) per second of wall time and of process CPU
time, measured side by side in one run.  ``--profile POLICY`` adds a cProfile summary of one
(shorter) replay.

Usage: python bench/bench_replay.py [--steps N] [--zones N] [--policies a,b,c] [--zenfs-steps N]
       [--trace-dir DIR] [--json PATH] [--profile POLICY] [--quick]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

from retainz.trace.generate import write_generated
from retainz.trace.replay import DEFAULT_GEOMETRY, ReplayConfig, replay

LAYOUT = "llama3-8b-fsdp:ranks=8"
RETENTION = "torchtitan:interval=1,keep_latest_k=10"
TARGET = 200_000


def trace(path_dir: str, steps: int) -> str:
    """The benchmark trace for ``steps`` steps (generated once, then reused)."""
    os.makedirs(path_dir, exist_ok=True)
    path = os.path.join(path_dir, f"replay-llama3-8b-k10-{steps}.jsonl")
    if not os.path.exists(path):
        tmp = path + ".part"
        write_generated(tmp, LAYOUT, RETENTION, steps)
        os.replace(tmp, path)
    return path


def run(path: str, policy: str, zones: int) -> dict:
    t, c = time.perf_counter(), time.process_time()
    r = replay(path, ReplayConfig(policy=policy, zones=zones))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    n = r["decisions"]
    return {"policy": policy, "generations": r["generations_committed"], "extents": n,
            "wall_seconds": wall, "cpu_seconds": cpu, "extents_per_s": n / wall,
            "extents_per_cpu_s": n / cpu, "decision_share": r["decision_cpu_seconds"] / wall,
            "capacity_stop_step": r["capacity_stop_step"], "gc_bytes": r["gc_bytes"], "waf": r["waf"],
            "trace_steps": r["trace"]["steps"]}


def profile(path: str, policy: str, zones: int, top: int = 25) -> str:
    prof = cProfile.Profile()
    prof.enable()
    replay(path, ReplayConfig(policy=policy, zones=zones))
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000, help="trace steps = generations (default 100,000)")
    ap.add_argument("--zones", type=int, default=4096, help="data zones (default 4,096)")
    ap.add_argument("--policies", default="greedy,retainz,zenfs")
    ap.add_argument("--zenfs-steps", type=int, default=1000,
                    help="generations zenfs replays (O(zones) decisions; default 1,000)")
    ap.add_argument("--trace-dir", default="out/bench/traces")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--profile", default=None, metavar="POLICY",
                    help="print a cProfile summary of POLICY on a 2,000-generation trace")
    ap.add_argument("--quick", action="store_true", help="5,000 generations, zenfs 200 (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.zenfs_steps = 5000, 200
    full = trace(args.trace_dir, args.steps)
    g = DEFAULT_GEOMETRY
    print(f"trace {LAYOUT}, {RETENTION}, {args.steps:,} steps; {args.zones:,} data zones of "
          f"{g['zone_capacity'] >> 20} MiB capacity ({g['zone_size'] >> 30} GiB zones, {g['max_active']} active); "
          f"MemoryDevice(payload=False), one process")
    results = []
    for policy in filter(None, (p.strip() for p in args.policies.split(","))):
        steps = min(args.zenfs_steps, args.steps) if policy.split(":")[0] == "zenfs" else args.steps
        path = full if steps == args.steps else trace(args.trace_dir, steps)
        r = run(path, policy, args.zones)
        results.append(r)
        print(f"{policy:10s} {r['extents']:>10,} extents ({r['generations']:,} generations) in "
              f"{r['wall_seconds']:7.1f} s: {r['extents_per_s']:>9,.0f} extents/s wall, "
              f"{r['extents_per_cpu_s']:>9,.0f} per CPU-s (placement {100 * r['decision_share']:.0f} % of wall time)"
              + ("" if steps == args.steps else f"  [first {steps:,} generations]"))
    print(f"target {TARGET:,} extents/s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.profile:
        print(profile(trace(args.trace_dir, 2000), args.profile, args.zones))
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"layout": LAYOUT, "retention": RETENTION, "zones": args.zones, "geometry": g,
                       "target_extents_per_s": TARGET, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
