"""The NVMe ZNS zone state machine, shared by the emulated devices.

:class:`EmulatedZonedDevice` keeps every zone's condition and written bytes and enforces the zone
rules of NVMe ZNS 1.1 section 2.1.1 the way Linux's null_blk zoned mode and QEMU's ``nvme-ns
zoned=true`` do.  Subclasses only store and fetch bytes (:class:`MemoryDevice` in lists of
bytearrays, :class:`FileDevice` in a sparse file).

State transitions (E = Empty, IO = implicitly open, EO = explicitly open, C = Closed, F = Full):

=========  =====================  ====================  ============  ===========
from       write / append         open                  close         finish
=========  =====================  ====================  ============  ===========
E          IO (needs active+open) EO (needs active+open) error       F (needs active)
IO         IO, F at capacity      EO                    C             F
EO         EO, F at capacity      EO (no-op)            C (E if wp=0) F
C          IO (needs open)        EO (needs open)       C (no-op)     F
F          ZoneFullError          error                 error         F (no-op)
=========  =====================  ====================  ============  ===========

Reset takes any of E, IO, EO, C, F to E.  Read-only zones accept reads only; offline zones nothing.
"Needs open" closes the oldest implicitly open zone when the open limit is reached (NVMe ZNS 1.1,
2.1.1.4.1, as null_blk and QEMU with ``zoned.auto_transition`` do); it fails with
:class:`TooManyOpenZonesError` only when every open zone is explicitly open.

Durability: a flush makes every completed write durable; zone management operations are durable on
completion.  :meth:`EmulatedZonedDevice.power_loss` turns the device into what a power cycle leaves.
"""

from __future__ import annotations

import abc
import array

from retainz.errors import (
    InvalidZoneTransitionError,
    OutOfRangeError,
    TooManyActiveZonesError,
    TooManyOpenZonesError,
    ZoneBoundaryError,
    ZoneFullError,
    ZoneInvalidWriteError,
    ZoneOfflineError,
    ZoneReadOnlyError,
)
from retainz.zoned.device import WriteData, ZonedDevice, ZoneOp, check_io_range, check_report_range
from retainz.zoned.model import COND_OF_VALUE, DeviceInfo, Geometry, Zone, ZoneCond

__all__ = ["EmulatedZonedDevice"]

_E, _IO, _EO, _C, _F = ZoneCond.EMPTY, ZoneCond.IMP_OPEN, ZoneCond.EXP_OPEN, ZoneCond.CLOSED, ZoneCond.FULL
_RO, _OFF = ZoneCond.READONLY, ZoneCond.OFFLINE


class EmulatedZonedDevice(ZonedDevice):
    """Zone state machine over abstract storage.

    Subclasses implement :meth:`_store`, :meth:`_load`, :meth:`_discard` and may override
    :meth:`_persist` (make the durable zone state stick) and :meth:`_sync_data`.

    Attributes kept per zone (indexed by zone): ``_cond`` (a list of ZoneCond), ``_written`` (a list
    of bytes written from the zone start; a finished zone keeps what was written before the finish),
    and their durable copies as of the last flush or zone operation, kept as the zone-state slot
    stores them so that recording them copies buffers instead of looping over the zones:
    ``_dcond`` (a ``bytearray``, one condition byte per zone) and ``_dwritten`` (an ``array('Q')``).
    """

    def __init__(self, geometry: Geometry, *, kind: str, path: str = "", payload: bool = True):
        self._info = DeviceInfo(geometry=geometry, kind=kind, path=path, payload=payload)
        g = geometry
        self._bs = g.block_size
        self._zsize = g.zone_size
        self._zcap = g.zone_capacity
        self._nz = g.nr_zones
        self._max_open = g.max_open
        self._max_active = g.max_active
        self._cond: list[ZoneCond] = [_E] * g.nr_zones
        self._written: list[int] = [0] * g.nr_zones
        self._dcond = bytearray([_E]) * g.nr_zones
        self._dwritten = array.array("Q", bytes(8 * g.nr_zones))
        self._dirty: set[int] = set()       # zones written since the last flush
        self._imp_open: dict[int, None] = {}  # insertion order = age, for eviction
        self._exp_open: set[int] = set()
        self._nr_closed = 0
        self._claimed = False               # a claim was made: every flush syncs the data

    # -- storage hooks -----------------------------------------------------------------------------
    @abc.abstractmethod
    def _store(self, zone: int, pos: int, data: WriteData) -> None:
        """Keep ``data`` at byte ``pos`` of ``zone`` (pos is the write pointer, relative)."""

    @abc.abstractmethod
    def _load(self, zone: int, pos: int, length: int) -> bytes:
        """Return ``length`` written bytes from byte ``pos`` of ``zone`` (entirely below the data end)."""

    def _load_into(self, zone: int, pos: int, out: memoryview) -> None:
        """:meth:`_load` of ``len(out)`` bytes into ``out`` (default: one copy)."""
        out[:] = self._load(zone, pos, len(out))

    @abc.abstractmethod
    def _discard(self, zone: int, keep: int) -> None:
        """Forget the zone's bytes from ``keep`` on (reset: keep=0; power loss: the durable end)."""

    def _claim(self, zone: int, pos: int, length: int) -> None:
        """Bytes ``pos .. pos + length`` of ``zone`` are written by another process (:meth:`claim`).
        Default: refused (only a device with a backing file other processes open can take claims)."""
        from retainz.errors import ZoneOpNotSupportedError

        raise ZoneOpNotSupportedError(f"{self.name}: another process cannot write this device directly "
                                      "(direct writes need a device file)", zone=zone, length=length)

    def _sync_data(self) -> None:  # noqa: B027 - optional hook
        """Make stored bytes durable (fsync)."""

    def _persist(self) -> None:  # noqa: B027 - optional hook
        """Make ``_dcond``/``_dwritten`` durable (the file device writes its header)."""

    # -- description -------------------------------------------------------------------------------
    @property
    def info(self) -> DeviceInfo:
        return self._info

    def report_zones(self, start: int = 0, count: int = 0) -> list[Zone]:
        end = check_report_range(self.geometry, start, count)
        return [self._zone(z) for z in range(start, end)]

    def report_used_zones(self, start: int = 0, count: int = 0) -> list[Zone]:
        end = check_report_range(self.geometry, start, count)
        cond = self._cond
        return [self._zone(z) for z in range(start, end) if cond[z] is not _E]

    def _zone(self, z: int) -> Zone:
        start = z * self._zsize
        cond = self._cond[z]
        wp = start + self._zsize if cond in (_F, _RO, _OFF) else start + self._written[z]
        return Zone(index=z, start=start, size=self._zsize, capacity=self._zcap, wp=wp, cond=cond)

    def open_counts(self) -> tuple[int, int]:
        """``(open zones, active zones)`` right now."""
        n_open = len(self._imp_open) + len(self._exp_open)
        return n_open, n_open + self._nr_closed

    # -- resource accounting -----------------------------------------------------------------------
    def _set_cond(self, z: int, new: ZoneCond) -> None:
        old = self._cond[z]
        if old == _IO:
            del self._imp_open[z]
        elif old == _EO:
            self._exp_open.discard(z)
        elif old == _C:
            self._nr_closed -= 1
        if new == _IO:
            self._imp_open[z] = None
        elif new == _EO:
            self._exp_open.add(z)
        elif new == _C:
            self._nr_closed += 1
        self._cond[z] = new

    def _check_active(self, z: int) -> None:
        if self._max_active:
            n_active = len(self._imp_open) + len(self._exp_open) + self._nr_closed
            if n_active >= self._max_active:
                raise TooManyActiveZonesError(
                    f"zone {z}: cannot activate: {n_active} zones are active (open or closed), "
                    f"the device allows {self._max_active}", zone=z)

    def _make_open_room(self, z: int) -> None:
        """Ensure an open resource is free, closing the oldest implicitly open zone if needed."""
        if not self._max_open:
            return
        if len(self._imp_open) + len(self._exp_open) < self._max_open:
            return
        if not self._imp_open:
            raise TooManyOpenZonesError(
                f"zone {z}: cannot open: all {self._max_open} open zones are explicitly open", zone=z)
        victim = next(iter(self._imp_open))
        self._set_cond(victim, _C)

    def _acquire(self, z: int, target: ZoneCond) -> None:
        """Move an Empty or Closed zone to ``target`` (implicitly or explicitly open)."""
        if self._cond[z] == _E:
            self._check_active(z)
        self._make_open_room(z)
        self._set_cond(z, target)

    # -- checks ------------------------------------------------------------------------------------
    def _zone_index(self, z: int) -> int:
        if not isinstance(z, int) or z < 0 or z >= self._nz:
            raise OutOfRangeError(f"zone {z} does not exist: the device has zones 0..{self._nz - 1}",
                                  zone=z if isinstance(z, int) else None)
        return z

    def _check_range(self, offset: int, length: int) -> None:
        check_io_range(self.geometry, offset, length)

    def _check_writable(self, z: int, cond: ZoneCond, offset: int, length: int) -> None:
        if cond == _F:
            raise ZoneFullError(f"zone {z} is full", zone=z, offset=offset, length=length)
        if cond == _RO:
            raise ZoneReadOnlyError(f"zone {z} is read-only", zone=z, offset=offset, length=length)
        if cond == _OFF:
            raise ZoneOfflineError(f"zone {z} is offline", zone=z, offset=offset, length=length)

    # -- data --------------------------------------------------------------------------------------
    def _length(self, data: WriteData) -> int:
        if isinstance(data, int):
            if self._info.payload:
                raise TypeError(f"{type(self).__name__} keeps payload: write bytes, not a byte count")
            return data
        return len(data) if not isinstance(data, memoryview) else data.nbytes

    def write(self, offset: int, data: WriteData) -> None:
        length = self._length(data)
        z, cond, written = self._at_write_pointer("write", offset, length)
        self._write_at_wp(z, cond, written, data, length, offset)

    def claim(self, offset: int, length: int) -> None:
        if length.__class__ is not int or length <= 0:
            raise ValueError(f"claim length must be a positive int, not {length!r}")
        z, cond, written = self._at_write_pointer("claim", offset, length)
        self._write_at_wp(z, cond, written, None, length, offset)

    def _at_write_pointer(self, what: str, offset: int, length: int) -> tuple[int, object, int]:
        """``(zone, condition, written bytes)`` for ``length`` bytes at device byte ``offset``, which
        must be in range, in a writable zone and at its write pointer (NVMe ZNS 2.1: a write not at the
        write pointer is an invalid write)."""
        self._check_range(offset, length)
        z = offset // self._zsize
        cond = self._cond[z]
        self._check_writable(z, cond, offset, length)
        pos = offset - z * self._zsize
        written = self._written[z]
        if pos != written:
            raise ZoneInvalidWriteError(
                f"zone {z}: {what} at byte {pos} of the zone, but its write pointer is at byte {written}",
                zone=z, offset=offset, length=length)
        return z, cond, written

    def append(self, zone: int, data: WriteData) -> int:
        z = self._zone_index(zone)
        length = self._length(data)
        start = z * self._zsize
        written = self._written[z]
        self._check_range(start + written if written < self._zcap else start, length)
        cond = self._cond[z]
        self._check_writable(z, cond, start + written, length)
        self._write_at_wp(z, cond, written, data, length, start + written)
        return start + written

    def _write_at_wp(self, z: int, cond: ZoneCond, written: int, data: WriteData, length: int,
                     offset: int) -> None:
        if written + length > self._zcap:
            raise ZoneBoundaryError(
                f"zone {z}: write of {length} bytes at byte {written} crosses the zone capacity "
                f"{self._zcap}", zone=z, offset=offset, length=length)
        if cond != _IO and cond != _EO:
            self._acquire(z, _IO)
        if data is None:
            self._claim(z, written, length)
            self._claimed = True
        else:
            self._store(z, written, data)
        self._written[z] = written + length
        self._dirty.add(z)
        if written + length == self._zcap:
            self._set_cond(z, _F)

    def read(self, offset: int, length: int) -> bytes:
        self._check_range(offset, length)
        z = offset // self._zsize
        pos = offset - z * self._zsize
        if pos + length <= self._written[z] and self._cond[z] != _OFF:
            return self._load(z, pos, length)     # one zone, all written: no assembly copies
        out = bytearray()
        end = offset + length
        while offset < end:
            z = offset // self._zsize
            zstart = z * self._zsize
            chunk_end = min(end, zstart + self._zsize)
            if self._cond[z] == _OFF:
                raise ZoneOfflineError(f"zone {z} is offline", zone=z, offset=offset, length=length)
            pos, stop = offset - zstart, chunk_end - zstart
            have = min(stop, self._written[z])
            if have > pos:
                out += self._load(z, pos, have - pos)
                pos = have
            if stop > pos:
                out += bytes(stop - pos)
            offset = chunk_end
        return bytes(out)

    def read_into(self, offset: int, out) -> None:
        out = memoryview(out).cast("B")
        length = len(out)
        self._check_range(offset, length)
        z = offset // self._zsize
        pos = offset - z * self._zsize
        if pos + length <= self._written[z] and self._cond[z] != _OFF:
            self._load_into(z, pos, out)          # one zone, all written: straight into ``out``
            return
        out[:] = self.read(offset, length)

    def flush(self) -> None:
        if not self._dirty:
            if self._claimed:    # claimed bytes may have been written since the last flush
                self._sync_data()
            return
        self._sync_data()
        for z in self._dirty:
            self._dwritten[z] = self._written[z]
            self._dcond[z] = self._cond[z]
        self._dirty.clear()
        self._persist()

    # -- zone management ---------------------------------------------------------------------------
    def zone_op(self, op: ZoneOp, zone: int) -> None:
        z = self._zone_index(zone)
        cond = self._cond[z]
        if cond == _OFF:
            raise ZoneOfflineError(f"zone {z} is offline: cannot {op.value} it", zone=z)
        if cond == _RO:
            raise ZoneReadOnlyError(f"zone {z} is read-only: cannot {op.value} it", zone=z)
        if op is ZoneOp.OPEN:
            if cond == _F:
                raise InvalidZoneTransitionError(f"zone {z} is full: cannot open it", zone=z)
            if cond == _IO:
                self._set_cond(z, _EO)
            elif cond != _EO:
                self._acquire(z, _EO)
            return  # open state is not durable: a power cycle closes open zones anyway
        if op is ZoneOp.CLOSE:
            if cond in (_E, _F):
                raise InvalidZoneTransitionError(
                    f"zone {z} is {cond.long}: only an open zone can be closed", zone=z)
            if cond != _C:
                self._set_cond(z, _C if self._written[z] else _E)
            return
        if op is ZoneOp.FINISH:
            if cond == _F:
                return
            if cond == _E:
                self._check_active(z)
            self._set_cond(z, _F)
        else:  # RESET: durable on completion (no data to sync: the zone's bytes are gone)
            if cond == _E:
                return
            self._reset_state(z)
            self._dirty.discard(z)
            self._persist()
            return
        # finish is durable on completion; the zone's earlier writes with it
        self._sync_data()
        self._dwritten[z] = self._written[z]
        self._dcond[z] = self._cond[z]
        self._dirty.discard(z)
        self._persist()

    def reset_zone(self, zone: int) -> None:
        """Reset a zone (:meth:`zone_op` RESET, without the generic dispatch: the store resets a
        zone per dead zone, on the replay hot path)."""
        z = zone
        if z.__class__ is not int or z < 0 or z >= self._nz:
            return self.zone_op(ZoneOp.RESET, zone)
        cond = self._cond[z]
        if cond is _E:
            return None
        if cond is _OFF or cond is _RO:
            return self.zone_op(ZoneOp.RESET, zone)    # raises
        self._reset_state(z)
        self._dirty.discard(z)
        self._persist()
        return None

    def reset_zones(self, zones) -> None:
        """Reset several zones, durable together on completion: one state write (:meth:`_persist`)
        for the batch instead of one per zone.  Same checks and errors as :meth:`reset_zone`; a
        failing zone leaves the zones before it reset (and durable)."""
        done = False
        try:
            for z in zones:
                if z.__class__ is not int or z < 0 or z >= self._nz or self._cond[z] in (_OFF, _RO):
                    self.zone_op(ZoneOp.RESET, z)          # raises
                if self._cond[z] is not _E:
                    self._reset_state(z)
                    self._dirty.discard(z)
                    done = True
        finally:
            if done:
                self._persist()

    def _reset_state(self, z: int) -> None:
        if self._cond[z] is _F:
            self._cond[z] = _E     # _set_cond(z, _E) for a full zone (no resource held), inlined
        else:
            self._set_cond(z, _E)
        self._written[z] = 0
        self._discard(z, 0)
        self._dwritten[z] = 0
        self._dcond[z] = _E

    # -- power --------------------------------------------------------------------------------------
    def unflushed(self) -> dict[int, tuple[int, int]]:
        """Zones holding writes that are not durable yet: ``{zone: (durable end, write end)}``, both in
        bytes from the zone start (the writes since the last flush, or since the zone operation that
        made the zone durable)."""
        return {z: (self._dwritten[z], self._written[z]) for z in sorted(self._dirty)
                if self._written[z] > self._dwritten[z]}

    def power_loss(self, keep_unflushed: bool = False, *, keep: dict[int, int] | None = None) -> None:
        """Turn the device into what a power cycle leaves behind.

        Args:
            keep_unflushed: True models a drive that had persisted every completed write (the write
                pointers stay where they are); False drops every write since the last flush (each
                zone returns to the write pointer and condition recorded at the last flush or zone
                operation), like LevelDB's ``RESET_DROP_UNSYNCED_DATA``.
            keep: overrides ``keep_unflushed`` zone by zone: ``{zone: bytes}`` of that zone's
                unflushed writes that persisted, a prefix from its durable end (clamped to what was
                written; zones not named lose all of theirs).  A drive with a volatile write cache
                persists unflushed writes in any order across zones, but within a zone only up to a
                write pointer (NVMe ZNS 1.1, 2.1.1: a zone is written sequentially), so every such
                mapping is a state a power cut can leave; callers keep whole blocks.

        Afterwards every open zone is Closed (Empty if nothing is written): NVMe controllers close
        open zones on a controller-level reset.
        """
        if keep is not None:
            for z in self._dirty:
                end = self._dwritten[z] + max(0, keep.get(z, 0))
                if end < self._written[z]:
                    self._written[z] = end
                    self._cond[z] = _C if end else _E   # reopened below as Closed/Empty anyway
                    self._discard(z, end)
                self._dwritten[z] = self._written[z]
                self._dcond[z] = self._cond[z]
        elif keep_unflushed:
            self.flush()
        for z in self._dirty:
            self._written[z] = self._dwritten[z]
            self._cond[z] = ZoneCond(self._dcond[z])
            self._discard(z, self._written[z])
        self._dirty.clear()
        self._imp_open.clear()
        self._exp_open.clear()
        for z, cond in enumerate(self._cond):
            if cond in (_IO, _EO):
                self._cond[z] = _C if self._written[z] else _E
        self._nr_closed = sum(1 for c in self._cond if c == _C)
        self._dcond = bytearray(self._cond)
        self._dwritten = array.array("Q", self._written)
        self._persist()

    def set_condition(self, zone: int, cond: ZoneCond) -> None:
        """Emulation only: put a zone in the Read Only or Offline condition, as a failing drive does.

        Raises:
            ValueError: ``cond`` is neither READONLY nor OFFLINE.
        """
        z = self._zone_index(zone)
        if cond not in (_RO, _OFF):
            raise ValueError(f"set_condition takes READONLY or OFFLINE, not {cond!r}")
        self._set_cond(z, cond)
        self._dcond[z] = cond
        self._dwritten[z] = self._written[z]
        self._dirty.discard(z)
        self._persist()

    # -- restoring state (file device open) ---------------------------------------------------------
    def _restore(self, conds: list[ZoneCond], written: list[int], imp_order: list[int] = ()) -> None:
        """Load a zone state saved by :meth:`_persist` (recounting open/active resources).

        ``imp_order`` lists implicitly open zones oldest first (the eviction order); others follow
        in zone order.  Only the zones that are not Empty are visited one by one (an open of a
        device of 1,048,576 zones, issue 44)."""
        cond = list(map(COND_OF_VALUE.__getitem__, conds))
        self._cond = cond
        self._imp_open.clear()
        self._exp_open.clear()
        for z in imp_order:                 # oldest first; a zone named again moves to the end
            if cond[z] is _IO:
                self._imp_open.pop(z, None)
                self._imp_open[z] = None
        used = [z for z, c in enumerate(cond) if c is not _E]
        self._nr_closed = 0
        for z in used:
            c = cond[z]
            if c is _IO:
                self._imp_open.setdefault(z, None)
            elif c is _EO:
                self._exp_open.add(z)
            elif c is _C:
                self._nr_closed += 1
        self._written = list(written)
        self._dcond = bytearray(cond)
        self._dwritten = array.array("Q", self._written)
        self._dirty.clear()

