"""A real NVMe namespace with Flexible Data Placement, presented to the store as host-managed zones.

The same zoned view as :class:`~retainz.zoned.fdp.FdpNamespaceDevice` (docs/fdp.md, "The store on an FDP
namespace"), with the Linux kernel's NVMe passthrough (:mod:`retainz.zoned.nvmeioctl`) where that device
has the FTL model:

* zone ``z`` is the namespace range ``[z * zone_capacity, (z + 1) * zone_capacity)`` (zones packed
  densely); the zone state machine is kept on the host (:class:`~retainz.zoned.emulated.
  EmulatedZonedDevice`);
* **a placement handle is the active resource**: ``max_active`` is the number of placement handles the
  namespace reports (Reclaim Unit Handle Status), a zone takes the lowest free one
  (:class:`~retainz.zoned.fdp.PlacementHandles`) with its first write and gives it back when full,
  finished or reset; full and finished zones with a Reclaim Unit Handle Update, so the next zone through
  the handle starts a fresh reclaim unit;
* every write is an NVMe Write with the data placement directive (DTYPE 2) and the zone's handle as the
  placement identifier (DSPEC), in pieces of at most the queue's ``max_hw_sectors_kb``, through
  ``NVME_IOCTL_IO64_CMD`` on the namespace's block device; no block-layer write carries a placement
  identifier on Linux before 6.16, which is why the write bypasses it;
* reads: ``O_DIRECT`` ``preadv`` on the block device (the kernel's page cache never sees the
  passthrough writes, so it must not answer reads);
* **reset** is a Dataset Management Deallocate of the zone's written range; flush is NVMe Flush.

:meth:`LinuxFdpDevice.placements` is the host's ledger of what went through each placement identifier
(bytes written, bytes since its last RUH Update, updates and the unwritten remainders they charged),
:meth:`LinuxFdpDevice.ruh_status` and :meth:`LinuxFdpDevice.fdp_statistics` are the drive's own
accounts (Reclaim Unit Handle Status; FDP statistics log 22h): the guest lane compares them
(tests/vm/test_fdp_guest.py).

**Durability**: a conventional namespace keeps no write pointers, so the zone table is kept on the
namespace itself, after the last zone: two zone-state slots, A and B, in the format of
:class:`~retainz.zoned.file.FileDevice`'s (every zone's condition and written bytes, the implicitly open
zones in order, a crc32c), written alternately by :meth:`_persist` after each flush's NVMe Flush and after
each zone operation, then flushed themselves.  Opening the namespace again loads the newest valid slot
(a torn slot leaves the other), so the store reopens and recovers as on a zoned device: data up to each
write pointer recorded at the last flush or zone operation survives a crash.  The slots are written
without a placement directive; QEMU charges such writes to placement handle 0 (``nvme_do_write_fdp``),
so :meth:`placements` counts them there too (``HandleLedger.unplaced``).  After a reopen an open zone
holds no handle until its next write, which takes the lowest free one.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import stat
from pathlib import Path

from retainz.errors import DeviceFormatError, NotADeviceError
from retainz.zoned.device import WriteData, ZoneOp
from retainz.zoned.emulated import EmulatedZonedDevice
from retainz.zoned.fdp import PlacementHandles
from retainz.zoned.file import decode_state_slot, encode_state_slot, state_slot_size
from retainz.zoned.linux import sysfs_queue_dir
from retainz.zoned.model import Geometry
from retainz.zoned.nvmeioctl import FdpLogStatistics, NvmePassthrough, RuhStatus
from retainz.zoned.syscalls import ioctl_u32

__all__ = ["LinuxFdpDevice", "HandleLedger"]

_BLKSSZGET = 0x1268          # logical block size (include/uapi/linux/fs.h)
_PAGE = mmap.PAGESIZE


@dataclasses.dataclass
class HandleLedger:
    """What the host sent through one placement identifier, in bytes: ``written`` in all,
    ``since_update`` since its last Reclaim Unit Handle Update, ``updates`` made, ``padding``: the
    remainders of reclaim units those updates left unwritten (``ru_size - since_update`` at each update,
    the bytes an FDP drive charges to MBMW: QEMU ``nvme_update_ruh``)."""

    written: int = 0
    since_update: int = 0
    updates: int = 0
    padding: int = 0
    unplaced: int = 0       # of ``written``: zone-state slots, written without a placement directive


class LinuxFdpDevice(EmulatedZonedDevice):
    """Zones on a real FDP namespace through NVMe passthrough (see the module docstring).

    Args:
        path: the namespace's block device, ``/dev/nvmeXnY``.
        zone_capacity: bytes per zone (whole logical blocks); the zones fill the namespace up to the two
            zone-state slots at its end.
        ru_size: the reclaim unit size in bytes (FDP configurations log; the guest lane passes QEMU's
            ``fdp.runs``), used for the padding of RUH Updates in :meth:`placements`.
        zones: number of zones (default: as many as the namespace holds).
        handles: placement handles to use (default: every one the namespace reports); also the zones
            that may be active and open at once.
        readonly: reports and reads only (``O_RDONLY``, no exclusive open; writes, resets and zone
            operations raise PermissionError; nothing is written to the namespace, not even the zone
            table).

    Raises:
        NotADeviceError: ``path`` is not a block device, or not an NVMe namespace.
        DeviceFormatError: a zone capacity that is not whole blocks, more zones than the namespace
            holds, more handles than it has, or a namespace without placement handles (FDP disabled).
        NvmeCommandError / OSError: the Reclaim Unit Handle Status cannot be read.
    """

    def __init__(self, path: str, *, zone_capacity: int, ru_size: int, zones: int | None = None,
                 handles: int | None = None, readonly: bool = False):
        st = os.stat(path)
        if not stat.S_ISBLK(st.st_mode):
            raise NotADeviceError(f"{path}: not a block device (give the namespace's /dev/nvmeXnY)")
        self.readonly = readonly
        self._fd = os.open(path, os.O_RDONLY if readonly else os.O_RDWR | os.O_EXCL)
        try:
            self._rfd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            size = os.lseek(self._fd, 0, os.SEEK_END)
            bs = ioctl_u32(self._fd, _BLKSSZGET)
            queue = sysfs_queue_dir(path)
            max_kb = int((Path(queue) / "max_hw_sectors_kb").read_text().strip() or 128)
            try:
                self._nvme = NvmePassthrough(self._fd, bs, max_kb * 1024)
            except OSError as e:
                raise NotADeviceError(f"{path}: not an NVMe namespace ({e.strerror})") from None
            drive_handles = [r.pid for r in self._nvme.ruh_status()]
        except BaseException:
            self.close()
            raise
        if not drive_handles:
            self.close()
            raise DeviceFormatError(f"{path}: the namespace reports no placement handles (FDP disabled?)")
        if zone_capacity <= 0 or zone_capacity % bs:
            self.close()
            raise DeviceFormatError(f"zone capacity {zone_capacity} is not a positive multiple of the "
                                    f"{bs}-byte block size")
        if zones is None:      # as many as fit before the two zone-state slots
            zones = size // zone_capacity
            while zones and zones * zone_capacity + 2 * state_slot_size(zones) > size:
                zones -= 1
        handles = len(drive_handles) if handles is None else handles
        if zones < 1 or zones * zone_capacity + 2 * state_slot_size(zones) > size \
                or not 1 <= handles <= len(drive_handles):
            self.close()
            raise DeviceFormatError(f"{path}: {zones} zones of {zone_capacity} B and {handles} handles do not "
                                    f"fit a namespace of {size} B with {len(drive_handles)} placement handles")
        geometry = Geometry(nr_zones=zones, zone_size=zone_capacity, zone_capacity=zone_capacity,
                            block_size=bs, max_open=handles, max_active=handles)
        super().__init__(geometry, kind="fdp-nvme", path=path, payload=True)
        self._pids = drive_handles[:handles]
        self._handles = PlacementHandles(handles)
        self._ru_size = ru_size
        self._ledger = [HandleLedger() for _ in range(handles)]
        self._sent = [0] * zones          # bytes of each zone on the namespace
        self._through: dict[int, int] = {}   # zone -> placement identifier of its data
        self._slot = state_slot_size(zones)
        self._state_at = size - 2 * self._slot
        self._seq = 0
        try:
            self._load_state()
        except BaseException:
            self.close()
            raise

    def _load_state(self) -> None:
        """Restore the zone table from the newest valid zone-state slot, if any (a fresh namespace has
        none: every zone Empty)."""
        best = None
        for i in range(2):
            raw = self._read_at(self._state_at + i * self._slot, self._slot)
            got = decode_state_slot(raw, self._nz)
            if got is not None and (best is None or got[0] > best[0]):
                best = got
        if best is None:
            return
        seq, conds, written, order = best
        if any(w > self._zcap or w % self._bs for w in written):
            raise DeviceFormatError(f"{self.name}: the zone-state slot does not fit {self._nz} zones of "
                                    f"{self._zcap} B (opened with another zone capacity?)")
        self._seq = seq
        self._restore(conds, written, order)
        self._sent = list(written)

    # -- what the drive and the host say ------------------------------------------------------------
    def zone_handle(self, zone: int) -> int | None:
        """The placement handle ``zone`` writes through now, or None."""
        return self._handles.held(zone)

    def zone_placement(self, zone: int) -> int | None:
        """The placement identifier ``zone``'s data was written through (kept after the zone gives its
        handle back, until it is reset), or None for a zone with no data."""
        return self._through.get(zone)

    def placement_id(self, handle: int) -> int:
        """The placement identifier (DSPEC) of ``handle``."""
        return self._pids[handle]

    def placements(self) -> list[HandleLedger]:
        """A copy of the host's ledger, one :class:`HandleLedger` per handle."""
        return [dataclasses.replace(h) for h in self._ledger]

    def ruh_status(self) -> list[RuhStatus]:
        """The drive's Reclaim Unit Handle Status (one descriptor per placement identifier)."""
        return self._nvme.ruh_status()

    def fdp_statistics(self, endurance_group: int = 1) -> FdpLogStatistics:
        """The drive's FDP statistics log (22h): HBMW, MBMW, MBE in bytes."""
        return self._nvme.fdp_statistics(endurance_group)

    # -- storage hooks --------------------------------------------------------------------------------
    def _check_rw(self) -> None:
        if self.readonly:
            raise PermissionError(f"{self.name}: device was opened read-only")

    def write(self, offset: int, data: WriteData) -> None:
        """:meth:`EmulatedZonedDevice.write` (PermissionError on a read-only device)."""
        self._check_rw()
        super().write(offset, data)

    def append(self, zone: int, data: WriteData) -> int:
        """:meth:`EmulatedZonedDevice.append` (PermissionError on a read-only device)."""
        self._check_rw()
        return super().append(zone, data)

    def reset_zone(self, zone: int) -> None:
        """:meth:`EmulatedZonedDevice.reset_zone`: a Deallocate (PermissionError on a read-only device)."""
        self._check_rw()
        super().reset_zone(zone)

    def reset_zones(self, zones) -> None:
        """:meth:`EmulatedZonedDevice.reset_zones` (PermissionError on a read-only device)."""
        self._check_rw()
        super().reset_zones(zones)

    def _store(self, zone: int, pos: int, data: WriteData) -> None:
        handle = self._handles.take(zone)
        pid = self._pids[handle]
        self._through[zone] = pid
        lba_bytes = zone * self._zcap + pos
        view = memoryview(data).cast("B")
        step = self._nvme.max_transfer
        for at in range(0, len(view), step):
            piece = view[at:at + step]
            self._nvme.write((lba_bytes + at) // self._bs, piece, placement_id=pid)
        ledger = self._ledger[handle]
        ledger.written += len(view)
        ledger.since_update += len(view)
        self._sent[zone] = pos + len(view)
        if self._sent[zone] >= self._zcap:
            self._release(zone, update=True)

    def _release(self, zone: int, *, update: bool) -> None:
        handle = self._handles.give_back(zone)
        if handle is None or not update:
            return
        self._nvme.ruh_update(self._pids[handle])
        ledger = self._ledger[handle]
        ledger.updates += 1
        ledger.padding += self._ru_size - ledger.since_update % self._ru_size if ledger.since_update else self._ru_size
        ledger.since_update = 0

    def _load(self, zone: int, pos: int, length: int) -> bytes:
        return self._read_at(zone * self._zcap + pos, length)

    def _read_at(self, start: int, length: int) -> bytes:
        head = start % _PAGE
        span = -(-(head + length) // _PAGE) * _PAGE
        with mmap.mmap(-1, span) as buf:
            got = os.preadv(self._rfd, [buf], start - head)
            if got < head + length:
                raise OSError(f"{self.name}: short read of {length} B at {start}")
            return bytes(buf[head:head + length])

    def _discard(self, zone: int, keep: int) -> None:
        if self._sent[zone] > keep:
            start = zone * self._zcap + keep
            self._nvme.deallocate(start // self._bs, (self._sent[zone] - keep) // self._bs)
            self._sent[zone] = keep
        if keep == 0:
            self._release(zone, update=False)
            self._through.pop(zone, None)

    def _sync_data(self) -> None:
        if not self.readonly:
            self._nvme.flush()

    def _persist(self) -> None:
        """Write the durable zone table (``_dcond``, ``_dwritten``) into the next zone-state slot, then
        an NVMe Flush."""
        if self._nvme is None or self.readonly:
            return
        self._seq += 1
        slot = encode_state_slot(self._seq, self._dcond, self._dwritten, self._slot, self._imp_open)
        at = self._state_at + (self._seq % 2) * self._slot
        view = memoryview(slot)
        step = self._nvme.max_transfer
        for off in range(0, len(view), step):
            self._nvme.write((at + off) // self._bs, view[off:off + step], placement_id=None)
        ledger = self._ledger[0]          # QEMU: a write without a directive goes through handle 0
        ledger.written += len(slot)
        ledger.since_update += len(slot)
        ledger.unplaced += len(slot)
        self._nvme.flush()

    def zone_op(self, op: ZoneOp, zone: int) -> None:
        """:meth:`EmulatedZonedDevice.zone_op`; FINISH of a zone holding a handle also makes a Reclaim
        Unit Handle Update on it and gives it back (the model's rule, docs/fdp.md).  PermissionError on a
        read-only device."""
        self._check_rw()
        super().zone_op(op, zone)
        if op is ZoneOp.FINISH and self._handles.held(zone) is not None:
            self._release(zone, update=True)

    def close(self) -> None:
        """Flush (the zone table records every completed write), release the transfer buffer and the
        descriptors.  Idempotent."""
        if getattr(self, "_nvme", None) is not None and hasattr(self, "_dirty") and not self.readonly:
            self.flush()
        nvme = getattr(self, "_nvme", None)
        if nvme is not None:
            nvme.close()
            self._nvme = None
        for name in ("_fd", "_rfd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
