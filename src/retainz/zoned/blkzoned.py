"""The Linux kernel's zoned block ABI (``<linux/blkzoned.h>``) for :mod:`.linux`: ioctl numbers,
struct layouts, packing and parsing of zone reports and ranges (:func:`raw_to_zone`), and the errno
classification of failed writes and zone operations (:func:`classify_write_error`,
:func:`classify_zone_op_error`).  Standard library only; no device is touched here.
"""

from __future__ import annotations

import errno as _errno
import os
import struct
from dataclasses import dataclass

from retainz.errors import (
    InvalidZoneTransitionError,
    MisalignedIOError,
    OutOfRangeError,
    TooManyActiveZonesError,
    TooManyOpenZonesError,
    ZoneBoundaryError,
    ZonedDeviceError,
    ZoneFullError,
    ZoneInvalidWriteError,
    ZoneOfflineError,
    ZoneOpNotSupportedError,
    ZoneReadOnlyError,
)
from retainz.zoned.device import ZoneOp
from retainz.zoned.model import Zone, ZoneCond, ZoneType

__all__ = [
    "RawZone",
    "BLKREPORTZONE", "BLKRESETZONE", "BLKGETZONESZ", "BLKGETNRZONES", "BLKOPENZONE", "BLKCLOSEZONE",
    "BLKFINISHZONE",
    "REPORT_HEADER", "BLK_ZONE", "BLK_ZONE_RANGE", "BLK_ZONE_REP_CAPACITY", "SECTOR",
    "pack_report_request", "parse_report", "pack_zone_range", "raw_to_zone",
    "classify_write_error", "classify_zone_op_error",
]

# -- <linux/blkzoned.h> (checked with sizeof/offsetof against the QEMU guest's Linux 6.1) -----------
BLKREPORTZONE = 0xC0101282
BLKRESETZONE = 0x40101283
BLKGETZONESZ = 0x80041284
BLKGETNRZONES = 0x80041285
BLKOPENZONE = 0x40101286
BLKCLOSEZONE = 0x40101287
BLKFINISHZONE = 0x40101288

#: struct blk_zone_report header: sector, nr_zones, flags; the zones follow at offset 16.
REPORT_HEADER = struct.Struct("<QII")
#: struct blk_zone: start, len, wp, type, cond, non_seq, reset, resv[4], capacity, reserved[24].
BLK_ZONE = struct.Struct("<QQQBBBB4xQ24x")
#: struct blk_zone_range: sector, nr_sectors.
BLK_ZONE_RANGE = struct.Struct("<QQ")
#: Report header flag: the ``capacity`` fields are valid.
BLK_ZONE_REP_CAPACITY = 1 << 0
#: Every zone ioctl counts 512-byte sectors.
SECTOR = 512


@dataclass(frozen=True, slots=True)
class RawZone:
    """One ``struct blk_zone`` as the kernel filled it (sectors, not bytes)."""

    start: int
    len: int
    wp: int
    type: int
    cond: int
    non_seq: int
    reset: int
    capacity: int


def pack_report_request(sector: int, nr_zones: int) -> bytearray:
    """The mutable buffer ``BLKREPORTZONE`` fills: a header asking for ``nr_zones`` zones from 512-byte
    ``sector`` on, followed by room for that many ``struct blk_zone`` (64 bytes each)."""
    buf = bytearray(REPORT_HEADER.size + nr_zones * BLK_ZONE.size)
    REPORT_HEADER.pack_into(buf, 0, sector, nr_zones, 0)
    return buf


def parse_report(buf: bytes | bytearray) -> tuple[int, list[RawZone]]:
    """Decode a filled ``BLKREPORTZONE`` buffer into ``(flags, zones)``; the header's ``nr_zones`` is
    how many zones the kernel reported.

    Raises:
        ValueError: the buffer is shorter than its header says.
    """
    _, n, flags = REPORT_HEADER.unpack_from(buf, 0)
    if REPORT_HEADER.size + n * BLK_ZONE.size > len(buf):
        raise ValueError(f"zone report claims {n} zones but the buffer holds "
                         f"{(len(buf) - REPORT_HEADER.size) // BLK_ZONE.size}")
    zones = [RawZone(*BLK_ZONE.unpack_from(buf, REPORT_HEADER.size + i * BLK_ZONE.size)) for i in range(n)]
    return flags, zones


def pack_zone_range(sector: int, nr_sectors: int) -> bytes:
    """A ``struct blk_zone_range`` for the zone management ioctls (512-byte sectors)."""
    return BLK_ZONE_RANGE.pack(sector, nr_sectors)


def raw_to_zone(raw: RawZone, flags: int, zone_sectors: int) -> Zone:
    """Convert a kernel zone to the model's :class:`Zone` in bytes.

    The capacity is the report's when ``flags`` has :data:`BLK_ZONE_REP_CAPACITY`, else the zone length.
    A Full (or read-only / offline) zone reports ``wp = start + size``.
    """
    start, size = raw.start * SECTOR, raw.len * SECTOR
    capacity = raw.capacity * SECTOR if flags & BLK_ZONE_REP_CAPACITY else size
    cond = ZoneCond(raw.cond)
    wp = start + size if cond in (ZoneCond.FULL, ZoneCond.READONLY, ZoneCond.OFFLINE) else raw.wp * SECTOR
    return Zone(index=raw.start // zone_sectors, start=start, size=size, capacity=capacity, wp=wp,
                cond=cond, type=ZoneType(raw.type))


# -- errno -> exception ---------------------------------------------------------------------------------

def classify_write_error(err: int, zone: Zone, offset: int, length: int, *, block_size: int = 4096,
                         written_before: int | None = None) -> ZonedDeviceError:
    """The exception a write that failed with ``err`` stands for, given the zone's state *after* it.

    Args:
        err: the errno of the failed ``pwrite`` (``EIO``, ``ETOOMANYREFS``, ``EOVERFLOW``, ``EINVAL``...).
        zone: a fresh report of the written zone.
        offset: device byte offset of the write.  length: its byte length.
        block_size: the logical block size, to tell a misaligned ``EINVAL``.
        written_before: bytes of the zone written before the request (None when unknown): when the
            zone is Full now but was not full before, the write started at the write pointer and ran
            into the capacity.

    Linux answers every zone status NVMe has with ``EIO`` except Too Many Open Zones (``ETOOMANYREFS``)
    and Too Many Active Zones (``EOVERFLOW``), so an ``EIO`` is told apart by the zone's condition and
    write pointer, in the emulators' order: read-only, offline, full, not at the write pointer, past
    the capacity.
    """
    kw = {"zone": zone.index, "offset": offset, "length": length, "errno": err}
    z, pos = zone.index, offset - zone.start
    if err == _errno.ETOOMANYREFS:
        return TooManyOpenZonesError(f"zone {z}: cannot open it implicitly: the device's open zone "
                                     f"limit is reached and every open zone is explicitly open", **kw)
    if err == _errno.EOVERFLOW:
        return TooManyActiveZonesError(f"zone {z}: cannot activate it: the device's active zone limit "
                                       "is reached", **kw)
    if err == _errno.EINVAL:
        if offset % block_size or length % block_size or length <= 0:
            return MisalignedIOError(f"offset {offset} and length {length} must be positive multiples of "
                                     f"the {block_size}-byte block size", **kw)
        return OutOfRangeError(f"write {offset}+{length} refused with EINVAL (out of range)", **kw)
    if err == _errno.EIO:
        if zone.cond == ZoneCond.READONLY:
            return ZoneReadOnlyError(f"zone {z} is read-only", **kw)
        if zone.cond == ZoneCond.OFFLINE:
            return ZoneOfflineError(f"zone {z} is offline", **kw)
        if zone.cond == ZoneCond.FULL:
            if written_before is not None and written_before == pos and pos + length > zone.capacity:
                return ZoneBoundaryError(f"zone {z}: write of {length} bytes at byte {pos} crosses the "
                                         f"zone capacity {zone.capacity}", **kw)
            return ZoneFullError(f"zone {z} is full", **kw)
        wp = zone.wp - zone.start
        if pos != wp and (written_before is None or pos != written_before):
            return ZoneInvalidWriteError(f"zone {z}: write at byte {pos} of the zone, but its write "
                                         f"pointer is at byte {wp}", **kw)
        if pos + length > zone.capacity:
            return ZoneBoundaryError(f"zone {z}: write of {length} bytes at byte {pos} crosses the zone "
                                     f"capacity {zone.capacity}", **kw)
    return ZonedDeviceError(f"zone {z}: write {offset}+{length} failed: {os.strerror(err)} (zone "
                            f"{zone.cond.long}, write pointer at byte {zone.wp - zone.start})", **kw)


def classify_zone_op_error(op: ZoneOp, err: int, zone: Zone) -> ZonedDeviceError:
    """The exception a zone management ioctl that failed with ``err`` stands for, given the zone's
    state after it (see :func:`classify_write_error` for why the state is needed)."""
    z = zone.index
    kw = {"zone": z, "errno": err}
    if err == _errno.ETOOMANYREFS:
        return TooManyOpenZonesError(f"zone {z}: cannot {op.value} it: the open zone limit is reached",
                                     **kw)
    if err == _errno.EOVERFLOW:
        return TooManyActiveZonesError(f"zone {z}: cannot {op.value} it: the active zone limit is "
                                       "reached", **kw)
    if err in (_errno.ENOTTY, _errno.EOPNOTSUPP):
        return ZoneOpNotSupportedError(f"zone {z}: the device does not support zone {op.value}", **kw)
    if err == _errno.EINVAL:
        return OutOfRangeError(f"zone {z}: {op.value} refused with EINVAL", **kw)
    if zone.cond == ZoneCond.READONLY:
        return ZoneReadOnlyError(f"zone {z} is read-only: cannot {op.value} it", **kw)
    if zone.cond == ZoneCond.OFFLINE:
        return ZoneOfflineError(f"zone {z} is offline: cannot {op.value} it", **kw)
    if err == _errno.EIO:
        if zone.type == ZoneType.CONVENTIONAL:
            return ZoneOpNotSupportedError(f"zone {z} is conventional: no zone {op.value}", **kw)
        if (op is ZoneOp.OPEN and zone.cond == ZoneCond.FULL) or (
                op is ZoneOp.CLOSE and zone.cond in (ZoneCond.EMPTY, ZoneCond.FULL)):
            return InvalidZoneTransitionError(f"zone {z} is {zone.cond.long}: cannot {op.value} it", **kw)
    return ZonedDeviceError(f"zone {z}: {op.value} failed: {os.strerror(err)} (zone {zone.cond.long})",
                            **kw)
