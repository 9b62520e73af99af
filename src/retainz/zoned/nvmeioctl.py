"""NVMe passthrough from user space: the Linux ioctl ABI and the few commands an FDP namespace needs.

The ABI is Linux's ``include/uapi/linux/nvme_ioctl.h``: ``struct nvme_passthru_cmd64`` (80 bytes: opcode,
flags, rsvd1, nsid, cdw2, cdw3, metadata, addr, metadata_len, data_len, cdw10..cdw15, timeout_ms,
rsvd2, a 64-bit result), sent with ``NVME_IOCTL_IO64_CMD`` (``_IOWR('N', 0x48, ...)``) or
``NVME_IOCTL_ADMIN64_CMD`` (``_IOWR('N', 0x47, ...)``) on a namespace's block device (``/dev/nvmeXnY``) or
its generic character device (``/dev/ngXnY``, Linux 5.13+); ``NVME_IOCTL_ID`` (``_IO('N', 0x40)``)
answers the namespace ID.  The ioctl returns 0, the command's NVMe status (> 0: raised here as
:class:`NvmeCommandError`) or fails with an errno.

Commands (field positions from the NVMe 2.0 base and NVM command set specifications, TP4146 for FDP; the
QEMU side that reads them is named with each):

* Write (I/O opcode 01h): CDW10/11 the starting LBA, CDW12 bits 15:00 the number of logical blocks
  (0's based) and bits 23:20 the directive type (DTYPE; 2 = data placement), CDW13 bits 31:16 the
  directive specific value (DSPEC: the placement identifier).  QEMU hw/nvme/ctrl.c
  ``nvme_do_write_fdp``: ``dtype = (dw12 >> 20) & 0xf``, ``pid = rw->dspec`` (the upper half of CDW13).
* Dataset Management (09h) with Attribute Deallocate (CDW11 bit 2), CDW10 the number of ranges (0's
  based), each range 16 bytes: context attributes, length in LBAs, starting LBA.
* Flush (00h).
* I/O Management Receive (12h), management operation 1 (CDW10 bits 7:0): the Reclaim Unit Handle
  Status: a 16-byte header whose bytes 14-15 count the descriptors, then 32-byte descriptors (placement
  identifier u16, RUH identifier u16, EARUTR u32, RUAMW u64: the logical blocks the handle's current
  reclaim unit can still take).  QEMU ``nvme_io_mgmt_recv_ruhs``.
* I/O Management Send (1Dh), management operation 1: Reclaim Unit Handle Update of the placement
  identifiers in the data buffer (CDW10 bits 31:16: their number, 0's based).  QEMU
  ``nvme_io_mgmt_send_ruh_update`` / ``nvme_update_ruh`` (charges an unwritten remainder to MBMW).
* Get Log Page (admin 02h): CDW10 bits 7:0 the log identifier, bits 31:16 NUMDL, CDW11 bits 15:0 NUMDU
  and bits 31:16 the log specific identifier (the endurance group for the FDP logs), CDW12/13 the offset.
  FDP statistics (22h): HBMW, MBMW, MBE as 128-bit counters of bytes (QEMU ``nvme_fdp_stats``).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

from retainz.errors import ZonedDeviceError
from retainz.zoned.syscalls import buffer_address, ioctl_mutable, ioctl_value

__all__ = ["NvmeCommandError", "NvmePassthrough", "RuhStatus", "FdpLogStatistics", "DTYPE_DATA_PLACEMENT",
           "LOG_FDP_STATISTICS", "LOG_FDP_RUH_USAGE"]

_CMD64 = struct.Struct("<BBHIIIQQIIIIIIIIIIQ")
assert _CMD64.size == 80
NVME_IOCTL_ID = 0x4E40                  # _IO('N', 0x40)
NVME_IOCTL_ADMIN64_CMD = 0xC0504E47     # _IOWR('N', 0x47, struct nvme_passthru_cmd64)
NVME_IOCTL_IO64_CMD = 0xC0504E48        # _IOWR('N', 0x48, struct nvme_passthru_cmd64)

OP_FLUSH, OP_WRITE, OP_DSM, OP_IO_MGMT_RECV, OP_IO_MGMT_SEND = 0x00, 0x01, 0x09, 0x12, 0x1D
ADMIN_GET_LOG_PAGE = 0x02
DTYPE_DATA_PLACEMENT = 2
LOG_FDP_RUH_USAGE, LOG_FDP_STATISTICS = 0x21, 0x22
_MO_RUH_STATUS = _MO_RUH_UPDATE = 0x01
_DSM_ATTR_DEALLOCATE = 1 << 2


class NvmeCommandError(ZonedDeviceError):
    """An NVMe command completed with a non-zero status (``status``: the 15-bit status field as the
    ioctl returns it; ``0x4000`` set means Do Not Retry)."""

    def __init__(self, message: str, status: int):
        super().__init__(f"{message}: NVMe status {status:#06x}")
        self.status = status


@dataclass(frozen=True)
class RuhStatus:
    """One Reclaim Unit Handle Status descriptor: ``pid`` (placement identifier), ``ruhid`` (reclaim unit
    handle identifier), ``ruamw`` (logical blocks the current reclaim unit can still take)."""

    pid: int
    ruhid: int
    ruamw: int


@dataclass(frozen=True)
class FdpLogStatistics:
    """The FDP statistics log page (22h) in bytes: host bytes with metadata written (HBMW), media bytes
    with metadata written (MBMW), media bytes erased (MBE)."""

    host_bytes_written: int
    media_bytes_written: int
    media_bytes_erased: int


class NvmePassthrough:
    """NVMe commands on one namespace through a descriptor of its block or generic character device.

    Buffers handed to the controller live in one page-aligned ``mmap`` of ``max_transfer`` bytes (a
    command moves at most that much; the caller splits larger writes).

    Args:
        fd: an open descriptor of ``/dev/nvmeXnY`` or ``/dev/ngXnY`` (read-write for writes).
        block_size: the namespace's logical block size in bytes.
        max_transfer: the largest data transfer of one command in bytes (the queue's
            ``max_hw_sectors_kb``).

    Raises:
        OSError: the descriptor is not an NVMe namespace (``NVME_IOCTL_ID`` fails).
    """

    def __init__(self, fd: int, block_size: int, max_transfer: int):
        self.fd = fd
        self.block_size = block_size
        self.nsid = ioctl_value(fd, NVME_IOCTL_ID)
        self.max_transfer = max_transfer
        self._buf = mmap.mmap(-1, max(max_transfer, mmap.PAGESIZE))
        self._addr = buffer_address(memoryview(self._buf))   # an mmap does not move while open

    def close(self) -> None:
        """Release the transfer buffer (the descriptor belongs to the caller)."""
        if self._buf is not None:
            self._buf.close()
            self._buf = None

    def _submit(self, request: int, opcode: int, *, nsid: int | None = None, data_len: int = 0,
                cdw: tuple[int, ...] = (), what: str) -> int:
        c = list(cdw) + [0] * (6 - len(cdw))
        raw = bytearray(_CMD64.pack(opcode, 0, 0, self.nsid if nsid is None else nsid, 0, 0, 0,
                                    self._addr if data_len else 0, 0, data_len, *c, 0, 0, 0))
        status = ioctl_mutable(self.fd, request, raw)
        if status:
            raise NvmeCommandError(what, status)
        return _CMD64.unpack(raw)[-1]

    def write(self, lba: int, data, *, placement_id: int | None) -> None:
        """Write ``data`` (whole logical blocks, at most ``max_transfer`` bytes) at logical block
        ``lba``; with a ``placement_id``, as a data placement directive (DTYPE 2, DSPEC = the placement
        identifier).

        Raises:
            NvmeCommandError: the controller refused it (QEMU does not refuse an invalid placement
                identifier: it writes through placement handle 0).  OSError from the ioctl.
        """
        n = len(data)
        self._buf[:n] = data
        nlb = n // self.block_size
        cdw12 = (nlb - 1) & 0xFFFF
        cdw13 = 0
        if placement_id is not None:
            cdw12 |= DTYPE_DATA_PLACEMENT << 20
            cdw13 = (placement_id & 0xFFFF) << 16
        self._submit(NVME_IOCTL_IO64_CMD, OP_WRITE, data_len=n,
                     cdw=(lba & 0xFFFFFFFF, lba >> 32, cdw12, cdw13), what=f"write of {nlb} blocks at LBA {lba}")

    def deallocate(self, lba: int, nlb: int) -> None:
        """Dataset Management with Attribute Deallocate of ``nlb`` logical blocks from ``lba`` (ranges of
        at most 2^32 - 1 blocks, up to 256 per command)."""
        ranges = []
        while nlb > 0:
            n = min(nlb, 0xFFFFFFFF)
            ranges.append(struct.pack("<IIQ", 0, n, lba))
            lba += n
            nlb -= n
        for i in range(0, len(ranges), 256):
            part = b"".join(ranges[i:i + 256])
            self._buf[:len(part)] = part
            self._submit(NVME_IOCTL_IO64_CMD, OP_DSM, data_len=len(part),
                         cdw=(len(part) // 16 - 1, _DSM_ATTR_DEALLOCATE), what="deallocate")

    def flush(self) -> None:
        """NVMe Flush of the namespace."""
        self._submit(NVME_IOCTL_IO64_CMD, OP_FLUSH, what="flush")

    def ruh_status(self) -> list[RuhStatus]:
        """The Reclaim Unit Handle Status of the namespace (I/O Management Receive, operation 1)."""
        n = min(self.max_transfer, 16 + 32 * 128)
        self._buf[:n] = bytes(n)
        self._submit(NVME_IOCTL_IO64_CMD, OP_IO_MGMT_RECV, data_len=n, cdw=(_MO_RUH_STATUS, n // 4 - 1),
                     what="I/O management receive (RUH status)")
        (count,) = struct.unpack_from("<H", self._buf, 14)
        out = []
        for i in range(min(count, (n - 16) // 32)):
            pid, ruhid, _earutr, ruamw = struct.unpack_from("<HHIQ", self._buf, 16 + 32 * i)
            out.append(RuhStatus(pid, ruhid, ruamw))
        return out

    def ruh_update(self, placement_id: int) -> None:
        """Reclaim Unit Handle Update of one placement identifier (I/O Management Send, operation 1):
        the handle's next write starts a fresh reclaim unit."""
        self._buf[:2] = struct.pack("<H", placement_id)
        self._submit(NVME_IOCTL_IO64_CMD, OP_IO_MGMT_SEND, data_len=4, cdw=(_MO_RUH_UPDATE,),
                     what=f"RUH update of placement identifier {placement_id}")

    def get_log_page(self, lid: int, length: int, *, lsi: int = 0, offset: int = 0) -> bytes:
        """Get Log Page ``lid`` (admin 02h), ``length`` bytes (a multiple of 4, at most ``max_transfer``)
        from byte ``offset``, log specific identifier ``lsi`` (the endurance group for FDP logs)."""
        self._buf[:length] = bytes(length)
        numd = length // 4 - 1
        self._submit(NVME_IOCTL_ADMIN64_CMD, ADMIN_GET_LOG_PAGE, nsid=0xFFFFFFFF, data_len=length,
                     cdw=(lid | (numd & 0xFFFF) << 16, numd >> 16 | lsi << 16, offset & 0xFFFFFFFF, offset >> 32),
                     what=f"get log page {lid:#04x}")
        return bytes(self._buf[:length])

    def fdp_statistics(self, endurance_group: int = 1) -> FdpLogStatistics:
        """The FDP statistics log (22h) of ``endurance_group`` (the low 64 bits of each 128-bit counter)."""
        raw = self.get_log_page(LOG_FDP_STATISTICS, 64, lsi=endurance_group)
        hbmw, _, mbmw, _, mbe, _ = struct.unpack_from("<QQQQQQ", raw)
        return FdpLogStatistics(hbmw, mbmw, mbe)
