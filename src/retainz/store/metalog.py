"""The metadata log as the store uses it: every state change is one journal record carrying the zone
attributes changed since the last one, and the journal's space is admitted like data space.

**Journal space.**  Every committed generation's entry is in every snapshot, so the log keeps the
snapshot's size (each entry's bytes, the largest, and estimates for generations being written) and
refuses work that a full journal could no longer roll over: a snapshot with the new work must fit
the meta zones the current chain leaves free, and at most half of all of them, so the rollover after
the next one still fits beside the chain the next one makes.  The room kept for the next record holds both
its copies (format 5: :func:`~retainz.store.records.append_frames`).  Deleting only shrinks the snapshot,
so every deletion (and GC move) until the catalog is empty can always be journaled.
"""

from __future__ import annotations

from retainz.errors import NoSpaceError
from retainz.store.catalog import Catalog
from retainz.store.journal import Journal
from retainz.store.records import (
    COPY_MEMBER_BYTES,
    EXTENT_BYTES,
    FRAME_HEADER,
    SNAPSHOT_HEAD_BYTES,
    ZONE_ATTR_BYTES,
    commit_record,
    delete_record,
    gen_entry_size,
    hint_record,
    move_record,
    pack_zones,
    snapshot_record_limit,
    snapshot_records,
    snapshot_zones,
    stamp,
    sync_record,
)
from retainz.store.types import GenerationInfo, GenState, StoreMetrics
from retainz.store.zonebook import ZoneBook
from retainz.zoned.model import round_up

__all__ = ["MetadataLog"]


#: The journal's space budget (used only here): a generation being admitted is estimated at
#: ``GEN_NAMES_BYTES`` of id, hint and shard names plus ``EXTENT_BYTES`` per expected extent and
#: ``SLACK_EXTENTS`` more (shard tails, zone splits).
GEN_NAMES_BYTES = 256
SLACK_EXTENTS = 8
#: A snapshot is sized with every entry 1/``GC_SPLIT_DIVISOR`` larger (GC moves split extents: 12.5 %),
#: ``SLACK_ZONES`` more zone attribute items than non-empty zones, and room for one more record as
#: large as the largest entry (at least ``MIN_RESERVE_RECORD`` bytes).
GC_SPLIT_DIVISOR = 8
SLACK_ZONES = 8
MIN_RESERVE_RECORD = 1024
#: Up to this many generations, a snapshot the O(1) bound says is too big is packed exactly.
EXACT_PACKING_LIMIT = 4096


class MetadataLog:
    """Appends the store's records to its :class:`~retainz.store.journal.Journal` and keeps the
    journal's space budget.

    Args:
        journal: the journal, positioned after the last valid record (its ``snapshot`` callable is
            set to :meth:`snapshot`, its ``seal`` to the record sequence number and live set after
            the last record: what its close record carries).
        catalog: the committed generations (what a snapshot holds).
        zones: the zone book (changed zone attributes, the opening counter, logical time).
        metrics: the store's counters (journal bytes, records, rollovers are kept equal to the
            journal's; the snapshot carries them).
        q: the sequence number of the last record replayed (format version 4, :mod:`.records`).

    Attributes:
        journal: the journal.
        q: the sequence number of the last record appended.
    """

    def __init__(self, journal: Journal, catalog: Catalog, zones: ZoneBook, metrics: StoreMetrics, q: int = 0):
        self.journal = journal
        self.q = q
        self.catalog = catalog
        self.zones = zones
        self.metrics = metrics
        journal.snapshot = self.snapshot
        journal.seal = lambda: (self.q, self.catalog.live)
        journal.bytes_written, journal.records, journal.rollovers = (metrics.journal_bytes,
                                                                     metrics.journal_records, metrics.rollovers)
        self._entries: dict[str, int] = {}  # committed generation -> bytes of its snapshot entry
        self._entries_total = 0
        self._biggest = 0                    # the largest entry seen (bytes)
        for gen in catalog.gens.values():
            self.track(gen)

    # -- records ---------------------------------------------------------------------------------------
    def _append(self, build) -> None:
        """Append the record ``build(zone attribute items, open_seq)`` makes, carrying the zones
        changed since the last record (flushed); on failure they stay marked."""
        dirty, items = self.zones.take_changed()
        j = self.journal
        try:
            j.append(stamp(build(items, self.zones.table.open_seq), self.q + 1, self.catalog.live))
        except BaseException:
            self.zones.mark(dirty)
            raise
        self.q += 1
        m = self.metrics
        m.journal_bytes, m.journal_records, m.rollovers = j.bytes_written, j.records, j.rollovers

    def commit(self, entry: bytes, replace_resets: list[int] | None = None) -> None:
        """Journal a commit of the generation entry ``entry`` (compact JSON bytes); with
        ``replace_resets``, one that retires the committed generation of the same id
        (:func:`~.records.commit_record`)."""
        now = self.zones.now
        self._append(lambda z, o: commit_record(entry, now, z, o, replace_resets))

    def delete(self, gen_id: str, resets: list[int]) -> None:
        """Journal the retirement of ``gen_id``; ``resets`` are reset after the record."""
        now = self.zones.now
        self._append(lambda z, o: delete_record(gen_id, resets, now, z, o))

    def move(self, moves: list, resets: list[int]) -> None:
        """Journal a GC pass's moves ``[[generation, shard, new extents]...]`` and victims."""
        now = self.zones.now
        self._append(lambda z, o: move_record(moves, resets, now, z, o))

    def hint(self, gen_id: str, hint) -> None:
        """Journal a new hint for committed ``gen_id``."""
        now = self.zones.now
        self._append(lambda z, o: hint_record(gen_id, hint, now, z, o))

    def sync(self) -> None:
        """Journal the zone attributes and metrics at a clean close."""
        now, metrics = self.zones.now, self.metrics_state()
        self._append(lambda z, o: sync_record(now, metrics, z, o))

    def metrics_state(self) -> dict:
        """The metrics as journaled (``waf`` is derived, not stored)."""
        m = self.metrics.to_dict()
        m.pop("waf")
        j = self.journal
        m["journal_bytes"], m["journal_records"], m["rollovers"] = j.bytes_written, j.records, j.rollovers
        return m

    def snapshot(self) -> list[bytes]:
        """The store's committed state as snapshot payloads (:func:`~.records.snapshot_records`)."""
        cat = self.catalog
        gens = [g for g in cat.gens.values() if g.state is GenState.COMMITTED or g.state is GenState.UNKNOWN]
        return snapshot_records(self.zones.now, cat.commit_seq, self.metrics_state(), self.zones.table.open_seq,
                                self.zones.attr_items(), gens, len(cat.gens),
                                snapshot_record_limit(self.journal.capacity, self.journal.bs), q=self.q)

    # -- space -----------------------------------------------------------------------------------------
    def track(self, gen: GenerationInfo, entry: bytes | None = None) -> int:
        """Record (or update, after a GC move) the snapshot bytes of committed ``gen``; returns them.
        ``entry``: its entry (:func:`~.records.gen_entry_bytes`) when the caller has it (a commit),
        so it is not encoded again."""
        n = gen_entry_size(gen) if entry is None else len(entry) + 1
        self._entries_total += n - self._entries.get(gen.id, 0)
        self._entries[gen.id] = n
        if n > self._biggest:
            self._biggest = n
        return n

    def forget(self, gen_id: str) -> None:
        """A retired generation leaves the snapshot."""
        self._entries_total -= self._entries.pop(gen_id, 0)

    def estimate(self, gen_id: str, declared: int, extent_bytes: int) -> int:
        """Snapshot bytes a generation being admitted may take (an estimate: its extents are not
        known yet): ``EXTENT_BYTES`` per extent, one per ``extent_bytes`` of its block-rounded
        declared size (1 MiB payload extents, or a zone for counted ones), plus 8 for shard tails
        and zone splits (``SLACK_EXTENTS``), and ``GEN_NAMES_BYTES`` of id, hint and shard names; at least the mean committed
        entry."""
        est = GEN_NAMES_BYTES + len(gen_id) + EXTENT_BYTES * (-(-declared // extent_bytes) + SLACK_EXTENTS)
        if self._entries:
            est = max(est, self._entries_total // len(self._entries))
        return est

    def need(self, extra: int, inflight: list[int]) -> tuple[int, int]:
        """``(snapshot bytes, meta zones)`` of a snapshot holding the committed generations, the
        writers in flight (their estimates ``inflight``) and an entry of ``extra`` bytes, with every
        non-empty data zone's attributes (and 8 more), every entry 12.5 % larger (GC moves split
        extents), and room for one more record as large as the largest entry (both its copies).

        The O(1) bound (:func:`~.records.snapshot_zones`) first; when it does not fit, the exact
        packing (:func:`~.records.pack_zones`, O(generations)) for up to 4,096 generations (small
        meta zones make the bound loose)."""
        j, t = self.journal, self.zones.table
        gens = self._entries_total + sum(inflight) + extra
        gens += gens // GC_SPLIT_DIVISOR
        zones = len(t) - t.n_empty + SLACK_ZONES
        items = len(self._entries) + len(inflight) + 1
        biggest = max(self._biggest, extra)
        nbytes = SNAPSHOT_HEAD_BYTES + zones * ZONE_ATTR_BYTES + gens
        z = snapshot_zones(gens, j.capacity, j.bs, items=items, biggest=biggest, zones=zones)
        if 2 * z > len(j.meta) and items <= EXACT_PACKING_LIMIT:
            entries = [n + n // GC_SPLIT_DIVISOR for n in self._entries.values()]
            entries += [n + n // GC_SPLIT_DIVISOR for n in inflight]
            entries.append(extra + extra // GC_SPLIT_DIVISOR)
            # the next record is appended twice (format 5: records.append_frames)
            reserve = 2 * round_up(max(biggest, MIN_RESERVE_RECORD) + COPY_MEMBER_BYTES + FRAME_HEADER, j.bs)
            z = min(z, pack_zones(entries, j.capacity, j.bs, zones=zones, reserve=reserve))
        return nbytes, z

    def check_room(self, extra: int, what: str, inflight: list[int]) -> None:
        """Refuse work whose snapshot entry of ``extra`` bytes the journal could not roll over
        (module docstring), with the writers in flight's estimates ``inflight``.

        Raises:
            NoSpaceError: ``cause`` ``"journal"``; ``needed``/``available`` in snapshot bytes.
        """
        nbytes, z = self.need(extra, inflight)
        j = self.journal
        m, free = len(j.meta), len(j.meta) - len(j.chain)
        if 2 * z > m or z > free:
            cap = j.capacity
            # an empty store whose meta zones cannot hold one generation: nothing to delete would help
            way = ("the meta zones are too small for any generation: format with more meta zones (mkfs "
                   "--meta-zones) or larger zones" if not self._entries and not inflight else
                   "delete generations, or format with more meta zones")
            raise NoSpaceError(f"{what}: the journal is full: a snapshot with it would take {z} meta zones "
                               f"({nbytes} bytes); {m} meta zones of {cap} bytes keep room for 2 x "
                               f"{m // 2} ({free} free beside the current chain), so deletions can always "
                               f"be journaled; {way}",
                               needed=nbytes, available=(min(m // 2, free)) * cap, cause="journal")
