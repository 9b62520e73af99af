"""Mount and crash recovery.

``Store.open`` runs, in order:

1. **Scan** the meta zones and pick the journal chain (:func:`retainz.store.journal.scan`): the
   highest sequence with a complete snapshot; a torn tail record is dropped.
2. **Replay** the snapshot and the records after it: the catalog of committed generations and the
   journaled zone attributes (written bytes, finish, reclaim step, lifetime, opening step).  A
   generation without a durable commit record does not exist.
3. **Reconcile** every data zone with the device's report (the device write pointer is trusted for
   what was written, the journal for what is live):

   ========================================  =================================================
   device / journal                          action
   ========================================  =================================================
   empty, no live extents                    empty
   empty, live extents                       CorruptJournalError (committed data lost)
   not empty, no live extents                reset: only uncommitted data, an interrupted
                                             deletion's or GC move's reset, or all dead
   open/closed, live extents                 kept; written = device write pointer; bytes past
                                             the last journaled extent are dead ("FINISH
                                             recovery", below); wp below a live extent's end
                                             is CorruptJournalError
   full, live extents                        kept; written = the journaled finish point if the
                                             journal recorded the finish, else the capacity
   ========================================  =================================================

   **FINISH recovery** (what happens to zones a crash left open): they are *not* finished.  The
   store keeps writing at the device's write pointer; the bytes between the last committed extent
   and the write pointer (an uncommitted generation, GC copies whose move record never landed) are
   counted dead and go with the zone's next reset.  Finishing them would waste their remaining
   capacity (unused capacity) for no gain: the device already closed them on power loss, and the
   active-zone budget is the same either way.
4. **Tidy the journal**: reset stale meta zones (older chains, a crashed rollover's partial chain);
   roll over to a fresh chain if the tail was torn (so no valid record ever follows garbage) or the
   chain's last zone has no room.
5. Bind the allocator to the rebuilt table.  Zones whose attributes recovery changed are marked so
   the next record journals them.

A read-only open (``Store.open(readonly=True)``) runs 1-3 and 5 without writing: zones step 3 would
reset are summarised as all dead, and what steps 3 and 4 would do is listed in
``RecoveryReport.repairs``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from retainz.errors import CorruptJournalError
from retainz.placement import make_allocator
from retainz.placement.base import ZoneSummary
from retainz.store.catalog import Catalog, decode, decode_gen, dumps, encode, encode_gen
from retainz.store.format import round_up
from retainz.store.journal import Journal, scan, snapshot_record_limit
from retainz.store.types import GenState
from retainz.zoned.model import ZoneCond

__all__ = ["RecoveryMixin", "RecoveryReport"]

#: Zone attributes of a zone the journal says nothing about (an empty zone): written, full,
#: reclaim step, lifetime, opening step, opening sequence number, last write step.
_NO_ATTRS = [0, 0, None, 0, 0, 0, 0]


@dataclass
class RecoveryReport:
    """What ``Store.open`` found and did.

    Attributes:
        records: journal records replayed (snapshot included).
        torn_bytes: bytes of a torn tail record dropped.
        fallbacks: newer journal chains skipped (a rollover that crashed before its snapshot was
            complete).
        zones_reset: data zones reset (uncommitted data, interrupted deletions and GC moves).
        dead_bytes_found: bytes past the last committed extent in zones kept open.
        rolled: True if the journal was rolled over at mount.
        repairs: what a read-write open would do and a read-only open did not (one line each:
            data zones to reset, stale meta zones to reset, a journal rollover); empty for a
            read-write open, which did them.
        seconds: wall time of the whole open.
        records_per_second: replay rate.
    """

    records: int = 0
    torn_bytes: int = 0
    fallbacks: int = 0
    zones_reset: list[int] = field(default_factory=list)
    dead_bytes_found: int = 0
    rolled: bool = False
    repairs: list[str] = field(default_factory=list)
    seconds: float = 0.0
    records_per_second: float = 0.0


class RecoveryMixin:
    """Mount and recovery methods of :class:`~retainz.store.store.Store`."""

    def _mount(self, policy: str | None) -> None:
        t0 = time.perf_counter()
        dev = self.device
        g = dev.geometry
        found = scan(dev)
        sb = found.sb
        if (sb.geometry.nr_zones, sb.geometry.zone_size, sb.geometry.zone_capacity, sb.geometry.block_size) != \
                (g.nr_zones, g.zone_size, g.zone_capacity, g.block_size):
            raise CorruptJournalError(f"the superblock's geometry {sb.geometry} does not match the device's {g}")
        self.uuid = sb.uuid
        self.meta_zones = sb.meta_zones
        self.gc_reserve_zones = sb.gc_reserve_zones
        self.policy = policy or sb.policy
        allocator = make_allocator(self.policy)
        allocator.check_device(g.nr_zones)
        self._max_active = max(g.max_active - 1, 0) if g.max_active else 0
        self._data_capacity = (g.nr_zones - self.meta_zones) * g.zone_capacity
        rep = RecoveryReport(torn_bytes=found.torn, fallbacks=found.fallbacks, records=len(found.payloads))
        self.recovery = rep
        self.catalog = Catalog()
        attrs = self._replay(found.payloads)
        self.table = self._new_table()
        self.journal = j = Journal(dev, sb, found.chain, found.end, self._snapshot)
        m = self.metrics
        j.bytes_written, j.records, j.rollovers = m.journal_bytes, m.journal_records, m.rollovers
        self._reconcile(attrs, rep)
        ro = self.readonly
        for z in found.stale:
            if ro:
                rep.repairs.append(f"reset stale meta zone {z} (an older or incomplete journal chain)")
            else:
                dev.reset_zone(z)
        last = dev.zone(self.journal.chain[-1])
        if found.torn or last.cond == ZoneCond.FULL or self.journal.room() < 2 * g.block_size:
            if ro:
                why = f"drop a torn tail of {found.torn} bytes" if found.torn else "its last zone is full"
                rep.repairs.append(f"roll the journal over to a fresh chain ({why})")
            else:
                self.journal.roll()
                rep.rolled = True
        for gen in self.catalog.gens.values():
            self._journal_entry(gen)
        self.allocator = allocator
        self.allocator.bind(self.table)
        self._closed = False
        rep.seconds = time.perf_counter() - t0
        rep.records_per_second = rep.records / rep.seconds if rep.seconds else 0.0

    def _replay(self, payloads: list[bytes]) -> dict[int, list]:
        """Rebuild the catalog, logical time and metrics; return the zone attributes by zone
        (``[written, full, reclaim_step, lifetime, opened_step, open_seq, last_write_step]``;
        attributes journaled
        by an older version lack the trailing fields, which default to 0)."""
        cat = self.catalog
        attrs: dict[int, list] = {}
        empty = _NO_ATTRS
        n = len(_NO_ATTRS)
        self._open_seq = 0
        for p in payloads:
            kind, body = decode(p)
            for a in body.get("z", ()):
                attrs[a[0]] = a[1:] if len(a) > n else a[1:] + _NO_ATTRS[len(a) - 1:]
            if "o" in body:
                self._open_seq = max(self._open_seq, body["o"])
            if "now" in body:
                self._now = max(self._now, body["now"])
            if kind == "c":
                cat.add(decode_gen(body["g"]))
            elif kind == "d":
                if body["g"] in cat.gens:
                    cat.remove(body["g"])
                for z in body["r"]:
                    attrs[z] = empty
            elif kind == "m":
                for gid, name, ext in body["s"]:
                    cat.replace_extents(gid, name, tuple(map(tuple, ext)))
                for z in body["r"]:
                    attrs[z] = empty
            elif kind == "sg":
                for item in body["g"]:
                    cat.add(decode_gen(item))
            elif kind in ("snap", "x"):
                for k, v in body.get("metrics", {}).items():
                    if hasattr(self.metrics, k):
                        setattr(self.metrics, k, v)
                if "commit_seq" in body:
                    cat.commit_seq = max(cat.commit_seq, body["commit_seq"])
        return attrs

    def _reconcile(self, attrs: dict[int, list], rep: RecoveryReport) -> None:
        dev = self.device
        bs = self._bs
        live: dict[int, int] = {}
        top: dict[int, int] = {}
        for gen in self.catalog.gens.values():
            for s in gen.shards.values():
                for z, off, length, _ in s.extents:
                    n = round_up(length, bs)
                    live[z] = live.get(z, 0) + n
                    if off + n > top.get(z, 0):
                        top[z] = off + n
        out = []
        for zr in dev.report_zones(self.meta_zones, dev.geometry.nr_zones - self.meta_zones):
            z = zr.index
            a = attrs.get(z, _NO_ATTRS)
            lv = live.get(z, 0)
            s = ZoneSummary(index=z, capacity=zr.capacity)
            if zr.cond == ZoneCond.EMPTY:
                if lv:
                    raise CorruptJournalError(f"zone {z} is empty on the device but the journal has "
                                              f"{lv} bytes of committed data in it: data lost")
            elif not lv and self.readonly:     # what a read-write open resets: all dead here
                written = (a[0] if a[1] else zr.capacity) if zr.cond == ZoneCond.FULL else zr.wp - zr.start
                s.cond = ZoneCond.FULL if zr.cond == ZoneCond.FULL or written >= zr.capacity else ZoneCond.IMP_OPEN
                s.written, s.dead = written, written
                s.reclaim_step, s.lifetime, s.opened_step, s.open_seq = a[2], a[3], a[4], a[5]
                s.last_write_step = a[6] if written == a[0] else self._now
                rep.repairs.append(f"reset data zone {z} ({written} bytes written, no committed data)")
            elif not lv:
                dev.reset_zone(z)
                rep.zones_reset.append(z)
                self.metrics.resets += 1
                written = zr.wp - zr.start
                # part-empty: charged like any reset (last write step: see below)
                self._charge_part_empty(zr.capacity, written, zr.cond == ZoneCond.FULL,
                                        a[6] if a[0] == written else self._now)
            else:
                if zr.cond == ZoneCond.FULL:
                    written = a[0] if a[1] else zr.capacity
                    s.cond = ZoneCond.FULL
                else:
                    written = zr.wp - zr.start
                    s.cond = ZoneCond.IMP_OPEN if written < zr.capacity else ZoneCond.FULL
                if written < top.get(z, 0):
                    raise CorruptJournalError(f"zone {z}: the device write pointer ({written} bytes in) is "
                                              f"below the end of a committed extent ({top[z]}): data lost")
                rep.dead_bytes_found += max(0, written - max(a[0], top.get(z, 0)))
                s.written, s.live, s.dead = written, lv, written - lv
                s.reclaim_step, s.lifetime, s.opened_step, s.open_seq = a[2], a[3], a[4], a[5]
                # the journaled last write step, unless the device holds bytes written after the
                # last record: then the latest step the journal knows (a lower bound)
                s.last_write_step = a[6] if written == a[0] else self._now
            out.append(s)
            if self._attrs_of(s) != list(a):
                self._dirty.add(z)
        self.table.open_seq = self._open_seq
        self.table.restore(out)

    # -- snapshot ----------------------------------------------------------------------------------
    def _snapshot(self) -> list[bytes]:
        """The store's committed state as snapshot record payloads (each at most 64 KiB or a quarter of
        a meta zone, except a single generation larger than that)."""
        out = [encode("snap", {"now": self._now, "commit_seq": self.catalog.commit_seq,
                               "metrics": self._metrics_state(), "o": self.table.open_seq})]
        zones = [self._attrs(s.index) for s in self.table if s.written or s.cond != ZoneCond.EMPTY]
        for i in range(0, len(zones), 2000):
            out.append(encode("sz", {"z": zones[i:i + 2000]}))
        batch: list = []
        size = 0
        limit = snapshot_record_limit(self.journal.capacity, self.journal.bs)
        for gen in self.catalog.gens.values():
            if gen.state is not GenState.COMMITTED:
                continue
            item = encode_gen(gen)
            n = len(dumps(item)) + 1
            if batch and size + n > limit:
                out.append(encode("sg", {"g": batch}))
                batch, size = [], 0
            batch.append(item)
            size += n
        if batch:
            out.append(encode("sg", {"g": batch}))
        out.append(encode("send", {"n": len(self.catalog.gens)}))
        return out
