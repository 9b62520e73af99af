"""The embedded default: a zoned device emulated in a regular (sparse) file.

File layout (little endian; every region block aligned):

=============================  =================================================================
offset                         content
=============================  =================================================================
0                              label block (4096 B), written once at creation: magic ``RETAINZD``,
                               format version, geometry, state-slot size, uuid, crc32c; a second
                               copy of the label at byte 2048 of the block
4096                           zone-state slot A, then its copy A'
4096 + 2 * slot_size           zone-state slot B, then its copy B'
data_offset = 4096 + 4 * slot  zone 0, then zone 1, ... each ``zone_size`` bytes (sparse)
data_offset + zones * size     (version 3) a third copy of the label block, the file's last 4096
                               bytes: a label in another block, at the far end (GPT keeps its
                               backup header in the disk's last LBA, UEFI spec 5.3.1)
=============================  =================================================================

A zone-state slot holds ``RZSTATE\\0``, a sequence number, every zone's condition (u8) and written
bytes (u64), the implicitly open zones oldest first (u32 count + u32 each: the order in which the open
limit closes them), and a crc32c.  Slots are written alternately, each with its copy (A and A', or B and B', then one sync; a device
rewrites only the 4096-byte pages of a slot pair that differ from its own last write there); the valid
slot with the highest sequence wins, so a torn slot write leaves the previous state readable, and one
damaged copy of the newest state leaves its twin (version 2; docs/format.md).  Version 1 files (one
label, slots A and B without copies, data at ``4096 + 2 * slot``) are read and written as they are.

**Bounds** (a file is input): the label's zone count is at most ``MAX_ZONES`` and its geometry must
be one :class:`~retainz.zoned.model.Geometry` accepts, checked before the state-slot size is computed
or anything is read past the label, and the file must be as long as the geometry says.

What survives a power cut or a killed process: every zone's data up to its write pointer as recorded
at the last :meth:`flush` (or the last finish/reset of that zone, which are durable on completion),
and the zone conditions recorded then.  A flush is two syncs in this order (``fdatasync``, see
``_datasync``): the data, then the zone-state slot that makes it visible, so a slot never records a
write pointer past data that is not durable.  A reset needs only the slot (the zone's data is gone).
Every :data:`WRITEBACK_BYTES` written, the kernel's writeback of the file is started without waiting
(``sync_file_range``), so a flush's ``fdatasync`` finds little left to write; this changes when bytes
reach the disk, never what a power cut keeps (that is still decided by the slot).  Data written after it is not visible after reopen.  A clean
:meth:`close` records the exact state, open zones included.
"""

from __future__ import annotations

import array
import fcntl
import os
import struct
import sys
import uuid as uuidlib
from collections.abc import Iterator

import crc32c
import numpy as np  # at import, not inside an open: a CLI command's open bar times the open, not numpy's load

from retainz.errors import CorruptDeviceError, DeviceBusyError, DeviceFormatError, NotADeviceError
from retainz.zoned.device import WriteData
from retainz.zoned.emulated import EmulatedZonedDevice
from retainz.zoned.model import COND_OF_VALUE, MAX_ZONES, Geometry, ZoneCond, round_up
from retainz.zoned.syscalls import best_effort, punch_hole, start_writeback

__all__ = ["FileDevice", "FILE_DEVICE_MAGIC", "WRITEBACK_BYTES", "state_slot_size", "encode_state_slot",
           "decode_state_slot"]

FILE_DEVICE_MAGIC = b"RETAINZD"
_STATE_MAGIC = b"RZSTATE\0"
_VERSION = 3
_READABLE = (1, 2, 3)
_LABEL_COPY = 2048          # byte of the label block holding the label's second copy (version 2)
_LABEL = struct.Struct("<8sIIQQIIIQ16s")
_SLOT_HEAD = struct.Struct("<8sQ")
_LABEL_SIZE = 4096


def state_slot_size(nr_zones: int) -> int:
    """Bytes of one zone-state slot for ``nr_zones`` zones (head, a condition byte and a u64 write pointer
    per zone, up to one u32 per implicitly open zone, counts and crc32c), in whole 4096-byte pages; the
    module docstring's layout (also :class:`~retainz.zoned.linuxfdp.LinuxFdpDevice`'s zone table)."""
    return round_up(_SLOT_HEAD.size + 13 * nr_zones + 8, 4096)


def device_file_sizes(g: Geometry) -> tuple[int, int]:
    """The lengths of a device file of geometry ``g`` (the module docstring's layout): version 2 (the
    label block, four zone-state slots, the zones) and version 3 (and the label's copy at the end)."""
    body = _LABEL_SIZE + 4 * state_slot_size(g.nr_zones) + g.size
    return body, body + _LABEL_SIZE


def zone0_candidates(size: int) -> Iterator[tuple[int, int]]:
    """``(byte offset of zone 0, zone-state slot size)`` for every slot size a device file of up to
    ``MAX_ZONES`` zones can have, that fits a file of ``size`` bytes: where zone 0 (a store's first
    superblock) starts when the label that says which is lost (``fsck --repair``, :meth:`FileDevice.relabel`)."""
    page = 4096
    for pages in range(1, state_slot_size(MAX_ZONES) // page + 1):
        start = _LABEL_SIZE + 4 * pages * page
        if start + page > size:
            return
        yield start, pages * page


def _create_flags(g: Geometry) -> str:
    """The ``retainz device create`` flags that make a device file of geometry ``g`` (sizes in the
    largest binary unit that divides them)."""
    def size(n: int) -> str:
        for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if n % unit == 0:
                return f"{n // unit}{name}"
        return str(n)
    flags = [f"--zones {g.nr_zones}", f"--zone-size {size(g.zone_size)}"]
    if g.zone_capacity != g.zone_size:
        flags.append(f"--zone-capacity {size(g.zone_capacity)}")
    if g.block_size != 4096:
        flags.append(f"--block-size {g.block_size}")
    return " ".join(flags + [f"--max-open {g.max_open}", f"--max-active {g.max_active}"])


def cut_short(path: str, size: int, need: int, geometry: Geometry, where: str) -> CorruptDeviceError:
    """The one refusal of a device file cut short into bytes it needs (``where``: which, or ``""``
    for its zone-state copies): nothing can rebuild them, so it names the two ways out, a copy from
    the source or a new empty file of the same geometry (``mkfs --force`` erases zones and cannot)."""
    return CorruptDeviceError(
        f"{path} is {size} bytes, shorter than its geometry ({need} bytes){where}: the file was cut short (an "
        "incomplete copy?) and its missing bytes cannot be rebuilt, `retainz fsck --repair` included; copy it "
        f"again from its source, or `retainz device create --force {path} {_create_flags(geometry)}` makes an "
        "empty one in its place (`mkfs --force` cannot: it erases zones, and these are missing)")


def not_a_device_file(path: str) -> IsADirectoryError:
    """The one refusal of a directory named where a device file belongs (every command, the mount,
    :meth:`FileDevice.create`)."""
    return IsADirectoryError(f"{path}: a directory, not a device file (make one with `retainz device create "
                             "FILE` and `retainz mkfs FILE`)")


class FileDevice(EmulatedZonedDevice):
    """A zoned device in a file (see the module docstring for the layout and durability).

    Create one with :meth:`create` (or ``retainz device create``); open an existing one with the
    constructor.  The device takes an ``flock`` on the file: exclusive for read-write, shared for
    ``readonly=True``.

    Raises:
        FileNotFoundError: no such file.
        NotADeviceError: the file is not a RetainZ device file (nothing is changed).
        CorruptDeviceError: the label or both zone-state slots fail their checksums.
        DeviceBusyError: another open of the device (in this process or another) holds its lock.
    """

    def __init__(self, path: str | os.PathLike, *, readonly: bool = False, lost_state: bool = False):
        self._fd = -1
        self._lost_state_ok = lost_state
        #: every zone-state copy was lost and ``lost_state`` was given: the zones read as Full until
        #: :meth:`rebuild_state` (a repair, from the journal) sets them
        self.state_lost = False
        path = os.fspath(path)
        label, geometry, slot_size, dev_uuid = self._read_label(path)
        version, label_note, self._short = label
        super().__init__(geometry, kind="file", path=path, payload=True)
        self.uuid = dev_uuid
        self.readonly = readonly
        self._slot_size = slot_size
        self._version = version
        self._copies = 2 if version >= 2 else 1      # copies of each zone-state slot
        self._data_offset = _LABEL_SIZE + 2 * self._copies * slot_size
        self._punch: set[int] = set()     # reset zones whose blocks are not punched yet (trim)
        # {slot pair (seq % 2): the slot this device last wrote there and synced}: the next write of
        # the pair rewrites only the pages that changed (mkfs writes the slot 65 times; issue 44)
        self._slots_written: dict[int, bytes] = {}
        self._unkicked = 0                 # bytes written since writeback was last started
        self._notes: tuple[str, ...] = label_note
        self._fd = os.open(path, os.O_RDONLY if readonly else os.O_RDWR)
        try:
            fcntl.flock(self._fd, (fcntl.LOCK_SH if readonly else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = -1
            raise DeviceBusyError(f"{path}: the device is in use (another open of it, in this process or "
                                  "another, holds its lock)") from None
        try:
            conds, written, self._seq = self._read_state()
        except BaseException:      # release the lock: a repair reopens the file at once
            os.close(self._fd)
            self._fd = -1
            raise
        if self._short:
            self._check_short(written)
        self._restore(conds, written, self._restore_order)

    def _check_short(self, written: list[int]) -> None:
        """A file cut short of its geometry by ``self._short`` bytes: readable when every byte a zone
        holds (its written bytes, from the zone state) is still in the file, so only the label copy at
        its end and space no zone has written are missing (noted; :meth:`repair_metadata` restores the
        length and the copy).  Else the missing bytes held data: refused.

        Raises:
            CorruptDeviceError: a zone's written bytes reach past the end of the file."""
        size = os.fstat(self._fd).st_size
        zs = self.geometry.zone_size
        cut = [z for z, w in enumerate(written) if w and self._data_offset + z * zs + w > size]
        if cut:
            os.close(self._fd)
            self._fd = -1
            raise cut_short(self._info.path, size, size + self._short, self.geometry,
                            f", and zone {cut[0]}'s written bytes reach past its end")
        self._notes += (f"the file is {self._short:,} bytes shorter than its geometry (cut short): only the label "
                        "copy at its end and space no zone has written are missing, nothing any zone holds "
                        "(fsck --repair restores its length and the copy)",)

    @property
    def notes(self) -> tuple[str, ...]:
        return self._notes

    # -- creation ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, geometry: Geometry, *, force: bool = False) -> FileDevice:
        """Create a device file (sparse: it takes disk space only as zones are written).

        Args:
            path: where to create it.
            geometry: the device geometry.
            force: overwrite an existing non-empty file.  Without it an existing file is refused and
                left untouched.

        Raises:
            FileExistsError: the path exists and is not empty, and ``force`` is False.
            IsADirectoryError: the path is a directory (``force`` or not).
            DeviceBusyError: another open of the device (in this process or another) holds its lock
                (nothing is changed).
            OSError: the file cannot be made (e.g. larger than the file system allows); the message
                names it, and a file this call created is removed.
        """
        path = os.fspath(path)
        if os.path.isdir(path):
            raise not_a_device_file(path)
        if path.endswith(os.sep):
            raise IsADirectoryError(f"{path}: a path ending in '{os.sep}' names a directory, not a device file "
                                    f"(drop the '{os.sep}')")
        if os.path.exists(path) and os.path.getsize(path) > 0 and not force:
            raise FileExistsError(f"{path} exists and is not empty; pass force=True to overwrite it")
        slot = state_slot_size(geometry.nr_zones)
        g = geometry
        label = _LABEL.pack(FILE_DEVICE_MAGIC, _VERSION, g.block_size, g.zone_size, g.zone_capacity,
                            g.nr_zones, g.max_open, g.max_active, slot, uuidlib.uuid4().bytes)
        label += struct.pack("<I", crc32c.crc32c(label))
        total = _LABEL_SIZE + 4 * slot + g.size + _LABEL_SIZE
        existed = os.path.lexists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:   # the lock before any change: a device in use elsewhere is refused untouched
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DeviceBusyError(f"{path}: the device is in use (another open of it, in this process or "
                                  "another, holds its lock); nothing was changed") from None
        try:
            os.ftruncate(fd, 0)
            block = label.ljust(_LABEL_COPY, b"\0") + label.ljust(_LABEL_SIZE - _LABEL_COPY, b"\0")
            os.pwrite(fd, block, 0)
            os.pwrite(fd, block, total - _LABEL_SIZE)      # the copy at the far end (version 3)
            empty = encode_state_slot(1, bytes([ZoneCond.EMPTY]) * g.nr_zones, array.array("Q", bytes(8 * g.nr_zones)),
                                 slot)
            os.pwrite(fd, empty * 2, _LABEL_SIZE)
            os.ftruncate(fd, total)
            os.fsync(fd)
        except (OSError, OverflowError) as e:  # e.g. EFBIG: larger than the file system allows
            os.close(fd)
            if not existed:   # remove only what this call made, so a retry is not refused
                os.unlink(path)
            reason = e.strerror if isinstance(e, OSError) and e.strerror else "beyond the largest file size"
            raise OSError(f"cannot create device file {path} of {total:,} bytes: {reason}") from e
        os.close(fd)
        return cls(path)

    @staticmethod
    def check_label(path: str) -> None:
        """Read ``path``'s device label (or its copy) without opening the device or taking its lock:
        a caller that hands the device to another process (the mount's server) refuses a foreign file
        first, in its own process.

        Raises:
            NotADeviceError, CorruptDeviceError: as opening the device would.
        """
        FileDevice._read_label(path)

    @staticmethod
    def relabel(path: str | os.PathLike, geometry: Geometry) -> str:
        """Write the label block (copies at 0 and 2048) and its copy at the end of a device file whose
        every label copy is lost, from ``geometry`` (``fsck --repair`` takes it from the store's
        superblock, which records the zones, their size and capacity and the block size; the open and
        active zone limits, which only the label held, are the caller's).  A new device uuid.  Returns
        what was done, one line.

        Raises:
            ValueError: a label copy is intact, or the file's size is not the layout ``geometry`` gives
                (format 3, or format 2 without the copy at the end); nothing is changed.
            OSError: a write failed.
        """
        path = os.fspath(path)
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(_LABEL_SIZE)
            f.seek(max(0, size - _LABEL_SIZE))
            tail = f.read(_LABEL_SIZE)
        n = _LABEL.size + 4
        for c in (raw[:n], raw[_LABEL_COPY:_LABEL_COPY + n], tail[:n]):
            if len(c) == n and c[:8] == FILE_DEVICE_MAGIC and \
                    struct.unpack_from("<I", c, _LABEL.size)[0] == crc32c.crc32c(c[:_LABEL.size]):
                raise ValueError(f"{path}: a device label copy is intact; nothing to rebuild")
        g = geometry
        slot = state_slot_size(g.nr_zones)
        body, whole = device_file_sizes(g)
        if size not in (body, whole):
            raise ValueError(f"{path} is {size} bytes, not the {whole} of a device file of this geometry; "
                             "nothing changed")
        version = 3 if size == whole else 2
        label = _LABEL.pack(FILE_DEVICE_MAGIC, version, g.block_size, g.zone_size, g.zone_capacity,
                            g.nr_zones, g.max_open, g.max_active, slot, uuidlib.uuid4().bytes)
        label += struct.pack("<I", crc32c.crc32c(label))
        block = label.ljust(_LABEL_COPY, b"\0") + label.ljust(_LABEL_SIZE - _LABEL_COPY, b"\0")
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if version == 3:
                os.pwrite(fd, block, body)
            os.pwrite(fd, block, 0)
            os.fsync(fd)
        except BlockingIOError:
            raise DeviceBusyError(f"{path}: the device is in use (another open of it, in this process or "
                                  "another, holds its lock); nothing was changed") from None
        finally:
            os.close(fd)
        return (f"rebuilt the device label (every copy was lost) from the store's superblock: {g.nr_zones} zones of "
                f"{g.zone_size:,} bytes; open and active zone limits {g.max_open} and {g.max_active} (only the label "
                "held them)")

    @staticmethod
    def _read_label(path: str) -> tuple[tuple[int, tuple[str, ...], int], Geometry, int, uuidlib.UUID]:
        """``((version, notes, short), geometry, slot size, uuid)`` from the label or, when it fails its
        checksum, its copy (version 2); ``short``: bytes the file lacks of its geometry, when it still
        holds the label and the zone-state slots (the open checks that no zone's data is missing).

        Raises:
            NotADeviceError: no label magic in either copy, or an unknown version.
            CorruptDeviceError: both copies fail their checksums, an impossible field (zone count
                over ``MAX_ZONES``, a geometry ``Geometry`` refuses, a slot size that does not match),
                or a file shorter than its label and zone-state slots.
        """
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(_LABEL_SIZE)
            tail = b""
            if size >= 2 * _LABEL_SIZE:
                f.seek(size - _LABEL_SIZE)
                tail = f.read(_LABEL_SIZE)
        n = _LABEL.size + 4
        copies = [raw[:n], raw[_LABEL_COPY:_LABEL_COPY + n], tail[:n]]

        def valid(c: bytes) -> bool:
            return len(c) == n and c[:8] == FILE_DEVICE_MAGIC and \
                struct.unpack_from("<I", c, _LABEL.size)[0] == crc32c.crc32c(c[:_LABEL.size])

        good = [i for i, c in enumerate(copies) if valid(c)]
        if good == [2] and _LABEL.unpack_from(copies[2])[1] < 3:
            good = []                      # only a version 3 file keeps a copy at its end
        if not good and not any(len(c) == n and c[:8] == FILE_DEVICE_MAGIC for c in copies[:2]):
            raise NotADeviceError(f"{path} is not a RetainZ device file (no {FILE_DEVICE_MAGIC.decode()} "
                                  "label); nothing was changed. Create one with `retainz device create`.")
        if not good:
            raise CorruptDeviceError(f"{path}: the device label fails its checksum in every copy")
        used = copies[good[0]]
        (_, version, bs, zsize, zcap, nz, mopen, mactive, slot, raw_uuid) = _LABEL.unpack_from(used)
        if version not in _READABLE or (good[0] == 1 and version < 2):
            raise NotADeviceError(f"{path}: device file format version {version} is not supported "
                                  f"(this RetainZ reads versions {', '.join(map(str, _READABLE))}); nothing "
                                  "was changed")
        notes: tuple[str, ...] = ()
        names = ("copy 0", "copy 1", "the copy at the end of the device")
        expected = [0, 1, 2] if version >= 3 else [0, 1] if version >= 2 else [0]
        damaged = [names[i] for i in expected if i not in good]
        if damaged == [names[2]]:
            notes = ("the device label's copy at the end of the device is damaged; copy 0 was used (fsck --repair "
                     "rewrites it)",)
        elif damaged:
            notes = (f"device label {' and '.join(damaged)} {'is' if len(damaged) == 1 else 'are'} damaged; "
                     f"{names[good[0]]} was used (fsck --repair rewrites it)",)
        if version == 1:   # its zones start where version 2 keeps the slot copies: no migration in place
            notes += ("device file format version 1 (one label copy, zone-state slots without copies), read and "
                      "written as is; `retainz fsck --upgrade` cannot migrate it in place (its zones start where "
                      f"version {_VERSION} keeps the copies)",)
        elif version < _VERSION:
            notes += (f"device file format version {version} (no label copy at the end of the device), read "
                      f"as is; `retainz fsck --upgrade` migrates it to version {_VERSION}",)
        if nz > MAX_ZONES:     # before the slot size is computed from it
            raise CorruptDeviceError(f"{path}: the label claims {nz:,} zones, over the limit of {MAX_ZONES:,}")
        try:
            geometry = Geometry(nr_zones=nz, zone_size=zsize, zone_capacity=zcap, block_size=bs,
                                max_open=mopen, max_active=mactive)
        except DeviceFormatError as e:
            raise CorruptDeviceError(f"{path}: the label's geometry is impossible: {e}") from None
        if slot != state_slot_size(nz):
            raise CorruptDeviceError(f"{path}: the label's state-slot size {slot} does not match its "
                                     f"{nz} zones")
        head = _LABEL_SIZE + (4 if version >= 2 else 2) * slot
        need = head + geometry.size + (_LABEL_SIZE if version >= 3 else 0)
        if size < head:
            raise cut_short(path, size, need, geometry, "")
        return (version, notes, max(0, need - size)), geometry, slot, uuidlib.UUID(bytes=raw_uuid)

    def _read_state(self) -> tuple[list[ZoneCond], list[int], int]:
        """``(conditions, written bytes, sequence)`` of the newest valid zone-state slot.  Each copy's
        checksum is checked; only the newest is decoded, its per-zone checks run over arrays
        (numpy), not a Python loop per zone (issue 44: an open of 1,048,576 zones)."""
        best = None                        # (sequence, raw slot, implicit-open count)
        bad = []                           # slots that were written but fail their checksum
        names = ["A", "A'", "B", "B'"] if self._copies == 2 else ["A", "B"]
        seqs = {}
        zeroed = []                        # slots that read as zeros: never written, or a lost block
        for i, name in enumerate(names):
            raw = os.pread(self._fd, self._slot_size, _LABEL_SIZE + i * self._slot_size)
            head = _check_slot(raw, self._nz)
            if head is None:
                (bad if raw.strip(b"\0") else zeroed).append(name)
            if head:
                seqs[name] = head[0]
            if head and (best is None or head[0] > best[0]):
                best = (head[0], raw, head[1])
        # A slot of zeros was written and lost (a zeroed 4 KiB block: issue 41) when its pair must have
        # been written: pair A at creation (sequence 1), pair B by the persist of sequence 3, so by any
        # state newer than 2; a zeroed slot is damage as a flipped one is, noted and rewritten by a repair.
        if best is not None:
            bad += [n for n in zeroed if n.startswith("A") or best[0] >= 3]
            bad.sort(key=names.index)
        if best is None:
            if not self._lost_state_ok:
                raise CorruptDeviceError(f"{self._info.path}: every zone-state copy fails its checksum")
            # a repair rebuilds the state from the journal (rebuild_state): until then every zone
            # reads as Full, so every byte the store may have written is readable
            self.state_lost = True
            self._damaged_slots = True
            self._notes += ("every zone-state copy fails its checksum: the zone state is rebuilt from the journal "
                            "(fsck --repair)",)
            self._restore_order = []
            return [ZoneCond.FULL] * self._nz, [self._zcap] * self._nz, 0
        self._damaged_slots = bool(bad)
        used = [n for n in names if seqs.get(n) == best[0]]
        if bad and self._copies == 2 and any(seqs.get(n + "'" if len(n) == 1 else n[0]) == best[0] for n in bad):
            self._notes += (f"zone-state copy {bad[0]} is damaged; its twin {used[0]}, sequence {best[0]}, was "
                            "used (fsck --repair rewrites it)",)
        elif bad:
            self._notes += (f"zone-state copy {bad[0]} fails its checksum (a write torn by a power cut, or "
                            f"damage); copy {used[0]}, sequence {best[0]}, was used: writes after it are not "
                            "visible",)
        seq, raw, n_order = best
        nz, head = self._nz, _SLOT_HEAD.size
        conds = np.frombuffer(raw, np.uint8, nz, head).copy()
        written = np.frombuffer(raw, "<u8", nz, head + nz)
        order = list(struct.unpack_from(f"<{n_order}I", raw, head + 9 * nz + 4))
        impossible = ~np.isin(conds, _COND_VALUES) | (written > self._zcap) | (written % self._bs != 0)
        if impossible.any():
            z = int(impossible.argmax())
            raise CorruptDeviceError(f"{self._info.path}: zone {z} state ({int(conds[z])}, {int(written[z])}) "
                                     "is impossible")
        if any(z >= nz or conds[z] != ZoneCond.IMP_OPEN for z in order):
            raise CorruptDeviceError(f"{self._info.path}: implicit-open order {order} is impossible")
        # A zone written to its capacity is Full (NVMe ZNS: the write that reaches the zone capacity
        # transitions the zone to ZSF).  A state saved between the two steps of that write (a
        # KeyboardInterrupt lands between any two bytecodes, and the close then flushes) says open
        # with every byte written: it is read as the Full zone it is.
        conds[(written == self._zcap) & np.isin(conds, _OPEN_OR_CLOSED)] = ZoneCond.FULL
        order = [z for z in order if conds[z] == ZoneCond.IMP_OPEN]
        self._restore_order = order
        return list(map(COND_OF_VALUE.__getitem__, conds.tobytes())), written.tolist(), seq

    # -- storage hooks -----------------------------------------------------------------------------
    def _store(self, zone: int, pos: int, data: WriteData) -> None:
        self._check_rw()
        if self._punch:
            self._punch.discard(zone)      # rewritten: its old blocks are reused in place
        view = memoryview(data)
        off = self._data_offset + zone * self._zsize + pos
        try:
            while view:
                n = os.pwrite(self._fd, view, off)
                view = view[n:]
                off += n
        except OSError as e:
            raise self._named(e) from None
        self._unkicked += len(data)
        if self._unkicked >= WRITEBACK_BYTES:
            self._unkicked = 0
            best_effort("sync_file_range", start_writeback, self._fd)

    def _claim(self, zone: int, pos: int, length: int) -> None:
        self._check_rw()
        if self._punch:
            self._punch.discard(zone)      # another process writes it: never punch it at trim

    def direct_region(self) -> tuple[str, int] | None:
        """``(the device file, byte offset of zone 0)``: a claimed extent at ``(zone, offset)`` is
        written with ``pwrite(fd, data, region + zone * zone_size + offset)`` (module docstring)."""
        return (self._info.path, self._data_offset)

    def _load(self, zone: int, pos: int, length: int) -> bytes:
        off = self._data_offset + zone * self._zsize + pos
        out = os.pread(self._fd, length, off)
        if len(out) < length:  # a sparse tail reads short only past EOF; the file is full size
            out += bytes(length - len(out))
        return out

    def _load_into(self, zone: int, pos: int, out: memoryview) -> None:
        off = self._data_offset + zone * self._zsize + pos
        done = 0
        while done < len(out):
            n = os.preadv(self._fd, [out[done:]], off + done)
            if n <= 0:               # past EOF of a sparse tail: zeros, as _load gives
                out[done:] = bytes(len(out) - done)
                return
            done += n

    def _discard(self, zone: int, keep: int) -> None:
        if self._fd < 0 or self.readonly:
            return
        if keep == 0:      # a reset: give the blocks back later (see trim), not on the hot path
            self._punch.add(zone)
            return
        start = round_up(keep, 4096)
        if start < self._zcap:
            best_effort("fallocate", punch_hole, self._fd, self._data_offset + zone * self._zsize + start,
                        self._zcap - start)

    def trim(self) -> int:
        """Give the file-system blocks of reset zones back (punch holes); returns zones trimmed.

        A reset only records the zone empty (its bytes read back as zeros: reads stop at the write
        pointer); punching its blocks is deferred to here, which :meth:`close` calls, because a
        hole punch is slow file-system work (a discard on SSD-backed file systems) and GC resets
        zones in bursts.  A zone written again before its trim reuses its blocks in place and is
        not punched."""
        if self._fd < 0 or self.readonly or not self._punch:
            return 0
        n = 0
        for zone in sorted(self._punch):
            best_effort("fallocate", punch_hole, self._fd, self._data_offset + zone * self._zsize, self._zcap)
            n += 1
        self._punch.clear()
        return n

    def _sync_data(self) -> None:
        self._check_rw()
        try:
            _datasync(self._fd)
        except OSError as e:
            raise self._named(e) from None

    def _persist(self) -> None:
        if self._fd < 0 or self.readonly:
            return
        self._seq += 1
        slot = encode_state_slot(self._seq, self._dcond, self._dwritten, self._slot_size, self._imp_open)
        pair = self._seq % 2
        base = _LABEL_SIZE + pair * self._copies * self._slot_size
        prev = self._slots_written.pop(pair, None)
        try:   # the slot and its copy (version 2), then one sync
            if prev is None:
                os.pwrite(self._fd, slot * self._copies, base)
            else:   # only the pages that differ from what this device last wrote in the pair
                view = memoryview(slot)
                for start, end in _changed_pages(prev, slot):
                    for copy in range(self._copies):
                        os.pwrite(self._fd, view[start:end], base + copy * self._slot_size + start)
            _datasync(self._fd)
        except OSError as e:
            raise self._named(e) from None
        self._slots_written[pair] = slot

    def repair_metadata(self) -> list[str]:
        """Rewrite damaged label and zone-state copies (``fsck --repair``): the label block from the
        intact copy (version 2), and both slot pairs from the current state (two persists).
        Returns what was rewritten, one line each.

        Raises:
            PermissionError: opened read-only.  OSError: a write failed.
        """
        self._check_rw()
        done = []
        if self._short:
            os.ftruncate(self._fd, os.fstat(self._fd).st_size + self._short)
            done.append(f"restored the file's length ({self._short:,} bytes were cut off its end)")
            self._short = 0
        if self._version >= 2:
            end = os.fstat(self._fd).st_size - _LABEL_SIZE
            raw = os.pread(self._fd, _LABEL_SIZE, 0)
            tail = os.pread(self._fd, _LABEL_SIZE, end) if self._version >= 3 else b""
            n = _LABEL.size + 4
            for c in (raw[:n], raw[_LABEL_COPY:_LABEL_COPY + n], tail[:n]):
                if len(c) == n and c[:8] == FILE_DEVICE_MAGIC and \
                        struct.unpack_from("<I", c, _LABEL.size)[0] == crc32c.crc32c(c[:_LABEL.size]):
                    block = c.ljust(_LABEL_COPY, b"\0") + c.ljust(_LABEL_SIZE - _LABEL_COPY, b"\0")
                    if block != raw:
                        os.pwrite(self._fd, block, 0)
                        done.append("rewrote the device label's copies")
                    if self._version >= 3 and block != tail:
                        os.pwrite(self._fd, block, end)
                        done.append("rewrote the device label's copy at the end of the device")
                    break
        if getattr(self, "_damaged_slots", False):
            self._slots_written.clear()      # the damage is on disk, not in what was written
            self.flush()
            self._persist()
            self._persist()
            self._damaged_slots = False
            done.append("rewrote both zone-state slots and their copies")
        _datasync(self._fd)
        return done

    def rebuild_state(self, conds: list[ZoneCond], written: list[int]) -> None:
        """Set every zone's condition and written bytes after all zone-state copies were lost
        (``lost_state``; a repair computes them from the journal: docs/format.md, "Repair"), and
        record them in both slot pairs.

        Raises:
            PermissionError: opened read-only.  OSError: a write failed.
        """
        self._check_rw()
        conds = [ZoneCond.CLOSED if c in (ZoneCond.IMP_OPEN, ZoneCond.EXP_OPEN) else c for c in conds]
        self._restore(conds, written, [])
        self._slots_written.clear()
        self._persist()
        self._persist()
        self.state_lost = False

    @property
    def upgradable(self) -> bool:
        """Whether :meth:`upgrade` would migrate something: the file is of device file format version 2
        (version 1 files, without slot copies, stay as they are; version 3 is this code's).  Reads no
        byte and writes none, so a read-only open can ask before ``fsck --upgrade`` opens read-write."""
        return self._version == 2

    def upgrade(self) -> list[str]:
        """Migrate a device file of an older format version to this one (``fsck --upgrade``): a
        version 2 file gains the label copy at its end; returns what was done (empty: nothing to
        do; version 1 files, without slot copies, stay as they are).

        Raises:
            PermissionError: opened read-only.  OSError: a write failed.
        """
        self._check_rw()
        if not self.upgradable:
            return []
        raw = os.pread(self._fd, _LABEL_SIZE, 0)
        n = _LABEL.size + 4
        c = next(c for c in (raw[:n], raw[_LABEL_COPY:_LABEL_COPY + n])
                 if struct.unpack_from("<I", c, _LABEL.size)[0] == crc32c.crc32c(c[:_LABEL.size]))
        label = c[:8] + struct.pack("<I", _VERSION) + c[12:_LABEL.size]
        label += struct.pack("<I", crc32c.crc32c(label))
        block = label.ljust(_LABEL_COPY, b"\0") + label.ljust(_LABEL_SIZE - _LABEL_COPY, b"\0")
        end = self._data_offset + self.geometry.size
        os.ftruncate(self._fd, end + _LABEL_SIZE)
        os.pwrite(self._fd, block, end)      # the copy at the end first, then the label block
        _datasync(self._fd)
        os.pwrite(self._fd, block, 0)
        _datasync(self._fd)
        self._version = _VERSION
        return [f"device file format 2 migrated to {_VERSION} (a label copy at the end of the device)"]

    def _named(self, e: OSError) -> OSError:
        """``e`` naming the device file (``PATH: No space left on device``), same errno and class."""
        return type(e)(e.errno, e.strerror, self._info.path) if e.filename is None and e.errno else e

    def _check_rw(self) -> None:
        if self._fd < 0:
            raise ValueError(f"{self._info.path}: device is closed")
        if self.readonly:
            raise PermissionError(f"{self._info.path}: device was opened read-only")

    # -- lifecycle ---------------------------------------------------------------------------------
    def power_loss(self, keep_unflushed: bool = False, *, keep: dict[int, int] | None = None) -> None:
        super().power_loss(keep_unflushed, keep=keep)
        conds, written, self._seq = self._read_state()  # what a reopen would see
        self._restore(conds, written, self._restore_order)

    def close(self) -> None:
        """Flush and record the exact zone state (open zones included), then release the file."""
        if self._fd < 0:
            return
        try:
            if not self.readonly:
                self.flush()
                cond = bytearray(self._cond)
                if self._dcond != cond:
                    self._dcond = cond
                    self._persist()
                self.trim()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __del__(self):
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1


#: ``fdatasync`` where the platform has it: the file's size never changes after :meth:`FileDevice.create`
#: (it is truncated to full size), so only the data and the block allocations it needs must reach the
#: disk, which ``fdatasync`` guarantees (POSIX: the metadata needed to retrieve the data); the
#: modification time is not needed.  Same ordering as ``fsync``: it returns once they are durable.
_datasync = getattr(os, "fdatasync", os.fsync)


def encode_state_slot(seq: int, conds, written, slot_size: int, imp_order=()) -> bytes:
    """One zone-state slot: head, a condition byte per zone, the write pointers (``<Q`` each), the
    implicitly open zones in opening order (``imp_order`` first, then any other by index), crc32c,
    zero-padded to ``slot_size``.

    ``conds``: a condition per zone (a ``bytearray``, as the device keeps its durable conditions,
    or any sequence of ints); ``written``: bytes per zone (an ``array('Q')``, as the device keeps
    them, or any sequence of ints).  No loop over the zones runs in Python (``bytes`` of the
    conditions, the pointers' own buffer, ``bytes.find`` for the open zones): the slot is rewritten
    at every zone state change (mkfs writes it 65 times; issue 44: 1.2 s a slot at 1,048,576 zones
    with a Python loop, 30 ms with lists)."""
    cond_bytes = bytes(conds)                 # ZoneCond is an IntEnum: one byte each, as before
    if isinstance(written, array.array) and written.typecode == "Q" and sys.byteorder == "little":
        pointers = memoryview(written).cast("B")
    else:
        pointers = array.array("Q", written)
        if sys.byteorder != "little":
            pointers.byteswap()
    imp = int(ZoneCond.IMP_OPEN)
    order = [z for z in imp_order if cond_bytes[z] == imp]
    listed = set(order)
    mark, z = bytes([imp]), cond_bytes.find(bytes([imp]))
    while z >= 0:                             # the implicitly open zones are few (the open-zone limit)
        if z not in listed:
            order.append(z)
        z = cond_bytes.find(mark, z + 1)
    body = b"".join((_SLOT_HEAD.pack(_STATE_MAGIC, seq), cond_bytes, pointers,
                     struct.pack(f"<I{len(order)}I", len(order), *order)))
    crc = struct.pack("<I", crc32c.crc32c(body))
    return b"".join((body, crc, bytes(slot_size - len(body) - len(crc))))


def _changed_pages(old: bytes, new: bytes) -> list[tuple[int, int]]:
    """``[(start, end)]`` byte ranges of the 4096-byte pages where two slots of one size differ, runs
    of adjacent pages merged (the slot size is a multiple of 4096)."""
    a = np.frombuffer(old, np.uint8).reshape(-1, 4096)
    b = np.frombuffer(new, np.uint8).reshape(-1, 4096)
    runs: list[tuple[int, int]] = []
    for page in np.flatnonzero((a != b).any(axis=1)).tolist():
        start = page * 4096
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], start + 4096)
        else:
            runs.append((start, start + 4096))
    return runs


def _check_slot(raw: bytes, nr_zones: int) -> tuple[int, int] | None:
    """``(sequence, implicit-open count)`` of a zone-state slot whose magic, count and crc32c are
    valid, else ``None`` (nothing per zone is decoded)."""
    end = _SLOT_HEAD.size + 9 * nr_zones
    if len(raw) < end + 8 or raw[:8] != _STATE_MAGIC:
        return None
    (n_order,) = struct.unpack_from("<I", raw, end)
    if n_order > nr_zones:
        return None
    end += 4 + 4 * n_order
    if len(raw) < end + 4:
        return None
    (crc,) = struct.unpack_from("<I", raw, end)
    if crc32c.crc32c(memoryview(raw)[:end]) != crc:
        return None
    return _SLOT_HEAD.unpack_from(raw)[1], n_order


def decode_state_slot(raw: bytes, nr_zones: int) -> tuple[int, list[int], list[int], list[int]] | None:
    """``(sequence, conditions, written bytes, implicit-open order)`` of a valid slot, else ``None``."""
    head = _check_slot(raw, nr_zones)
    if head is None:
        return None
    seq, n_order = head
    end = _SLOT_HEAD.size + 9 * nr_zones + 4 + 4 * n_order
    conds = list(raw[_SLOT_HEAD.size:_SLOT_HEAD.size + nr_zones])
    written = list(struct.unpack_from(f"<{nr_zones}Q", raw, _SLOT_HEAD.size + nr_zones))
    order = list(struct.unpack_from(f"<{n_order}I", raw, end - 4 * n_order))
    return seq, conds, written, order


#: every condition value a slot may hold; the conditions a zone written to its capacity is read as Full from
_COND_VALUES = tuple(int(c) for c in ZoneCond)
_OPEN_OR_CLOSED = (int(ZoneCond.IMP_OPEN), int(ZoneCond.EXP_OPEN), int(ZoneCond.CLOSED))


#: Bytes written between two starts of the kernel's writeback (:func:`~retainz.zoned.syscalls.start_writeback`).
WRITEBACK_BYTES = 8 << 20

