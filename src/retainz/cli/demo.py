"""``retainz demo``: the main job on the embedded default (a file-backed zoned device).

For now it creates a file device, writes a few checkpoint-sized streams into zones with write-pointer
discipline, finishes and resets zones, and prints the zone report.  The experiment runner replaces it
as the main job once it exists.
"""

from __future__ import annotations

import argparse
import os

from retainz.errors import RetainZError
from retainz.store.store import superblock_zones
from retainz.zoned import FileDevice, Geometry, ZoneCond, format_size

#: The demo's device: 16 zones of 4 MiB, 3 MiB writable, ZN540-like open/active limits scaled down.
GEOMETRY = Geometry(nr_zones=16, zone_size=4 << 20, zone_capacity=3 << 20, max_open=4, max_active=6)
#: What the demo writes, 1 MiB at a time from each zone's start (so every zone it wrote begins with it).
CHUNK = bytes(range(256)) * 4096


def register(sub) -> None:
    p = sub.add_parser("demo", help="a short tour of the file-backed zoned device (the main job is `make main`)")
    p.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    p.add_argument("--force", action="store_true",
                   help="overwrite OUT/zns.img even if it holds a store, data the demo did not write, or is not a "
                        "RetainZ device file")
    p.set_defaults(func=_demo)


def _check_target(path: str) -> None:
    """The demo rewrites its device file: refuse one that is not a RetainZ device file, that holds a
    store, or whose zones hold data the demo did not write (a previous demo's device: :data:`GEOMETRY`,
    and every written zone starts with :data:`CHUNK`).

    Raises:
        FileExistsError: ``path`` holds something else (nothing is changed).
    """
    if not os.path.lexists(path) or (os.path.isfile(path) and os.path.getsize(path) == 0):
        return
    try:
        with FileDevice(path, readonly=True) as dev:
            store = superblock_zones(dev)
            used = [z for z in dev.report_zones() if z.written]
            bs = dev.geometry.block_size          # every written zone holds at least one block
            ours = dev.geometry == GEOMETRY and all(dev.read(z.start, bs) == CHUNK[:bs] for z in used)
    except (RetainZError, OSError):
        raise FileExistsError(f"{path} exists and is not a RetainZ device file; pass --force to overwrite it, "
                              "or use another --out") from None
    if store:
        raise FileExistsError(f"{path} holds a RetainZ store; pass --force to overwrite it, or use another --out")
    if used and not ours:
        raise FileExistsError(f"{path} holds data RetainZ does not recognise ({len(used)} non-empty zones, first "
                              f"{used[0].index}); pass --force to overwrite it, or use another --out")


def _demo(args: argparse.Namespace) -> int:
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise NotADirectoryError(f"{args.out}: not a directory (--out names the demo's output folder)")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "zns.img")
    if not args.force:
        _check_target(path)
    geometry = GEOMETRY
    dev = FileDevice.create(path, geometry, force=True)
    chunk = CHUNK
    # three "generations", each 5 MiB, written sequentially zone after zone
    zone = 0
    for gen in range(3):
        left = 5 << 20
        while left:
            z = dev.zone(zone)
            if z.remaining == 0:
                zone += 1
                continue
            n = min(left, z.remaining, len(chunk))
            dev.write(z.wp, chunk[:n])
            left -= n
        print(f"generation {gen}: 5 MiB written, now in zone {zone}")
    dev.flush()
    dev.finish_zone(zone)
    dev.reset_zone(0)
    dev.close()
    with FileDevice(path, readonly=True) as dev:
        for z in dev.report_zones():
            if z.cond != ZoneCond.EMPTY or z.index < 2:
                print(f"Zone {z.index:05d}: {z.type.short}, ofst {z.start:014d}, len {z.size:014d}, "
                      f"cap {z.capacity:014d}, wp {z.wp:014d}, {z.cond.short}")
        used = sum(z.written for z in dev.report_zones())
    print(f"device {path}: {format_size(used)} still written across {geometry.nr_zones} zones "
          "(zone 0 was reset, the last zone finished)")
    return 0
