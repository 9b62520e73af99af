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
   the victims to reset (those left with no live data), is appended and flushed: the move's commit point (one record and two
   flushes per pass, not per victim);
4. the catalog switches to the new extents (the old ones become dead) and the victims are reset.

A crash before (3) leaves the old extents in force and the copies as garbage (dead bytes, or reset
zones at mount); a crash after (3) leaves the move in force and mount redoes the victim's reset.
Readers never see a half-moved extent: the catalog changes under the store lock only at step 4.

Zones holding data of a generation still being written are never collected (its extents are not in
the catalog yet).  An extent the policy has no room for (``NO_SPACE`` on its GC request) is skipped
alone, as ZenFS's ``MigrateExtents`` does: the extents already moved stay moved, the victim keeps
the skipped ones and is not reset (``GCReport.partial``).  Likewise the extents of a shard the
policy does not migrate (``Allocator.migrates``: ZenFS's ``MigrateExtents`` moves only ``.sst``
files) stay where they are.  A victim whose copy fails its checksum
is given up: its copies become dead, the victims copied before it are still moved, and the error
is listed in the :class:`GCReport`; :meth:`Collector.collect` never loops: one pass per call.
Admission asks :meth:`Collector.make_room` instead, which repeats forced passes while each frees
space and the generation still does not fit (f2fs's foreground GC rule).

Which zones are victims is always the policy's rule (``Allocator.gc_victims``), forced or not
(:meth:`Collector.collect` says what forced means per policy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import crc32c

from retainz.errors import ChecksumError, NoSpaceError
from retainz.placement.base import Allocator
from retainz.store.catalog import Catalog
from retainz.store.metalog import MetadataLog
from retainz.store.types import GCReport
from retainz.store.writer import WritePath
from retainz.store.zonebook import ZoneBook
from retainz.zoned.model import ZoneCond, round_up

__all__ = ["Collector"]


class Collector:
    """The store's copying garbage collector (see the module docstring).

    Args:
        zones, catalog, log, write_path, allocator: the store's parts it works with.
        gc_reserve_zones: the store's reserve (the unforced pass asks the policy with it).
        busy: returns the zones holding data of generations still being written (never collected).

    Attributes:
        running: a pass is in progress (placements it makes never start another).
        inflight: the copies written by the pass in progress and not yet in the catalog (live:
            a recomputation of the zone table counts them).
    """

    def __init__(self, zones: ZoneBook, catalog: Catalog, log: MetadataLog, write_path: WritePath,
                 allocator: Allocator, gc_reserve_zones: int, busy: Callable[[], Iterable[int]]):
        self.zones = zones
        self.catalog = catalog
        self.log = log
        self.write_path = write_path
        self.allocator = allocator
        self.gc_reserve_zones = gc_reserve_zones
        self.busy = busy
        self.running = False
        self.inflight: list = []

    def collect(self, *, force: bool, progress=None) -> GCReport:
        """One GC pass over the policy's victims.

        Victims always come from the policy's rule (``Allocator.gc_victims``).  Unforced, it is
        asked with the store's reserve (``gc_reserve_zones``).  Forced (``Store.gc(force=True)``,
        and the store's own retry when admission or a placement finds no space), it is asked with
        a reserve of every data zone, so that what "forced" means is the policy's own rule at its
        most eager:

        * base rule (``greedy``, ``common``, ``dedicated``): every full zone holding dead bytes,
          most dead bytes first;
        * ``retainz`` and its hint controls: every full zone with live data and reclaimable space,
          by cost-benefit, except zones about to reset themselves while an empty zone is left;
        * ``zenfs``: unchanged: ZenFS's worker ignores the reserve and collects only at or below
          its free-space start level (20 %), with its garbage threshold.

        Before asking the rule, a pass retries the resets that failed (``ZoneBook.failed_resets``):
        a zone holding only dead bytes is reset whatever the policy (no rule needs to copy from it).

        If the rule names nothing, nothing is collected: a placement that still finds no space is
        then a capacity stop (:class:`NoSpaceError`), never a bypass of the policy.

        An unforced pass also reports what it left (:meth:`_held_back`): the zones a forced pass
        would collect now, their live and reclaimable bytes, and why the rule waited (the reserve
        not reached, or the policy's own rule), as ZenFS's GC waits for its free-space level and
        ``btrfs balance`` relocates only what its filters name: copying live data costs writes
        (WAF) that waiting may save, so the eager pass is asked for, never implied.

        Raises:
            NoSpaceError: the move record does not fit the journal (the copies are undone).
            ZonedDeviceError: a device operation failed (likewise).
        """
        rep = GCReport()
        if self.running:
            return rep
        t = self.zones.table
        busy = set(self.busy())
        if self.zones.failed_resets:
            # a zone whose reset failed keeps only dead bytes until a later reset: this pass is one,
            # whatever the policy's victims (a cost-benefit rule sees nothing to copy in it)
            self.zones.reset_dead([s.index for s in t if s.written and not s.live and s.index not in busy])
        victims = self.allocator.gc_victims(len(t) if force else self.gc_reserve_zones)
        self.running = True
        pending: dict[tuple, list] = {}   # (generation id, shard) -> its new extent list
        copies: dict[int, int] = {}       # zone -> bytes of copies written (for rollback)
        copy_ext: list = []               # the copies: live, not in the catalog until the record
        moved_out: list = []              # the extents the copies replace (dead once moved)
        touched: set[int] = set()         # zones holding copies undone (all dead: reset them)
        self.inflight = copy_ext
        done: list[int] = []
        try:
            for i, v in enumerate(victims):
                if progress is not None:
                    progress(i, len(victims))
                s = t.zones.get(v)
                if s is None or s.cond != ZoneCond.FULL or v in busy or s.written == 0:
                    rep.skipped.append(v)
                    continue
                saved, mark_out = dict(pending), len(moved_out)
                vcopies: dict[int, int] = {}
                mark = len(copy_ext)
                try:
                    moved, copied, left, left_bytes, kept = self._copy_zone(v, pending, copy_ext, vcopies,
                                                                            moved_out, touched)
                except BaseException as e:
                    if not isinstance(e, ChecksumError):
                        for z, n in vcopies.items():  # undone with the pass's other copies below
                            copies[z] = copies.get(z, 0) + n
                        raise
                    self.zones.kill(vcopies)          # give this victim up; keep the others
                    touched.update(vcopies)
                    del copy_ext[mark:]
                    del moved_out[mark_out:]
                    pending = saved
                    rep.skipped.append(v)
                    rep.errors.append(f"zone {v}: {e}")
                    continue
                for z, n in vcopies.items():
                    copies[z] = copies.get(z, 0) + n
                rep.extents_moved += moved
                rep.bytes_copied += copied
                if left or kept:    # extents stay: no space, or the policy does not migrate them
                    rep.partial.append(v)
                    rep.extents_skipped += left
                    rep.extents_kept += kept
                    if left:
                        rep.errors.append(f"zone {v}: {left} extents ({left_bytes} bytes) not moved: no space")
                    if kept:
                        rep.errors.append(f"zone {v}: {kept} extents not moved: policy "
                                          f"{self.allocator.name} does not migrate their shards")
                else:
                    done.append(v)
            if pending:
                self.zones.device.flush()
                self.log.move([[gid, name, ext] for (gid, name), ext in pending.items()], done)
        except BaseException:
            self.inflight = []
            self.zones.kill(copies)
            self.zones.reset_dead(set(copies) | touched)
            self.running = False
            raise
        self.inflight = []
        try:
            self._apply_moves(pending, moved_out, done, rep)
            self.zones.reset_dead(set(copies) | touched)   # copies undone may have left all-dead zones
        finally:
            self.running = False
        self._held_back(rep, force)
        return rep

    def _held_back(self, rep: GCReport, force: bool) -> None:
        """Fill ``rep``'s account of the space the pass left: ``reclaimable``, ``empty_zones``,
        ``gc_reserve_zones``, and after an unforced pass ``held_back`` (the forced rule's victims
        now, less zones being written and zones this pass named but could not empty), their live and
        reclaimable bytes, and ``waiting`` (why)."""
        t = self.zones.table
        rep.reclaimable, rep.empty_zones, rep.gc_reserve_zones = t.reclaimable, t.n_empty, self.gc_reserve_zones
        if force:
            return
        tried = set(rep.skipped) | set(rep.partial) | set(self.busy())
        held = [v for v in self.allocator.gc_victims(len(t)) if v not in tried and v in t.zones
                and t.zones[v].cond == ZoneCond.FULL and t.zones[v].written]
        if not held:
            return
        rep.held_back = held
        rep.held_back_live = sum(t.zones[v].live for v in held)
        rep.held_back_reclaimable = sum(t.zones[v].dead + t.zones[v].unused for v in held)
        rep.waiting = (f"GC collects only while fewer than {self.gc_reserve_zones} data zones are empty (the GC "
                       f"reserve), and {t.n_empty} are" if t.n_empty >= self.gc_reserve_zones else
                       f"policy {self.allocator.name}'s rule leaves these zones for now")

    def make_room(self, enough: Callable[[], bool]) -> int:
        """Forced passes (:meth:`collect` with ``force=True``) until ``enough()`` holds or a pass
        frees nothing: foreground GC as f2fs runs it (``f2fs_gc``, fs/f2fs/gc.c: a foreground pass
        goes back to ``gc_more`` while ``has_not_enough_free_secs``, "Foreground GC should do
        cleaning job until acquiring enough free sections", commit 8d63a795).  One pass can copy
        only into the space free at its start, since its victims are reset when it ends; the
        next pass has them.

        Args:
            enough: returns True once the caller's need is met (checked before each pass).

        Returns:
            passes run (0 when ``enough()`` held, or nothing is reclaimable at the start: no dead
            bytes and no capacity lost to finishes, :attr:`ZoneTable.reclaimable`; a finished
            zone's unwritten capacity comes back with its reset like dead bytes).  It stops when a
            pass leaves the data zones' free bytes (:meth:`ZoneBook.free`) no higher than before
            (free bytes are bounded by the capacity, so this terminates).

        Raises:
            as :meth:`collect`.
        """
        passes = 0
        if not self.zones.table.reclaimable:
            return 0
        while not enough():
            before = self.zones.free()
            self.collect(force=True)
            passes += 1
            if self.zones.free() <= before:
                break
        return passes

    def _copy_zone(self, v: int, pending: dict, copy_ext: list, vcopies: dict, moved_out: list,
                   touched: set) -> tuple[int, int, int, int]:
        """Copy every committed extent in zone ``v`` (step 1); record each affected shard's new
        extent list in ``pending`` and each replaced extent in ``moved_out``.

        An extent the policy finds no room for (``NO_SPACE`` on its GC request) is skipped, as
        ZenFS's ``MigrateExtents`` does: it stays where it is (pieces of it already copied are
        undone: dead, their zones in ``touched``), and the extents moved before and after it stay
        moved.  A shard the policy does not migrate (``Allocator.migrates``; ZenFS's
        ``MigrateExtents`` moves only ``.sst`` files) keeps its extents in ``v``.
        Returns (extents moved, bytes copied, extents skipped, bytes skipped, extents kept)."""
        cat, bs, table = self.catalog, self.zones.block_size, self.zones.table
        migrates = self.allocator.migrates
        moved = copied = left = left_bytes = kept = 0
        for gid in list(cat.zone_gens.get(v, ())):
            gen = cat.gens[gid]
            for shard in gen.shards.values():
                key = (gid, shard.name)
                current = pending.get(key, shard.extents)
                if not migrates(shard.name):
                    kept += sum(1 for e in current if e[0] == v)
                    continue
                new = None
                changed = False
                for i, e in enumerate(current):
                    if e[0] != v:
                        if new is not None:
                            new.append(e)
                        continue
                    if new is None:
                        new = list(current[:i])
                    before = len(copy_ext)
                    try:
                        copied += self._copy_extent(gen, shard.name, e, copy_ext, vcopies)
                    except NoSpaceError:
                        for p in copy_ext[before:]:    # a split copy placed part-way: undo it
                            n = round_up(p[2], bs)
                            table.on_kill(p[0], n)
                            vcopies[p[0]] -= n
                            if not vcopies[p[0]]:
                                del vcopies[p[0]]
                            touched.add(p[0])
                        del copy_ext[before:]
                        new.append(e)
                        left += 1
                        left_bytes += round_up(e[2], bs)
                        continue
                    new.extend(copy_ext[before:])
                    moved_out.append(e)
                    changed = True
                    moved += 1
                if changed:
                    pending[key] = new
        return moved, copied, left, left_bytes, kept

    def _apply_moves(self, pending: dict, moved_out: list, done: list[int], rep: GCReport) -> None:
        """Step 4: the catalog takes the new extents; the replaced extents die; the victims left
        with no live data are reset (a victim with skipped extents stays full, its summary exact)."""
        bs = self.zones.block_size
        for (gid, name), ext in pending.items():
            self.catalog.replace_extents(gid, name, tuple(ext))
        for gid in {gid for gid, _ in pending}:
            self.log.track(self.catalog.gens[gid])
        killed: dict[int, int] = {}
        for e in moved_out:
            killed[e[0]] = killed.get(e[0], 0) + round_up(e[2], bs)
        self.zones.kill(killed)
        self.zones.reset_journaled(done)     # the move record names them
        rep.victims.extend(done)
        rep.zones_reset += len(done)
        self.write_path.metrics.gc_bytes += rep.bytes_copied

    def _copy_extent(self, gen, shard_name: str, e: tuple, out: list, copies: dict) -> int:
        """Copy one extent to where the allocator places it; appends the new extent(s) to ``out``."""
        z, off, length, crc = e
        padded = round_up(length, self.zones.block_size)
        if crc is None:
            return self.write_path.write(gen, padded, length, out, copies, gc=True)[0]
        data = self.zones.device.read(z * self.zones.zone_size + off, padded)
        actual = crc32c.crc32c(memoryview(data)[:length])
        if actual != crc:
            raise ChecksumError(f"generation {gen.id!r} shard {shard_name!r}: extent at zone {z} offset "
                                f"{off} ({length} bytes) fails its crc32c; not moved",
                                generation=gen.id, shard=shard_name, zone=z, offset=off,
                                length=length, expected=crc, actual=actual)
        return self.write_path.write(gen, memoryview(data), length, out, copies, gc=True)[0]
