"""Every call into libc or the kernel that the standard library does not make for us, declared once.

Python's ``os``, ``fcntl`` and ``mmap`` modules check their calls themselves (a failure raises
:class:`OSError` with the errno), so they are used directly.  What they lack goes through here:

=====================  ===================================  ==========================================
call                   prototype (glibc, 64-bit ``off_t``)  used for
=====================  ===================================  ==========================================
``fallocate64``        ``int (int fd, int mode,``            punching a reset zone's blocks out of a
                       ``off64_t offset, off64_t len)``       :class:`~retainz.zoned.file.FileDevice`
``sync_file_range``    ``int (int fd, off64_t offset,``      starting a device file's writeback
                       ``off64_t nbytes, unsigned flags)``
``prctl``              ``int (int option, unsigned long``    ``PR_SET_PDEATHSIG`` for the QEMU child
                       ``x 4)``
``ioctl`` (zoned)      through ``fcntl.ioctl``               ``BLKREPORTZONE``, ``BLKGETZONESZ``,
                                                             ``BLKGETNRZONES``, the zone management
                                                             ioctls (:mod:`.blkzoned` has the ABI)
=====================  ===================================  ==========================================

Each libc function gets its full prototype (``argtypes`` and ``restype``) on a handle of this module's
own, set once when the handle is made: a ctypes function without ``argtypes`` passes a Python int as
a C ``int``, so a 64-bit offset would be truncated to its low 32 bits (a hole punched at 5 GiB landing at
1 GiB).  Every return code is checked: ``-1`` raises :class:`OSError` with ``errno``.  A caller that
treats a call as best effort (the writeback hint, a hole punch) goes through :func:`best_effort`,
which logs the failure and counts it in :data:`FAILURES` instead of ignoring it.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import fcntl
import logging
import os
import struct
from collections.abc import Callable

from retainz.zoned import blkzoned as bz

__all__ = ["punch_hole", "start_writeback", "set_parent_death_signal", "ioctl_u32", "ioctl_value", "ioctl_mutable",
           "report_zones",
           "zone_management", "buffer_address", "foreign_buffer", "best_effort", "FAILURES", "FALLOC_FL_KEEP_SIZE",
           "FALLOC_FL_PUNCH_HOLE", "SYNC_FILE_RANGE_WRITE", "PR_SET_PDEATHSIG"]

log = logging.getLogger("retainz.zoned")

#: ``<linux/falloc.h>``.
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
#: ``<fcntl.h>`` (``sync_file_range(2)``).
SYNC_FILE_RANGE_WRITE = 0x2
#: ``<linux/prctl.h>``.
PR_SET_PDEATHSIG = 1

#: Best-effort calls that failed in this process, by call name (:func:`best_effort`).
FAILURES: collections.Counter[str] = collections.Counter()
_WARNED: set[tuple[str, int | None]] = set()

_off64 = ctypes.c_int64
_PROTOTYPES: dict[str, tuple[tuple[str, ...], list, type]] = {
    # name: (symbols tried in order, argtypes, restype)
    "fallocate": (("fallocate64", "fallocate"), [ctypes.c_int, ctypes.c_int, _off64, _off64], ctypes.c_int),
    "sync_file_range": (("sync_file_range",), [ctypes.c_int, _off64, _off64, ctypes.c_uint], ctypes.c_int),
    "prctl": (("prctl",), [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong],
              ctypes.c_int),
}


class _Libc:
    """This module's own libc handle: each function bound once, with its full prototype."""

    def __init__(self) -> None:
        path = ctypes.util.find_library("c")
        try:
            self._lib = ctypes.CDLL(path, use_errno=True)
        except OSError:
            self._lib = None
        self._fns: dict[str, object | None] = {}

    def fn(self, name: str):
        """The bound function, or ``None`` where this platform's libc lacks it."""
        if name not in self._fns:
            symbols, argtypes, restype = _PROTOTYPES[name]
            f = None
            for sym in symbols:
                f = getattr(self._lib, sym, None) if self._lib is not None else None
                if f is not None:
                    f.argtypes = argtypes
                    f.restype = restype
                    break
            self._fns[name] = f
        return self._fns[name]

    def call(self, name: str, *args) -> int:
        """Call ``name``; ``-1`` raises :class:`OSError` with ``errno``.

        Raises:
            OSError: the call failed (its errno), or ``ENOSYS`` when libc has no such function.
        """
        f = self.fn(name)
        if f is None:
            raise OSError(38, f"{name} is not available on this platform")   # ENOSYS
        ctypes.set_errno(0)
        rc = f(*args)
        if rc == -1:
            err = ctypes.get_errno()
            raise OSError(err, f"{name}: {os.strerror(err)}")
        return rc


_libc = _Libc()


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Deallocate the file's bytes ``[offset, offset + length)`` keeping its size (``fallocate(2)`` with
    ``FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE``); they read back as zeros.

    Args:
        fd: a file descriptor open for writing.
        offset, length: bytes (any 64-bit values; ``length > 0``).

    Raises:
        ValueError: a negative offset or a length that is not positive.
        OSError: the call failed (``EOPNOTSUPP`` on a file system without hole punching, ``ENOSYS``
            without the call, ``EBADF``...).
    """
    if offset < 0 or length <= 0:
        raise ValueError(f"punch_hole: offset {offset} and length {length} must be >= 0 and > 0")
    _libc.call("fallocate", fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, offset, length)


def start_writeback(fd: int) -> None:
    """Start writing the whole file's dirty pages back without waiting (``sync_file_range(2)`` with
    ``SYNC_FILE_RANGE_WRITE`` over ``[0, end of file)``).  A hint: it changes when bytes reach the disk,
    never what a power cut keeps (RocksDB's ``bytes_per_sync`` does the same).

    Raises:
        OSError: the call failed, or ``ENOSYS`` where libc lacks it.
    """
    _libc.call("sync_file_range", fd, 0, 0, SYNC_FILE_RANGE_WRITE)


def set_parent_death_signal(signum: int) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies
    (``prctl(PR_SET_PDEATHSIG, signum)``, Linux only).

    Raises:
        OSError: the call failed, or ``ENOSYS`` where libc lacks ``prctl``.
    """
    _libc.call("prctl", PR_SET_PDEATHSIG, signum, 0, 0, 0)


def best_effort(name: str, call: Callable[..., object], *args) -> bool:
    """Run ``call(*args)`` as a best-effort step: an :class:`OSError` is logged (a warning naming
    ``name`` and the errno, once per name and errno) and counted in :data:`FAILURES[name]`, never
    silently dropped and never raised.  Returns whether the call succeeded."""
    try:
        call(*args)
    except OSError as e:
        FAILURES[name] += 1
        if (name, e.errno) not in _WARNED:
            _WARNED.add((name, e.errno))
            log.warning("%s failed (best effort, continuing; counted in FAILURES): %s", name, e)
        return False
    return True


# -- the zoned block ioctls (<linux/blkzoned.h>; fcntl.ioctl checks the return code) -------------------
def ioctl_u32(fd: int, request: int) -> int:
    """An ioctl that fills one ``unsigned int`` (``BLKGETZONESZ``: sectors per zone; ``BLKGETNRZONES``).

    Raises:
        OSError: the ioctl failed (``ENOTTY`` on a device that is not a block device...).
    """
    return struct.unpack("<I", fcntl.ioctl(fd, request, bytes(4)))[0]


def ioctl_value(fd: int, request: int) -> int:
    """An ioctl whose answer is its return value (``NVME_IOCTL_ID``: the namespace ID).

    Raises:
        OSError: the ioctl failed.
    """
    return fcntl.ioctl(fd, request)


def ioctl_mutable(fd: int, request: int, buf: bytearray) -> int:
    """An ioctl on a structure the kernel reads and writes in place (``NVME_IOCTL_IO64_CMD``,
    ``NVME_IOCTL_ADMIN64_CMD``: ``struct nvme_passthru_cmd64``); returns the ioctl's return value
    (for NVMe passthrough, the command's status: 0 is success).

    Raises:
        OSError: the ioctl failed.
    """
    return fcntl.ioctl(fd, request, buf, True)


def report_zones(fd: int, sector: int, nr_zones: int) -> tuple[int, list[bz.RawZone]]:
    """``BLKREPORTZONE``: up to ``nr_zones`` zones from 512-byte ``sector`` on (64-bit sectors).

    Returns ``(flags, zones)`` as :func:`~retainz.zoned.blkzoned.parse_report` decodes them.

    Raises:
        OSError: the ioctl failed.
    """
    buf = bz.pack_report_request(sector, nr_zones)
    fcntl.ioctl(fd, bz.BLKREPORTZONE, buf, True)
    return bz.parse_report(buf)


def zone_management(fd: int, request: int, sector: int, nr_sectors: int) -> None:
    """A zone management ioctl (``BLKRESETZONE``, ``BLKOPENZONE``, ``BLKCLOSEZONE``, ``BLKFINISHZONE``)
    over ``struct blk_zone_range {u64 sector; u64 nr_sectors}``.

    Raises:
        OSError: the ioctl failed (the caller classifies the errno: :mod:`.blkzoned`).
    """
    fcntl.ioctl(fd, request, bz.pack_zone_range(sector, nr_sectors))


def buffer_address(view: memoryview) -> int | None:
    """The memory address of a writable, contiguous buffer (to check page alignment for
    ``O_DIRECT``), or ``None`` when ctypes cannot address it (read-only or not contiguous)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return None


def foreign_buffer(pointer, size: int) -> memoryview:
    """A writable byte view (``size`` bytes, format ``B``) of memory a foreign library owns, at the
    address a ctypes ``pointer`` holds (libfuse's request buffer handed to a FUSE callback): no copy.
    Valid only while the owner keeps that memory (for FUSE, until the callback returns)."""
    return memoryview((ctypes.c_char * size).from_address(ctypes.addressof(pointer.contents))).cast("B")
