"""The zone book: the store's data zones, what it knows about each, and what their state costs.

It owns the :class:`~retainz.placement.base.ZoneTable` the placement policy reads, the store's
logical time (the latest training step reported), the space accounting (free bytes, the state a
capacity stop records) and the zone operations on data zones (finish, reset), each charged to the
metrics (unused capacity, dead-space byte-steps, resets, finishes).  It also remembers which zones'
journaled attributes (:class:`~retainz.store.records.ZoneAttrs`) changed since the last journal
record, so the next record carries them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from retainz.errors import PowerCutError, ZonedDeviceError
from retainz.placement.base import ZoneSummary, ZoneTable
from retainz.store.records import zone_attr_item
from retainz.store.types import StoreMetrics
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import ZoneCond

__all__ = ["ZoneBook"]

log = logging.getLogger(__name__)

_EMPTY, _FULL = ZoneCond.EMPTY, ZoneCond.FULL


class ZoneBook:
    """The data zones of a store on ``device`` (zones ``meta_zones`` .. N-1).

    Args:
        device: the zoned device.
        meta_zones: zones before the first data zone.
        metrics: the store's counters (this book adds resets, finishes, unused capacity and the
            byte-step integrals to them).

    Attributes:
        table: the zone table (summaries of every data zone; cached, equal to a recomputation).
        now: the store's logical time (training step).
        data_capacity: writable bytes of all data zones.
        max_active: active-zone budget for data: the device's (:meth:`ZonedDevice.active_zone_budget`: its
            active limit, or on a Linux zoned block device the lower of its open and active limits)
            minus the journal's one active meta zone (0 = unlimited).
        zone_capacity, zone_size, block_size: the geometry's, in bytes.
    """

    def __init__(self, device: ZonedDevice, meta_zones: int, metrics: StoreMetrics):
        g = device.geometry
        self.device = device
        self.meta_zones = meta_zones
        self.metrics = metrics
        self.block_size = g.block_size
        self.zone_size = g.zone_size
        self.zone_capacity = g.zone_capacity
        # the device's budget (ZonedDevice.active_zone_budget): its active limit, or on a Linux zoned
        # block device the lower of its open and active limits, less the journal's one meta zone
        budget = device.active_zone_budget()
        self.max_active = max(budget - 1, 0) if budget else 0
        self.data_capacity = (g.nr_zones - meta_zones) * g.zone_capacity
        self.now = 0
        #: resets the device refused (the zones kept their dead bytes): see :meth:`reset`.
        self.failed_resets = 0
        self.table = self.new_table()
        #: zones whose journaled attributes changed since the last record (never rebound, so a
        #: cached ``changed.add`` stays valid across records).
        self.changed: set[int] = set()

    def new_table(self) -> ZoneTable:
        """An empty table of this store's data zones.  The journal keeps one meta zone active (a
        rollover finishes the old zone before it opens the next), so data gets the device's limits
        minus one, and ``reserved_active`` tells policies (ZenFS's "device max - 2") what the
        device's own limit is."""
        g = self.device.geometry
        caps = {z: g.zone_capacity for z in range(self.meta_zones, g.nr_zones)}
        return ZoneTable(caps, max_open=max(g.max_open - 1, 0) if g.max_open else 0,
                         max_active=self.max_active, reserved_active=1 if self.max_active else 0)

    # -- time and space ------------------------------------------------------------------------------
    def advance(self, step: int) -> None:
        """Move logical time to ``step`` if later; dead bytes and capacity lost to finishes
        integrate over the steps passed (byte-steps)."""
        dt = step - self.now
        if dt > 0:
            m, t = self.metrics, self.table
            m.dead_space_byte_steps += t.dead * dt
            m.unused_capacity_byte_steps += t.unused * dt
            self.now = step
            t.now = step

    def free(self) -> int:
        """Bytes writable without a reset, O(1): capacity - written - capacity lost to finishes."""
        t = self.table
        return self.data_capacity - t.written - t.unused

    def stop_state(self) -> dict:
        """The data zones' state, as a capacity stop records it (bytes; O(open zones)):
        ``empty_zones``, ``open_free_bytes`` (writable capacity left in partly filled zones:
        stranded when the policy will not use it), ``dead_bytes``, ``live_bytes``."""
        t = self.table
        return {"empty_zones": t.n_empty, "open_free_bytes": sum(s.remaining for s in t.open.values()),
                "dead_bytes": t.dead, "live_bytes": t.live}

    # -- zone operations -------------------------------------------------------------------------------
    def reconcile(self, z: int) -> None:
        """Bring zone ``z``'s summary in line with the device's report after a device operation on
        it failed part-way (a real device may have done some of it): a zone the device reports
        empty is reset in the table; bytes past the table's written bytes count as dead, and a zone
        it reports full counts its whole capacity as written (the bytes past the table's, dead), so
        it is full in the table too, with no finish or unused capacity charged (recovery's rule for
        a full zone whose finish was never journaled).  Never raises for the zone's state; a failing
        report raises.

        Raises:
            ZonedDeviceError: the report itself failed (the table is left as it was).
        """
        zr = self.device.zone(z)
        s = self.table.zones[z]
        if zr.cond is ZoneCond.EMPTY:
            if s.written or s.cond is not _EMPTY:
                self.table.on_reset(z)
                self.changed.add(z)
            return
        wp = zr.capacity if zr.cond is _FULL else zr.wp - zr.start
        if wp > s.written and s.cond is not _FULL:   # up to the capacity: the table's zone is full too
            self.table.on_write(z, wp - s.written, None, s.lifetime, self.now, live=False)
            self.changed.add(z)

    def finish(self, z: int) -> None:
        """Finish open data zone ``z`` (a placement decision): its remaining capacity is charged as
        unused.

        Raises:
            ZonedDeviceError: the device refused; the zone is reconciled with its report first."""
        s = self.table.zones[z]
        try:
            self.device.finish_zone(z)
        except ZonedDeviceError:
            self.reconcile_quietly(z)
            raise
        self.metrics.finishes += 1
        self.metrics.unused_capacity_bytes += s.capacity - s.written
        self.table.on_finish(z)
        self.changed.add(z)

    def kill(self, zone_bytes: dict[int, int]) -> None:
        """``{zone: bytes}`` of live data became dead (retired, aborted, moved)."""
        on_kill = self.table.on_kill
        for z, n in zone_bytes.items():
            on_kill(z, n)

    def reset(self, z: int) -> None:
        """Reset data zone ``z`` (it holds no live data); a zone reset while part-empty is charged
        its unused capacity (:meth:`charge_part_empty`).  Its attributes are journaled with the
        next record.

        A reset the device refuses loses nothing (the zone holds only dead bytes): the zone is
        reconciled with the device's report, the failure is counted in :attr:`failed_resets` and
        logged, and the zone waits for a later reset (GC, the next deletion, the next mount)."""
        s = self.table.zones[z]
        try:
            self.device.reset_zone(z)
        except PowerCutError:
            raise                            # the device is gone: nothing to reconcile with
        except ZonedDeviceError as e:
            self._reset_failed(z, e)
            return
        self.charge_part_empty(s.capacity, s.written, s.cond is _FULL, s.last_write_step)
        self.table.on_reset(z)
        self.metrics.resets += 1
        self.changed.add(z)

    def reset_journaled(self, zs: list[int]) -> None:
        """Reset data zones a journaled record already names for reset (``r`` of a deletion or a
        GC move): one batched device reset, and no re-journaling of their (empty) attributes,
        since replaying that record resets them.  If the batch fails, each zone is reset alone
        (:meth:`reset`: a refused reset leaves the zone all dead, reconciled)."""
        if not zs:
            return
        try:
            self.device.reset_zones(zs)
        except PowerCutError:
            raise
        except ZonedDeviceError:
            for z in zs:
                try:
                    done = self.device.zone(z).cond is ZoneCond.EMPTY
                except ZonedDeviceError:
                    done = False
                if done:
                    self._count_reset(z)
                else:
                    self.reset(z)
            return
        for z in zs:
            self._count_reset(z)

    def _count_reset(self, z: int) -> None:
        s = self.table.zones[z]
        self.charge_part_empty(s.capacity, s.written, s.cond is _FULL, s.last_write_step)
        self.table.on_reset(z)
        self.metrics.resets += 1

    def _reset_failed(self, z: int, error: ZonedDeviceError) -> None:
        self.failed_resets += 1
        log.warning("zone %d: reset failed (%s); it keeps its dead bytes until a later reset", z, error)
        self.reconcile_quietly(z)

    def reconcile_quietly(self, z: int) -> None:
        """:meth:`reconcile`, logging (not raising) a failed report."""
        try:
            self.reconcile(z)
        except PowerCutError:
            pass                             # the device is gone; recovery reconciles at the next open
        except ZonedDeviceError as e:       # the report failed too: the table stays as it was
            log.warning("zone %d: report failed while reconciling (%s)", z, e)

    def reset_dead(self, zones: Iterable[int]) -> None:
        """Reset the zones among ``zones`` that hold bytes but no live data (:meth:`reset`)."""
        for z in list(zones):
            s = self.table.zones[z]
            if s.written and not s.live:
                self.reset(z)

    def charge_part_empty(self, capacity: int, written: int, full: bool, last_write_step: int) -> None:
        """Unused capacity of a zone reset while part-empty: ``capacity - written`` bytes, held
        from its last write to now (byte-steps).  A full zone was charged at its finish (or has
        none)."""
        if full or not written:
            return
        m = self.metrics
        unused = capacity - written
        m.unused_capacity_bytes += unused
        m.unused_capacity_byte_steps += unused * max(0, self.now - last_write_step)

    # -- journaled attributes ----------------------------------------------------------------------------
    def mark(self, zones: Iterable[int]) -> None:
        """Zones whose journaled attributes changed (the next record carries them)."""
        self.changed.update(zones)

    def take_changed(self) -> tuple[set[int], list]:
        """The zones changed since the last call and their attribute items (ascending zone); the
        caller gives the set back with :meth:`mark` if its record is not written."""
        dirty = set(self.changed)
        self.changed.clear()
        zones = self.table.zones
        return dirty, [zone_attr_item(z, zones[z]) for z in sorted(dirty)]

    def attr_items(self) -> list:
        """Attribute items of every data zone that is not empty (a snapshot's ``sz`` records)."""
        return [zone_attr_item(s.index, s) for s in self.table if s.written or s.cond is not _EMPTY]

    def restore(self, summaries: list[ZoneSummary], open_seq: int, now: int) -> None:
        """Take the summaries recovery rebuilt (the zones that are not empty; the others keep the
        table's empty summaries), the journal's opening counter and logical time."""
        self.now = now
        self.table.now = now
        self.table.open_seq = open_seq
        self.table.restore(summaries)
