"""Copying garbage collection.

When fewer data zones than ``gc_reserve_zones`` are empty (checked at admission, and whenever an
allocation finds no space), the store asks the allocator for victims (``Allocator.gc_victims``) and
collects them one at a time (ZenFS ``GCWorker`` / ``MigrateExtents``, with the fixes its issues
call for):

1. every committed extent in the victim is read and verified against its crc32c, then written
   where the allocator places it (``ExtentRequest.gc = True``; a copy may be split across zones);
   the copies count as live in their zones but nothing refers to them yet;
2. ``flush`` - the copies are durable;
3. one ``m`` (move) record per victim, holding every affected shard's complete new extent list and
   the victim to reset, is appended and flushed: the move's commit point;
4. the catalog switches to the new extents (the old ones become dead) and the victim is reset.

A crash before (3) leaves the old extents in force and the copies as garbage (dead bytes, or reset
zones at mount); a crash after (3) leaves the move in force and mount redoes the victim's reset.
Readers never see a half-moved extent: the catalog changes under the store lock only at step 4.

Zones holding data of a generation still being written are never collected (its extents are not in
the catalog yet).  A victim whose copy fails (no space, a checksum mismatch) is given up: its copies
become dead and the error is listed in the :class:`GCReport`; GC never loops: one pass per call.
"""

from __future__ import annotations

import crc32c

from retainz.errors import ChecksumError, NoSpaceError
from retainz.store.format import round_up
from retainz.store.types import GCReport
from retainz.zoned.model import ZoneCond

__all__ = ["GCMixin"]


class GCMixin:
    """GC methods of :class:`~retainz.store.store.Store`."""

    def gc(self, *, force: bool = False) -> GCReport:
        """Run one pass of copying GC.

        Args:
            force: collect every full zone holding dead bytes (most dead first), not only what the
                allocator asks for below the reserve.

        Returns:
            a :class:`GCReport`.
        """
        with self._lock:
            self._check_open()
            return self._gc(force=force)

    def _gc(self, *, force: bool) -> GCReport:
        rep = GCReport()
        if self._in_gc:
            return rep
        t = self.table
        if force:
            victims = [s.index for s in sorted((s for s in t if s.cond == ZoneCond.FULL and s.dead > 0),
                                               key=lambda s: (-s.dead, s.index))]
        else:
            victims = self.allocator.gc_victims(self.gc_reserve_zones)
        busy = set(self._partial or ())
        for w in self._writers.values():
            busy.update(w._zone_bytes)
        self._in_gc = True
        try:
            for v in victims:
                s = t.zones.get(v)
                if s is None or s.cond != ZoneCond.FULL or v in busy or s.written == 0:
                    rep.skipped.append(v)
                    continue
                try:
                    self._collect(v, rep)
                except (NoSpaceError, ChecksumError) as e:
                    rep.skipped.append(v)
                    rep.errors.append(f"zone {v}: {e}")
                    if isinstance(e, NoSpaceError):
                        break
        finally:
            self._in_gc = False
        return rep

    def _collect(self, v: int, rep: GCReport) -> None:
        """Move the live extents out of zone ``v`` and reset it (steps 1-4 of the module docstring)."""
        bs = self._bs
        cat = self.catalog
        moves: list[tuple] = []       # (gen, shard, new extents, old bytes in v)
        copies: dict[int, int] = {}   # zone -> bytes of copies written (for rollback)
        copy_ext: list = []           # the copies, live but not in the catalog until the move record
        self._inflight.append(copy_ext)
        moved = copied = 0
        try:
            for gid in list(cat.zone_gens.get(v, ())):
                gen = cat.gens[gid]
                for shard in gen.shards.values():
                    new = None
                    for i, e in enumerate(shard.extents):
                        if e[0] != v:
                            if new is not None:
                                new.append(e)
                            continue
                        if new is None:
                            new = list(shard.extents[:i])
                        before = len(copy_ext)
                        copied += self._copy_extent(gen, shard.name, e, copy_ext, copies)
                        new.extend(copy_ext[before:])
                        moved += 1
                    if new is not None:
                        moves.append((gen, shard, tuple(new)))
            self.device.flush()
            self._append("m", {"s": [[g.id, s.name, ext] for g, s, ext in moves], "r": [v],
                               "now": self._now})
        except BaseException:
            self._inflight.remove(copy_ext)
            for z, n in copies.items():
                self.table.on_kill(z, n)
            self._reset_dead(copies)
            raise
        self._inflight.remove(copy_ext)
        live_v = 0
        for gen, shard, ext in moves:
            old = cat.replace_extents(gen.id, shard.name, ext)
            live_v += sum(round_up(e[2], bs) for e in old if e[0] == v)
        if live_v:
            self.table.on_kill(v, live_v)
        self._reset_zone(v)
        rep.victims.append(v)
        rep.extents_moved += moved
        rep.bytes_copied += copied
        rep.zones_reset += 1
        self.metrics.gc_bytes += copied

    def _copy_extent(self, gen, shard_name: str, e: tuple, out: list, copies: dict) -> int:
        """Copy one extent to where the allocator places it; appends the new extent(s) to ``out``."""
        z, off, length, crc = e
        padded = round_up(length, self._bs)
        if crc is None:
            data = padded
        else:
            data = self.device.read(z * self._zsize + off, padded)
            actual = crc32c.crc32c(memoryview(data)[:length])
            if actual != crc:
                raise ChecksumError(f"generation {gen.id!r} shard {shard_name!r}: extent at zone {z} offset "
                                    f"{off} ({length} bytes) fails its crc32c; not moved",
                                    generation=gen.id, shard=shard_name, zone=z, offset=off,
                                    length=length, expected=crc, actual=actual)
            data = memoryview(data)
        return self._put(gen, data, length, out, copies, True)
