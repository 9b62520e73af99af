"""``retainz replay TRACE --policy NAME (--zones N | --pressure P | --occupancy O) ... [--json]``.

Each option is a field of :class:`~retainz.trace.replay.ReplayConfig` under the same name (``--zone-size``
is ``zone_size``); :meth:`ReplayConfig.cli_args` writes them back.  A bad value is one line and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses

from retainz.cli import (
    check_blocks,
    count_arg,
    fraction_arg,
    int_arg,
    positive_size_arg,
    print_json,
    size_arg,
)
from retainz.trace.replay import FLEET_RATE, ReplayConfig

_SHOW = ("waf", "host_bytes", "gc_bytes", "resets", "finishes", "dead_space_byte_steps",
         "unused_capacity_bytes", "unused_capacity_byte_steps", "peak_occupancy", "capacity_stop_step",
         "generations_committed", "decisions", "decision_cpu_seconds")
#: Shown in text when the device was sized by occupancy.
_SHOW_OCCUPANCY = ("mean_live_bytes", "effective_occupancy")
#: An FDP device's statistics shown in text (``--json`` has them all under ``fdp``): the device WAF
#: (media bytes written / host bytes written, FDP statistics log page 0x22) and its two terms.
_SHOW_FDP = ("device_waf", "host_bytes_written", "media_bytes_written")


#: The configuration's defaults are the options' defaults.
_DEFAULT = {f.name: f.default for f in dataclasses.fields(ReplayConfig)}


def register(sub) -> None:
    d = _DEFAULT
    p = sub.add_parser("replay", help="replay a trace through the store and print its metrics")
    p.add_argument("trace", help="a trace v1 file (retainz trace generate)")
    p.add_argument("--policy", default=d["policy"], help="placement policy NAME[:param=value,...]")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--zones", type=int_arg(2, too_low="{v} is under 2 (a store needs 2 data zones besides the "
                                              "GC reserve)"), help="usable data zones")
    size.add_argument("--pressure", type=fraction_arg, help="peak live bytes / usable capacity, e.g. 0.9")
    size.add_argument("--occupancy", type=fraction_arg,
                      help="time-averaged live bytes / usable capacity, e.g. 0.5 (sizes the device from the "
                           "trace's mean live bytes, not its peak)")
    p.add_argument("--reserve-zones", type=count_arg, default=d["reserve_zones"],
                   help=f"GC reserve zones added on top (default {d['reserve_zones']})")
    p.add_argument("--meta-zones", type=count_arg, default=d["meta_zones"],
                   help=f"journal zones added on top (default {d['meta_zones']})")
    p.add_argument("--zone-size", type=size_arg, default=d["zone_size"])
    p.add_argument("--zone-capacity", type=size_arg, default=d["zone_capacity"],
                   help="writable bytes per zone (default: 1077MiB with the default 2GiB zones, else the "
                        "zone size)")
    p.add_argument("--max-active", type=count_arg, default=d["max_active"])
    p.add_argument("--max-open", type=count_arg, default=d["max_open"])
    p.add_argument("--block-size", type=int, default=d["block_size"], choices=(512, 4096))
    p.add_argument("--device", default=d["device"],
                   help="memory (payload-less, default), memory-payload, file:PATH (new file device with "
                        "pattern payload, verified), fdp[:KEY=VALUE,...] (payload-less FDP namespace on the FTL "
                        "model; keys ru_size, spare, ruh, unit), or /dev/NAME")
    p.add_argument("--seed", type=int, default=d["seed"])
    p.add_argument("--zone-map", action="store_true", help="include the zone-state timeline")
    p.add_argument("--verify-summaries", action="store_true",
                   help="recompute zone summaries before every decision (slow; checks the cache)")
    p.add_argument("--no-verify-payload", dest="verify_payload", action="store_false",
                   help="on a payload device, do not read the committed generations back at the end")
    p.add_argument("--promote-bandwidth", type=positive_size_arg, default=d["promote_bandwidth"], metavar="BYTES",
                   help="model promotion to a durable tier at BYTES per step (e.g. 4MiB), every generation "
                        "kept until durable: deletions wait for their promotion (default: no promotion)")
    p.add_argument("--no-promote-hint", dest="promote_hint", action="store_false",
                   help="with --promote-bandwidth, give the policies the rule's hints alone (not the expected "
                        "promotion finish): the ablation")
    p.add_argument("--write-bandwidth", type=_rate_arg, default=d["write_bandwidth"], metavar="RATE",
                   help="replay with time: one job's save is written at RATE bytes per step (e.g. 64MiB), its "
                        "shards in units interleaved with every other save in flight; 'fleet': each job at the "
                        "rate a format-2 fleet trace records for it (default: serialized)")
    p.add_argument("--write-unit", type=positive_size_arg, default=None, metavar="SIZE",
                   help="with --write-bandwidth, bytes per write of a shard, a multiple of the block size "
                        "(default 1MiB)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_replay)


def _rate_arg(text: str) -> int | str:
    """argparse type of ``--write-bandwidth``: a positive size, or ``fleet`` (each job's own rate from a
    format-2 fleet trace's header, :data:`~retainz.trace.replay.FLEET_RATE`)."""
    return FLEET_RATE if text.strip().lower() == FLEET_RATE else positive_size_arg(text)


def config_from_args(args: argparse.Namespace) -> ReplayConfig:
    """The :class:`ReplayConfig` of parsed ``retainz replay`` options (each option is the field of
    the same name).

    Raises:
        ValueError: a bad value (one line naming its flag); ``--write-unit`` without
            ``--write-bandwidth`` (a serialized replay writes every shard whole).
    """
    if args.write_unit is None:
        args.write_unit = _DEFAULT["write_unit"]
    elif args.write_bandwidth is None:
        raise ValueError("--write-unit needs --write-bandwidth: a serialized replay writes every shard whole")
    check_blocks("--write-unit", args.write_unit, args.block_size)
    return ReplayConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ReplayConfig)})


def _replay(args: argparse.Namespace) -> int:
    from retainz.trace.replay import replay

    result = replay(args.trace, config_from_args(args))
    if args.json:
        print_json(result, sort_keys=True)
    else:
        rows = {k: result[k] for k in _SHOW + (("overlapped_bytes",) if "overlapped_bytes" in result else ())
                + (_SHOW_OCCUPANCY if "effective_occupancy" in result else ())}
        if "fdp" in result:      # an FDP namespace: the drive's own WAF beside the store's
            rows.update((f"fdp_{k}", result["fdp"][k]) for k in _SHOW_FDP)
        for k, v in rows.items():
            if v is None:
                v = "-" if k != "capacity_stop_step" else "none (the trace ran to its end)"
            print(f"{k:28s} {v:.4f}" if isinstance(v, float) else f"{k:28s} {v}")
    return 0
