"""The zone model: geometry, zone conditions and zone reports.

Names and numbers follow Linux's ``include/uapi/linux/blkzoned.h`` (the values libzbd re-exports), so a
report from an emulated device and one from a real ``/dev/nvmeXnY`` look the same.  Every position and
size is in bytes; the kernel's 512-byte sectors are converted in exactly one place (the Linux device).
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass

from retainz.errors import DeviceFormatError

__all__ = [
    "ZoneCond",
    "ZoneType",
    "Zone",
    "Geometry",
    "DeviceInfo",
    "parse_size",
    "format_size",
]


class ZoneType(enum.IntEnum):
    """Zone types (``BLK_ZONE_TYPE_*``)."""

    CONVENTIONAL = 0x1
    SEQ_WRITE_REQUIRED = 0x2
    SEQ_WRITE_PREFERRED = 0x3

    @property
    def short(self) -> str:
        return _TYPE_SHORT.get(self, "???")


_TYPE_SHORT = {
    ZoneType.CONVENTIONAL: "cnv",
    ZoneType.SEQ_WRITE_REQUIRED: "swr",
    ZoneType.SEQ_WRITE_PREFERRED: "swp",
}


class ZoneCond(enum.IntEnum):
    """Zone conditions (``BLK_ZONE_COND_*``), the NVMe ZNS zone states ZSE, ZSIO, ZSEO, ZSC, ZSF,
    ZSRO and ZSO (NVMe ZNS 1.1, section 2.1.1)."""

    NOT_WP = 0x0
    EMPTY = 0x1
    IMP_OPEN = 0x2
    EXP_OPEN = 0x3
    CLOSED = 0x4
    READONLY = 0xD
    FULL = 0xE
    OFFLINE = 0xF

    @property
    def short(self) -> str:
        """libzbd's two-letter code (``zbd report``)."""
        return _COND_NAMES.get(self, ("??", "unknown"))[0]

    @property
    def long(self) -> str:
        """libzbd's long name, e.g. ``open-implicit``."""
        return _COND_NAMES.get(self, ("??", "unknown"))[1]

    @property
    def is_open(self) -> bool:
        return self in (ZoneCond.IMP_OPEN, ZoneCond.EXP_OPEN)

    @property
    def is_active(self) -> bool:
        """Open or closed: the zone holds one of the device's active resources."""
        return self in (ZoneCond.IMP_OPEN, ZoneCond.EXP_OPEN, ZoneCond.CLOSED)

    @classmethod
    def from_short(cls, code: str) -> ZoneCond:
        for cond, (short, _) in _COND_NAMES.items():
            if short == code:
                return cond
        raise ValueError(f"unknown zone condition code {code!r}; valid: "
                         + ", ".join(s for s, _ in _COND_NAMES.values()))


_COND_NAMES = {
    ZoneCond.NOT_WP: ("nw", "not-write-pointer"),
    ZoneCond.EMPTY: ("em", "empty"),
    ZoneCond.IMP_OPEN: ("oi", "open-implicit"),
    ZoneCond.EXP_OPEN: ("oe", "open-explicit"),
    ZoneCond.CLOSED: ("cl", "closed"),
    ZoneCond.READONLY: ("ro", "read-only"),
    ZoneCond.FULL: ("fu", "full"),
    ZoneCond.OFFLINE: ("ol", "offline"),
}


@dataclass(frozen=True, slots=True)
class Zone:
    """One row of a zone report.

    Attributes:
        index: zone number, from 0.
        start: first byte of the zone on the device.
        size: the zone's LBA span in bytes (``len`` in the kernel's report).
        capacity: writable bytes in the zone (``capacity`` <= ``size``; NVMe ZNS "zone capacity").
        wp: the write pointer as a device byte offset.  A Full zone reports ``start + size``, as Linux
            does after a finish, whatever was written.
        cond: the zone condition.
        type: the zone type (RetainZ devices expose sequential-write-required zones only).
    """

    index: int
    start: int
    size: int
    capacity: int
    wp: int
    cond: ZoneCond
    type: ZoneType = ZoneType.SEQ_WRITE_REQUIRED

    @property
    def written(self) -> int:
        """Bytes written in the zone so far (``capacity`` for a Full zone)."""
        if self.cond == ZoneCond.FULL:
            return self.capacity
        return self.wp - self.start

    @property
    def remaining(self) -> int:
        """Bytes that can still be written before the zone is full."""
        if self.cond in (ZoneCond.FULL, ZoneCond.READONLY, ZoneCond.OFFLINE):
            return 0
        return self.capacity - (self.wp - self.start)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cond"] = self.cond.long
        d["type"] = self.type.short
        return d


#: Most zones a device may have: about a million, far above real drives (a 32 TB ZNS SSD with
#: 2 GiB zones has about 16,000; a 30 TB SMR disk with 256 MiB zones about 115,000).  Keeps the
#: per-zone state (file-device header, in-memory zone table) bounded.
MAX_ZONES = 1 << 20
#: Largest device in bytes: every byte offset (``os.pwrite``, the file-device label, the superblock's
#: zone size) is a signed 64-bit number.
MAX_DEVICE_BYTES = (1 << 63) - 1
#: Largest max open / max active zone count: NVMe ZNS reports MOR and MAR as 32-bit fields
#: (Zoned Namespace Command Set, Identify Namespace data structure).
MAX_ZONE_LIMIT = (1 << 32) - 1


@dataclass(frozen=True, slots=True)
class Geometry:
    """What a zoned device looks like.

    Attributes:
        nr_zones: number of zones.
        zone_size: bytes per zone (LBA span); a multiple of ``block_size``.
        zone_capacity: writable bytes per zone, ``block_size <= zone_capacity <= zone_size``.
        block_size: logical block size in bytes: 4096 (default) or 512.  Every write offset and
            length must be a multiple of it.
        max_open: max open zones (implicitly or explicitly open), 0 = unlimited (NVMe MOR + 1).
        max_active: max active zones (open or closed), 0 = unlimited (NVMe MAR + 1).

    Raises:
        DeviceFormatError: on any inconsistent value (named in the message).
    """

    nr_zones: int
    zone_size: int
    zone_capacity: int
    block_size: int = 4096
    max_open: int = 0
    max_active: int = 0

    def __post_init__(self):
        problems = []
        if self.block_size not in (512, 4096):
            problems.append(f"block size {self.block_size} is not 512 or 4096")
        if self.nr_zones < 1:
            problems.append(f"zone count {self.nr_zones} must be at least 1")
        if self.nr_zones > MAX_ZONES:
            problems.append(f"zone count {self.nr_zones:,} exceeds the limit of {MAX_ZONES:,} zones")
        if self.zone_size <= 0 or self.zone_size % (self.block_size or 1):
            problems.append(f"zone size {self.zone_size} is not a positive multiple of the block size")
        if (self.zone_capacity <= 0 or self.zone_capacity % (self.block_size or 1)
                or self.zone_capacity > self.zone_size):
            problems.append(f"zone capacity {self.zone_capacity} must be a positive multiple of the "
                            f"block size and at most the zone size {self.zone_size}")
        if self.zone_size > 0 and self.nr_zones >= 1 and self.nr_zones * self.zone_size > MAX_DEVICE_BYTES:
            problems.append(f"{self.nr_zones} zones of {self.zone_size} bytes exceed the largest device, "
                            f"{MAX_DEVICE_BYTES} bytes (a byte offset is a signed 64-bit number)")
        if self.max_open < 0 or self.max_active < 0:
            problems.append("max open/active zones cannot be negative")
        if max(self.max_open, self.max_active) > MAX_ZONE_LIMIT:
            problems.append(f"max open/active zones cannot exceed {MAX_ZONE_LIMIT} (NVMe ZNS MOR and MAR are "
                            "32-bit fields)")
        if self.max_active and self.max_open > self.max_active:
            problems.append(f"max open zones {self.max_open} exceeds max active zones {self.max_active}")
        if problems:
            raise DeviceFormatError("invalid zoned device geometry: " + "; ".join(problems))

    @property
    def size(self) -> int:
        """Bytes of LBA space: ``nr_zones * zone_size``."""
        return self.nr_zones * self.zone_size

    @property
    def capacity(self) -> int:
        """Writable bytes: ``nr_zones * zone_capacity``."""
        return self.nr_zones * self.zone_capacity


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """A device's geometry plus what kind of device it is.

    Attributes:
        geometry: the :class:`Geometry`.
        kind: ``"memory"``, ``"file"``, ``"linux"`` or a wrapper's name.
        path: the backing path, or ``""``.
        payload: False when the device may count written bytes without keeping them.
        model: ``"host-managed"`` for every device RetainZ drives.
    """

    geometry: Geometry
    kind: str
    path: str = ""
    payload: bool = True
    model: str = "host-managed"

    def to_dict(self) -> dict:
        g = self.geometry
        return {
            "kind": self.kind, "path": self.path, "model": self.model, "payload": self.payload,
            "nr_zones": g.nr_zones, "zone_size": g.zone_size, "zone_capacity": g.zone_capacity,
            "block_size": g.block_size, "max_open": g.max_open, "max_active": g.max_active,
            "size": g.size, "capacity": g.capacity,
        }


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
          "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def round_up(n: int, to: int) -> int:
    """``n`` (bytes, >= 0) rounded up to a multiple of ``to`` (a block or zone size, > 0)."""
    return -(-n // to) * to


def parse_size(text: str | int) -> int:
    """Parse ``"64MiB"``, ``"64M"``, ``"4096"`` or ``"1GB"`` into bytes.

    Binary units (K, M, G, T, KiB...) are powers of 1024; KB, MB, GB, TB are powers of 1000
    (as QEMU's ``zoned.zone_size=64M`` means 64 MiB).

    Raises:
        ValueError: an unparseable size or unknown unit (the message lists the units).
    """
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"bad size {text!r}: expected an integer with an optional unit "
                         "(K, M, G, T, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def format_size(n: int) -> str:
    """Format bytes the short binary way: ``64 MiB``, ``1.5 GiB``, ``512 B``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n} B"
