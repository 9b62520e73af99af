"""The zoned device interface every backend implements.

A device is a small, flat set of verbs in bytes, after libzbd: report zones, write at the write pointer,
zone append, read, the four zone management operations, flush.  The store talks only to this interface,
so the same store code runs on a :class:`~retainz.zoned.memory.MemoryDevice`, a
:class:`~retainz.zoned.file.FileDevice` and a :class:`~retainz.zoned.linux.LinuxZonedDevice`.
"""

from __future__ import annotations

import abc
import enum

from retainz.errors import MisalignedIOError, OutOfRangeError
from retainz.zoned.model import DeviceInfo, Geometry, Zone, ZoneCond

__all__ = ["ZoneOp", "ZonedDevice", "WriteData", "check_io_range", "check_report_range"]

#: What :meth:`ZonedDevice.write` accepts: bytes-like data, or an ``int`` byte count on a device whose
#: ``info.payload`` is False (the bytes are counted, not kept: trace replay).
WriteData = bytes | bytearray | memoryview | int


def check_io_range(g: Geometry, offset: int, length: int) -> None:
    """Check a read or write range: block aligned, non-empty, inside the device.

    Raises:
        MisalignedIOError: offset or length not a positive multiple of the block size (EINVAL).
        OutOfRangeError: the range runs past the device end (LBA Out of Range).
    """
    if offset < 0 or length <= 0 or offset % g.block_size or length % g.block_size:
        raise MisalignedIOError(
            f"offset {offset} and length {length} must be positive multiples of the "
            f"{g.block_size}-byte block size", offset=offset, length=length)
    if offset + length > g.size:
        raise OutOfRangeError(f"range {offset}+{length} runs past the device end {g.size}",
                              offset=offset, length=length)


def check_report_range(g: Geometry, start: int, count: int) -> int:
    """Check a zone report range (``count=0``: to the last zone); returns the end zone (exclusive).

    Raises:
        OutOfRangeError: ``start`` or ``count`` outside the device.
    """
    n = g.nr_zones
    if start < 0 or start >= n:
        raise OutOfRangeError(f"zone {start} does not exist: the device has zones 0..{n - 1}", zone=start)
    end = n if count == 0 else start + count
    if count < 0 or end > n:
        raise OutOfRangeError(f"report of {count} zones from zone {start} runs past the last zone {n - 1}",
                              zone=start)
    return end


class ZoneOp(enum.Enum):
    """Zone management operations (NVMe ZNS Zone Management Send actions; Linux BLK*ZONE ioctls)."""

    OPEN = "open"
    CLOSE = "close"
    FINISH = "finish"
    RESET = "reset"


class ZonedDevice(abc.ABC):
    """A host-managed zoned block device.

    All offsets and lengths are bytes on the device.  Writes and reads must be block aligned
    (``geometry.block_size``).  Zone management takes a zone index.

    Rules every implementation follows (tested by ``tests/zoned/test_device_conformance.py``):

    * A write must start exactly at its zone's write pointer (else :class:`ZoneInvalidWriteError`),
      must not cross the zone capacity (:class:`ZoneBoundaryError`), and fails on a Full zone
      (:class:`ZoneFullError`).  A write that reaches the capacity makes the zone Full.
    * Writing to an Empty or Closed zone opens it implicitly.  When the open limit is reached, the
      oldest implicitly open zone is closed to make room (NVMe ZNS 1.1, 2.1.1.4.1); when every open
      zone is explicitly open the write fails with :class:`TooManyOpenZonesError`.  An Empty zone also
      needs an active resource: :class:`TooManyActiveZonesError` when the active limit is reached.
    * Finish makes a zone Full and its reported write pointer ``start + size`` (as Linux reports a Full
      zone); reset makes it Empty and its data reads back as zeros.
    * Reads of unwritten space (past the write pointer, or past the data of a finished zone) return
      zeros.

    Implementations are not thread-safe; the store serialises access.
    """

    # -- description -------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def info(self) -> DeviceInfo:
        """The device's geometry and kind."""

    @property
    def geometry(self) -> Geometry:
        return self.info.geometry

    @property
    def name(self) -> str:
        """How the device is named in messages: its path, or its kind (``memory``)."""
        return self.info.path or self.info.kind

    @property
    def notes(self) -> tuple[str, ...]:
        """What the device noticed when it was opened that is not an error but a checker should say
        (e.g. a file device whose newer zone-state copy fails its checksum); empty by default."""
        return ()

    # -- zones -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def report_zones(self, start: int = 0, count: int = 0) -> list[Zone]:
        """Report zones ``start .. start+count-1`` (``count=0``: to the last zone).

        Raises:
            OutOfRangeError: ``start`` or ``count`` outside the device.
        """

    def report_used_zones(self, start: int = 0, count: int = 0) -> list[Zone]:
        """The zones of :meth:`report_zones` ``(start, count)`` that are not Empty, in zone order (NVMe
        ZNS Zone Management Receive reports filtered by zone state; what a mount and a format look
        at).  This default filters the full report; the emulated devices list them without building
        a report row per Empty zone (a device of 1,048,576 zones, issue 44).

        Raises:
            OutOfRangeError: ``start`` or ``count`` outside the device.
        """
        return [z for z in self.report_zones(start, count) if z.cond != ZoneCond.EMPTY]

    def zone(self, index: int) -> Zone:
        """Report one zone."""
        return self.report_zones(index, 1)[0]

    @abc.abstractmethod
    def zone_op(self, op: ZoneOp, zone: int) -> None:
        """Apply a zone management operation to one zone.

        Raises:
            InvalidZoneTransitionError: the operation is not allowed from the zone's condition.
            TooManyOpenZonesError / TooManyActiveZonesError: opening would exceed a limit.
            ZoneReadOnlyError / ZoneOfflineError: the zone is read-only or offline.
            OutOfRangeError: no such zone.
        """

    def open_zone(self, zone: int) -> None:
        """Explicitly open a zone (Empty, Closed or implicitly open -> explicitly open)."""
        self.zone_op(ZoneOp.OPEN, zone)

    def close_zone(self, zone: int) -> None:
        """Close an open zone (-> Closed, or Empty when nothing was written)."""
        self.zone_op(ZoneOp.CLOSE, zone)

    def finish_zone(self, zone: int) -> None:
        """Finish a zone (-> Full; its unwritten capacity can no longer be used)."""
        self.zone_op(ZoneOp.FINISH, zone)

    def reset_zone(self, zone: int) -> None:
        """Reset a zone (-> Empty; its data is gone and reads back as zeros)."""
        self.zone_op(ZoneOp.RESET, zone)

    def reset_zones(self, zones) -> None:
        """Reset several zones (each as :meth:`reset_zone`; all durable when this returns).  A
        device may batch their durability (the emulated devices write their zone state once)."""
        for z in zones:
            self.reset_zone(z)

    # -- data --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def write(self, offset: int, data: WriteData) -> None:
        """Write ``data`` at device byte ``offset``, which must be its zone's write pointer.

        ``data`` is bytes-like, or an ``int`` byte count on a device with ``info.payload`` False.

        Raises:
            MisalignedIOError, OutOfRangeError, ZoneFullError, ZoneInvalidWriteError,
            ZoneBoundaryError, TooManyOpenZonesError, TooManyActiveZonesError, ZoneReadOnlyError,
            ZoneOfflineError; TypeError for an ``int`` on a device that keeps payload.
        """

    @abc.abstractmethod
    def append(self, zone: int, data: WriteData) -> int:
        """Zone append: write ``data`` at the zone's write pointer and return the device byte offset
        where it landed.  Same errors as :meth:`write`, except never ZoneInvalidWriteError."""

    def claim(self, offset: int, length: int) -> None:
        """Advance the write pointer over ``length`` bytes at device byte ``offset`` that another
        process writes itself, through its own descriptor of the device's backing file (the node
        service hands the extent out, :mod:`retainz.node`).  The zone rules are those of
        :meth:`write` (``offset`` is the write pointer; the same transitions and errors); the bytes
        read back as whatever that process wrote by the time of the read.  :meth:`flush` covers
        them once written (a flush after a claim syncs the backing file's data).

        Raises:
            ZoneOpNotSupportedError: a device another process cannot write directly (the default:
                memory devices, zoned block devices, remote devices).  The errors of :meth:`write`.
        """
        from retainz.errors import ZoneOpNotSupportedError

        raise ZoneOpNotSupportedError(f"{self.name}: another process cannot write this device directly "
                                      "(direct writes need a device file)", offset=offset, length=length)

    def active_zone_budget(self) -> int:
        """Zones a store may keep active at once on this device (0 = no limit): the geometry's
        ``max_active`` (NVMe ZNS Max Active Resources).  A device that may refuse to close a zone on
        its own while other processes write it answers less (see
        :class:`~retainz.zoned.linux.LinuxZonedDevice`)."""
        return self.geometry.max_active

    def direct_region(self) -> tuple[str, int] | None:
        """``(path of the backing file, byte offset of zone 0 in it)`` when other processes may write
        claimed extents themselves (``pwrite(fd, data, region + zone * zone_size + offset)``), else
        ``None`` (the default)."""
        return None

    def direct_io(self) -> dict:
        """How another process must write a claimed extent: ``{}`` (the default: any ``pwrite``), or
        ``{"o_direct": True, "block_size": B, "max_write": M}`` (``O_DIRECT`` from a page-aligned
        buffer padded to ``B``, in pieces of at most ``M`` bytes, 0: one piece)."""
        return {}

    def claim_turn(self, extents) -> None:  # noqa: B027 - optional hook
        """Return once the claimed ``extents`` (``(zone, offset, length)``, as :meth:`claim` took them)
        may be written: on a device that takes a zone's writes only at its write pointer, once every
        earlier claim of their zones is written.  Default: at once (a device file takes any order)."""

    def claims_written(self, extents) -> list:
        """The claimed ``extents`` whose bytes the device does not hold yet (default: none can be
        told apart: ``[]``)."""
        return []

    def release_claims(self, extents) -> int:
        """End claimed ``extents`` whose writer will not write them (it died or gave up); returns the
        bytes the device wrote to close their gap (default 0: a device file has no gap to close)."""
        return 0

    @abc.abstractmethod
    def read(self, offset: int, length: int) -> bytes:
        """Read ``length`` bytes from device byte ``offset`` (block aligned; may span zones).

        Raises:
            MisalignedIOError, OutOfRangeError, ZoneOfflineError, NoPayloadError.
        """

    def read_into(self, offset: int, out) -> None:
        """Fill the writable buffer ``out`` (``len(out)`` bytes, block aligned) from device byte ``offset``:
        :meth:`read` without the bytes object, where the device can read straight into ``out``
        (a FileDevice: ``preadv``).  Default: :meth:`read`, then one copy.

        Raises:
            as :meth:`read`.
        """
        memoryview(out).cast("B")[:] = self.read(offset, len(out))

    @abc.abstractmethod
    def flush(self) -> None:
        """Make every completed write durable (NVMe Flush; ``fsync`` on a file)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the device (file handles, locks).  Idempotent."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        g = self.geometry
        return (f"{type(self).__name__}({self.info.path or self.info.kind!r}, zones={g.nr_zones}, "
                f"zone_size={g.zone_size}, zone_capacity={g.zone_capacity})")
