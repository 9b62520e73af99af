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
(tests/test_fdp_guest.py).

Not durable across processes: the zone table lives in memory, as on the model; a store on it is formatted
and used by one process (a restart would need the write pointers from a durable zone-state record).
"""

from __future__ import annotations

import dataclasses
import fcntl
import mmap
import os
import stat
import struct
from pathlib import Path

from retainz.errors import DeviceFormatError, NotADeviceError
from retainz.zoned.device import WriteData, ZoneOp
from retainz.zoned.emulated import EmulatedZonedDevice
from retainz.zoned.fdp import PlacementHandles
from retainz.zoned.linux import sysfs_queue_dir
from retainz.zoned.model import Geometry
from retainz.zoned.nvmeioctl import FdpLogStatistics, NvmePassthrough, RuhStatus

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


class LinuxFdpDevice(EmulatedZonedDevice):
    """Zones on a real FDP namespace through NVMe passthrough (see the module docstring).

    Args:
        path: the namespace's block device, ``/dev/nvmeXnY``.
        zone_capacity: bytes per zone (whole logical blocks); the zones fill the namespace.
        ru_size: the reclaim unit size in bytes (FDP configurations log; the guest lane passes QEMU's
            ``fdp.runs``), used for the padding of RUH Updates in :meth:`placements`.
        zones: number of zones (default: as many as the namespace holds).
        handles: placement handles to use (default: every one the namespace reports); also the zones
            that may be active and open at once.

    Raises:
        NotADeviceError: ``path`` is not a block device, or not an NVMe namespace.
        DeviceFormatError: a zone capacity that is not whole blocks, more zones than the namespace
            holds, more handles than it has, or a namespace without placement handles (FDP disabled).
        NvmeCommandError / OSError: the Reclaim Unit Handle Status cannot be read.
    """

    def __init__(self, path: str, *, zone_capacity: int, ru_size: int, zones: int | None = None,
                 handles: int | None = None):
        st = os.stat(path)
        if not stat.S_ISBLK(st.st_mode):
            raise NotADeviceError(f"{path}: not a block device (give the namespace's /dev/nvmeXnY)")
        self._fd = os.open(path, os.O_RDWR | os.O_EXCL)
        try:
            self._rfd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            size = os.lseek(self._fd, 0, os.SEEK_END)
            raw = fcntl.ioctl(self._fd, _BLKSSZGET, struct.pack("i", 0))
            bs = struct.unpack("i", raw)[0]
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
        fit = size // zone_capacity
        zones = fit if zones is None else zones
        handles = len(drive_handles) if handles is None else handles
        if not 1 <= zones <= fit or not 1 <= handles <= len(drive_handles):
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
        start = zone * self._zcap + pos
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
        self._nvme.flush()

    def zone_op(self, op: ZoneOp, zone: int) -> None:
        """:meth:`EmulatedZonedDevice.zone_op`; FINISH of a zone holding a handle also makes a Reclaim
        Unit Handle Update on it and gives it back (the model's rule, docs/fdp.md)."""
        super().zone_op(op, zone)
        if op is ZoneOp.FINISH and self._handles.held(zone) is not None:
            self._release(zone, update=True)

    def close(self) -> None:
        """Release the transfer buffer and the descriptors.  Idempotent."""
        nvme = getattr(self, "_nvme", None)
        if nvme is not None:
            nvme.close()
            self._nvme = None
        for name in ("_fd", "_rfd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
