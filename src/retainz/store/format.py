"""On-device format: layout, the superblock, id rules.

Layout of a store on a device of N zones (``meta_zones`` = M, default 3 as in ZenFS):

========================  ==================================================================
zones 0 .. M-1            meta zones: the metadata journal (:mod:`retainz.store.journal`)
zones M .. N-1            data zones: shard extents, placed by the allocator
========================  ==================================================================

Every meta zone in use starts with a one-block **superblock** (little endian), written twice
(blocks 0 and 1, from format version 3)::

    magic "RETAINZS" | u32 format version | u32 flags | 16 B uuid | u64 sequence | u32 part
    | u32 nr_zones | u64 zone_size | u64 zone_capacity | u32 block_size | u32 meta_zones
    | u32 gc_reserve_zones | 64 B policy (UTF-8, NUL padded) | u32 crc32c of everything before

``sequence`` numbers journal generations (ZenFS's superblock sequence): a rollover writes the new
snapshot under ``sequence + 1``; ``part`` is the zone's place in a snapshot that spills across meta
zones.  The rest of the block is zero.

**Redundancy** (version 3; docs/format.md).  A chain zone holds two identical superblock copies, in
blocks 0 and 1 (btrfs mirrors its superblock likewise), so one damaged block never hides the chain;
its records start at block 2.  A meta zone outside the chain holds a *spare* superblock (flag
:data:`SPARE`, block 0 only, the zone then finished), written at format and by each rollover into
the free meta zones that are empty (ZenFS writes its superblock to every meta zone), so the store's
identity and geometry survive on every meta zone but the ones a rollover has just reset.

**Format versions.**  The version is bumped by any change older code would misread: a new record
kind or record member, a new meaning of a field, a layout change.  (A change older code reads
correctly, e.g. a record member it may ignore, keeps the version.)  This code writes
:data:`FORMAT_VERSION` and reads :data:`READABLE_VERSIONS`; flags must be a subset of
:data:`KNOWN_FLAGS`.

* A store of a version this code does not read, or with unknown flag bits, is refused at open,
  read-write or read-only, before anything is written (:class:`~retainz.errors.UnsupportedFormatError`
  names the version found); ``format`` refuses to overwrite it without ``force``.
* An older readable version is opened as is read-only (``RecoveryReport.repairs`` says so); a
  read-write open refuses it (:class:`~retainz.errors.OldFormatError`, naming ``retainz fsck
  --upgrade``) unless asked to migrate: ``Store.open(upgrade=True)`` (``fsck --upgrade``) or a repair
  (``fsck --repair``, which rewrites the journal anyway) rolls the journal over to a chain under the
  current version before any new record is written.  Older code then refuses the upgraded store
  (the versions it reads stop below it) rather than misread it.

History: 1 (the first format); 2 adds the replace commit (a commit record with ``rp``, retiring the
committed generation of the same id in the same record) and the hint update record (``h``); 3 writes
the superblock twice in each chain zone (records start at block 2), spare superblocks (flag
:data:`SPARE`) in the other meta zones, and each snapshot's head and end records twice; 4 stamps
each appended record with its sequence number and the live-set digest (:mod:`.records`), and marks
unknown generations in a snapshot entry; 5 writes every appended record twice (each copy in its own
blocks) and keeps the previous journal chain as the second copy of the current snapshot
(:mod:`.records`, "Copies"; :mod:`.journal`, "Previous chain"), so no single lost block loses a
record; 6 ends every chain zone it finishes with a close record (:mod:`.records`, "Zone close"), so
zeroed blocks at the end of a Full chain zone are a lost tail, not padding.

**Bounds** (a device is input): :meth:`Superblock.decode` refuses, with a valid checksum, a geometry
:class:`~retainz.zoned.model.Geometry` refuses (zone count over ``MAX_ZONES``...), meta zones
outside ``2 .. MAX_META_ZONES`` or not below the zone count, a ``part`` not below the meta zones,
and a GC reserve not below the zone count, before anything is sized from them.
"""

from __future__ import annotations

import re
import struct
import uuid as uuidlib
from dataclasses import dataclass

import crc32c

from retainz.errors import CorruptJournalError, InvalidIdError, UnsupportedFormatError
from retainz.zoned.model import Geometry

__all__ = ["MAGIC", "FORMAT_VERSION", "READABLE_VERSIONS", "KNOWN_FLAGS", "SPARE", "Superblock", "check_id",
           "MAX_ID_BYTES", "MAX_META_ZONES", "superblock_copies", "head_bytes"]

MAGIC = b"RETAINZS"
#: The format version this code writes.
FORMAT_VERSION = 6
#: The format versions this code reads.
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
#: Superblock flag: a spare copy in a meta zone outside the journal chain (version 3).
SPARE = 1
#: Superblock flag bits this code knows: any other bit refuses the store.
KNOWN_FLAGS = SPARE
MAX_ID_BYTES = 255
#: Meta zones are the first zones; at most this many.
MAX_META_ZONES = 64
_SB = struct.Struct("<8sII16sQIIQQIII64s")
#: Bytes of an encoded superblock: its fields and their crc32c (what a damage campaign flips).
SUPERBLOCK_BYTES = _SB.size + 4


def superblock_copies(version: int) -> int:
    """Superblock blocks at the start of a chain zone of format ``version``: 2 from version 3, else 1."""
    return 2 if version >= 3 else 1


def head_bytes(version: int, block_size: int) -> int:
    """Bytes before a chain zone's first record (its superblock copies) in format ``version``."""
    return superblock_copies(version) * block_size


@dataclass(frozen=True)
class Superblock:
    """The first block of every meta zone in use (see the module docstring).

    Attributes:
        uuid: the store's identity (same in every meta zone of one store).
        sequence: journal generation; higher wins at mount.
        part: index of this zone in its journal chain (0 = first).
        geometry: the device geometry at format (checked at open).
        meta_zones: M.
        gc_reserve_zones: GC starts when fewer data zones than this are empty.
        policy: the allocator spec recorded at format (``Store.open(policy=None)`` uses it).
        flags: :data:`SPARE` for a spare copy outside the chain, else 0.
        version: format version.
    """

    uuid: uuidlib.UUID
    sequence: int
    part: int
    geometry: Geometry
    meta_zones: int
    gc_reserve_zones: int
    policy: str
    flags: int = 0
    version: int = FORMAT_VERSION

    def encode(self) -> bytes:
        g = self.geometry
        policy = self.policy.encode()
        if len(policy) > 64:
            raise ValueError(f"policy spec {self.policy!r} is longer than 64 bytes")
        body = _SB.pack(MAGIC, self.version, self.flags, self.uuid.bytes, self.sequence, self.part,
                        g.nr_zones, g.zone_size, g.zone_capacity, g.block_size, self.meta_zones,
                        self.gc_reserve_zones, policy)
        body += struct.pack("<I", crc32c.crc32c(body))
        return body.ljust(g.block_size, b"\0")

    @staticmethod
    def has_magic(block: bytes) -> bool:
        return block[:8] == MAGIC

    def check_supported(self, where: str) -> None:
        """Refuse a version or flags this code does not know (module docstring).

        Raises:
            UnsupportedFormatError: naming the version (or flags) found in ``where``.
        """
        if self.version not in READABLE_VERSIONS:
            raise UnsupportedFormatError(f"{where}: RetainZ store format version {self.version}; this code reads "
                                         f"versions {', '.join(map(str, READABLE_VERSIONS))} (newer software "
                                         "wrote it?): nothing written")
        if self.flags & ~KNOWN_FLAGS:
            raise UnsupportedFormatError(f"{where}: RetainZ store with unknown format flags {self.flags:#x} "
                                         f"(format version {self.version}): nothing written")

    @classmethod
    def decode(cls, block: bytes, device_geometry: Geometry) -> Superblock | None:
        """Parse a superblock; ``None`` if the magic is absent or the checksum fails.  The version
        and flags are returned as found (:meth:`check_supported` refuses unknown ones).

        Raises:
            DeviceFormatError: the recorded geometry is impossible (a valid checksum over it).
            CorruptJournalError: the recorded policy name is not UTF-8, or the meta-zone count, part
                or GC reserve is impossible (module docstring, "Bounds").
        """
        if len(block) < _SB.size + 4 or block[:8] != MAGIC:
            return None
        (crc,) = struct.unpack_from("<I", block, _SB.size)
        if crc32c.crc32c(block[:_SB.size]) != crc:
            return None
        (_, version, flags, raw_uuid, seq, part, nz, zsize, zcap, bs, meta, reserve,
         policy) = _SB.unpack_from(block)
        bad = []
        if not 2 <= meta <= MAX_META_ZONES or meta >= nz:
            bad.append(f"{meta} meta zones (2..{MAX_META_ZONES}, below the {nz} zones)")
        if part >= min(meta, MAX_META_ZONES):
            bad.append(f"part {part} of {meta} meta zones")
        if reserve >= nz:
            bad.append(f"a GC reserve of {reserve} zones on {nz}")
        if bad:
            raise CorruptJournalError("a superblock with a valid checksum records an impossible "
                                      + "; ".join(bad) + ": corrupt or crafted store")
        g = device_geometry
        geometry = Geometry(nr_zones=nz, zone_size=zsize, zone_capacity=zcap, block_size=bs,
                            max_open=g.max_open, max_active=g.max_active)
        try:
            policy_name = policy.rstrip(b"\0").decode()
        except UnicodeDecodeError:
            raise CorruptJournalError("a superblock's policy name is not UTF-8 text: corrupt store") from None
        return cls(uuid=uuidlib.UUID(bytes=raw_uuid), sequence=seq, part=part, geometry=geometry,
                   meta_zones=meta, gc_reserve_zones=reserve, policy=policy_name,
                   flags=flags, version=version)


_BAD_ID = re.compile(r"[\x00-\x1f\x7f/\\]|\.\.")
_VALID_IDS: dict[str, None] = {}  # a bounded cache: shard names repeat across generations


def check_id(value: str, what: str = "generation id") -> str:
    """Validate a generation id or shard name: it becomes a file name in ``retainz get``.

    Raises:
        InvalidIdError: not a str, empty or only whitespace, ``.``, contains ``..``, ``/``, ``\\``, NUL or another
            control character, or longer than 255 bytes in UTF-8.
    """
    if type(value) is str and value in _VALID_IDS:
        return value
    if not isinstance(value, str):
        raise InvalidIdError(f"{what} must be a str, not {type(value).__name__}")
    if not value.strip():
        raise InvalidIdError(f"{what} is empty or only whitespace ({value!r})")
    if value == "." or ".." in value:
        raise InvalidIdError(f"{what} {value!r} is '.' or contains '..'")
    if "/" in value or "\\" in value:
        raise InvalidIdError(f"{what} {value!r} contains a path separator")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidIdError(f"{what} {value!r} contains NUL or a control character")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise InvalidIdError(f"{what} is longer than {MAX_ID_BYTES} bytes")
    if _BAD_ID.search(value):  # pragma: no cover - the checks above are exhaustive
        raise InvalidIdError(f"{what} {value!r} is not allowed")
    if len(_VALID_IDS) < 65536:
        _VALID_IDS[value] = None
    return value
