"""An in-process zoned device, with or without payload."""

from __future__ import annotations

from retainz.errors import NoPayloadError
from retainz.zoned.device import WriteData
from retainz.zoned.emulated import EmulatedZonedDevice
from retainz.zoned.model import Geometry

__all__ = ["MemoryDevice"]


class MemoryDevice(EmulatedZonedDevice):
    """A zoned device held in memory.

    Args:
        geometry: the device's :class:`~retainz.zoned.model.Geometry`.
        payload: True keeps every byte written (tests, small stores).  False is the trace-replay
            instrument: a write may pass a byte count (``int``) instead of bytes, which is counted
            and not kept; a zone that received such a write raises :class:`NoPayloadError` when its
            data is read, until it is reset.  Bytes passed as real buffers are still kept (the
            store's journal is written that way, so a payload-less store can still recover).

    Memory: one bytearray per zone that holds kept bytes, grown as written (never ``zone_capacity``
    up front), so thousands of payload-less zones cost a few lists of integers.
    """

    def __init__(self, geometry: Geometry, *, payload: bool = True):
        super().__init__(geometry, kind="memory", payload=payload)
        self._data: list[bytearray | None] = [None] * geometry.nr_zones
        self._counted: set[int] = set()  # zones holding counted (not kept) bytes

    def _store(self, zone: int, pos: int, data: WriteData) -> None:
        if isinstance(data, int):
            self._counted.add(zone)
            self._data[zone] = None
            return
        if zone in self._counted:
            return
        buf = self._data[zone]
        if buf is None:
            buf = self._data[zone] = bytearray()
        buf += data

    def _load(self, zone: int, pos: int, length: int) -> bytes:
        if zone in self._counted:
            raise NoPayloadError(f"zone {zone} holds counted bytes only (payload=False device)",
                                 zone=zone, offset=zone * self._zsize + pos, length=length)
        buf = self._data[zone]
        return bytes(buf[pos:pos + length])

    def _discard(self, zone: int, keep: int) -> None:
        if keep == 0:
            self._data[zone] = None
            self._counted.discard(zone)
        elif self._data[zone] is not None:
            del self._data[zone][keep:]
