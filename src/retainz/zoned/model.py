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
    "COND_OF_VALUE",
    "ZoneCond",
    "ZoneType",
    "Zone",
    "Geometry",
    "DeviceInfo",
    "parse_size",
    "format_sizes",
    "SIZE_UNITS",
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


#: ``COND_OF_VALUE[v]``: the :class:`ZoneCond` of condition value ``v`` (``None`` for no condition),
#: a table for decoding many zones at once without an enum call per zone (an open of a device file).
COND_OF_VALUE: tuple[ZoneCond | None, ...] = tuple(
    ZoneCond(v) if v in ZoneCond._value2member_map_ else None for v in range(256))


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
        if self.zone_capacity <= 0 or self.zone_capacity % (self.block_size or 1):
            problems.append(f"zone capacity {self.zone_capacity} is not a positive multiple of the block size")
        if self.zone_capacity > self.zone_size:
            problems.append(f"zone capacity {self.zone_capacity} must be at most the zone size {self.zone_size}")
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


#: The size units :func:`parse_size` accepts, exactly as written (case matters): GNU coreutils'
#: (``truncate -s``, ``dd``) and util-linux's convention.  K, M, G, T, P and KiB...PiB are powers of
#: 1024 (IEC 80000-13 binary prefixes; the single letters as coreutils and QEMU read them); KB...PB and
#: ``kB`` are powers of 1000 (SI); ``B`` is one byte.
SIZE_UNITS = {"": 1, "B": 1,
              "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30,
              "T": 1 << 40, "TiB": 1 << 40, "P": 1 << 50, "PiB": 1 << 50,
              "kB": 1000, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "TB": 1000 ** 4, "PB": 1000 ** 5}
_SIZE_RE = re.compile(r"([0-9]+) ?([A-Za-z]*)", re.ASCII)
_UNIT_LIST = "B, K/KiB, M/MiB, G/GiB, T/TiB, P/PiB (x1024) or kB/KB, MB, GB, TB, PB (x1000)"


def round_up(n: int, to: int) -> int:
    """``n`` (bytes, >= 0) rounded up to a multiple of ``to`` (a block or zone size, > 0)."""
    return -(-n // to) * to


def parse_size(text: str | int, *, multiple_of: int | None = None, what: str = "size") -> int:
    """Parse a byte size, ``"64MiB"``, ``"64M"``, ``"64MB"``, ``"4096"``, into bytes: the one size
    parser of the project (command-line flags, ``mem:`` device specs, manifests, environment knobs).

    The unit is read exactly as written (:data:`SIZE_UNITS`): ``64MiB`` and ``64M`` are 67,108,864
    bytes, ``64MB`` is 64,000,000 bytes, and a unit that matches one only when case is ignored
    (``64mb``, ``64mib``, ``64Mb``: megabits?) is refused as ambiguous rather than guessed.  A whole
    number of units, optionally one space before the unit; no sign, no fraction, no surrounding space.

    Args:
        text: the size as written, or an ``int`` (bytes, taken as is once checked).
        multiple_of: refuse a value that is not a multiple of this (a block size).
        what: how the error names the value (``"--zone-size"``).

    Raises:
        ValueError: one line naming ``text`` and the rule it breaks: malformed, an unknown or
            ambiguous unit, negative, or not a multiple of ``multiple_of``.  (No upper bound here: the
            consumer bounds it, e.g. :class:`Geometry` at the largest device, 2^63 - 1 bytes.)
    """
    if isinstance(text, bool) or not isinstance(text, int | str):
        raise ValueError(f"bad {what} {text!r}: expected a number of bytes or a string like 64MiB")
    if isinstance(text, int):
        value = text
        if value < 0:
            raise ValueError(f"bad {what} {text}: a size cannot be negative")
    else:
        m = _SIZE_RE.fullmatch(text)
        if m is None:
            raise ValueError(f"bad {what} {text!r}: " + _malformed(text))
        number, unit = m.groups()
        if unit not in SIZE_UNITS:
            meant = _meant(unit)
            if meant:
                choices = " or ".join(f"{number}{u} ({int(number) * SIZE_UNITS[u]:,} B)" for u in meant)
                raise ValueError(f"bad {what} {text!r}: unit {unit!r} is ambiguous (units are case-sensitive): "
                                 f"write {choices}")
            raise ValueError(f"bad {what} {text!r}: unknown unit {unit!r}; valid: {_UNIT_LIST}")
        value = int(number) * SIZE_UNITS[unit]
    if multiple_of and value % multiple_of:
        raise ValueError(f"bad {what} {text!r}: {value:,} bytes is not a multiple of the {multiple_of}-byte "
                         "block size")
    return value


def _meant(unit: str) -> list[str]:
    """The units a refused ``unit`` could mean when case is ignored: ``mb``, ``Mb``, ``mib``, ``m`` ->
    ``MiB`` and ``MB`` (binary or decimal: the writer must say which); ``b`` -> ``B``; else none."""
    u = unit.lower()
    if u == "b":
        return ["B"]
    if len(u) in (1, 2, 3) and u[0] in "kmgtp" and u[1:] in ("", "b", "ib"):
        p = u[0].upper()
        return [f"{p}iB", "kB" if p == "K" else f"{p}B"]
    return []


def _whole(number: str, unit: str) -> str:
    """For ``1.5`` ``GiB``: ``"; write 1536MiB"`` (the same bytes in a smaller unit of the same
    system), or ``""`` when none is whole."""
    from fractions import Fraction

    if unit not in SIZE_UNITS:
        return ""
    n = Fraction(number) * SIZE_UNITS[unit]
    if n.denominator != 1:
        return ""
    base = 1000 if SIZE_UNITS[unit] % 1000 == 0 else 1024
    for u, scale in sorted(SIZE_UNITS.items(), key=lambda kv: -kv[1]):
        if scale < SIZE_UNITS[unit] and (scale == 1 or scale % base == 0) and n % scale == 0 and u and \
                (len(u) != 1 or u == "B"):
            return f"; write {int(n // scale)}{u if u else ''}"
    return ""


def _malformed(text: str) -> str:
    t = text.strip()
    if t != text:
        return "remove the surrounding spaces"
    if t.startswith("-"):
        return "a size cannot be negative"
    m = re.fullmatch(r"([0-9]*[.,][0-9]+) ?([A-Za-z]*)", t, re.ASCII)
    if m:
        return "a size is a whole number of units" + _whole(m.group(1).replace(",", "."), m.group(2))
    if not t:
        return "empty"
    return f"expected an integer with an optional unit ({_UNIT_LIST})"


def format_sizes(n: int) -> str:
    """``n`` bytes in both unit systems and exactly: ``"64 MiB = 67.11 MB = 67,108,864 B"`` (one unit
    system is left out when it has nothing to add: ``"512 B"``)."""
    iec = format_size(n)
    si = _format_si(n)
    exact = f"{n:,} B"
    return " = ".join(dict.fromkeys([iec, si, exact]))


def _format_si(n: int) -> str:
    for unit, scale in (("TB", 1000 ** 4), ("GB", 1000 ** 3), ("MB", 1000 ** 2), ("kB", 1000)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n} B"


def format_size(n: int) -> str:
    """Format bytes the short binary way: ``64 MiB``, ``1.5 GiB``, ``512 B``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{n} B"
