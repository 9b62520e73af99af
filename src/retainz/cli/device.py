"""``retainz device create|info`` and ``retainz zones report|reset|finish|open|close``.

The zone report prints libzbd's ``zbd report`` line format, so output can be diffed against
``zbd report`` on a real device::

    Zone 00003: swr, ofst 00000000196608, len 00000000065536, cap 00000000049152, wp 00000000197120, oi, non_seq 0, reset 0
"""

from __future__ import annotations

import argparse

from retainz.cli import check_blocks, count_arg, geometry_lines, int_arg, plural, print_json, size_arg
from retainz.zoned import FileDevice, Geometry, ZoneCond, ZoneOp, format_size, open_device, parse_device

#: Open and active zone limit of a created device unless given (a ZN540's 14).
DEFAULT_ZONE_LIMIT = 14


def register(sub) -> None:
    dev = sub.add_parser("device", help="create or describe a zoned device")
    dsub = dev.add_subparsers(dest="device_command", metavar="ACTION", required=True)
    create = dsub.add_parser("create", help="create a file-backed zoned device (sparse file)")
    create.add_argument("path")
    create.add_argument("--zones", type=int_arg(1, too_low="{v} is under 1 (a device has at least one zone)"), required=True,
                        help="number of zones")
    create.add_argument("--zone-size", type=size_arg, required=True,
                        help="zone size, e.g. 64MiB (= 64M; 64MB is 64,000,000 B), a multiple of the block size")
    create.add_argument("--zone-capacity", type=size_arg,
                        help="writable bytes per zone, a multiple of the block size (default, or 0: the zone size)")
    create.add_argument("--block-size", type=int, default=4096, choices=(512, 4096))
    create.add_argument("--max-open", type=count_arg, help="max open zones (default: 14, or every zone when the device "
                        "has fewer; 0 = unlimited)")
    create.add_argument("--max-active", type=count_arg, help="max active zones (default: 14, or every zone when the "
                        "device has fewer; 0 = unlimited)")
    create.add_argument("--force", action="store_true", help="overwrite an existing file")
    create.set_defaults(func=_create)
    info = dsub.add_parser("info", help="print a device's geometry")
    info.add_argument("device")
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=_info)

    zones = sub.add_parser("zones", help="report or manage zones (like blkzone / zbd)")
    zsub = zones.add_subparsers(dest="zones_command", metavar="ACTION", required=True)
    report = zsub.add_parser("report", help="report zones")
    report.add_argument("device")
    report.add_argument("--json", action="store_true")
    report.add_argument("--csv", action="store_true", help="zbd report -csv format")
    report.add_argument("--start", type=count_arg, default=0, help="first zone")
    report.add_argument("--count", type=count_arg, default=0, help="number of zones (0 = to the end)")
    report.add_argument("-ro", "--cond", choices=[c.short for c in ZoneCond],
                        help="only zones in this condition (zbd's short codes)")
    report.set_defaults(func=_report)
    for op in ZoneOp:
        p = zsub.add_parser(op.value, help=f"{op.value} one zone")
        p.add_argument("device")
        p.add_argument("zone", type=count_arg)
        p.add_argument("--force", action="store_true",
                       help="operate on a device that holds a RetainZ store, or reset a zone holding data "
                            "(may destroy it)")
        p.set_defaults(func=_zone_op, op=op)


def _what_force_overwrites(path: str) -> str:
    """The refusal of ``device create`` over an existing file: what ``--force`` would destroy (a
    store's committed generations, counted by a read-only open that writes nothing)."""
    from retainz.errors import ForeignDeviceError
    from retainz.store import Store

    plain = f"{path} exists and is not empty; `retainz device create --force` overwrites it"
    try:
        dev = open_device(path, readonly=True)
    except Exception:
        return plain
    try:
        try:
            with Store.open(dev, readonly=True) as store:
                n = len(store.generations())
        except ForeignDeviceError:        # a device file with no store on it
            return plain
        except Exception:          # a store that does not open read-only: damaged, busy, an older format
            return (f"{path} holds a RetainZ store (it does not open: see `retainz fsck {path}`); `retainz device "
                    "create --force` overwrites it and every generation on it")
        return (f"{path} holds a RetainZ store with {plural(n, 'committed generation')}; `retainz device create "
                "--force` overwrites it and every generation on it")
    finally:
        dev.close()


def _create(args: argparse.Namespace) -> int:
    from retainz.zoned.model import MAX_ZONES

    # the flags' own words first: Geometry names its fields ("zone count", and a zone capacity of 0
    # the user never gave when --zone-size is 0, since the capacity defaults to it)
    if args.zones > MAX_ZONES:
        raise ValueError(f"--zones {args.zones:,}: zone count {args.zones:,} exceeds the limit of {MAX_ZONES:,} zones")
    if args.zone_size == 0:
        raise ValueError(f"--zone-size 0: a zone holds at least one block ({args.block_size} B)")
    check_blocks("--zone-size", args.zone_size, args.block_size)
    check_blocks("--zone-capacity", args.zone_capacity, args.block_size)
    # a ZN540-like default limit of 14, but never more than the device has zones (a 4-zone device that
    # reported 14 open zones read as a bug)
    default_limit = min(DEFAULT_ZONE_LIMIT, max(args.zones, 0))
    geometry = Geometry(nr_zones=args.zones, zone_size=args.zone_size,
                        zone_capacity=args.zone_capacity or args.zone_size, block_size=args.block_size,
                        max_open=default_limit if args.max_open is None else args.max_open,
                        max_active=default_limit if args.max_active is None else args.max_active)
    spec = parse_device(args.path)     # the spec every other command reads: file:PATH is PATH
    if spec.kind != "file":
        raise ValueError(f"{args.path} names a {spec.kind} device, not a device file: `retainz device create` "
                         "makes device files only")
    try:
        dev = FileDevice.create(spec.path, geometry, force=args.force)
    except FileExistsError:         # the API's remedy is force=True: give the flag
        raise FileExistsError(_what_force_overwrites(args.path)) from None
    with dev:
        print(f"created {args.path}: {geometry.nr_zones} zones of {format_size(geometry.zone_size)} "
              f"(capacity {format_size(geometry.zone_capacity)}), uuid {dev.uuid}")
        for line in geometry_lines(geometry):
            print(line)
    return 0


def _info(args: argparse.Namespace) -> int:
    with open_device(args.device, readonly=True) as dev:
        info = dev.info.to_dict()
        zones = dev.report_zones()
    info["zones_by_condition"] = {c.long: sum(z.cond == c for z in zones) for c in ZoneCond
                                  if any(z.cond == c for z in zones)}
    if args.json:
        print_json(info, indent=2)
        return 0
    lim = lambda n: "no limit" if n == 0 else str(n)  # noqa: E731
    print(f"Device: {info['path'] or info['kind']} ({info['kind']})")
    print(f"    Zone model: {info['model']}")
    print(f"    Capacity: {format_size(info['capacity'])} writable, {format_size(info['size'])} LBA space")
    print(f"    Logical block size: {info['block_size']} B")
    print(f"    Number of zones: {info['nr_zones']}")
    print(f"    Zone size: {format_size(info['zone_size'])}, capacity {format_size(info['zone_capacity'])}")
    print(f"    Maximum number of open zones: {lim(info['max_open'])}")
    print(f"    Maximum number of active zones: {lim(info['max_active'])}")
    print("    Zones: " + ", ".join(f"{n} {c}" for c, n in info["zones_by_condition"].items()))
    return 0


def _report(args: argparse.Namespace) -> int:
    with open_device(args.device, readonly=True) as dev:
        n = dev.geometry.nr_zones
        if args.start >= n:                                  # bad input (exit 2), not a device failure
            raise ValueError(f"zone {args.start} does not exist: the device has zones 0..{n - 1}")
        if args.start + args.count > n:
            raise ValueError(f"zones {args.start}..{args.start + args.count - 1} run past the last zone {n - 1}")
        zones = dev.report_zones(args.start, args.count)
    if args.cond:
        zones = [z for z in zones if z.cond == ZoneCond.from_short(args.cond)]
    if args.json:
        print_json([z.to_dict() for z in zones], indent=2)
    elif args.csv:
        print("zone num, type, ofst, len, cap, wp, cond, non_seq, reset")
        for z in zones:
            print(f"{z.index:05d}, {int(z.type)}, {z.start:014d}, {z.size:014d}, {z.capacity:014d}, "
                  f"{z.wp:014d}, 0x{int(z.cond):01x}, 0, 0")
    else:
        for z in zones:
            print(f"Zone {z.index:05d}: {z.type.short}, ofst {z.start:014d}, len {z.size:014d}, "
                  f"cap {z.capacity:014d}, wp {z.wp:014d}, {z.cond.short}, non_seq 0, reset 0")
    return 0


def _zone_op(args: argparse.Namespace) -> int:
    with open_device(args.device) as dev:
        if not 0 <= args.zone < dev.geometry.nr_zones:
            raise ValueError(f"zone {args.zone} does not exist: the device has zones "
                             f"0..{dev.geometry.nr_zones - 1}")
        if not args.force:
            from retainz.errors import ForeignDeviceError
            from retainz.store.store import superblock_zones

            if superblock_zones(dev):   # like mkfs: never destroy a store without --force
                raise ForeignDeviceError(
                    f"{args.device} holds a RetainZ store: a zone {args.op.value} would corrupt it; use "
                    "`retainz rm` / `retainz gc` to free space (`retainz mkfs --force` to erase the "
                    "store), or pass --force")
            z = dev.zone(args.zone)
            if args.op is ZoneOp.RESET and z.written:   # nor data it does not recognise
                raise ForeignDeviceError(
                    f"{args.device}: zone {args.zone} ({z.cond.long}, {z.written:,} bytes written) is on a device holding "
                    "no RetainZ store: a reset discards data RetainZ does not recognise; pass --force")
        dev.zone_op(args.op, args.zone)
        z = dev.zone(args.zone)
    print(f"zone {z.index}: {z.cond.long}, wp {z.wp}")
    return 0
