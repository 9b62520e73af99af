"""``fsck`` (verify every checksum, cross-check catalog, summaries and device), ``df``, and the
recomputation of the zone table the cached summaries must always equal."""

from __future__ import annotations

from collections.abc import Iterable

import crc32c

from retainz.errors import ZonedDeviceError
from retainz.placement.base import ZoneSummary, ZoneTable
from retainz.store.catalog import Catalog
from retainz.store.types import FsckReport, SpaceReport
from retainz.store.zonebook import ZoneBook
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import ZoneCond, round_up

__all__ = ["fsck", "space", "recompute_table"]


def fsck(device: ZonedDevice, catalog: Catalog, zones: ZoneBook, fresh: ZoneTable,
         repairs: list[str]) -> FsckReport:
    """Check the whole store; never raises for what it finds (it lists it).

    Checks: every extent lies in a data zone below the zone's written bytes and below the
    device's write pointer; no two extents overlap; every extent with a checksum reads back with
    it and every shard's bytes match the shard crc32c; shard sizes equal their extents' lengths;
    the cached zone summaries equal a recomputation; every data zone's condition and written
    bytes agree with the device report.  On a read-only store, ``repairs`` lists what a
    read-write open would repair (``RecoveryReport.repairs``).  Nothing is written.

    Args:
        fresh: :func:`recompute_table` of the store (the cached summaries must equal it).
    """
    rep = FsckReport(repairs=list(repairs), notes=list(device.notes))
    bs, zsize = zones.block_size, zones.zone_size
    reported = {z.index: z for z in device.report_zones()}
    spans: dict[int, list] = {}
    for gen in catalog.ordered():
        rep.generations += 1
        for shard in gen.shards.values():
            rep.shards += 1
            where = f"generation {gen.id!r} shard {shard.name!r}"
            if sum(e[2] for e in shard.extents) != shard.size:
                rep.problems.append(f"{where}: extents hold {sum(e[2] for e in shard.extents)} "
                                    f"bytes, the shard {shard.size}")
            crc = 0
            verifiable = shard.crc is not None
            for z, off, length, ecrc in shard.extents:
                rep.extents += 1
                n = round_up(length, bs)
                s = zones.table.zones.get(z)
                if s is None:
                    rep.problems.append(f"{where}: extent in zone {z}, not a data zone")
                    continue
                spans.setdefault(z, []).append((off, off + n, where))
                dz = reported[z]
                dev_written = dz.capacity if dz.cond == ZoneCond.FULL else dz.wp - dz.start
                if off + n > s.written or off + n > dev_written:
                    rep.problems.append(f"{where}: extent zone {z} offset {off} +{n} runs past the "
                                        f"zone's written bytes ({s.written}; device {dev_written})")
                    continue
                if ecrc is None:
                    rep.unverifiable_bytes += length
                    verifiable = False
                    continue
                try:
                    data = device.read(z * zsize + off, n)[:length]
                except ZonedDeviceError as e:
                    rep.problems.append(f"{where}: extent zone {z} offset {off}: read failed: {e}")
                    verifiable = False
                    continue
                actual = crc32c.crc32c(data)
                if actual != ecrc:
                    rep.problems.append(f"{where}: extent zone {z} offset {off} ({length} bytes): "
                                        f"crc32c {actual:#010x}, expected {ecrc:#010x}")
                else:
                    rep.bytes_verified += length
                crc = crc32c.crc32c(data, crc)
            if verifiable and crc != shard.crc:
                rep.problems.append(f"{where}: whole-shard crc32c mismatch")
    for z, sp in spans.items():
        sp.sort()
        for (_a0, a1, w0), (b0, _, w1) in zip(sp, sp[1:], strict=False):
            if b0 < a1:
                rep.problems.append(f"zone {z}: extents overlap at offset {b0} ({w0}; {w1})")
    for z, s in zones.table.zones.items():
        if fresh.zones[z].key() != s.key():
            rep.problems.append(f"zone {z}: cached summary {s.key()} differs from a recomputation "
                                f"{fresh.zones[z].key()}")
        dz = reported[z]
        if s.cond == ZoneCond.EMPTY:
            if dz.cond != ZoneCond.EMPTY:
                rep.problems.append(f"zone {z}: empty in the store, {dz.cond.long} on the device")
        elif s.cond == ZoneCond.FULL:
            if dz.cond != ZoneCond.FULL:
                rep.problems.append(f"zone {z}: full in the store, {dz.cond.long} on the device")
        elif dz.cond in (ZoneCond.EMPTY, ZoneCond.FULL) or dz.wp - dz.start != s.written:
            rep.problems.append(f"zone {z}: store has {s.written} bytes written, the device "
                                f"{dz.cond.long} with write pointer at {dz.wp - dz.start}")
    return rep


def space(zones: ZoneBook, generations: int, *, admissible: int, gc_reserve: int) -> SpaceReport:
    """Space report, like ``zenfs df`` (see :class:`SpaceReport`); ``admissible`` and ``gc_reserve``
    in bytes, as the store's admission computes them."""
    t = zones.table
    used = t.live
    reclaimable = t.dead + t.unused
    n_full = sum(1 for s in t if s.cond == ZoneCond.FULL)
    return SpaceReport(capacity=zones.data_capacity, free=zones.free(), used=used, reclaimable=reclaimable,
                       space_amplification=(100.0 * reclaimable / used) if used else 0.0,
                       data_zones=len(t), meta_zones=zones.meta_zones, empty_zones=t.n_empty,
                       open_zones=len(t.open), full_zones=n_full, generations=generations,
                       admissible=admissible, gc_reserve=gc_reserve)


def recompute_table(zones: ZoneBook, extent_lists: Iterable) -> ZoneTable:
    """A zone table rebuilt from scratch: live bytes from ``extent_lists`` (the catalog's committed
    extents, the open writers' extents, GC copies before their move record: everything live);
    written bytes, finish state, reclaim step, lifetime and opening step as journaled (the zone
    attributes); dead = written - live; open/empty sets and totals recomputed.
    ``zones.table.key() == recompute_table(...).key()`` must always hold."""
    bs = zones.block_size
    live: dict[int, int] = {}
    for extents in extent_lists:
        for e in extents:
            live[e[0]] = live.get(e[0], 0) + round_up(e[2], bs)
    t = zones.new_table()
    t.now = zones.now
    out = []
    for z, s in zones.table.zones.items():
        lv = live.get(z, 0)
        out.append(ZoneSummary(index=z, capacity=s.capacity, cond=s.cond, written=s.written, live=lv,
                               dead=s.written - lv, reclaim_step=s.reclaim_step, lifetime=s.lifetime,
                               opened_step=s.opened_step, open_seq=s.open_seq,
                               last_write_step=s.last_write_step))
    t.restore(out)
    return t
