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
*not* in the current chain, those of the previous chain last; if it needs more zones than there are,
:class:`NoSpaceError` is raised before anything is written, so a roll never loops (ZenFS issue
#293); (2) the old chain's last zone is finished (it releases its active-zone resource, so metadata
never needs more than one); (3) the new zones get superblock ``sequence + 1`` and the snapshot, each
finished before the next is used; (4) flush; (5) only then the previous chain's zones are reset, and
the old chain becomes the previous one.  A crash before (4) leaves the old chain intact and the new
one without its ``send`` record, so mount falls back to the old chain.

**Previous chain** (format version 5).  Appended records are written twice, each copy in its own
blocks (:func:`~retainz.store.records.append_frames`); a snapshot's batches are written once, and
their second copy is the chain the roll replaced: its snapshot and every record appended to it,
replayed, give the state the new snapshot holds (up to the ``q`` its head carries).  It is kept,
in other meta zones, until the next roll has made a newer chain durable; the roll uses its zones
for the new chain only when no other meta zone is free, so the space rule stays the one of
:mod:`.metalog` (a snapshot fits beside the current chain).  When a record of the current chain's
snapshot is damaged with every copy, mount replays the previous chain's records in place of the
snapshot, then the current chain's appended records (the snapshot's head and end must be readable:
they are written twice).  This is ZenFS's metadata roll (the old log stays readable until the new
snapshot is synced, ``ZenFS::RollMetaZoneLocked``) kept one roll longer, as btrfs keeps the
previous tree roots in its superblock's backup roots (``btrfs_super_block.super_roots``) so that a
damaged current root falls back to the one before.

**Mount** reads the first block of every meta zone, tries the chains from the highest sequence down
and takes the first whose snapshot is complete (a damaged chain with a complete snapshot is damage,
never a reason to fall back to an older chain, which would lose its appended records).  A record that runs past the write pointer of the
chain's last zone is a *torn tail* (what a power cut leaves) and is dropped, provided no valid record
starts after it.  After a power cycle everything below a zone's write pointer is durable (a zone
keeps a prefix of its writes), so a checksum mismatch in a record that lies wholly below it is
corruption; the one exception is a torn record in a zone finished afterwards (a Full zone reads
zeros where nothing was written): its last block and everything after it in the zone must read as
zeros.  A checksum mismatch otherwise, a non-empty meta zone whose superblock fails its checksum, or
a gap in a chain is :class:`CorruptJournalError` (never skipped silently).

**Copies** (format version 3, docs/format.md).  A chain zone's superblock is read from block 0, or
from block 1 when block 0 fails; a spare superblock (flag ``SPARE``) marks a meta zone outside the
chain and is neither a chain nor stale.  A copy of a duplicated record (a snapshot's head or end;
from version 5 every appended record: :func:`~retainz.store.records.copy_of`) that fails its
checksum or reads as zeros is skipped when its other copy is intact, and an intact copy 1 after its
intact copy 0 is not replayed again; every copy used in place of a damaged one (and the previous
chain used for a damaged snapshot) is named in :attr:`MountScan.notes`.  A record
whose header claims more than :func:`~retainz.store.records.record_limit` bytes is refused before
anything past its header is read.  ``salvage`` (``fsck --repair``) skips any other damaged record to
the next valid one and lists what it lost, so every intact record is replayed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from retainz.errors import CorruptJournalError, ForeignDeviceError, NoSpaceError, ZonedDeviceError
from retainz.store.format import FORMAT_VERSION, MAX_META_ZONES, SPARE, Superblock, head_bytes
from retainz.store.records import (
    COPY_MEMBER_BYTES,
    EXTENT_BYTES,
    FRAME_HEADER,
    LOST,
    Kind,
    append_frames,
    close_bytes,
    close_record,
    copy_of,
    decode,
    fits,
    frame,
    frame_size,
    kind_of,
    plan_zones,
    record_limit,
    snapshot_zones,
    unframe,
    write_limit,
)
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import ZoneCond

__all__ = ["parse_zone", "ZoneWindow", "SCAN_WINDOW", "Journal", "MountScan", "scan", "MAX_META_ZONES",
           "default_meta_zones"]



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
    # format 4's sizing (one copy of the next record, no close record): the default does not move with
    # format 5's record copies nor format 6's close, so a device formatted with it keeps its data zones (recorded runs depend on them)
    z = snapshot_zones(nbytes + nbytes // 8, zone_capacity, block_size, zones=data, next_copies=1, closing=False)
    m = max(3, min(MAX_META_ZONES, nr_zones // 8, 2 * z))
    return max(2, min(m, nr_zones - gc_reserve_zones - 2))


@dataclass
class ZoneParse:
    """Records found in one meta zone.

    Attributes:
        payloads: the records' payloads in order.
        end: byte (relative to the zone start) after the last valid record.
        torn: bytes dropped as a torn tail (0: none).
        notes: damaged record copies skipped because the other copy is intact (one line each).
        lost: damaged records a salvage skipped (one line each; only with ``salvage``).
        lost_at: for each line of ``lost``, the index in ``payloads`` of the ``LOST`` mark standing
            for it.
        holes: the ``LOST`` marks (indexes in ``payloads``) a valid record follows in the same zone:
            damage below the zone's write pointer, never a write cut short (a power cut lands a
            prefix of a zone's writes).
        closed: the zone's close record was read (format version 6): its records end at ``end``
            and it takes no more.
    """

    payloads: list[bytes] = field(default_factory=list)
    end: int = 0
    torn: int = 0
    notes: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    lost_at: list[int] = field(default_factory=list)
    holes: list[int] = field(default_factory=list)
    closed: bool = False

    def skip(self, problem: str) -> None:
        """A salvage skips a damaged record: ``problem`` listed, one ``LOST`` mark for a run of them."""
        self.lost.append(problem)
        if not self.payloads or self.payloads[-1] is not LOST:
            self.payloads.append(LOST)   # replay makes what it could concern unknown
        self.lost_at.append(len(self.payloads) - 1)


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

    def frame(self, pos: int, bs: int, limit: int | None = None) -> tuple[int, int, bool, memoryview | None]:
        """:func:`~retainz.store.records.unframe` at ``pos``, plus the frame's bytes (``None``
        when its header is zero, it runs past ``end``, or its length is over ``limit``: nothing
        past the header is read for it); one window read at most."""
        need = FRAME_HEADER
        while True:
            rel, v = pos - self._lo, self._view
            if rel >= 0 and rel + need <= len(v):
                n, total, ok = unframe(v, rel, len(v), bs)
                if not total or (limit is not None and n > limit):
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
               full: bool = True, limit: int | None = None, salvage: bool = False,
               closing: bool = False) -> ZoneParse:
    """Parse the records in the zone's bytes ``[start, end)``.

    Args:
        buf: the zone's data from byte 0: a bytes-like object holding at least ``end`` bytes, or a
            :class:`ZoneWindow` (what :func:`scan` passes: read a window at a time).
        tail: True for the last zone of a chain, where a record that runs past ``end`` (the write
            pointer) is a torn tail; elsewhere it is corruption.
        full: the zone is Full, so ``end`` is its capacity and zero padding may end its records; in
            a zone that is not Full, ``end`` is the write pointer and every block below it was
            written, so a zero header there is corruption (a zeroed block), never the end.
        limit: the largest payload a record may claim (:func:`~retainz.store.records.record_limit`;
            default: what fits ``end - start``); a larger claim is damage, refused unread.
        salvage: skip a damaged record to the next valid one (listed in ``lost``) instead of
            raising.
        closing: the zone is of format version 6 (:mod:`.records`, "Zone close"): a Full zone's
            records end at its close record, so zeros reached before one are a lost tail (damage),
            not padding, and what lies between the close's end and the close itself (a write that
            failed or was torn before the roll) is dropped.

    Raises:
        CorruptJournalError: a checksum mismatch inside ``end`` (unless it is one copy of a
            duplicated record whose other copy is intact), a length over ``limit``, or a record
            past ``end`` that is not the last thing written.
    """
    win = buf if isinstance(buf, ZoneWindow) else ZoneWindow.over(memoryview(buf)[:end])
    if limit is None:
        limit = max(0, end - start - FRAME_HEADER)
    out = ZoneParse(end=start)
    pos = start
    prev0 = 0                               # frame bytes of the previous record if it was a copy 0
    closing = closing and full
    marks: dict[int, tuple[int, int, int, int]] = {}    # record start -> what was parsed before it

    def close_after() -> int | None:
        """Where the close record is when it is the next valid frame after ``pos`` and says the
        records end at or before ``pos`` (at a record start): the bytes up to it were abandoned."""
        later = later_valid()
        if later is None:
            return None
        n, _, _, view = win.frame(later, bs, limit)
        payload = bytes(view[FRAME_HEADER:FRAME_HEADER + n])
        rec = _close_of(payload) if kind_of(payload) is Kind.CLOSE else None
        return later if rec is not None and rec.end <= pos and rec.end in marks else None

    def later_valid() -> int | None:
        return next((p for p in range(pos + bs, end, bs) if win.frame(p, bs, limit)[2]), None)

    def copy_skip() -> int | None:
        """Where parsing resumes if the damaged record at ``pos`` is one copy of a duplicated
        record whose other copy is intact (records.copy_of), else None."""
        if prev0:                           # it is copy 1 of the copy 0 just read: same size
            nxt = pos + prev0
            if nxt <= end and (nxt + FRAME_HEADER > end or win.frame(nxt, bs, limit)[2]
                               or not win.frame(nxt, bs, limit)[1]):
                return nxt
            return None
        later = later_valid()               # copy 0: copy 1 follows it, the same size
        if later is None:
            return None
        n2, total2, ok2, view2 = win.frame(later, bs, limit)
        if ok2 and copy_of(view2[FRAME_HEADER:FRAME_HEADER + 16]) == 1 and later - pos == total2:
            return later
        return None

    while pos + FRAME_HEADER <= end:
        marks.setdefault(pos, (len(out.payloads), len(out.notes), len(out.lost), len(out.lost_at)))
        n, total, ok, view = win.frame(pos, bs, limit)
        problem = None
        if closing and (not total or not ok) and copy_skip() is None:
            at = close_after()
            if at is not None:              # abandoned bytes before the close: read it
                pos = at
                prev0 = 0
                continue
        if not total:                       # a zero header
            if copy_skip() is None:         # not a zeroed copy of a duplicated record
                later = later_valid()
                if closing and later is None:
                    problem = (f"the records end at byte {pos} of a Full zone with no close record after "
                               "them: its last records are lost (zeroed blocks): corrupt journal")
                    if not salvage:
                        raise CorruptJournalError(f"meta zone {zone}: {problem}")
                    out.skip(f"meta zone {zone}: {problem}")
                    break
                if later is not None or not full:
                    problem = (f"a zeroed block at byte {pos}, below the write pointer ({end})"
                               + (f", hides the valid record at byte {later}" if later is not None else "")
                               + ": corrupt journal")
                    if not salvage:
                        raise CorruptJournalError(f"meta zone {zone}: {problem}")
                    out.skip(f"meta zone {zone}: {problem}")
                    if later is None:
                        break
                    prev0 = 0
                    pos = later
                    continue
                break
            problem = "a zeroed copy"       # its twin is used below
        elif pos + total > end:
            later = later_valid()
            if tail and later is None and not closing:
                out.torn = end - pos
                break
            problem = (f"record at byte {pos} claims {n} bytes, past the end of the written area ({end})"
                       + (f", and a valid record follows at byte {later}" if later is not None else "")
                       + ": corrupt journal")
        elif n > limit:     # inside the zone but larger than any record: refused unread
            problem = (f"record at byte {pos} claims {n} bytes, more than a record holds ({limit}): "
                       "corrupt journal")
        elif not ok:
            if tail and full and not closing and total > bs and not _holds_data(win, pos + total - bs, end):
                # a torn record in a zone finished afterwards (a rollover finishes the old zone):
                # the blocks it never wrote read as zeros up to the zone's end.  A record's last
                # block always holds payload, so a record whose last block holds data was written
                # whole and is durable (below a write pointer after a power cycle): its checksum
                # failure is corruption, never a torn tail.
                out.torn = total
                break
            problem = f"record at byte {pos} ({n} bytes) fails its checksum: corrupt journal"
        if problem is not None:
            nxt = copy_skip()
            if nxt is not None:
                out.notes.append(f"meta zone {zone}: a record copy at byte {pos} is "
                                 f"{'damaged' if total else 'zeroed'}; its other copy was used")
                prev0 = 0
                pos = out.end = nxt
                continue
            if salvage:
                out.skip(f"meta zone {zone}: {problem}")
                nxt = later_valid()
                if nxt is None:
                    break
                prev0 = 0
                pos = nxt
                continue
            raise CorruptJournalError(f"meta zone {zone}: {problem}")
        payload = bytes(view[FRAME_HEADER:FRAME_HEADER + n])
        if kind_of(payload) is Kind.CLOSE:
            rec = _close_of(payload)
            e = rec.end if rec is not None else None
            if e is None or e > pos or (e < pos and e not in marks):
                problem = (f"the close record at byte {pos} says the records end at byte {e}, "
                           f"{'past it' if e is not None and e > pos else 'not at a record'}: corrupt journal")
                if not salvage:
                    raise CorruptJournalError(f"meta zone {zone}: {problem}")
                out.skip(f"meta zone {zone}: {problem}")
                break
            if e < pos:                     # a failed or torn write before the roll: never replayed
                np_, nn, nl, nla = marks[e]
                del out.payloads[np_:], out.notes[nn:], out.lost[nl:], out.lost_at[nla:]
                out.torn = pos - e
            if rec.q is not None:
                out.payloads.append(payload)    # the seal settles a gap before it (recovery.replay)
            out.closed = True
            out.end = e
            break
        cp = copy_of(payload)
        if not (cp == 1 and prev0 == total):    # an intact copy 1 after its intact copy 0: replayed once
            out.payloads.append(payload)
        prev0 = total if cp == 0 else 0
        pos += total
        out.end = pos
    return out


def _close_of(payload: bytes):
    """A close record decoded (its ``end``: where its zone's records end; ``q``, ``lv``: its seal),
    ``None`` when it does not decode."""
    try:
        return decode(payload)
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None


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
        stale: non-empty meta zones outside the chain (older or incomplete chains, damaged spares) to
            reset.
        fallbacks: newer chains skipped because their snapshot was incomplete (a crashed roll).
        spares: meta zones holding an intact spare superblock.
        notes: each copy used in place of a damaged one (superblock copies, snapshot record copies,
            damaged spares), one line each.
        damaged: True when a copy was damaged: a rollover rewrites the chain's (``fsck --repair``).
        lost: damaged records a salvage skipped (only with ``salvage``).
        previous: meta zones of the previous chain (sequence one lower, complete), kept as the
            second copy of the chain's snapshot (format version 5); empty when there is none.
        closed: the chain's last zone holds its close record (format version 6; a roll stopped
            before its finish, or before the new chain was durable): the next append rolls over.
    """

    sb: Superblock
    chain: list[int]
    payloads: list[bytes]
    end: int
    torn: int
    stale: list[int]
    fallbacks: int = 0
    spares: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    damaged: bool = False
    lost: list[str] = field(default_factory=list)
    previous: list[int] = field(default_factory=list)
    closed: bool = False


def _zone_superblock(device: ZonedDevice, z, written: int) -> tuple[Superblock | None, bool, int | None]:
    """``(superblock, damaged, copy used)`` of meta zone ``z``: block 0, else block 1 (version 3
    chain zones hold two copies).  ``damaged``: a copy that holds the magic fails its checksum, or
    only block 1 is intact; a zone with neither copy is ``(None, damaged, None)``."""
    g = device.geometry
    bs = g.block_size
    raw = device.read(z.start, min(2 * bs, max(written, bs)))
    b0, b1 = raw[:bs], raw[bs:2 * bs]
    sb0 = Superblock.decode(b0, g)
    if sb0 is not None:
        # a v3 chain zone's copy 1 should be intact too; a damaged one is rewritten by a repair
        bad1 = (sb0.version >= 3 and not sb0.flags & SPARE and len(b1) == bs
                and Superblock.decode(b1, g) is None)
        return sb0, bad1, 0
    sb1 = Superblock.decode(b1, g) if len(b1) == bs else None
    if sb1 is not None and sb1.version >= 3 and not sb1.flags & SPARE:
        return sb1, True, 1
    return None, Superblock.has_magic(b0) or Superblock.has_magic(b1), None


def _recover_superblocks(device: ZonedDevice, zones, bad: list[int], sbs: dict[int, Superblock],
                         spares: dict[int, Superblock], notes: list[str]) -> tuple[list[int], bool]:
    """Give a superblock back to each meta zone in ``bad`` (both copies lost) that holds journal
    records after its superblock blocks: a chain zone, whose superblock is the store's (uuid,
    geometry, policy: the same in every meta zone's copy) with the chain's sequence and the part
    that is missing.  A zone starting with a snapshot head is part 0 (of the newest chain, or of a
    chain of its own under the highest sequence a spare names when no chain zone kept a copy; when
    the newest chain found has its part 0, of the chain after it or of the previous chain (format
    5), as the record sequence number ``q`` of its head is above or below that chain's);
    another is the newest chain's missing part.  ZenFS writes the superblock to every meta zone for
    this reason (``ZenFS::MkFS``); btrfs keeps superblock mirrors at fixed offsets.  Adds what it
    recovered to ``sbs`` and ``notes``; returns ``(zones still without one, recovered any)``.
    """
    template = next(iter(sbs.values()), None) or max(spares.values(), key=lambda sb: sb.sequence)
    g = device.geometry
    bs = g.block_size
    heads: dict[int, tuple[Kind | None, int | None]] = {}
    for zi in bad:
        got = _first_record(device, zones[zi], head_bytes(template.version, bs))
        if got is not None:
            heads[zi] = got
    if not heads:
        return bad, False
    by_seq: dict[int, dict[int, int]] = {}
    for zi, sb in sbs.items():
        by_seq.setdefault(sb.sequence, {})[sb.part] = zi
    # a spare is written by a roll under the new chain's sequence: a higher one than every chain's
    # names the chain whose superblocks are lost
    top = max([*by_seq, *(sb.sequence for sb in spares.values())])
    parts = set(by_seq.get(top, {}))
    firsts = sorted((zi for zi, (k, _) in heads.items() if k is Kind.SNAP),
                    key=lambda zi: -1 if heads[zi][1] is None else heads[zi][1], reverse=True)
    rest = sorted(zi for zi, (k, _) in heads.items() if k is not Kind.SNAP)
    assign: dict[int, tuple[int, int]] = {}
    if firsts and 0 not in parts:
        assign[firsts.pop(0)] = (top, 0)
        parts = parts | {0}
    elif firsts and top in by_seq:
        # part 0 of the newest chain is there: a snapshot head is of a newer chain (format 5: the
        # newest chain's while the one found is its previous chain) or of the previous chain, by
        # the record sequence number its head carries against the found chain's
        top_head = _first_record(device, zones[by_seq[top][0]], head_bytes(sbs[by_seq[top][0]].version, bs))
        top_q = None if top_head is None else top_head[1]
        q = heads[firsts[0]][1]
        if q is not None and top_q is not None and q > top_q:
            assign[firsts.pop(0)] = (top + 1, 0)
        elif q is not None and top_q is not None and q < top_q and top - 1 not in by_seq:
            assign[firsts.pop(0)] = (top - 1, 0)
    missing = [p for p in range(max(parts | {0}) + len(rest) + 1) if p not in parts]
    for zi, p in zip(rest, missing, strict=False):
        assign[zi] = (top, p)
    src = next(iter(sbs), None)
    if src is None:
        src = max(spares, key=lambda zi: spares[zi].sequence)
    for zi, (seq, part) in assign.items():
        sbs[zi] = dataclasses.replace(template, sequence=seq, part=part, flags=template.flags & ~SPARE)
        notes.append(f"meta zone {zi}: both superblock copies are lost; its journal records were kept with the "
                     f"superblock of meta zone {src} (sequence {seq}, part {part}) (fsck --repair rewrites it)")
    return [zi for zi in bad if zi not in assign], True


def _first_record(device: ZonedDevice, z, head: int) -> tuple[Kind | None, int | None] | None:
    """``(kind, q)`` of the first record of meta zone ``z`` (its records start at byte ``head``;
    copy 1 when copy 0 is damaged); ``q`` is ``None`` when it carries none or does not decode.
    ``None`` when neither copy is intact."""
    g = device.geometry
    bs = g.block_size
    written = z.capacity if z.cond == ZoneCond.FULL else z.wp - z.start
    if written < head + bs:
        return None
    win = ZoneWindow.on(device, z.start, written)
    limit = record_limit(g.zone_capacity, bs, head)
    n, total, ok, view = win.frame(head, bs, limit)
    if not ok:
        n, total, ok, view = win.frame(head + total, bs, limit) \
            if total else (0, 0, False, None)     # copy 0 of the first record damaged: copy 1
    if not ok:
        return None
    payload = bytes(view[FRAME_HEADER:FRAME_HEADER + n])
    try:
        q = decode(payload).q
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        q = None
    return kind_of(payload), q


def no_store_error(name: str) -> ForeignDeviceError:
    """The one refusal of a device without a superblock in its first zones (never formatted, or
    something else's), naming the command that formats it."""
    return ForeignDeviceError(f"{name} holds no RetainZ store (no superblock in its first zones); "
                              f"format it with `retainz mkfs {name}`")


def scan(device: ZonedDevice, *, salvage: bool = False, state_known: bool = True) -> MountScan:
    """Find the current journal chain on ``device`` and read its records.

    Args:
        salvage: skip damaged records (:func:`parse_zone`) instead of raising; what was lost is in
            :attr:`MountScan.lost`.
        state_known: the device reports its zones' conditions and write pointers.  ``False`` (a
            device file whose every zone-state copy was lost reads every zone as Full until a repair
            rebuilds the state): zeros end a zone's records, as before format 6, since no Full
            zone can be told from one cut short.

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
    spares: dict[int, Superblock] = {}
    bad: list[int] = []
    headless: list[int] = []     # non-empty, no superblock copy (and no damaged magic either)
    notes: list[str] = []
    damaged = False
    n_meta = len(zones)
    for z in zones:
        if z.index >= n_meta:
            break
        if z.cond == ZoneCond.EMPTY:
            continue
        written = z.capacity if z.cond == ZoneCond.FULL else z.wp - z.start
        sb, hurt, used = _zone_superblock(device, z, written)
        if sb is None:
            (bad if hurt else headless).append(z.index)
            continue
        sb.check_supported(f"{device.name} meta zone {z.index}")
        if hurt:
            damaged = True
            notes.append(f"meta zone {z.index}: superblock copy {1 - used} is damaged; copy {used} was used")
        if not sbs and not spares:
            n_meta = min(sb.meta_zones, len(zones))
        (spares if sb.flags & SPARE else sbs)[z.index] = sb
    bad = [z for z in bad if z < n_meta]
    headless = [z for z in headless if z < n_meta]
    if sbs or spares:     # a chain zone whose every superblock copy is lost: rebuilt from another copy
        left, found = _recover_superblocks(device, zones, bad + headless, sbs, spares, notes)
        bad = [z for z in bad if z in left]
        damaged = damaged or found
    if not sbs:
        if bad or spares:
            raise CorruptJournalError(f"meta zone(s) {bad}: the RetainZ superblock fails its checksum "
                                      "and no other copy exists: corrupt store" if bad else
                                      f"meta zones {sorted(spares)} hold spare superblocks but no zone holds "
                                      "a journal chain: corrupt store")
        raise no_store_error(device.name)
    damaged_spares = []
    for zi in bad:   # only block 0 written (a spare, or a roll cut before its copy 1): not a chain zone
        z = zones[zi]
        if (z.cond != ZoneCond.FULL and z.wp - z.start <= bs) or (
                z.cond == ZoneCond.FULL and not device.read(z.start + bs, bs).strip(b"\0")):
            damaged_spares.append(zi)
    bad = [z for z in bad if z not in damaged_spares]
    if bad:
        raise CorruptJournalError(f"meta zone(s) {bad}: both superblock copies fail their checksums, and the "
                                  "zone holds no journal record another superblock copy could stand for: "
                                  "corrupt store")
    for zi in damaged_spares:
        damaged = True
        notes.append(f"meta zone {zi}: its one superblock block (a spare) is damaged; the chain's copies were used")
    every = {**sbs, **spares}
    if len({sb.uuid for sb in every.values()}) > 1:
        raise CorruptJournalError("meta zones hold superblocks of different stores: "
                                  + ", ".join(f"zone {z}: {sb.uuid}" for z, sb in sorted(every.items())))
    by_seq: dict[int, dict[int, int]] = {}
    for z, sb in sbs.items():
        parts = by_seq.setdefault(sb.sequence, {})
        if sb.part in parts:
            raise CorruptJournalError(f"meta zones {parts[sb.part]} and {z} both claim part {sb.part} of "
                                      f"journal sequence {sb.sequence}")
        parts[sb.part] = z
    fallbacks = 0
    gap = ""
    for seq in sorted(by_seq, reverse=True):
        chain = _chain_of(by_seq[seq])
        if chain is None:
            # a roll cut before its flush may keep a later part and not an earlier one (zones keep
            # their writes independently): an incomplete chain when an older one is complete
            gap = gap or f"journal sequence {seq} has parts {sorted(by_seq[seq])}: a part is missing"
            fallbacks += 1
            continue
        open_part = next((z for z in chain[:-1] if zones[z].cond != ZoneCond.FULL), None)
        if open_part is not None:
            # a roll finishes each zone of its chain before it writes the next: a part not Full
            # before the last is a roll cut before its flush (damage never changes a zone's
            # condition), and its records may stop anywhere: fall back to the older chain
            gap = gap or f"journal sequence {seq}: part in meta zone {open_part} is not finished: a rollover cut short"
            fallbacks += 1
            continue
        got = _parse_chain(device, zones, chain, sbs, state_known)
        if not _complete(got.payloads, got.holes):
            # an older chain still on the device means this one's roll never completed (the
            # old chain is reset only after the new one is flushed): fall back to it
            gap = gap or (got.lost[0] if got.lost else "")
            fallbacks += 1
            continue
        previous = _chain_of(by_seq.get(seq - 1, {})) or []
        payloads, chain_notes = got.payloads, list(got.notes)
        lost_items = list(zip(got.lost_at, got.lost, strict=True))
        body, head_q = _snapshot_span(payloads)
        if previous and head_q is None and lost_items:
            # the head lost with its snapshot end: the first appended record's ``q`` less one is
            # where the previous chain must end (a gap in ``q`` would show a lost record)
            first = next((i for i, p in enumerate(payloads) if p is not LOST and kind_of(p) in _APPENDED_KINDS), None)
            q = _q_of(payloads[first]) if first is not None else None
            if q is not None:
                body, head_q = first, q - 1
        if previous and head_q is not None and any(i < body for i, _ in lost_items):
            cover = _previous_copy(device, zones, previous, sbs, head_q)
            if cover is not None:
                chain_notes += [f"{m}; the previous journal chain (sequence {seq - 1}, meta zones {previous}) "
                                "holds the same records: they were replayed in place of this chain's snapshot"
                                for i, m in lost_items if i < body]
                payloads = cover + payloads[body:]
                lost_items = [(i - body + len(cover), m) for i, m in lost_items if i >= body]
        if lost_items and not salvage:
            raise CorruptJournalError(lost_items[0][1])
        stale = [z.index for z in zones[:n_meta] if z.cond != ZoneCond.EMPTY and z.index not in chain
                 and z.index not in spares and z.index not in previous]
        return MountScan(sb=sbs[chain[0]], chain=chain, payloads=payloads, end=got.end, torn=got.torn,
                         stale=stale, fallbacks=fallbacks, spares=sorted(spares),
                         notes=notes + chain_notes, damaged=damaged or bool(chain_notes),
                         lost=[m for _, m in lost_items], previous=previous, closed=got.closed)
    raise CorruptJournalError(gap or "no journal chain with a complete snapshot: corrupt store")


def _chain_of(parts: dict[int, int]) -> list[int] | None:
    """The meta zones of a chain ``{part: zone}`` in part order; ``None`` when a part is missing."""
    if not parts or sorted(parts) != list(range(len(parts))):
        return None
    return [parts[p] for p in range(len(parts))]


def _complete(payloads: list[bytes], holes: list[int]) -> bool:
    """A chain that was written whole, so it is the current one: it starts with its snapshot head
    (or a damaged record standing for it) and holds its snapshot end, or a hole (a damaged record
    a valid one follows in the same zone: ``ZoneParse.holes``).  A roll cut before its flush leaves
    a prefix of each zone's writes (a torn tail at most: a power cut lands a prefix of a write,
    ``zoned.faulty``; the zones of a chain of several parts keep theirs independently), never a
    hole; so a damaged chain (the head or the end lost with every copy included) is never passed
    over for an older one, which would lose every record appended since the roll, deletions
    included (issue 41: "nothing deleted comes back").  Nor is one holding an appended record
    (:data:`_APPENDED_KINDS`) after damage in an earlier part: records are appended only once the
    roll is flushed, so its snapshot was whole (a lost tail of its Full first part, the snapshot end
    and close lost with every copy, used to pass the chain over and list a generation deleted in its
    next part again)."""
    if not payloads or (payloads[0] is not LOST and kind_of(payloads[0]) is not Kind.SNAP):
        return False
    return bool(holes) or any(p is not LOST and kind_of(p) in (Kind.SNAP_END, *_APPENDED_KINDS) for p in payloads)


#: Kinds of the records of a snapshot (the rest are appended after its end).
_SNAPSHOT_KINDS = (Kind.SNAP, Kind.ZONES, Kind.GENS, Kind.SNAP_END)
#: Kinds appended to a chain after its roll was flushed (never part of a snapshot or a close).
_APPENDED_KINDS = (Kind.COMMIT, Kind.DELETE, Kind.MOVE, Kind.SYNC, Kind.HINT)


def _q_of(payload: bytes) -> int | None:
    """The record sequence number ``q`` of an intact payload, ``None`` when it carries none."""
    try:
        return decode(payload).q
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None


def _snapshot_span(payloads: list[bytes]) -> tuple[int, int | None]:
    """``(body, q)`` of a chain's snapshot: ``payloads[:body]`` are its records (``LOST`` marks
    among them stand for damaged snapshot records) and ``q`` is the sequence number its head
    carries (``None``: unknown).  The span ends after the snapshot end; when that is lost, at the
    first appended record if its ``q`` follows the head's (no appended record was lost before it),
    else after the last intact snapshot record (a ``LOST`` mark after it may hold appended records,
    and stays a gap for the replay).  A lost head's ``q`` is the first appended record's less one,
    when that record directly follows the intact snapshot end."""
    intact = [(i, kind_of(p)) for i, p in enumerate(payloads) if p is not LOST]
    head_q = _q_of(payloads[0]) if payloads and payloads[0] is not LOST else None
    send = next((i for i, k in intact if k is Kind.SNAP_END), None)
    if send is not None:
        if head_q is None and send + 1 < len(payloads) and payloads[send + 1] is not LOST \
                and kind_of(payloads[send + 1]) not in _SNAPSHOT_KINDS:
            q = _q_of(payloads[send + 1])
            head_q = q - 1 if q is not None else None
        return send + 1, head_q
    first = next((i for i, k in intact if k not in _SNAPSHOT_KINDS), None)
    if first is not None and head_q is not None and _q_of(payloads[first]) == head_q + 1:
        return first, head_q
    last = max((i for i, k in intact if k in _SNAPSHOT_KINDS and (first is None or i < first)), default=-1)
    return last + 1, head_q


def _parse_chain(device: ZonedDevice, zones, chain: list[int], sbs: dict[int, Superblock],
                 state_known: bool = True) -> ZoneParse:
    """Every record of the chain's zones, in order, salvaging (:func:`parse_zone`): ``lost_at``
    indexes the whole chain's payloads, ``end`` and ``torn`` are its last zone's.  ``state_known``:
    see :func:`scan`."""
    g = device.geometry
    bs = g.block_size
    out = ZoneParse()
    for i, zi in enumerate(chain):
        z = zones[zi]
        written = z.capacity if z.cond == ZoneCond.FULL else z.wp - z.start
        head = head_bytes(sbs[zi].version, bs)
        parsed = parse_zone(ZoneWindow.on(device, z.start, written), head, written, bs, zone=zi,
                            tail=i == len(chain) - 1, full=z.cond == ZoneCond.FULL,
                            limit=record_limit(g.zone_capacity, bs, head), salvage=True,
                            closing=sbs[zi].version >= 6 and state_known)
        if written < head:   # a roll cut between its superblock copies: a torn tail (rolled over)
            parsed.end, parsed.torn = written, head - written
        out.lost_at += [len(out.payloads) + j for j in parsed.lost_at]
        out.holes += [len(out.payloads) + j for j in parsed.lost_at if j < len(parsed.payloads) - 1]
        out.lost += parsed.lost
        out.payloads += parsed.payloads
        out.notes += parsed.notes
        out.end, out.torn, out.closed = parsed.end, parsed.torn, parsed.closed
    return out


def _previous_copy(device: ZonedDevice, zones, previous: list[int], sbs: dict[int, Superblock],
                   q: int) -> list[bytes] | None:
    """The previous chain's records up to the current chain's snapshot (format version 5, module
    docstring "Previous chain"): the snapshot it replaced and every record appended after it, up to
    the sequence number ``q`` the current snapshot head carries.  Replayed, they give the
    state that snapshot holds.  ``None`` when they cannot stand for it: a record of the previous
    chain up to ``q`` is damaged (with every copy), its snapshot is incomplete, or its records do
    not reach ``q`` exactly.  Damage after the record that reaches ``q`` (a lost tail of its Full
    zone, its close record lost: format version 6) costs nothing: what lay there came after the
    current snapshot, which the current chain holds."""
    got = _parse_chain(device, zones, previous, sbs)
    if not _complete(got.payloads, got.holes):
        return None
    out: list[bytes] = []
    top = None
    for p in got.payloads:
        if p is LOST:
            if top == q:
                break           # damage after the current snapshot's point: not needed
            return None
        try:
            rq = decode(p).q
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            return None
        if rq is not None and rq > q and kind_of(p) is not Kind.SNAP:
            break               # a record after the roll (one whose write failed: the roll withdrew it)
        out.append(p)
        if rq is not None:
            top = rq
    return out if top == q else None


class Journal:
    """Appends records to the current chain and rolls it over.

    Args:
        device: the device.
        sb: the superblock of the current chain (``part`` ignored).
        chain: the chain's meta zones, in order.
        end: write position in the chain's last zone (bytes from its start).
        snapshot: callable returning the snapshot payloads of the store's current state (used by
            :meth:`roll`; the store's :class:`~retainz.store.metalog.MetadataLog` sets it).
        spares: meta zones holding an intact spare superblock (a roll keeps them, and writes one
            into every free meta zone that is empty).
        previous: meta zones of the previous chain, the second copy of the current snapshot (module
            docstring, "Previous chain"): a roll writes the new chain elsewhere when it can, and
            resets them only once the new chain is durable.
        closed: the chain's last zone already holds its close record (:attr:`MountScan.closed`).

    Attributes:
        seal: callable returning ``(q, (count, digest, commit_seq))`` after the last record appended
            (the store's :class:`~retainz.store.metalog.MetadataLog` sets it): what the close record
            of the chain's last zone carries (:func:`~retainz.store.records.close_record`).
    """

    def __init__(self, device: ZonedDevice, sb: Superblock, chain: list[int], end: int,
                 snapshot: Callable[[], list[bytes]] | None = None, spares: list[int] | None = None,
                 previous: list[int] | None = None, closed: bool = False):
        self.device = device
        self.sb = sb
        self.chain = list(chain)
        self.previous = list(previous or ())
        self.end = end
        self.snapshot = snapshot
        g = device.geometry
        self.bs = g.block_size
        self.zone_size = g.zone_size
        self.capacity = g.zone_capacity
        self.meta = list(range(sb.meta_zones))
        self.spares = set(spares or ())
        self.bytes_written = 0
        self.records = 0
        self.rollovers = 0
        #: a record write failed: the chain's tail is unknown, so the next append rolls over first
        self.fenced = False
        #: the chain's last zone holds its close record: it takes no more records
        self.closed = closed
        self.seal: Callable[[], tuple[int, tuple[int, int, int]]] | None = None

    @property
    def max_record(self) -> int:
        """Largest payload a record may have (:func:`~retainz.store.records.write_limit`: both its
        copies fit a meta zone after its superblock copies, and at most ``MAX_RECORD_BYTES``)."""
        return write_limit(self.capacity, self.bs)

    @property
    def max_frame(self) -> int:
        """Bytes of the largest record's frames, both copies (:attr:`max_record` framed and block
        padded, twice): what a refusal's ``NoSpaceError.available`` gives, in the frame bytes its
        ``needed`` counts (at most a chain zone's capacity less the superblock copies)."""
        return 2 * frame_size(self.max_record + COPY_MEMBER_BYTES, self.bs)

    @property
    def tail(self) -> int:
        """Bytes every zone of this chain keeps free for its close record (format version 6:
        :func:`~retainz.store.records.close_bytes`; 0 before)."""
        return close_bytes(self.sb.version, self.bs)

    def room(self) -> int:
        """Bytes left in the chain's last zone (0 once it is closed)."""
        return 0 if self.closed else self.capacity - self.end

    def append(self, payload: bytes, *, flush: bool = True) -> None:
        """Append one record (rolling over first if the last zone has no room) and flush.

        A failed record write fences the chain (:attr:`fenced`): the device may hold part of the
        record, so the next append first rolls over to a fresh chain.

        Raises:
            NoSpaceError: the record is larger than a meta zone (``needed``: its frame's bytes,
                ``available``: :attr:`max_frame`), or a needed rollover does not fit the free meta
                zones (nothing was written).
            ZonedDeviceError: the write or the flush failed.
        """
        if len(payload) > self.max_record:
            raise NoSpaceError(f"journal record of {len(payload)} bytes does not fit a meta zone "
                               f"(at most {self.max_record} bytes a record)",
                               needed=2 * frame_size(len(payload) + COPY_MEMBER_BYTES, self.bs),
                               available=self.max_frame)
        frames = append_frames(payload, self.bs)
        size = sum(map(len, frames))
        if not fits(self.end, size, self.capacity, self.tail) or self.fenced or self.closed:
            self.roll(reserve=size)
            self.fenced = False
        at = self.chain[-1] * self.zone_size + self.end
        try:
            for f in frames:    # copy 0, then copy 1: a write cut short tears one copy at most
                self.device.write(at, f)
                at += len(f)
        except ZonedDeviceError:
            # the device may have written part of it: the next record goes to a fresh chain
            self.fenced = True
            raise
        self.end += size
        self.bytes_written += size
        self.records += 1
        if flush:
            self.device.flush()

    def roll(self, payloads: list[bytes] | None = None, *, reserve: int = 0) -> None:
        """Write a fresh snapshot under ``sequence + 1`` into free meta zones; the old chain becomes
        the previous chain (the new snapshot's second copy) and the one before it is reset (see the
        module docstring).  The new chain's last zone keeps at least ``reserve`` bytes free (the
        record that triggered the roll), so one roll always suffices.

        Raises:
            NoSpaceError: a snapshot record larger than a meta zone (``needed``: its frame's bytes,
                ``available``: :attr:`max_frame`), or the snapshot needs more meta zones than are
                free (nothing was written either way).
        """
        if payloads is None:
            if self.snapshot is None:
                raise ValueError("Journal.roll: no snapshot source (give payloads, or set Journal.snapshot)")
            payloads = self.snapshot()
        frames = [frame(p, self.bs) for p in payloads]
        # the previous chain's zones last: it stays the current snapshot's copy until the new one is durable
        free = [z for z in self.meta if z not in self.chain and z not in self.previous]
        free += [z for z in self.previous if z not in self.chain]
        room = self.capacity - close_bytes(FORMAT_VERSION, self.bs)    # the new chain's close keeps its room
        for p, f in zip(payloads, frames, strict=True):
            if len(p) > record_limit(room, self.bs):
                raise NoSpaceError(f"a journal snapshot record of {len(f)} bytes does not fit a meta zone",
                                   needed=len(f), available=frame_size(record_limit(room, self.bs), self.bs))
        plan = [[frames[i] for i in group]
                for group in plan_zones(map(len, frames), self.capacity, self.bs, reserve)]
        head = head_bytes(FORMAT_VERSION, self.bs)
        total = sum(map(len, frames)) + head * len(plan)
        if len(plan) > len(free):
            raise NoSpaceError(
                f"journal snapshot of {total} bytes needs {len(plan)} meta zones but {len(free)} are free "
                f"({len(self.meta)} meta zones of {self.capacity} bytes); format with more meta zones",
                needed=total, available=len(free) * self.capacity)
        dev = self.device
        use = free[:len(plan)]
        for z in free:   # the zones the new chain takes, and anything but an intact spare or the previous chain
            if dev.zone(z).cond != ZoneCond.EMPTY and (z in use or (z not in self.spares and z not in self.previous)):
                dev.reset_zone(z)
                self.spares.discard(z)
        old = self.chain
        if old and dev.zone(old[-1]).cond not in (ZoneCond.FULL, ZoneCond.EMPTY):
            self.close_zone(old[-1])
            dev.finish_zone(old[-1])
        seq = self.sb.sequence + 1
        # spares first: no meta zone is active now (the old chain's last is finished), so each
        # spare (written, then finished) needs one active zone at most, like the journal
        for z in free[len(plan):]:
            if z not in self.previous and dev.zone(z).cond == ZoneCond.EMPTY:
                self.write_spare(z, seq)
        new: list[int] = []
        for part, group in enumerate(plan):
            z = use[part]
            if new:
                dev.finish_zone(new[-1])
            sb = Superblock(uuid=self.sb.uuid, sequence=seq, part=part, geometry=self.sb.geometry,
                            meta_zones=self.sb.meta_zones, gc_reserve_zones=self.sb.gc_reserve_zones,
                            policy=self.sb.policy, flags=self.sb.flags)
            block = sb.encode()
            data = block * 2 + b"".join(group)    # two superblock copies (format version 3)
            closes = part < len(plan) - 1 and self.tail > 0
            if closes:      # a zone the snapshot spills over and does not fill: finished after its close
                data += b"".join(append_frames(close_record(len(data)), self.bs))
            dev.write(z * self.zone_size, data)
            self.bytes_written += len(data)
            self.records += len(group) + closes
            new.append(z)
            self.end = len(data)
        dev.flush()
        retired, self.previous = self.previous, old
        self.sb = Superblock(uuid=self.sb.uuid, sequence=seq, part=0, geometry=self.sb.geometry,
                             meta_zones=self.sb.meta_zones, gc_reserve_zones=self.sb.gc_reserve_zones,
                             policy=self.sb.policy, flags=self.sb.flags)
        self.chain = new
        self.closed = False
        self.rollovers += 1
        for z in retired:   # the new chain is durable: the chain before the old one is not needed
            if z not in use:
                try:
                    if dev.zone(z).cond != ZoneCond.EMPTY:
                        dev.reset_zone(z)
                except ZonedDeviceError:
                    pass    # an older chain left behind: stale at mount, reset by the next roll

    def close_zone(self, zone: int) -> None:
        """Write the close record of the chain's last zone ``zone`` (format version 6:
        :func:`~retainz.store.records.close_record`, both copies at its write pointer, flushed so
        that the finish after it never lands alone) unless it has one.  Its end is :attr:`end`,
        the end of the last record written whole: a write that failed or was torn since lies
        between the two and is never replayed.

        Raises:
            ZonedDeviceError: the write or the flush failed (the chain is fenced: the next roll
                writes another close after whatever this one left).
        """
        if self.closed or not self.tail:
            return
        dev = self.device
        z = dev.zone(zone)
        at = z.wp - z.start
        head = head_bytes(self.sb.version, self.bs)
        writes = []
        if at < head:       # a roll cut between the zone's superblock copies: the head is completed first
            sb = dataclasses.replace(self.sb, part=len(self.chain) - 1)
            writes.append(sb.encode() * ((head - at) // self.bs))
        writes += append_frames(close_record(max(self.end, head), self.seal() if self.seal is not None else None),
                                self.bs)
        size = sum(map(len, writes))
        if at + size > self.capacity:   # no room (a device that moved the write pointer past the
            return                      # reserve): the zone reads as a lost tail, never as whole
        try:
            for f in writes:
                dev.write(z.start + at, f)
                at += len(f)
            dev.flush()
        except ZonedDeviceError:
            self.fenced = True
            raise
        self.bytes_written += size
        self.records += 1
        self.closed = True

    def previous_damage(self) -> list[str]:
        """What is damaged in the previous chain (``fsck``; a mount reads it only when the current
        snapshot needs it): one line per record lost with every copy, per damaged copy, or for a
        chain that could no longer stand for the current snapshot.  Reads the previous chain's zones; writes nothing."""
        if not self.previous:
            return []
        dev = self.device
        zones = {z.index: z for z in dev.report_zones(0, max(self.previous) + 1)}
        sbs = {}
        for zi in self.previous:
            z = zones[zi]
            written = z.capacity if z.cond == ZoneCond.FULL else z.wp - z.start
            sb = _zone_superblock(dev, z, written)[0] if z.cond != ZoneCond.EMPTY else None
            if sb is None:
                return [f"meta zone {zi}: the previous journal chain's superblocks are lost: it is no copy of the "
                        "current snapshot any more (fsck --repair rewrites it)"]
            sbs[zi] = sb
        got = _parse_chain(dev, zones, self.previous, sbs)
        out = [f"{m} (in the previous journal chain, the current snapshot's copy; fsck --repair rewrites it)"
               for m in got.lost + got.notes]
        if not got.lost and not _complete(got.payloads, got.holes):
            out.append(f"meta zones {self.previous}: the previous journal chain's snapshot is incomplete: it is no "
                       "copy of the current snapshot (fsck --repair rewrites it)")
        return out

    def write_spare(self, zone: int, sequence: int | None = None) -> None:
        """Write a spare superblock (flag ``SPARE``) into empty meta zone ``zone`` and finish it
        (format version 3: :mod:`.format`, "Redundancy").  Not flushed (the caller's flush or the
        next one makes it durable; a spare is only a copy).

        Raises:
            ZonedDeviceError: the write or the finish failed (e.g. the active-zone limit).
        """
        sb = Superblock(uuid=self.sb.uuid, sequence=self.sb.sequence if sequence is None else sequence, part=0,
                        geometry=self.sb.geometry, meta_zones=self.sb.meta_zones,
                        gc_reserve_zones=self.sb.gc_reserve_zones, policy=self.sb.policy,
                        flags=self.sb.flags | SPARE)
        self.device.write(zone * self.zone_size, sb.encode())
        self.device.finish_zone(zone)
        self.bytes_written += self.bs
        self.spares.add(zone)
