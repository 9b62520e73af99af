"""The metadata journal: meta-zone chains, appends, rollover and the mount scan.

Records are framed and encoded by :mod:`.records`.  A record never spans zones.  A zero header
(crc 0, length 0) ends a Full zone's records (the padding of a finished zone reads back as zeros);
below the write pointer of a zone that is not Full, or before a later valid record, it is a zeroed
block: corruption.

**Chains.**  The journal lives in a *chain* of meta zones sharing one superblock ``sequence``; each
zone starts with a superblock whose ``part`` numbers it in the chain.  A chain opens with a complete
snapshot (``snap`` ... ``send`` records) that may spill over several zones, then takes appended
records in its last zone.

**Rollover** (ZenFS ``ZenFS::RollMetaZoneLocked``), when the last zone has no room for a record, and
at mount after a torn tail: (1) the whole snapshot is framed in memory and packed into the meta zones
*not* in the current chain; if it needs more zones than there are, :class:`NoSpaceError` is raised
before anything is written, so a roll never loops (ZenFS issue #293); (2) the old chain's last zone
is finished (it releases its active-zone resource, so metadata never needs more than one); (3) the
new zones get superblock ``sequence + 1`` and the snapshot, each finished before the next is used;
(4) flush; (5) only then the old chain's zones are reset.  A crash before (4) leaves the old chain
intact and the new one without its ``send`` record, so mount falls back to the old chain.

**Mount** reads the first block of every meta zone, tries the chains from the highest sequence down
and takes the first whose snapshot is complete.  A record that runs past the write pointer of the
chain's last zone is a *torn tail* (what a power cut leaves) and is dropped, provided no valid record
starts after it.  After a power cycle everything below a zone's write pointer is durable (a zone
keeps a prefix of its writes), so a checksum mismatch in a record that lies wholly below it is
corruption; the one exception is a torn record in a zone finished afterwards (a Full zone reads
zeros where nothing was written): its last block and everything after it in the zone must read as
zeros.  A checksum mismatch otherwise, a non-empty meta zone whose superblock fails its checksum, or
a gap in a chain is :class:`CorruptJournalError` (never skipped silently).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from retainz.errors import CorruptJournalError, ForeignDeviceError, NoSpaceError, ZonedDeviceError
from retainz.store.format import Superblock
from retainz.store.records import (
    EXTENT_BYTES,
    FRAME_HEADER,
    Kind,
    frame,
    kind_of,
    plan_zones,
    snapshot_zones,
    unframe,
)
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import ZoneCond

__all__ = ["parse_zone", "ZoneWindow", "SCAN_WINDOW", "Journal", "MountScan", "scan", "MAX_META_ZONES",
           "default_meta_zones"]

#: Meta zones are the first zones; at most this many.
MAX_META_ZONES = 64


def default_meta_zones(nr_zones: int, zone_capacity: int, block_size: int, gc_reserve_zones: int) -> int:
    """The meta-zone count ``Store.format`` picks when the caller gives none.

    Rule: twice the meta zones a snapshot of a device full of 1 MiB extents takes (every data zone
    non-empty, ``ZONE_ATTR_BYTES`` each; one extent of ``EXTENT_BYTES`` per MiB of data capacity,
    or per zone when zones are smaller; 12.5 % slack for GC splits), since a rollover writes the
    new snapshot next to the old chain (the admission rule keeps ``2 x snapshot zones <= meta
    zones``).  At least 3 (ZenFS's count), at most 64 and at most an eighth of the zones (but
    never below 3, nor so many that fewer than ``gc_reserve_zones + 2`` data zones remain).

    Examples: a ZN540-like device (1077 MiB zone capacity, 904 zones) gets 3; 65,536 zones of
    1 MiB get 28 (a full snapshot is about 11.5 MiB).
    """
    data = max(nr_zones - 3, 1)
    nbytes = data * max(1, zone_capacity // (1 << 20)) * EXTENT_BYTES
    z = snapshot_zones(nbytes + nbytes // 8, zone_capacity, block_size, zones=data)
    m = max(3, min(MAX_META_ZONES, nr_zones // 8, 2 * z))
    return max(2, min(m, nr_zones - gc_reserve_zones - 2))


@dataclass
class ZoneParse:
    """Records found in one meta zone.

    Attributes:
        payloads: the records' payloads in order.
        end: byte (relative to the zone start) after the last valid record.
        torn: bytes dropped as a torn tail (0: none).
    """

    payloads: list[bytes] = field(default_factory=list)
    end: int = 0
    torn: int = 0


#: Bytes of a meta zone :func:`scan` reads at a time (a record larger than this is read whole).
SCAN_WINDOW = 4 << 20


class ZoneWindow:
    """A meta zone's bytes ``[0, end)`` as :func:`parse_zone` reads them: either a buffer holding
    them (:meth:`over`) or read from the device a window of :data:`SCAN_WINDOW` bytes at a time
    (:meth:`on`), so mounting a journal zone of any size holds one window in memory, not the zone.

    Args:
        read: ``read(pos, n)``: the zone's bytes ``[pos, pos + n)`` (bytes-like).
        end: bytes readable (the zone's written bytes).
        window: bytes read at a time.
    """

    __slots__ = ("_read", "end", "_window", "_lo", "_view")

    def __init__(self, read: Callable[[int, int], bytes], end: int, window: int = SCAN_WINDOW):
        self._read = read
        self.end = end
        self._window = window
        self._lo = 0
        self._view = memoryview(b"")

    @classmethod
    def over(cls, buf) -> ZoneWindow:
        """The zone's bytes already in ``buf`` (no copy, no reads)."""
        w = cls(None, len(buf), len(buf))
        w._view = memoryview(buf)
        return w

    @classmethod
    def on(cls, device: ZonedDevice, zone_start: int, written: int, window: int = SCAN_WINDOW) -> ZoneWindow:
        """The first ``written`` bytes of the zone starting at device byte ``zone_start``."""
        return cls(lambda pos, n: device.read(zone_start + pos, n), written, window)

    def _load(self, pos: int, n: int) -> None:
        self._view = memoryview(self._read(pos, min(max(n, self._window), self.end - pos)))
        self._lo = pos

    def get(self, pos: int, n: int) -> memoryview:
        """The bytes ``[pos, pos + n)`` (``pos + n <= end``), reading a new window if needed."""
        if pos < self._lo or pos + n > self._lo + len(self._view):
            self._load(pos, n)
        return self._view[pos - self._lo:pos - self._lo + n]

    def frame(self, pos: int, bs: int) -> tuple[int, int, bool, memoryview | None]:
        """:func:`~retainz.store.records.unframe` at ``pos``, plus the frame's bytes (``None``
        when its header is zero or it runs past ``end``); one window read at most."""
        need = FRAME_HEADER
        while True:
            rel, v = pos - self._lo, self._view
            if rel >= 0 and rel + need <= len(v):
                n, total, ok = unframe(v, rel, len(v), bs)
                if not total:
                    return n, total, False, None
                if rel + total <= len(v):
                    return n, total, ok, v[rel:rel + total]
                if pos + total > self.end:
                    return n, total, False, None
                need = total                # the frame runs past this window: read it whole
            self._load(pos, need)
            if len(self._view) < need:
                raise CorruptJournalError(f"reading {need} bytes at byte {pos} of a meta zone returned "
                                          f"{len(self._view)}")


def parse_zone(buf, start: int, end: int, bs: int, *, zone: int, tail: bool,
               full: bool = True) -> ZoneParse:
    """Parse the records in the zone's bytes ``[start, end)``.

    Args:
        buf: the zone's data from byte 0: a bytes-like object holding at least ``end`` bytes, or a
            :class:`ZoneWindow` (what :func:`scan` passes: read a window at a time).
        tail: True for the last zone of a chain, where a record that runs past ``end`` (the write
            pointer) is a torn tail; elsewhere it is corruption.
        full: the zone is Full, so ``end`` is its capacity and zero padding may end its records; in
            a zone that is not Full, ``end`` is the write pointer and every block below it was
            written, so a zero header there is corruption (a zeroed block), never the end.

    Raises:
        CorruptJournalError: a checksum mismatch inside ``end``, or a record past ``end`` that is not
            the last thing written.
    """
    win = buf if isinstance(buf, ZoneWindow) else ZoneWindow.over(memoryview(buf)[:end])
    out = ZoneParse(end=start)
    pos = start

    def later_valid() -> int | None:
        return next((p for p in range(pos + bs, end, bs) if win.frame(p, bs)[2]), None)

    while pos + FRAME_HEADER <= end:
        n, total, ok, view = win.frame(pos, bs)
        if not total:                       # a zero header
            later = later_valid()
            if later is not None or not full:
                raise CorruptJournalError(
                    f"meta zone {zone}: a zeroed block at byte {pos}, below the write pointer ({end})"
                    + (f", hides the valid record at byte {later}" if later is not None else "")
                    + ": corrupt journal")
            break
        if pos + total > end:
            later = later_valid()
            if not tail or later is not None:
                raise CorruptJournalError(
                    f"meta zone {zone}: record at byte {pos} claims {n} bytes, past the end of the "
                    f"written area ({end})" + (f", and a valid record follows at byte {later}"
                                               if later is not None else "") + ": corrupt journal")
            out.torn = end - pos
            break
        if not ok:
            if tail and full and total > bs and not _holds_data(win, pos + total - bs, end):
                # a torn record in a zone finished afterwards (a rollover finishes the old zone):
                # the blocks it never wrote read as zeros up to the zone's end.  A record's last
                # block always holds payload, so a record whose last block holds data was written
                # whole and is durable (below a write pointer after a power cycle): its checksum
                # failure is corruption, never a torn tail.
                out.torn = total
                break
            raise CorruptJournalError(f"meta zone {zone}: record at byte {pos} ({n} bytes) fails its "
                                      "checksum: corrupt journal")
        out.payloads.append(bytes(view[FRAME_HEADER:FRAME_HEADER + n]))
        pos += total
        out.end = pos
    return out


def _holds_data(win: ZoneWindow, pos: int, end: int) -> bool:
    """Whether any byte of the zone's ``[pos, end)`` is not zero (read a window at a time)."""
    while pos < end:
        n = min(end - pos, SCAN_WINDOW)
        if win.get(pos, n).tobytes().strip(b"\0"):
            return True
        pos += n
    return False


@dataclass
class MountScan:
    """What :func:`scan` found.

    Attributes:
        sb: the superblock of the chosen chain (its part 0).
        chain: meta zone indexes of the chain, in part order.
        payloads: every record of the chain in order (snapshot first).
        end: write position (relative) after the last valid record of the chain's last zone.
        torn: bytes dropped as a torn tail.
        stale: non-empty meta zones outside the chain (older or incomplete chains) to reset.
        fallbacks: newer chains skipped because their snapshot was incomplete (a crashed roll).
    """

    sb: Superblock
    chain: list[int]
    payloads: list[bytes]
    end: int
    torn: int
    stale: list[int]
    fallbacks: int = 0


def scan(device: ZonedDevice) -> MountScan:
    """Find the current journal chain on ``device`` and read its records.

    Raises:
        ForeignDeviceError: no meta zone holds a RetainZ superblock.
        UnsupportedFormatError: a superblock of a format version or flags this code does not know
            (nothing is written).
        CorruptJournalError: see the module docstring.
    """
    g = device.geometry
    bs = g.block_size
    zones = device.report_zones(0, min(g.nr_zones, MAX_META_ZONES))
    sbs: dict[int, Superblock] = {}
    bad: list[int] = []
    n_meta = len(zones)
    for z in zones:
        if z.index >= n_meta:
            break
        if z.cond == ZoneCond.EMPTY:
            continue
        block = device.read(z.start, bs)
        sb = Superblock.decode(block, g)
        if sb is None:
            if Superblock.has_magic(block):
                bad.append(z.index)
            continue
        sb.check_supported(f"{device.name} meta zone {z.index}")
        if not sbs:
            n_meta = min(sb.meta_zones, len(zones))
        sbs[z.index] = sb
    bad = [z for z in bad if z < n_meta]
    if not sbs:
        if bad:
            raise CorruptJournalError(f"meta zone(s) {bad}: the RetainZ superblock fails its checksum "
                                      "and no other copy exists: corrupt store")
        raise ForeignDeviceError(f"{device.name} holds no RetainZ store (no superblock in its first zones)")
    if bad:
        raise CorruptJournalError(f"meta zone(s) {bad}: superblock fails its checksum: corrupt store")
    if len({sb.uuid for sb in sbs.values()}) > 1:
        raise CorruptJournalError("meta zones hold superblocks of different stores: "
                                  + ", ".join(f"zone {z}: {sb.uuid}" for z, sb in sorted(sbs.items())))
    by_seq: dict[int, dict[int, int]] = {}
    for z, sb in sbs.items():
        parts = by_seq.setdefault(sb.sequence, {})
        if sb.part in parts:
            raise CorruptJournalError(f"meta zones {parts[sb.part]} and {z} both claim part {sb.part} of "
                                      f"journal sequence {sb.sequence}")
        parts[sb.part] = z
    fallbacks = 0
    for seq in sorted(by_seq, reverse=True):
        parts = by_seq[seq]
        chain = [parts[p] for p in sorted(parts)]
        if sorted(parts) != list(range(len(parts))):
            raise CorruptJournalError(f"journal sequence {seq} has parts {sorted(parts)}: a part is missing")
        payloads: list[bytes] = []
        end = torn = 0
        for i, zi in enumerate(chain):
            z = zones[zi]
            last = i == len(chain) - 1
            written = z.capacity if z.cond == ZoneCond.FULL else z.wp - z.start
            parsed = parse_zone(ZoneWindow.on(device, z.start, written), bs, written, bs, zone=zi, tail=last,
                                full=z.cond == ZoneCond.FULL)
            payloads += parsed.payloads
            end, torn = parsed.end, parsed.torn
        complete = (bool(payloads) and kind_of(payloads[0]) is Kind.SNAP
                    and any(kind_of(p) is Kind.SNAP_END for p in payloads))
        if not complete:
            fallbacks += 1
            continue
        stale = [z.index for z in zones[:n_meta] if z.cond != ZoneCond.EMPTY and z.index not in chain]
        return MountScan(sb=sbs[chain[0]], chain=chain, payloads=payloads, end=end, torn=torn,
                         stale=stale, fallbacks=fallbacks)
    raise CorruptJournalError("no journal chain with a complete snapshot: corrupt store")


class Journal:
    """Appends records to the current chain and rolls it over.

    Args:
        device: the device.
        sb: the superblock of the current chain (``part`` ignored).
        chain: the chain's meta zones, in order.
        end: write position in the chain's last zone (bytes from its start).
        snapshot: callable returning the snapshot payloads of the store's current state (used by
            :meth:`roll`; the store's :class:`~retainz.store.metalog.MetadataLog` sets it).
    """

    def __init__(self, device: ZonedDevice, sb: Superblock, chain: list[int], end: int,
                 snapshot: Callable[[], list[bytes]] | None = None):
        self.device = device
        self.sb = sb
        self.chain = list(chain)
        self.end = end
        self.snapshot = snapshot
        g = device.geometry
        self.bs = g.block_size
        self.zone_size = g.zone_size
        self.capacity = g.zone_capacity
        self.meta = list(range(sb.meta_zones))
        self.bytes_written = 0
        self.records = 0
        self.rollovers = 0
        #: a record write failed: the chain's tail is unknown, so the next append rolls over first
        self.fenced = False

    @property
    def max_record(self) -> int:
        """Largest payload that fits a meta zone after its superblock."""
        return self.capacity - self.bs - 8

    def room(self) -> int:
        """Bytes left in the chain's last zone."""
        return self.capacity - self.end

    def append(self, payload: bytes, *, flush: bool = True) -> None:
        """Append one record (rolling over first if the last zone has no room) and flush.

        A failed record write fences the chain (:attr:`fenced`): the device may hold part of the
        record, so the next append first rolls over to a fresh chain.

        Raises:
            NoSpaceError: the record is larger than a meta zone, or a needed rollover does not fit
                the free meta zones (nothing was written).
            ZonedDeviceError: the write or the flush failed.
        """
        rec = frame(payload, self.bs)
        if len(rec) > self.capacity - self.bs:
            raise NoSpaceError(f"journal record of {len(payload)} bytes does not fit a meta zone "
                               f"({self.capacity - self.bs} bytes after the superblock)",
                               needed=len(rec), available=self.capacity - self.bs)
        if self.end + len(rec) > self.capacity or self.fenced:
            self.roll(reserve=len(rec))
            self.fenced = False
        z = self.chain[-1]
        try:
            self.device.write(z * self.zone_size + self.end, rec)
        except ZonedDeviceError:
            # the device may have written part of it: the next record goes to a fresh chain
            self.fenced = True
            raise
        self.end += len(rec)
        self.bytes_written += len(rec)
        self.records += 1
        if flush:
            self.device.flush()

    def roll(self, payloads: list[bytes] | None = None, *, reserve: int = 0) -> None:
        """Write a fresh snapshot under ``sequence + 1`` into free meta zones, then reset the old
        chain (see the module docstring).  The new chain's last zone keeps at least ``reserve``
        bytes free (the record that triggered the roll), so one roll always suffices.

        Raises:
            NoSpaceError: the snapshot needs more meta zones than are free (nothing was written).
        """
        if payloads is None:
            if self.snapshot is None:
                raise ValueError("Journal.roll: no snapshot source (give payloads, or set Journal.snapshot)")
            payloads = self.snapshot()
        frames = [frame(p, self.bs) for p in payloads]
        free = [z for z in self.meta if z not in self.chain]
        for f in frames:
            if len(f) > self.capacity - self.bs:
                raise NoSpaceError(f"a journal snapshot record of {len(f)} bytes does not fit a meta zone",
                                   needed=len(f), available=self.capacity - self.bs)
        plan = [[frames[i] for i in group]
                for group in plan_zones(map(len, frames), self.capacity, self.bs, reserve)]
        total = sum(map(len, frames)) + self.bs * len(plan)
        if len(plan) > len(free):
            raise NoSpaceError(
                f"journal snapshot of {total} bytes needs {len(plan)} meta zones but {len(free)} are free "
                f"({len(self.meta)} meta zones of {self.capacity} bytes); format with more meta zones",
                needed=total, available=len(free) * self.capacity)
        dev = self.device
        for z in free:
            if dev.zone(z).cond != ZoneCond.EMPTY:
                dev.reset_zone(z)
        old = self.chain
        if old and dev.zone(old[-1]).cond not in (ZoneCond.FULL, ZoneCond.EMPTY):
            dev.finish_zone(old[-1])
        seq = self.sb.sequence + 1
        new: list[int] = []
        for part, group in enumerate(plan):
            z = free[part]
            if new:
                dev.finish_zone(new[-1])
            sb = Superblock(uuid=self.sb.uuid, sequence=seq, part=part, geometry=self.sb.geometry,
                            meta_zones=self.sb.meta_zones, gc_reserve_zones=self.sb.gc_reserve_zones,
                            policy=self.sb.policy, flags=self.sb.flags)
            data = sb.encode() + b"".join(group)
            dev.write(z * self.zone_size, data)
            self.bytes_written += len(data)
            self.records += len(group)
            new.append(z)
            self.end = len(data)
        dev.flush()
        for z in old:
            dev.reset_zone(z)
        self.sb = Superblock(uuid=self.sb.uuid, sequence=seq, part=0, geometry=self.sb.geometry,
                             meta_zones=self.sb.meta_zones, gc_reserve_zones=self.sb.gc_reserve_zones,
                             policy=self.sb.policy, flags=self.sb.flags)
        self.chain = new
        self.rollovers += 1
