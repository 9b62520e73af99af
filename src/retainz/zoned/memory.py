"""An in-process zoned device, with or without payload."""

from __future__ import annotations

from retainz.errors import NoPayloadError
from retainz.zoned.device import WriteData
from retainz.zoned.emulated import EmulatedZonedDevice
from retainz.zoned.model import Geometry, ZoneCond

_E, _IO, _EO, _F = ZoneCond.EMPTY, ZoneCond.IMP_OPEN, ZoneCond.EXP_OPEN, ZoneCond.FULL
_RO, _OFF = ZoneCond.READONLY, ZoneCond.OFFLINE

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
        self._end = geometry.nr_zones * geometry.zone_size
        self._payload = payload

    def write(self, offset: int, data: WriteData) -> None:
        """:meth:`EmulatedZonedDevice.write`, with a lean path for a byte count (``int``) on a
        payload-less device (the trace-replay instrument): the same ZNS checks in the same order
        (alignment, range, zone condition, write pointer, zone capacity, open/active limits) and
        the same errors, without the generic dispatch."""
        if data.__class__ is not int or self._payload:
            return EmulatedZonedDevice.write(self, offset, data)
        length = data
        bs = self._bs
        if offset < 0 or length <= 0 or offset % bs or length % bs or offset + length > self._end:
            return EmulatedZonedDevice.write(self, offset, data)   # raises the precise error
        zsize = self._zsize
        z = offset // zsize
        cond = self._cond[z]
        written = self._written[z]
        if cond is _F or cond is _RO or cond is _OFF or offset - z * zsize != written \
                or written + length > self._zcap:
            return EmulatedZonedDevice.write(self, offset, data)   # raises the precise error
        if cond is _E and (not self._max_open or len(self._imp_open) + len(self._exp_open) < self._max_open):
            self._check_active(z)      # empty: needs an active resource (an open one is free)
            self._imp_open[z] = None   # _set_cond(z, _IO), inlined
            self._cond[z] = cond = _IO
        elif cond is not _IO and cond is not _EO:
            self._acquire(z, _IO)      # closed, or no open resource free: the generic rule
            cond = _IO
        if self._data[z] is not None:
            self._data[z] = None
        self._counted.add(z)
        written += length
        self._written[z] = written
        self._dirty.add(z)
        if written == self._zcap:
            if cond is _IO:            # _set_cond(z, _F), inlined
                del self._imp_open[z]
                self._cond[z] = _F
            else:
                self._set_cond(z, _F)
        return None

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
        with memoryview(buf) as view:
            return bytes(view[pos:pos + length])   # one copy (a bytearray slice would be two)

    def _discard(self, zone: int, keep: int) -> None:
        if keep == 0:
            self._data[zone] = None
            self._counted.discard(zone)
        elif self._data[zone] is not None:
            del self._data[zone][keep:]
