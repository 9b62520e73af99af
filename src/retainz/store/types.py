"""What the store hands back: catalog entries, metrics and reports (data only).

Extents are plain tuples ``(zone, offset, length, crc)`` on the hot path (no per-extent objects):

* ``zone``: device zone index;
* ``offset``: byte offset of the extent inside the zone (block aligned);
* ``length``: bytes of shard data in the extent (only a shard's last extent may end mid-block; the
  extent occupies ``length`` rounded up to the block size on the device);
* ``crc``: crc32c of the ``length`` data bytes, or ``None`` for a counted extent written by size on a
  payload-less device (trace replay).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field

from retainz.hint import Hint

__all__ = ["Extent", "GenState", "ShardInfo", "GenerationInfo", "StoreMetrics", "GCReport",
           "FsckReport", "SpaceReport"]

#: ``(zone, offset in zone, length in bytes, crc32c or None)``.
Extent = tuple[int, int, int, "int | None"]


class GenState(enum.Enum):
    """A generation's life : writing -> committed (or aborted) -> deleted."""

    WRITING = "writing"
    COMMITTED = "committed"
    ABORTED = "aborted"
    DELETED = "deleted"
    #: a repair lost a journal record that could have deleted or changed it (docs/format.md,
    #: "Repair"): kept on the device, not listed nor read, until ``Store.restore`` or ``Store.delete``
    UNKNOWN = "unknown"


@dataclass(slots=True)
class ShardInfo:
    """One shard of a generation.  Read-only for callers.

    Attributes:
        name: shard name (a file name, e.g. ``__0_0.distcp``).
        size: bytes of data.
        crc: crc32c of the whole shard, ``None`` for a counted (payload-less) shard.
        extents: the shard's :data:`Extent` tuples, in data order.
    """

    name: str
    size: int
    crc: int | None
    extents: tuple = ()


@dataclass(slots=True)
class GenerationInfo:
    """One generation (a checkpoint save).  Read-only for callers.

    Attributes:
        id: the generation id.
        step: the training step it was saved at.
        hint: the retention hint given at ``begin_generation`` (journaled with the commit).
        state: :class:`GenState`.
        shards: ``{name: ShardInfo}`` in write order.
        commit_seq: position of its commit record in the journal (0 while writing), a total order
            of commits.
        unknown_reason: why a repair made it :attr:`GenState.UNKNOWN` ("" otherwise).
    """

    id: str
    step: int
    hint: Hint = field(default_factory=Hint)
    state: GenState = GenState.WRITING
    shards: dict[str, ShardInfo] = field(default_factory=dict)
    commit_seq: int = 0
    unknown_reason: str = ""

    @property
    def size(self) -> int:
        """Bytes of shard data."""
        return sum(s.size for s in self.shards.values())


@dataclass
class StoreMetrics:
    """Counters the store keeps (the run records' ``metrics``).  Bytes are device bytes (block-rounded);
    byte-steps integrate bytes over training steps reported through ``advance``.

    They are journaled with every snapshot and at a clean close; after a crash they resume from the
    last snapshot or close (the bytes of the lost session are not recounted).

    Attributes:
        host_bytes: bytes written on behalf of users (shard data, block-rounded).
        gc_bytes: bytes copied by garbage collection.
        resets: data-zone resets.
        finishes: data-zone finishes (allocator decisions).
        unused_capacity_bytes: zone capacity never written between a zone's opening and its finish
            or reset (bytes), summed over zones: ``capacity - written`` counted when a zone is
            finished, and when a zone that is not full is reset (a zone left part-empty until its
            data died: what a policy that never finishes pays instead of dead space).  Zones
            still open at the end of a run are not counted.
        unused_capacity_byte_steps: the same capacity integrated over the steps it lies unusable
            (byte-steps): for a finished zone, ``(capacity - written) x`` the steps from its finish
            to its reset (integrated as time advances); for a zone reset while part-empty,
            ``(capacity - written) x`` the steps from its last write (``ZoneSummary.last_write_step``,
            journaled) to its reset, charged at the reset.  A zone reset at recovery counts alike,
            from the journaled last write step (or, when the device holds bytes written after the
            last record, from the latest step the journal knows).
        dead_space_byte_steps: integral over steps of dead-but-unreclaimed bytes.
        peak_occupancy: the largest live + dead bytes seen (sampled after every shard, commit and
            deletion).
        decisions: allocator ``place`` calls.
        decision_cpu_seconds: CPU time of the calling thread spent inside ``place``
            (``time.thread_time``: other processes on a loaded machine do not inflate it).
        journal_bytes: bytes written to meta zones (records, padding, superblocks, snapshots).
        journal_records: records appended.
        rollovers: journal rollovers.
        generations_committed, generations_deleted, generations_aborted: counts.
    """

    host_bytes: int = 0
    gc_bytes: int = 0
    resets: int = 0
    finishes: int = 0
    unused_capacity_bytes: int = 0
    unused_capacity_byte_steps: int = 0
    dead_space_byte_steps: int = 0
    peak_occupancy: int = 0
    decisions: int = 0
    decision_cpu_seconds: float = 0.0
    journal_bytes: int = 0
    journal_records: int = 0
    rollovers: int = 0
    generations_committed: int = 0
    generations_deleted: int = 0
    generations_aborted: int = 0

    @property
    def waf(self) -> float:
        """Write amplification factor: ``(host_bytes + gc_bytes) / host_bytes`` (1.0 when no host
        bytes)."""
        return (self.host_bytes + self.gc_bytes) / self.host_bytes if self.host_bytes else 1.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["waf"] = self.waf
        return d


@dataclass
class GCReport:
    """What one ``gc()`` call did.

    Attributes:
        victims: zones collected (copied and reset), in order.
        skipped: zones the allocator named but GC left alone (holding data of a generation still
            being written, or not full, or a checksum mismatch while copying).
        partial: victims GC moved some extents out of but not all: the policy had no room for the
            rest (``NO_SPACE`` on their GC requests), or does not migrate their shards
            (``Allocator.migrates``: ZenFS moves only ``.sst`` files).  They keep those extents and
            are not reset.
        extents_moved: extents copied.
        extents_skipped: extents left in their victims for want of space.
        extents_kept: extents left in their victims because the policy does not migrate their shard.
        bytes_copied: bytes copied (block-rounded).
        zones_reset: zones reset, victims and all-dead zones.
        errors: why a victim was given up (checksum mismatch while copying, no space), one line each.
        reclaimable: bytes still reclaimable on the data zones after the pass (dead plus capacity
            lost to finishes, ``ZoneTable.reclaimable``).
        empty_zones: empty data zones after the pass; ``gc_reserve_zones``: the store's GC reserve
            (an unforced pass collects only while fewer than that many are empty, under the base
            and ``retainz`` rules).
        held_back: after an unforced pass, the zones a forced one (``gc(force=True)``) would collect
            now, the policy's rule at its most eager (:meth:`Collector.collect`); empty after a
            forced pass.  ``held_back_live``: the live bytes they hold (what the forced pass would
            copy); ``held_back_reclaimable``: the reclaimable bytes in them (what it would give back).
        waiting: why the unforced pass left ``held_back`` (one line, the store's words), else "".
    """

    victims: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    partial: list[int] = field(default_factory=list)
    extents_moved: int = 0
    extents_skipped: int = 0
    extents_kept: int = 0
    bytes_copied: int = 0
    zones_reset: int = 0
    errors: list[str] = field(default_factory=list)
    reclaimable: int = 0
    empty_zones: int = 0
    gc_reserve_zones: int = 0
    held_back: list[int] = field(default_factory=list)
    held_back_live: int = 0
    held_back_reclaimable: int = 0
    waiting: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class FsckReport:
    """What ``fsck()`` found.  ``ok`` is True when ``problems`` is empty.

    Attributes:
        generations, shards, extents: counts checked.
        bytes_verified: shard bytes read and checksummed.
        unverifiable_bytes: bytes of counted (payload-less) extents, which carry no checksum.
        problems: one line per problem (checksum mismatch, extent past a write pointer, summary
            mismatch...).
        repairs: on a store opened read-only, what a read-write open would repair (the normal
            recovery of a crash: zones to reset, a journal rollover); not problems.
        notes: what the device noticed when opened (:attr:`ZonedDevice.notes`); not problems.
        dropped: generations a repair did not keep (``{"id", "step", "reason"}``; ``id`` and
            ``step`` ``None`` when only the lost record named it).
        unknown: generations kept as unknown after a repair (``{"id", "step", "reason",
            "bytes"}``): not listed nor read until ``retainz fsck --restore``.
    """

    generations: int = 0
    shards: int = 0
    extents: int = 0
    bytes_verified: int = 0
    unverifiable_bytes: int = 0
    problems: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    unknown: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


@dataclass
class SpaceReport:
    """Space accounting, like ``zenfs df`` (bytes).

    Attributes:
        capacity: writable bytes of the data zones.
        free: bytes writable without a reset (remaining capacity of open and empty zones).
        used: live bytes.
        reclaimable: dead bytes plus capacity lost to early finishes (what resets give back).
        space_amplification: ``(used + reclaimable) / used`` in percent over 100, as zenfs prints
            ``Space amplification: N %`` ((written-to space / live) - 1, in percent).
        data_zones, meta_zones, empty_zones, open_zones, full_zones: zone counts.
        generations: committed generations.
        admissible: bytes a new generation can reserve now (free, less the writers' reservations
            and the GC reserve): what can be written.  ``free`` also counts the reserve.
        gc_reserve: bytes admission keeps free for GC (0 for a policy without admission control).
    """

    capacity: int = 0
    free: int = 0
    used: int = 0
    reclaimable: int = 0
    space_amplification: float = 0.0
    data_zones: int = 0
    meta_zones: int = 0
    empty_zones: int = 0
    open_zones: int = 0
    full_zones: int = 0
    generations: int = 0
    admissible: int = 0
    gc_reserve: int = 0

    def to_dict(self) -> dict:
        return asdict(self)
