"""Copying garbage collection.

When fewer data zones than ``gc_reserve_zones`` are empty (checked at admission, and whenever an
allocation finds no space), the store asks the allocator for victims (``Allocator.gc_victims``) and
collects them one at a time (ZenFS ``GCWorker`` / ``MigrateExtents``, with the fixes its issues
call for):

1. every committed extent in the victim is read and verified against its crc32c, then written
   where the allocator places it (``ExtentRequest.gc = True``; a copy may be split across zones);
   the copies count as live in their zones but nothing refers to them yet;
2. ``flush`` - the copies are durable;
3. one ``m`` (move) record per GC pass, holding every affected shard's complete new extent list and
   the victims to reset, is appended and flushed: the move's commit point (one record and two
   flushes per pass, not per victim);
4. the catalog switches to the new extents (the old ones become dead) and the victims are reset.

A crash before (3) leaves the old extents in force and the copies as garbage (dead bytes, or reset
zones at mount); a crash after (3) leaves the move in force and mount redoes the victim's reset.
Readers never see a half-moved extent: the catalog changes under the store lock only at step 4.

Zones holding data of a generation still being written are never collected (its extents are not in
the catalog yet).  A victim whose copy fails (no space, a checksum mismatch) is given up: its copies
become dead, the victims copied before it are still moved, and the error is listed in the
:class:`GCReport`; GC never loops: one pass per call.
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
        pending: dict[tuple, list] = {}   # (generation id, shard) -> its new extent list
        copies: dict[int, int] = {}       # zone -> bytes of copies written (for rollback)
        copy_ext: list = []               # the copies: live, not in the catalog until the record
        self._inflight.append(copy_ext)
        done: list[int] = []
        try:
            for v in victims:
                s = t.zones.get(v)
                if s is None or s.cond != ZoneCond.FULL or v in busy or s.written == 0:
                    rep.skipped.append(v)
                    continue
                saved = dict(pending)
                vcopies: dict[int, int] = {}
                mark = len(copy_ext)
                try:
                    moved, copied = self._copy_zone(v, pending, copy_ext, vcopies)
                except (NoSpaceError, ChecksumError) as e:
                    for z, n in vcopies.items():      # give this victim up; keep the others
                        self.table.on_kill(z, n)
                    del copy_ext[mark:]
                    pending = saved
                    rep.skipped.append(v)
                    rep.errors.append(f"zone {v}: {e}")
                    if isinstance(e, NoSpaceError):
                        break
                    continue
                for z, n in vcopies.items():
                    copies[z] = copies.get(z, 0) + n
                done.append(v)
                rep.extents_moved += moved
                rep.bytes_copied += copied
            if done:
                self.device.flush()
                self._append("m", {"s": [[gid, name, ext] for (gid, name), ext in pending.items()],
                                   "r": done, "now": self._now})
        except BaseException:
            self._inflight.remove(copy_ext)
            for z, n in copies.items():
                self.table.on_kill(z, n)
            self._reset_dead(copies)
            self._in_gc = False
            raise
        self._inflight.remove(copy_ext)
        try:
            self._apply_moves(pending, done, rep)
            self._reset_dead(copies)   # copies of a victim given up may have left all-dead zones
        finally:
            self._in_gc = False
        return rep

    def _copy_zone(self, v: int, pending: dict, copy_ext: list, vcopies: dict) -> tuple[int, int]:
        """Copy every committed extent in zone ``v`` (step 1); record each affected shard's new
        extent list in ``pending``.  Returns (extents moved, bytes copied)."""
        cat = self.catalog
        moved = copied = 0
        for gid in list(cat.zone_gens.get(v, ())):
            gen = cat.gens[gid]
            for shard in gen.shards.values():
                key = (gid, shard.name)
                current = pending.get(key, shard.extents)
                new = None
                for i, e in enumerate(current):
                    if e[0] != v:
                        if new is not None:
                            new.append(e)
                        continue
                    if new is None:
                        new = list(current[:i])
                    before = len(copy_ext)
                    copied += self._copy_extent(gen, shard.name, e, copy_ext, vcopies)
                    new.extend(copy_ext[before:])
                    moved += 1
                if new is not None:
                    pending[key] = new
        return moved, copied

    def _apply_moves(self, pending: dict, done: list[int], rep: GCReport) -> None:
        """Step 4: the catalog takes the new extents; the victims' old extents die; reset them."""
        bs = self._bs
        victims = set(done)
        killed: dict[int, int] = {}
        for (gid, name), ext in pending.items():
            old = self.catalog.replace_extents(gid, name, tuple(ext))
            for e in old:
                if e[0] in victims:
                    killed[e[0]] = killed.get(e[0], 0) + round_up(e[2], bs)
        for z, n in killed.items():
            self.table.on_kill(z, n)
        for v in done:
            self._reset_zone(v)
            rep.victims.append(v)
            rep.zones_reset += 1
        self.metrics.gc_bytes += rep.bytes_copied

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
