"""An FDP namespace presented to the store as host-managed zones (docs/fdp.md, "The store on an FDP
namespace").

A conventional NVMe namespace with Flexible Data Placement has no zones: the host writes anywhere, picks a
reclaim unit handle per write and frees with Deallocate.  :class:`FdpNamespaceDevice` keeps the zone state
machine on the host (it is a :class:`~retainz.zoned.memory.MemoryDevice`: payload optional) and turns the
zone verbs into FDP commands on the FTL model (:class:`retainz.fdp.ftl.FlashTranslationLayer`):

* zone ``z`` is the LBA range ``[z * zone_capacity, (z + 1) * zone_capacity)`` of the namespace (zones
  packed densely: the namespace is exactly what the zones can hold, so the spare factor is the flash's
  over-provisioning of the writable bytes, whatever the gap between zone size and capacity);
* **a placement handle is the active resource**: the device has one handle per active zone
  (``max_active``); a zone takes the lowest free handle when its first byte reaches the model and gives it
  back when it is full, finished or reset (full and finished zones with an RUH Update, so the next zone
  through the handle starts a fresh RU; no padding when the zone's data ends on an RU boundary).  The store's placement, which decides the zone of every extent
  and which groups share a zone when more are in flight than the active limit allows, thereby decides the
  handle of every extent;
* a write goes to the model through the zone's handle, in whole model pages (``unit`` bytes) once the
  zone's write pointer passes a page's end;
* **reset** is a Deallocate of the zone's range; **finish** of a partly written zone sends its last partial
  page and an RUH Update on its handle (the next zone through the handle starts a fresh RU);
* :meth:`fdp_statistics` is the model's FDP statistics log (0x22): device WAF = MBMW / HBMW.

Sizing: the namespace is ``nr_zones * zone_capacity`` bytes; the flash is the namespace divided by
``1 - spare_factor``, rounded up to whole RUs of ``ru_size`` bytes (one erase block of ``ru_size / unit`` pages
per RU), so the spare factor is the drive's whole over-provisioning: the model's free-RU reserve and the RUs
open at once (a host RU per handle and GC's RU) come out of it, as on a drive.  A namespace of too few RUs
for that gets the fewest RUs that hold the namespace, the reserve and the open RUs instead
(:attr:`FdpNamespaceDevice.spare_factor` is the over-provisioning as built).  Not durable: the zone table lives in memory (trace
replay and tests); power loss keeps the emulated device's semantics and leaves the model as written.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

from retainz.errors import DeviceFormatError
from retainz.fdp.ftl import FdpStatistics, FlashGeometry, FlashTranslationLayer
from retainz.zoned.device import WriteData, ZoneOp
from retainz.zoned.emulated import EmulatedZonedDevice
from retainz.zoned.memory import MemoryDevice
from retainz.zoned.model import Geometry

__all__ = ["FdpNamespaceDevice", "PlacementHandles"]


class PlacementHandles:
    """The placement handles of an FDP namespace, lent to zones: a zone takes the lowest free handle when
    its first byte goes to the namespace and gives it back when it is full, finished or reset.  The store's
    active-zone limit is the number of handles, so a free one is always there when a zone needs it
    (:class:`FdpNamespaceDevice` on the FTL model, :class:`~retainz.zoned.linuxfdp.LinuxFdpDevice` on a
    real namespace).

    Args:
        count: placement handles 0..count-1.
    """

    def __init__(self, count: int):
        self._free = list(range(count))
        self._held: dict[int, int] = {}      # zone -> its placement handle while it holds one

    def held(self, zone: int) -> int | None:
        """The handle ``zone`` holds now, or None."""
        return self._held.get(zone)

    def take(self, zone: int) -> int:
        """The handle of ``zone``, lending it the lowest free one if it holds none.

        Raises:
            RuntimeError: no handle is free (more zones active than handles: a device bug)."""
        handle = self._held.get(zone)
        if handle is None:
            if not self._free:
                raise RuntimeError(f"zone {zone} needs a placement handle and none is free: {self._held}")
            handle = self._held[zone] = self._free.pop(0)
        return handle

    def give_back(self, zone: int) -> int | None:
        """End ``zone``'s loan; returns the handle it held, or None."""
        handle = self._held.pop(zone, None)
        if handle is not None:
            bisect.insort(self._free, handle)
        return handle


class FdpNamespaceDevice(MemoryDevice):
    """A zoned view of an FDP namespace on the FTL model (see the module docstring).

    Args:
        geometry: the zones the store sees; ``max_active`` (>= 1) is the number of placement handles.
        ru_size: reclaim unit size in bytes (default: the zone capacity, so a zone's data fills one RU); a
            multiple of ``unit``.
        spare_factor: the flash's over-provisioning, (physical - namespace) / physical, in (0, 1).
        ruh_type: "II" (initially isolated, default) or "PI" (persistently isolated) for every handle.
        unit: the model's page in bytes (default: the block size); divides the zone capacity.
        victim: the model's GC victim selection, "greedy" or "fifo".
        payload: keep written bytes (True) or count them (False: trace replay).
        handles: placement handles the host uses: None (default) for one per active zone, or 1 for a host
            that sends no placement identifier (every write goes through handle 0, the namespace's default
            handle, and a zone that fills or finishes makes no RUH Update: the drive knows no zones).

    Raises DeviceFormatError for a geometry the model cannot represent (no active limit, sizes that are
    not whole units, an RU that is not whole units, a spare factor outside (0, 1)).
    """

    @staticmethod
    def check(geometry: Geometry, *, ru_size: int | None = None, spare_factor: float = 0.07, ruh_type: str = "II",
              unit: int | None = None, handles: int | None = None) -> None:
        """Refuse options the model cannot represent, before anything is built (the constructor's
        arguments; :func:`retainz.zoned.spec.parse_device` checks an ``fdp:`` spec with it).

        Raises:
            DeviceFormatError: no active limit, a page that is not whole blocks or does not divide the
            zone capacity, an RU that is not whole pages, a spare factor outside (0, 1), a handle type
            other than II or PI, ``handles`` other than 1 or None."""
        g = geometry
        unit = unit or g.block_size
        ru_size = ru_size or g.zone_capacity
        if not g.max_active:
            raise DeviceFormatError("an FDP namespace needs max_active >= 1: one placement handle per active zone")
        if unit % g.block_size or g.zone_capacity % unit:
            raise DeviceFormatError(f"the model's page ({unit} B) must be whole blocks and divide the zone "
                                    f"capacity ({g.zone_capacity} B)")
        if ru_size % unit:
            raise DeviceFormatError(f"RU size {ru_size} B is not a whole number of {unit}-byte pages")
        if not 0.0 < spare_factor < 1.0:
            raise DeviceFormatError(f"spare factor must be in (0, 1), got {spare_factor}")
        if ruh_type not in ("II", "PI"):
            raise DeviceFormatError(f"handle type must be II or PI, got {ruh_type!r}")
        if handles not in (None, 1):
            raise DeviceFormatError(f"handles must be 1 (no placement identifiers) or left out (one per active "
                                    f"zone), got {handles!r}")

    def __init__(self, geometry: Geometry, *, ru_size: int | None = None, spare_factor: float = 0.07,
                 ruh_type: str = "II", unit: int | None = None, victim: str = "greedy", payload: bool = True,
                 handles: int | None = None):
        self.check(geometry, ru_size=ru_size, spare_factor=spare_factor, ruh_type=ruh_type, unit=unit,
                   handles=handles)
        super().__init__(geometry, payload=payload)
        g = geometry
        unit = unit or g.block_size
        ru_size = ru_size or g.zone_capacity
        self._single = handles == 1
        handles = 1 if self._single else g.max_active
        logical = g.nr_zones * g.zone_capacity // unit
        pages_per_ru = ru_size // unit
        types = (ruh_type,) * handles
        rus = max(math.ceil(logical / (1.0 - spare_factor) / pages_per_ru),
                  math.ceil(logical / pages_per_ru) + 1 + FlashTranslationLayer.open_rus_per_rg(types))
        self._ftl = FlashTranslationLayer(FlashGeometry(unit, pages_per_ru, 1, rus), logical, types, victim=victim,
                                          reserve_rus=1)
        self._unit = unit
        self._info = dataclasses.replace(self._info, kind="fdp")
        self._sent = [0] * g.nr_zones          # bytes of each zone sent to the model (whole units)
        self._handles = PlacementHandles(handles)

    # The lean payload-less path of MemoryDevice.write does not call _store: every write goes through the
    # generic one, which does.
    write = EmulatedZonedDevice.write

    @property
    def ftl(self) -> FlashTranslationLayer:
        """The FTL model behind the namespace."""
        return self._ftl

    @property
    def spare_factor(self) -> float:
        """The flash's over-provisioning as built, (physical - namespace) / physical: the requested spare
        factor when the namespace has enough RUs for it to hold the free-RU reserve and every open RU,
        else the larger share those need (module docstring, "Sizing")."""
        physical = self._ftl.geometry.physical_pages
        return (physical - self._ftl.logical_pages) / physical

    def fdp_statistics(self) -> FdpStatistics:
        """A copy of the model's FDP statistics (log page 0x22 counters and per-handle attribution)."""
        return self._ftl.stats.copy()

    def zone_handle(self, zone: int) -> int | None:
        """The placement handle ``zone`` writes through now, or None."""
        if self._single:
            return 0 if self._sent[zone] else None
        return self._handles.held(zone)

    def _store(self, zone: int, pos: int, data: WriteData) -> None:
        super()._store(zone, pos, data)
        length = data if isinstance(data, int) else len(data)
        end = pos + length
        self._send(zone, end - end % self._unit)
        if end >= self._zcap:  # full: the next zone through the handle starts a fresh RU
            self._release(zone, update=True)

    def _send(self, zone: int, upto: int) -> None:
        """Write the zone's bytes ``[sent, upto)`` (whole units) to the model through the zone's handle."""
        sent = self._sent[zone]
        if upto <= sent:
            return
        handle = 0 if self._single else self._handles.take(zone)
        self._ftl.write(zone * self._zcap + sent, upto - sent, handle)
        self._sent[zone] = upto

    def _release(self, zone: int, *, update: bool = False) -> None:
        if self._single:
            return
        handle = self._handles.give_back(zone)
        if handle is not None and update:
            self._ftl.ruh_update(handle)

    def zone_op(self, op: ZoneOp, zone: int) -> None:
        """:meth:`EmulatedZonedDevice.zone_op`; FINISH also sends a last partial unit and makes an RUH Update
        on the zone's handle, giving the handle back."""
        super().zone_op(op, zone)
        if op is ZoneOp.FINISH and (self._handles.held(zone) is not None or self._written[zone] > self._sent[zone]):
            written = self._written[zone]
            self._send(zone, -(-written // self._unit) * self._unit)
            self._release(zone, update=True)

    def _discard(self, zone: int, keep: int) -> None:
        super()._discard(zone, keep)
        keep_units = -(-keep // self._unit) * self._unit
        if self._sent[zone] > keep_units:
            self._ftl.deallocate(zone * self._zcap + keep_units, self._sent[zone] - keep_units)
            self._sent[zone] = keep_units
        if keep == 0:
            self._release(zone)
