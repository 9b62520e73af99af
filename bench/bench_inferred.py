"""``retainz-inferred`` vs exact hints vs no hints: what ``retainz mount --retention auto`` costs.

The recorded workloads of the quick matrix (SmolLM2-135M DCP layout, 50,000 steps, ZN540 geometry,
4 reserve zones: TorchTitan ``keep_latest_k=10`` every 500 and Megatron ``save_interval=1000``,
``retain_interval=5000``) plus an HF Trainer ``save_total_limit=2`` run and a Lightning top-k by a
metric (irregular deletions), each replayed through the store with the three hint sources:

* ``retainz``: the runtime's own rule (exact hints);
* ``retainz-inferred``: the rule inferred online from the saves and deletions seen so far
  (:mod:`retainz.retention.inference`), no hint until it is confident;
* ``retainz-nohint``: no hints.

Usage: ``python -m bench.bench_inferred [--pressure 0.9 0.98] [--json out.json]``; prints one row per
(workload, pressure) with WAF, capacity stop step and dead-space byte-steps of each.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from retainz.trace.generate import write_generated
from retainz.trace.replay import ReplayConfig, replay

WORKLOADS = {
    "torchtitan": "torchtitan:interval=500,keep_latest_k=10",
    "megatron": "megatron:save_interval=1000,retain_interval=5000",
    "hf": "hf:save_steps=500,save_total_limit=2",
    "lightning-topk": "lightning:every_n_train_steps=500,save_top_k=3,metric=synthetic",
}
POLICIES = ("retainz", "retainz-inferred", "retainz-nohint")
LAYOUT = "smollm2-135m-dcp"
STEPS = 50_000


def run(pressures: list[float]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, rule in WORKLOADS.items():
            trace = os.path.join(tmp, f"{name}.trace")
            write_generated(trace, LAYOUT, rule, STEPS)
            for pressure in pressures:
                row = {"workload": name, "rule": rule, "pressure": pressure}
                for policy in POLICIES:
                    r = replay(trace, ReplayConfig(policy=policy, pressure=pressure, reserve_zones=4))
                    row[policy] = {"waf": round(r["waf"], 4), "capacity_stop_step": r["capacity_stop_step"],
                                   "dead_space_byte_steps": r["dead_space_byte_steps"],
                                   "gc_bytes": r["gc_bytes"]}
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _line(row: dict) -> str:
    cells = []
    for p in POLICIES:
        m = row[p]
        stop = m["capacity_stop_step"]
        cells.append(f"{p} WAF {m['waf']:.3f} stop {stop if stop is not None else '-':>6} "
                     f"dead {m['dead_space_byte_steps']:.3g}")
    return f"{row['workload']:<15} p={row['pressure']:<5} " + " | ".join(cells)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pressure", type=float, nargs="+", default=[0.9, 0.98])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    rows = run(args.pressure)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
