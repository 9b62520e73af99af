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
4. **Tidy the journal**: reset stale meta zones (older chains, a crashed rollover's partial chain;
   the previous chain, the current snapshot's second copy from format 5, is kept);
   roll over to a fresh chain if the tail was torn (so no valid record ever follows garbage), the
   chain's last zone has no room, or the chain is of an older format version (the upgrade:
   :mod:`.format`, "Format versions").
5. Bind the allocator to the rebuilt table.  Zones whose attributes recovery changed are marked so
   the next record journals them.

:func:`mount` runs 1-4 and hands the store its parts (catalog, zone book, metadata log) in the
state recovery left them; the store binds the allocator (5).

A read-only open (``Store.open(readonly=True)``) runs 1-3 and 5 without writing: zones step 3 would
reset are summarised as all dead, and what steps 3 and 4 would do is listed in
``RecoveryReport.repairs``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from retainz.errors import CorruptJournalError, OldFormatError
from retainz.placement.base import ZoneSummary
from retainz.store.catalog import Catalog
from retainz.store.format import FORMAT_VERSION, Superblock
from retainz.store.journal import Journal, scan
from retainz.store.metalog import MetadataLog
from retainz.store.records import LOST, NO_ATTRS, Kind, ZoneAttrs, decode, live_hash
from retainz.store.types import GenerationInfo, GenState, StoreMetrics
from retainz.store.zonebook import ZoneBook
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import ZoneCond, round_up

__all__ = ["RecoveryReport", "Replayed", "Mounted", "replay", "reconcile", "mount"]


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
        copies: each redundant copy used in place of a damaged one (superblock copies, snapshot
            record copies, damaged spares; docs/format.md), one line each.
        lost: with ``repair``: damaged records skipped and generations dropped because their data
            is gone, one line each.
        dropped: with ``repair``: every generation the repair did not keep as committed, one
            ``{"id", "step", "reason"}`` each (``id``/``step`` ``None`` and ``count`` generations
            when only the lost record named them; ``"unknown": True`` for one kept on the device as
            unknown).
        upgraded_from: the older format version a read-write open migrated (``upgrade`` or
            ``repair``: the journal rolled over at the current version), else ``None``.
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
    copies: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    upgraded_from: int | None = None


@dataclass
class Replayed:
    """What the journal's records say (step 2).

    Attributes:
        catalog: the committed generations.
        attrs: the last journaled attributes of each zone the journal names.
        now: the latest logical time recorded.
        open_seq: the zone table's opening counter.
        metrics: the last journaled metrics (``StoreMetrics`` fields).
    """

    catalog: Catalog = field(default_factory=Catalog)
    attrs: dict[int, ZoneAttrs] = field(default_factory=dict)
    now: int = 0
    open_seq: int = 0
    metrics: dict = field(default_factory=dict)
    q: int = 0
    dropped: list[dict] = field(default_factory=list)


class _Gaps:
    """What a salvaging replay knows about records it could not read (module docstring of
    :mod:`.records`, "Record sequence and live-set digest").

    At a gap (a damaged frame, or a jump in ``q``) every generation held becomes a *suspect*: a
    lost record could have deleted, replaced or moved it.  The next record that carries ``lv``
    settles the gap: ``k`` commits were lost (its commit sequence less ours) and the live count
    moved by ``net``, so ``k - net`` deletions or replacements were lost; none clears the suspects,
    one with no lost commit is found by the digest (our digest XOR its one's hash), as is one lost
    replacing commit (XOR the old and the new version's hashes); anything else leaves them
    suspects, made unknown at the end.  A gap inside a snapshot only loses generations
    (``send`` gives how many).  Lost commits are named by commit sequence (their ids were only in
    the lost records)."""

    def __init__(self, cat: Catalog, dropped: list[dict]):
        self.cat = cat
        self.dropped = dropped
        self.where: str | None = None        # the open gap
        self.suspects: dict[str, str] = {}   # generation id -> why
        self.offset = 0                      # generations we know exist but cannot hold (lost commits)
        self.phantom = 0                     # their hashes, when known (a lost replacing commit)
        self.digest_ok = True

    def open(self, where: str) -> None:
        if self.where is None:
            self.where = where
            for gid in self.cat.gens:
                self.suspects.setdefault(gid, f"{where} could have deleted or changed it")

    def settle(self, lv: list, q: int | None) -> None:
        """Compare the live set ``lv`` a record carries (before it) with ours."""
        cat = self.cat
        n, digest, cs = lv
        on, od, ocs = cat.live
        od ^= self.phantom
        k = max(0, cs - ocs)
        net = n - (on + self.offset)
        lost = k - net                     # deletions or replacements in the lost records
        where, self.where = self.where, None
        if k == 1 and lost == 1 and self.digest_ok:
            # one lost commit that retired one generation: a replacing commit of a suspect?
            hit = [gid for gid in self.suspects if gid in cat.gens
                   and od ^ live_hash(gid, cat.gens[gid].commit_seq) ^ live_hash(gid, cs) == digest]
            if len(hit) == 1:
                gen = cat.remove(hit[0])
                self.dropped.append({"id": gen.id, "step": None, "reason": (
                    f"{where}: its replacing commit (commit sequence {cs}) was lost: the version of step "
                    f"{gen.step} stays retired, and the new one cannot be read (its extents were only in that "
                    "record)")})
                self.phantom ^= live_hash(gen.id, cs)
                self.offset += 1
                cat.commit_seq = cs
                self.suspects.clear()
                return
        if k:
            self.dropped.append({"id": None, "step": None, "count": k, "reason": (
                f"{where}: {k} commit record(s) (commit sequence {ocs + 1}..{cs}) lost with every copy; "
                "the generation id is only in that record, so it cannot be named; its data stays as dead bytes "
                "until GC")})
            self.offset += k
            self.digest_ok = False
            cat.commit_seq = max(ocs, cs)
        if lost == 0:
            self.suspects.clear()
        elif lost == 1 and k == 0 and self.digest_ok:
            gone = [gid for gid in self.suspects if gid in cat.gens
                    and od ^ live_hash(gid, cat.gens[gid].commit_seq) == digest]
            if len(gone) == 1:
                gen = cat.remove(gone[0])
                self.dropped.append({"id": gen.id, "step": gen.step, "reason": (
                    f"{where}: its deletion record was lost; the live-set digest of record {q} shows it "
                    "deleted, so it stays deleted")})
                self.suspects.clear()

    def snapshot_end(self, count: int) -> None:
        """A gap inside a snapshot lost ``count - held`` generations' entries (and no deletion)."""
        if self.where is None:
            return
        missing = count - len(self.cat.gens)
        if missing > 0:
            self.dropped.append({"id": None, "step": None, "count": missing, "reason": (
                f"{self.where}: {missing} generation(s) of the snapshot lost with every copy of their record; "
                "their ids cannot be named; their data stays as dead bytes until GC")})
            self.offset += missing
            self.digest_ok = False
        self.where = None
        self.suspects.clear()

    def finish(self) -> list[GenerationInfo]:
        """Make every suspect still held unknown; returns them."""
        out = []
        for gid, why in self.suspects.items():
            gen = self.cat.gens.get(gid)
            if gen is not None and gen.state is GenState.COMMITTED:
                gen.state, gen.unknown_reason = GenState.UNKNOWN, why
                out.append(gen)
        return out


#: Records replayed between two progress calls.
PROGRESS_RECORDS = 4096


def replay(payloads: list[bytes], *, salvage: bool = False, lost: list[str] | None = None,
           progress=None) -> Replayed:
    """Replay a chain's records (snapshot first) into the catalog, zone attributes, time and metrics.

    Args:
        salvage: skip a record that does not decode (listed in ``lost``) instead of raising.
        progress: ``progress(done, total)`` in records, every :data:`PROGRESS_RECORDS` and at the end.

    Raises:
        CorruptJournalError: a record that does not decode (its checksum matched: written by other
            code, or a bug; nesting too deep for the JSON parser included).
    """
    out = Replayed()
    cat, attrs = out.catalog, out.attrs
    gaps = _Gaps(cat, out.dropped)
    last_q = None
    for i, p in enumerate(payloads):
        if progress is not None and i % PROGRESS_RECORDS == 0:
            progress(i, len(payloads))
        if p is LOST or not p:
            gaps.open(f"a damaged journal record after record {i}")
            continue
        try:
            rec = decode(p)
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as e:
            msg = (f"journal record {i} ({bytes(p[:8])!r}...) does not decode: "
                   f"{type(e).__name__}: {str(e)[:200]}")
            if salvage:
                if lost is not None:
                    lost.append(msg)
                gaps.open(f"journal record {i} (it does not decode)")
                continue
            raise CorruptJournalError(msg) from None
        if rec.q is not None:
            # the records that must precede it: up to its own q for a zone's close (format 6: it seals
            # the state after its zone's last record, which it settles a gap with as the next record's
            # lv would), up to the one before for any other record
            top = rec.q if rec.kind is Kind.CLOSE else rec.q - 1
            if last_q is not None and top > last_q and rec.kind is not Kind.SNAP:
                where = f"journal records {last_q + 1}..{top} (missing: a zeroed or lost block)"
                if not salvage:
                    raise CorruptJournalError(f"{where}: corrupt journal")
                gaps.open(where)
            last_q = out.q = rec.q
        if gaps.where is not None and rec.lv is not None:
            gaps.settle(rec.lv, rec.q)
        if rec.lv is not None and rec.lv[2] > cat.commit_seq:
            # the last commit sequence number handed out before this record: what a lost snapshot
            # head held when the last commits were deleted before the roll (no number is reused)
            cat.commit_seq = rec.lv[2]
        for z, a in rec.zones:
            attrs[z] = a
        if rec.open_seq is not None and rec.open_seq > out.open_seq:
            out.open_seq = rec.open_seq
        if rec.now is not None and rec.now > out.now:
            out.now = rec.now
        kind = rec.kind
        if kind is Kind.COMMIT or kind is Kind.GENS:
            for gen in rec.gens:
                if rec.replaces and gen.id in cat.gens:
                    cat.remove(gen.id)
                    gaps.suspects.pop(gen.id, None)
                cat.add(gen)
            for z in rec.resets:
                attrs[z] = NO_ATTRS
        elif kind is Kind.DELETE:
            gaps.suspects.pop(rec.deleted, None)
            if rec.deleted in cat.gens:
                cat.remove(rec.deleted)
            for z in rec.resets:
                attrs[z] = NO_ATTRS
        elif kind is Kind.MOVE:
            for gid, name, ext in rec.moves:
                if salvage and (gid not in cat.gens or name not in cat.gens[gid].shards):
                    continue            # its commit record was lost (named at the gap)
                cat.replace_extents(gid, name, ext)
            for z in rec.resets:
                attrs[z] = NO_ATTRS
        elif kind is Kind.HINT:
            gid, hint = rec.hint
            if gid in cat.gens:
                cat.gens[gid].hint = hint
        elif kind is Kind.SNAP or kind is Kind.SYNC:
            out.metrics.update(rec.metrics)
            if rec.commit_seq is not None and rec.commit_seq > cat.commit_seq:
                cat.commit_seq = rec.commit_seq
        elif kind is Kind.SNAP_END:
            gaps.snapshot_end(rec.count)
    for gen in gaps.finish():
        out.dropped.append({"id": gen.id, "step": gen.step, "reason": f"unknown: {gen.unknown_reason}",
                            "unknown": True})
    if progress is not None:
        progress(len(payloads), len(payloads))
    return out


def reconcile(zones: ZoneBook, catalog: Catalog, attrs: dict[int, ZoneAttrs], open_seq: int,
              rep: RecoveryReport, *, readonly: bool) -> None:
    """Step 3 (module docstring): rebuild every data zone's summary from the device's report, the
    catalog's live extents and the journaled attributes, resetting zones with no committed data
    (listing them in ``rep.repairs`` instead when ``readonly``); zones whose attributes changed
    are marked for the next record.

    Raises:
        CorruptJournalError: committed data lost (an empty zone, or a write pointer below a
            committed extent's end).
    """
    dev = zones.device
    bs = zones.block_size
    live: dict[int, int] = {}
    top: dict[int, int] = {}
    for gen in catalog.gens.values():
        for s in gen.shards.values():
            for z, off, length, _ in s.extents:
                n = round_up(length, bs)
                live[z] = live.get(z, 0) + n
                if off + n > top.get(z, 0):
                    top[z] = off + n
    out = []
    changed = []
    first, n = zones.meta_zones, dev.geometry.nr_zones
    used = {zr.index: zr for zr in dev.report_used_zones(first, n - first)}
    # Only the zones the device or the journal says something about are visited: every other data
    # zone is empty with no attributes, as the fresh table has it (a device of 1,048,576 zones).
    for z in sorted(z for z in {*used, *attrs, *live} if first <= z < n):
        zr = used.get(z)
        a = attrs.get(z, NO_ATTRS)
        lv = live.get(z, 0)
        if zr is None:                # empty on the device: its summary stays the table's empty one
            if lv:
                raise CorruptJournalError(f"zone {z} is empty on the device but the journal has "
                                          f"{lv} bytes of committed data in it: data lost")
            if a != NO_ATTRS:
                changed.append(z)
            continue
        s = ZoneSummary(index=z, capacity=zr.capacity)
        if not lv and readonly:     # what a read-write open resets: all dead here
            written = (a.written if a.full else zr.capacity) if zr.cond == ZoneCond.FULL else zr.wp - zr.start
            s.cond = ZoneCond.FULL if zr.cond == ZoneCond.FULL or written >= zr.capacity else ZoneCond.IMP_OPEN
            s.written, s.dead = written, written
            s.reclaim_step, s.lifetime, s.opened_step, s.open_seq = (a.reclaim_step, a.lifetime, a.opened_step,
                                                                 a.open_seq)
            s.last_write_step = a.last_write_step if written == a.written else zones.now
            rep.repairs.append(f"reset data zone {z} ({written} bytes written, no committed data)")
        elif not lv:
            dev.reset_zone(z)
            rep.zones_reset.append(z)
            zones.metrics.resets += 1
            written = zr.wp - zr.start
            # part-empty: charged like any reset (last write step: see below)
            zones.charge_part_empty(zr.capacity, written, zr.cond == ZoneCond.FULL,
                                    a.last_write_step if a.written == written else zones.now)
        else:
            if zr.cond == ZoneCond.FULL:
                written = a.written if a.full else zr.capacity
                s.cond = ZoneCond.FULL
            else:
                written = zr.wp - zr.start
                s.cond = ZoneCond.IMP_OPEN if written < zr.capacity else ZoneCond.FULL
            if written < top.get(z, 0):
                raise CorruptJournalError(f"zone {z}: the device write pointer ({written} bytes in) is "
                                          f"below the end of a committed extent ({top[z]}): data lost")
            rep.dead_bytes_found += max(0, written - max(a.written, top.get(z, 0)))
            s.written, s.live, s.dead = written, lv, written - lv
            s.reclaim_step, s.lifetime, s.opened_step, s.open_seq = (a.reclaim_step, a.lifetime, a.opened_step,
                                                                 a.open_seq)
            # the journaled last write step, unless the device holds bytes written after the
            # last record: then the latest step the journal knows (a lower bound)
            s.last_write_step = a.last_write_step if written == a.written else zones.now
        out.append(s)
        if ZoneAttrs.of(s) != a:
            changed.append(z)
    zones.restore(out, open_seq, zones.now)
    zones.mark(changed)


@dataclass
class Mounted:
    """The parts :func:`mount` rebuilt.

    Attributes:
        sb: the superblock of the journal chain in use.
        catalog, zones, log: the store's catalog, zone book and metadata log.
        metrics: the store's counters, resumed from the journal.
        report: what recovery found and did.
    """

    sb: Superblock
    catalog: Catalog
    zones: ZoneBook
    log: MetadataLog
    metrics: StoreMetrics
    report: RecoveryReport


def _drop_missing(device: ZonedDevice, catalog: Catalog, meta_zones: int, rep: RecoveryReport) -> None:
    """Salvage: drop committed generations whose extents the device no longer holds (an empty zone,
    a write pointer below the extent's end, or a meta zone), as a replay that skipped damaged
    records can leave (a lost deletion's zones were reset); each is listed in ``rep.lost``."""
    g = device.geometry
    reported = {z.index: z for z in device.report_zones()}
    for gen in list(catalog.gens.values()):
        why = None
        for s in gen.shards.values():
            for z, off, length, _ in s.extents:
                zr = reported.get(z)
                written = 0 if zr is None else zr.capacity if zr.cond == ZoneCond.FULL else zr.wp - zr.start
                if zr is None or z < meta_zones or off + round_up(length, g.block_size) > written:
                    why = f"its shard {s.name!r} has an extent in zone {z} the device does not hold"
                    break
            if why:
                break
        if why:
            catalog.remove(gen.id)
            rep.lost.append(f"generation {gen.id!r} (step {gen.step}) dropped: {why}")
            rep.dropped = [d for d in rep.dropped if d["id"] != gen.id]
            rep.dropped.append({"id": gen.id, "step": gen.step, "reason": f"dropped: {why}"})


def _rebuild_zone_state(device: ZonedDevice, found, catalog: Catalog, attrs: dict[int, ZoneAttrs],
                        meta_zones: int, rep: RecoveryReport) -> None:
    """Repair of a device whose every zone-state copy was lost (a FileDevice opened with
    ``lost_state``: every zone reads as Full): set each zone's condition and write pointer from what
    the journal knows, as a ZNS drive's own write pointers would give them.  Data zones: the
    journaled written bytes (at least the end of every committed extent), Full when the journal
    recorded a finish, Empty when it holds nothing; meta zones: the chain's last zone ends after its
    last valid record, the chain's other zones, the previous chain's and the spares are Full, the rest
    Empty.  Bytes
    written after the last record (an uncommitted generation) are beyond the rebuilt write pointer:
    dead, overwritten later."""
    g = device.geometry
    bs = g.block_size
    top: dict[int, int] = {}
    for gen in catalog.gens.values():
        for sh in gen.shards.values():
            for z, off, length, _ in sh.extents:
                top[z] = max(top.get(z, 0), off + round_up(length, bs))
    conds, written = [], []
    for z in range(g.nr_zones):
        if z < meta_zones:
            if z in found.chain:
                last = z == found.chain[-1]
                w = found.end if last else g.zone_capacity
                c = ZoneCond.FULL if w >= g.zone_capacity else ZoneCond.CLOSED
            elif z in found.spares or z in found.previous:
                c, w = ZoneCond.FULL, g.zone_capacity
            else:
                c, w = ZoneCond.EMPTY, 0
        else:
            a = attrs.get(z, NO_ATTRS)
            w = max(a.written, top.get(z, 0))
            c = (ZoneCond.FULL if a.full or w >= g.zone_capacity else ZoneCond.CLOSED) if w else ZoneCond.EMPTY
            if c == ZoneCond.FULL:
                w = g.zone_capacity
        conds.append(c)
        written.append(w)
    device.rebuild_state(conds, written)
    rep.lost.append(f"every zone-state copy was lost: the zone state was rebuilt from the journal "
                    f"({sum(c != ZoneCond.EMPTY for c in conds)} zones not empty)")


def mount(device: ZonedDevice, *, readonly: bool, repair: bool = False, upgrade: bool = False,
          progress=None) -> Mounted:
    """Steps 1-4 of the module docstring on ``device``.

    ``progress(done, total)`` follows the replay in journal records (:func:`replay`).

    ``repair`` (``fsck --repair``; read-write only): the journal scan skips damaged records
    (:func:`~retainz.store.journal.scan` ``salvage``); generations a lost record could concern
    become unknown (:func:`replay`), generations whose data is gone are dropped, and the journal
    rolls over to a fresh chain, which rewrites every superblock and snapshot copy (and a spare into
    every free empty meta zone), twice, so that the previous chain (format 5) is one the repair wrote.
    What was lost is in ``report.lost`` and ``report.dropped``.

    ``upgrade`` (``fsck --upgrade``): a store of an older format version is migrated (the journal
    rolls over under the current version); without it (or ``repair``) a read-write open of one is
    refused (docs/format.md, "Version policy").

    Raises:
        OldFormatError: a read-write open of an older format version without ``upgrade`` or
            ``repair`` (nothing written).
        ForeignDeviceError: the device holds no RetainZ store.
        UnsupportedFormatError: a format version or flags this code does not know.
        CorruptJournalError: the journal or superblock is damaged, the superblock's geometry is
            not the device's, or committed data is missing.
    """
    if repair and readonly:
        raise ValueError("a repair writes: it needs a read-write open")
    t0 = time.perf_counter()
    g = device.geometry
    state_lost = getattr(device, "state_lost", False)   # a device file whose zone state a repair rebuilds
    found = scan(device, salvage=repair, state_known=not state_lost)
    sb = found.sb
    if (sb.geometry.nr_zones, sb.geometry.zone_size, sb.geometry.zone_capacity, sb.geometry.block_size) != \
            (g.nr_zones, g.zone_size, g.zone_capacity, g.block_size):
        raise CorruptJournalError(f"the superblock's geometry {sb.geometry} does not match the device's {g}")
    old = sb.version < FORMAT_VERSION
    if old and not readonly and not (repair or upgrade):
        raise OldFormatError(f"{device.name}: a RetainZ store of format version {sb.version} (written by an "
                             f"earlier RetainZ); this code writes version {FORMAT_VERSION} and reads it as is "
                             f"(ls, get, fsck); migrate it with `retainz fsck --upgrade {device.name}` (older "
                             "RetainZ then refuses it): nothing written")
    rep = RecoveryReport(torn_bytes=found.torn, fallbacks=found.fallbacks, records=len(found.payloads),
                         copies=list(found.notes), lost=list(found.lost))
    state = replay(found.payloads, salvage=repair, lost=rep.lost, progress=progress)
    rep.dropped = list(state.dropped)
    if repair and state_lost:
        _rebuild_zone_state(device, found, state.catalog, state.attrs, sb.meta_zones, rep)
    if repair:
        _drop_missing(device, state.catalog, sb.meta_zones, rep)
    metrics = StoreMetrics()
    for k, v in state.metrics.items():
        if hasattr(metrics, k) and k != "waf":
            setattr(metrics, k, v)
    zones = ZoneBook(device, sb.meta_zones, metrics)
    zones.now = state.now
    journal = Journal(device, sb, found.chain, found.end, spares=found.spares, previous=found.previous,
                      closed=found.closed)
    log = MetadataLog(journal, state.catalog, zones, metrics, q=state.q)
    reconcile(zones, state.catalog, state.attrs, state.open_seq, rep, readonly=readonly)
    for z in found.stale:
        if readonly:
            rep.repairs.append(f"reset stale meta zone {z} (an older or incomplete journal chain)")
        else:
            device.reset_zone(z)
    last = device.zone(journal.chain[-1])
    if readonly and found.damaged:
        rep.repairs.append("rewrite the damaged metadata copies (fsck --repair)")
    if readonly and old:
        rep.repairs.append(f"nothing: format version {sb.version} is read as is; `retainz fsck --upgrade` "
                           f"migrates it to version {FORMAT_VERSION}")
    if repair or found.torn or (old and not readonly) or last.cond == ZoneCond.FULL \
            or journal.room() < 2 * g.block_size:
        if readonly:
            why = (f"drop a torn tail of {found.torn} bytes" if found.torn else
                   "its last zone is closed" if found.closed else "its last zone is full")
            rep.repairs.append(f"roll the journal over to a fresh chain ({why})")
        else:
            journal.roll()
            if repair:
                # the chain the repair read is damaged, or holds what the repair changed: a second
                # roll makes the previous chain (the new snapshot's copy) one the repair wrote
                journal.roll()
            rep.rolled = True
            if old:
                rep.upgraded_from = sb.version
    rep.seconds = time.perf_counter() - t0
    rep.records_per_second = rep.records / rep.seconds if rep.seconds else 0.0
    return Mounted(sb=sb, catalog=state.catalog, zones=zones, log=log, metrics=metrics, report=rep)
