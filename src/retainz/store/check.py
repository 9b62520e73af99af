"""``fsck`` (verify every checksum, cross-check catalog, summaries and device) and ``df``."""

from __future__ import annotations

import crc32c

from retainz.errors import SummaryMismatchError, ZonedDeviceError
from retainz.placement.base import ZoneSummary, ZoneTable
from retainz.store.format import round_up
from retainz.store.types import FsckReport, SpaceReport
from retainz.zoned.model import ZoneCond

__all__ = ["CheckMixin"]


class CheckMixin:
    """fsck/df and the cached-summary check (recompute_table) of :class:`~retainz.store.store.Store`."""

    def fsck(self) -> FsckReport:
        """Check the whole store; never raises for what it finds (it lists it).

        Checks: every extent lies in a data zone below the zone's written bytes and below the
        device's write pointer; no two extents overlap; every extent with a checksum reads back with
        it and every shard's bytes match the shard crc32c; shard sizes equal their extents' lengths;
        the cached zone summaries equal a recomputation; every data zone's condition and written
        bytes agree with the device report.  On a read-only store, ``repairs`` lists what a
        read-write open would repair (``RecoveryReport.repairs``).  Nothing is written.
        """
        with self._lock:
            self._check_open()
            rep = FsckReport(repairs=list(self.recovery.repairs))
            bs, zsize = self._bs, self._zsize
            zones = {z.index: z for z in self.device.report_zones()}
            spans: dict[int, list] = {}
            for gen in self.catalog.ordered():
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
                        s = self.table.zones.get(z)
                        if s is None:
                            rep.problems.append(f"{where}: extent in zone {z}, not a data zone")
                            continue
                        spans.setdefault(z, []).append((off, off + n, where))
                        dz = zones[z]
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
                            data = self.device.read(z * zsize + off, n)[:length]
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
            fresh = self.recompute_table()
            for z, s in self.table.zones.items():
                if fresh.zones[z].key() != s.key():
                    rep.problems.append(f"zone {z}: cached summary {s.key()} differs from a recomputation "
                                        f"{fresh.zones[z].key()}")
                dz = zones[z]
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

    def df(self):
        """Space report, like ``zenfs df`` (see :class:`SpaceReport`)."""
        with self._lock:
            t = self.table
            used = t.live
            reclaimable = t.dead + t.unused
            n_full = sum(1 for s in t if s.cond == ZoneCond.FULL)
            return SpaceReport(capacity=self._data_capacity, free=self._free(), used=used,
                               reclaimable=reclaimable,
                               space_amplification=(100.0 * reclaimable / used) if used else 0.0,
                               data_zones=len(t), meta_zones=self.meta_zones, empty_zones=t.n_empty,
                               open_zones=len(t.open), full_zones=n_full,
                               generations=len(self.catalog.gens))

    # -- summaries ---------------------------------------------------------------------------------
    def recompute_table(self) -> ZoneTable:
        """A zone table rebuilt from scratch: live bytes from the catalog's committed extents and the
        open writers' extents; written bytes, finish state, reclaim step, lifetime and opening step
        as journaled (the zone attributes); dead = written - live; open/empty sets and totals
        recomputed.  Extents being written (the shard in progress, GC copies before their move record)
        count as live.  ``store.table.key() == store.recompute_table().key()`` must always hold."""
        with self._lock:
            bs = self._bs
            live: dict[int, int] = {}
            gens = list(self.catalog.gens.values()) + [w.gen for w in self._writers.values()]
            lists = [s.extents for gen in gens for s in gen.shards.values()] + self._inflight
            for extents in lists:
                for e in extents:
                    live[e[0]] = live.get(e[0], 0) + round_up(e[2], bs)
            t = self._new_table()
            t.now = self._now
            out = []
            for z, s in self.table.zones.items():
                lv = live.get(z, 0)
                out.append(ZoneSummary(index=z, capacity=s.capacity, cond=s.cond, written=s.written, live=lv,
                                       dead=s.written - lv, reclaim_step=s.reclaim_step, lifetime=s.lifetime,
                                       opened_step=s.opened_step, open_seq=s.open_seq,
                                       last_write_step=s.last_write_step))
            t.restore(out)
            return t

    def _rebuild_summaries(self) -> None:
        fresh = self.recompute_table()
        if fresh.key() != self.table.key():
            bad = [z for z in self.table.zones if fresh.zones[z].key() != self.table.zones[z].key()]
            raise SummaryMismatchError(f"cached zone summaries differ from a recomputation in zones {bad[:8]}")
        self.table.restore(list(fresh.zones.values()))
