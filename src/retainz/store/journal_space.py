"""Journal space accounting of :class:`~retainz.store.store.Store`: estimating a generation's snapshot
entry and refusing work that a full journal could no longer roll over (so deletions can always be
journaled)."""

from __future__ import annotations

from retainz.errors import NoSpaceError
from retainz.store.catalog import dumps, encode_gen
from retainz.store.format import round_up
from retainz.store.journal import (
    EXTENT_BYTES,
    SNAPSHOT_HEAD_BYTES,
    ZONE_ATTR_BYTES,
    pack_zones,
    snapshot_zones,
)


class JournalSpaceMixin:
    """Journal-space methods of :class:`~retainz.store.store.Store`."""

    def _journal_estimate(self, gen_id: str, need: int) -> int:
        """Snapshot bytes a generation being admitted may take (an estimate: its extents are not
        known yet): ``EXTENT_BYTES`` per extent, one per 1 MiB of its block-rounded declared size
        (payload extents) or per zone (counted ones), plus 8 for shard tails and zone splits, and
        256 bytes of id, hint and shard names; at least the mean entry of the committed ones."""
        ext = 1 << 20 if self.device.info.payload else self._cap
        est = 256 + len(gen_id) + EXTENT_BYTES * (-(-need // ext) + 8)
        if self._jgen:
            est = max(est, self._jgen_total // len(self._jgen))
        return est

    def _journal_need(self, extra: int, exclude=None) -> tuple[int, int]:
        """``(snapshot bytes, meta zones)`` of a snapshot holding the committed generations, the
        writers in flight (their estimates; not ``exclude``) and an entry of ``extra`` bytes,
        with every non-empty data zone's attributes (and 8 more), every entry 12.5 % larger (GC
        moves split extents), and room for one more record as large as the largest entry.

        The O(1) bound of :func:`~retainz.store.journal.snapshot_zones` first; when it does not
        fit, the exact packing (:func:`~retainz.store.journal.pack_zones`, O(generations)) for up
        to 4,096 generations (small meta zones make the bound loose)."""
        j, t = self.journal, self.table
        inflight = self._jreserved - (exclude._jest if exclude is not None else 0)
        gens = self._jgen_total + inflight + extra
        gens += gens // 8
        zones = len(t) - t.n_empty + 8
        items = len(self._jgen) + len(self._writers) + 1
        biggest = max(self._jbig, extra)
        nbytes = SNAPSHOT_HEAD_BYTES + zones * ZONE_ATTR_BYTES + gens
        z = snapshot_zones(gens, j.capacity, j.bs, items=items, biggest=biggest, zones=zones)
        if 2 * z > len(j.meta) and items <= 4096:
            entries = [n + n // 8 for n in self._jgen.values()]
            entries += [w._jest + w._jest // 8 for w in self._writers.values() if w is not exclude]
            entries.append(extra + extra // 8)
            reserve = round_up(max(biggest, 1024) + 8, j.bs)
            z = min(z, pack_zones(entries, j.capacity, j.bs, zones=zones, reserve=reserve))
        return nbytes, z

    def _check_journal(self, extra: int, what: str, exclude=None) -> None:
        """Raise :class:`NoSpaceError` unless a snapshot with an entry of ``extra`` bytes more
        (:meth:`_journal_need`) takes at most the meta zones the current chain leaves free, and at
        most half of all of them: the rollover after the next one writes beside the chain the
        next one makes, and deleting only shrinks the snapshot, so every deletion (and GC move)
        until the catalog is empty can be journaled."""
        nbytes, z = self._journal_need(extra, exclude)
        j = self.journal
        m, free = len(j.meta), len(j.meta) - len(j.chain)
        if 2 * z > m or z > free:
            cap = j.capacity
            raise NoSpaceError(f"{what}: the journal is full: a snapshot with it would take {z} meta zones "
                               f"({nbytes} bytes); {m} meta zones of {cap} bytes keep room for 2 x "
                               f"{m // 2} ({free} free beside the current chain), so deletions can always "
                               "be journaled; delete generations, or format with more meta zones",
                               needed=nbytes, available=(min(m // 2, free)) * cap, cause="journal")

    def _journal_entry(self, gen) -> None:
        """Record the snapshot bytes of committed generation ``gen`` (its ``encode_gen`` form)."""
        n = len(dumps(encode_gen(gen))) + 1
        self._jgen_total += n - self._jgen.get(gen.id, 0)
        self._jgen[gen.id] = n
        if n > self._jbig:
            self._jbig = n

