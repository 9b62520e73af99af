"""``retainz replay TRACE --policy NAME (--zones N | --pressure P) ... [--json]``."""

from __future__ import annotations

import argparse

from retainz.cli import print_json, size_arg
from retainz.trace.replay import DEFAULT_GEOMETRY

_SHOW = ("waf", "host_bytes", "gc_bytes", "resets", "finishes", "dead_space_byte_steps",
         "unused_capacity_bytes", "unused_capacity_byte_steps", "peak_occupancy", "capacity_stop_step",
         "generations_committed", "decisions", "decision_cpu_seconds")


def register(sub) -> None:
    p = sub.add_parser("replay", help="replay a trace through the store and print its metrics")
    p.add_argument("trace", help="a trace v1 file (retainz trace generate)")
    p.add_argument("--policy", default="retainz", help="placement policy NAME[:param=value,...]")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--zones", type=int, help="usable data zones")
    size.add_argument("--pressure", type=float, help="peak live bytes / usable capacity, e.g. 0.9")
    p.add_argument("--reserve-zones", type=int, default=2, help="GC reserve zones added on top (default 2)")
    p.add_argument("--meta-zones", type=int, default=3, help="journal zones added on top (default 3)")
    p.add_argument("--zone-size", type=size_arg, default=DEFAULT_GEOMETRY["zone_size"])
    p.add_argument("--zone-capacity", type=size_arg, default=None,
                   help="writable bytes per zone (default: 1077MiB with the default 2GiB zones, else the "
                        "zone size)")
    p.add_argument("--max-active", type=int, default=DEFAULT_GEOMETRY["max_active"])
    p.add_argument("--max-open", type=int, default=DEFAULT_GEOMETRY["max_open"])
    p.add_argument("--block-size", type=int, default=4096, choices=(512, 4096))
    p.add_argument("--device", default="memory",
                   help="memory (payload-less, default), memory-payload, file:PATH (new file device with "
                        "pattern payload, verified), or /dev/NAME")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--zone-map", action="store_true", help="include the zone-state timeline")
    p.add_argument("--verify-summaries", action="store_true",
                   help="recompute zone summaries before every decision (slow; checks the cache)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    from retainz.trace.replay import replay

    result = replay(args.trace, policy=args.policy, zones=args.zones, pressure=args.pressure,
                    reserve_zones=args.reserve_zones, meta_zones=args.meta_zones, zone_size=args.zone_size,
                    zone_capacity=args.zone_capacity, max_active=args.max_active, max_open=args.max_open,
                    block_size=args.block_size, device=args.device, seed=args.seed, zone_map=args.zone_map,
                    verify_summaries=args.verify_summaries)
    if args.json:
        print_json(result, sort_keys=True)
    else:
        for k in _SHOW:
            v = result[k]
            print(f"{k:28s} {v:.4f}" if isinstance(v, float) else f"{k:28s} {v}")
    return 0
