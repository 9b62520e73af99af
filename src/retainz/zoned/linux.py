"""A real Linux zoned block device (``/dev/nvmeXnY``, null_blk zoned, an emulator's namespace) through
the kernel's zoned block ioctls (made by :mod:`.syscalls`; the ABI is :mod:`.blkzoned`).

How it maps the :class:`~retainz.zoned.device.ZonedDevice` verbs onto the kernel:

* geometry: ``/sys/block/<dev>/queue`` (``zoned``, ``chunk_sectors``, ``nr_zones``, ``max_open_zones``,
  ``max_active_zones``, ``logical_block_size``) plus the capacity of zone 0 from ``BLKREPORTZONE``;
* :meth:`~LinuxZonedDevice.report_zones`: ``BLKREPORTZONE``; zone management: ``BLKOPENZONE``,
  ``BLKCLOSEZONE``, ``BLKFINISHZONE``, ``BLKRESETZONE`` (all in 512-byte sectors, whatever the block
  size; converted to bytes here and nowhere else);
* writes: ``os.pwrite`` on an ``O_DIRECT`` descriptor from a page-aligned buffer (a caller's
  page-aligned writable buffer, e.g. an ``mmap`` or :meth:`LinuxZonedDevice.aligned_buffer`, is used
  as it is; anything else is copied into one).  Linux 6.1 does not order writes to a zone unless the
  queue's scheduler is ``mq-deadline`` (6.10+ has zone write plugging), and it splits a large write
  into ``max_sectors_kb`` requests that may then be reordered: so each zone has a lock that keeps one
  write in flight, and when the scheduler is not ``mq-deadline`` a write is issued in pieces of at most
  ``max_sectors_kb``, one after the other;
* reads: ``os.preadv`` into a page-aligned buffer; bytes past a zone's written data (its write
  pointer, or its capacity) read as zeros whatever the device returns there (null_blk returns a 0xFF
  pattern past the write pointer, QEMU zeros), which costs one zone report when the write pointers of
  the zones read are not cached;
* :meth:`~LinuxZonedDevice.append`: Linux 6.1 has no zone append from user space, so it is
  **emulated**: under the zone's lock, a write at the cached write pointer, which returns the offset
  where the data landed.  Correct as long as nothing else writes the zone (the device is opened
  ``O_EXCL``; a non-exclusive writer elsewhere could still move the write pointer, in which case one
  retry after re-reading the write pointer is made);
* flush: ``fsync`` (the kernel sends a device cache flush);
* :meth:`~LinuxZonedDevice.claim` (the node service: another process writes the extent with its own
  ``O_DIRECT`` descriptor): a lease at the zone's claim pointer, kept by :class:`~retainz.zoned.claims.
  ZoneClaims`, which orders the zone's writers by turns; the device's own writes and zone operations
  wait until the zone's leases are written.  A zone with leases outstanding reports its claim pointer as
  its write pointer (the model's view: a claim advances the write pointer).

Errors: the kernel answers most zone errors with a bare ``EIO``.  :func:`classify_write_error` and
:func:`classify_zone_op_error` turn an errno plus a fresh report of the zone into the same exception
types the emulated devices raise (Zone Is Full, Zone Invalid Write, Invalid Zone State Transition...).
Requests whose outcome the arithmetic alone decides (misaligned, out of range, crossing the zone
capacity) are refused before any I/O, as the emulators do: in particular a write crossing the capacity
would otherwise land its first pieces and then fail, leaving the write pointer moved.

Where real devices differ from the model (``retainz.zoned.emulated``), this class presents the model's
semantics, so the store sees one behaviour (each point was found by the conformance suite in the QEMU
guest lane, Linux 6.1, QEMU 7.2):

* a Full zone reports ``wp = start + size`` (the NVMe driver already does; null_blk reports
  ``start + capacity`` for a zone filled by writes);
* unwritten space reads as zeros (null_blk returns a 0xFF pattern past the write pointer);
* closing an open zone with nothing written leaves it Empty: QEMU's NVMe ZNS makes it Closed (holding
  an active resource, as ZNS allows), so such a close is followed by a reset, which loses nothing;
* finishing an Empty zone needs a free active resource (as null_blk and the model): QEMU takes
  Empty -> Full directly, a legal ZNS transition, so the check is made here first (a zone report);
* finishing an Empty or a Closed zone needs no open resource (the model; QEMU checks none): null_blk
  wants a free one, and answers ``ETOOMANYREFS`` when it cannot make one by closing an implicitly
  open zone itself (every open zone explicitly open; or, for a Closed zone, the active limit reached
  too).  Then an explicitly open zone lends its resource: it is closed, the finish is issued, and it
  is opened explicitly again (its write pointer and data are untouched; it ends explicitly open as
  before).  With no explicitly open zone to lend, the next point applies;
* a write to, an open of, or a finish of a Closed zone when the open limit is reached closes the least
  recently written implicitly open zone (ZNS 2.1.1.4.1; QEMU does it itself, and finishes a Closed zone
  without an open resource): null_blk refuses these with ``ETOOMANYREFS`` when the active limit is
  reached too, so the close is done from here and the request retried once.
"""

from __future__ import annotations

import dataclasses
import errno as _errno
import mmap
import os
import stat
import threading
from pathlib import Path

from retainz.errors import (
    DeviceBusyError,
    NotADeviceError,
    OutOfRangeError,
    TooManyActiveZonesError,
    TooManyOpenZonesError,
    ZoneBoundaryError,
    ZonedDeviceError,
    ZoneFullError,
    ZoneInvalidWriteError,
    ZoneOfflineError,
)
from retainz.zoned import syscalls
from retainz.zoned.blkzoned import (
    BLKCLOSEZONE,
    BLKFINISHZONE,
    BLKGETNRZONES,
    BLKGETZONESZ,
    BLKOPENZONE,
    BLKRESETZONE,
    SECTOR,
    RawZone,
    classify_write_error,
    classify_zone_op_error,
    raw_to_zone,
)
from retainz.zoned.claims import ZoneClaims
from retainz.zoned.device import WriteData, ZonedDevice, ZoneOp, check_io_range, check_report_range
from retainz.zoned.model import DeviceInfo, Geometry, Zone, ZoneCond

__all__ = ["LinuxZonedDevice", "sysfs_queue_dir"]

_OP_IOCTL = {ZoneOp.OPEN: BLKOPENZONE, ZoneOp.CLOSE: BLKCLOSEZONE, ZoneOp.FINISH: BLKFINISHZONE,
             ZoneOp.RESET: BLKRESETZONE}
_REPORT_BATCH = 256  # zones per BLKREPORTZONE call (16 KiB buffer)
_PAGE = mmap.PAGESIZE


# -- sysfs ------------------------------------------------------------------------------------------

def sysfs_queue_dir(path: str, sys_root: str = "/sys") -> Path:
    """``/sys/class/block/<name>/queue`` of a block device node (its parent's for a partition).

    Raises:
        NotADeviceError: the node has no sysfs entry.
    """
    st = os.stat(path)
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    dev_dir = Path(sys_root) / "dev" / "block" / f"{major}:{minor}"
    if not dev_dir.exists():
        raise NotADeviceError(f"{path}: block device {major}:{minor} has no {dev_dir}")
    real = dev_dir.resolve()
    if (real / "partition").exists():
        real = real.parent
    return real / "queue"


def _read_sysfs(queue: Path, name: str, default: str = "") -> str:
    try:
        return (queue / name).read_text().strip()
    except OSError:
        return default


class LinuxZonedDevice(ZonedDevice):
    """A host-managed zoned block device driven through the Linux zoned block ioctls.

    Args:
        path: the device node, e.g. ``/dev/nvme0n1`` or ``/dev/nullb0``.
        readonly: open ``O_RDONLY`` (reports and reads only); otherwise ``O_RDWR | O_DIRECT | O_EXCL``.

    Raises:
        FileNotFoundError: no such path.
        NotADeviceError: the path is not a block device, or a block device that is not zoned
            (a regular file, a loop device: ``BLKREPORTZONE`` answers ``ENOTTY``), or not host-managed.
        DeviceBusyError: another process holds the device exclusively (``EBUSY``).
        PermissionError: no permission to open the device (run as root or join the ``disk`` group).

    See the module docstring for the I/O rules and for how append is emulated.
    """

    def __init__(self, path: str | os.PathLike, *, readonly: bool = False):
        self._fd = -1
        path = os.fspath(path)
        st = os.stat(path)
        if not stat.S_ISBLK(st.st_mode):
            kind = next((k for test, k in ((stat.S_ISREG, "a regular file"), (stat.S_ISCHR, "a character device"),
                                           (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                                           (stat.S_ISSOCK, "a socket")) if test(st.st_mode)), "a special file")
            hint = " (a file-backed zoned device is opened as file:PATH)" if stat.S_ISREG(st.st_mode) else ""
            raise NotADeviceError(f"{path} is {kind}, not a zoned block device{hint}")
        self.readonly = readonly
        flags = os.O_RDONLY if readonly else os.O_RDWR | os.O_DIRECT | os.O_EXCL
        try:
            fd = os.open(path, flags | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == _errno.EBUSY:
                raise DeviceBusyError(f"{path}: the device is in use (mounted or opened exclusively "
                                      "by another process)") from None
            raise
        self._fd = fd
        try:
            self._init_geometry(path)
        except BaseException:
            os.close(fd)
            self._fd = -1
            raise
        self._locks = [threading.Lock() for _ in range(self._nz)]
        self._wp_cache: dict[int, int] = {}  # zone -> bytes written (capacity when full)
        self._last_write = [0] * self._nz  # per zone: the write counter at its last write
        self._tick = 0
        self._buf: mmap.mmap | None = None

    _claims: ZoneClaims | None = None

    @property
    def claims(self) -> ZoneClaims:
        """The leases of extents other processes write (:meth:`claim`), made at the first use."""
        if self._claims is None:
            self._claims = ZoneClaims(self._zsize, self._real_written, self._fill_zeros)
        return self._claims

    def _init_geometry(self, path: str) -> None:
        zone_sectors = self._ioctl_get(BLKGETZONESZ, path)
        queue = sysfs_queue_dir(path)
        model = _read_sysfs(queue, "zoned", "none")
        if zone_sectors == 0 or model == "none":
            raise NotADeviceError(f"{path} is a block device but not a zoned one (BLKGETZONESZ = 0, "
                                  f"{queue}/zoned = {model!r})")
        if model != "host-managed":
            raise NotADeviceError(f"{path} is a {model} zoned device; RetainZ drives host-managed "
                                  "devices only")
        nr_zones = self._ioctl_get(BLKGETNRZONES, path)
        block_size = int(_read_sysfs(queue, "logical_block_size", "512"))
        chunk = int(_read_sysfs(queue, "chunk_sectors", "0") or 0)
        if chunk and chunk != zone_sectors:
            raise NotADeviceError(f"{path}: chunk_sectors {chunk} differs from the zone size "
                                  f"{zone_sectors} sectors")
        sys_nr = int(_read_sysfs(queue, "nr_zones", "0") or 0)
        if sys_nr and sys_nr != nr_zones:
            raise NotADeviceError(f"{path}: BLKGETNRZONES says {nr_zones} zones, sysfs {sys_nr}")
        self._zone_sectors = zone_sectors
        self._nz = nr_zones
        self._zsize = zone_sectors * SECTOR
        self._end = nr_zones * self._zsize
        self._bs = block_size
        flags, raw = self._report_raw(0, 1)
        if not raw:
            raise NotADeviceError(f"{path}: BLKREPORTZONE reported no zone")
        first = raw_to_zone(raw[0], flags, zone_sectors)
        self._zcap = first.capacity
        scheduler = _read_sysfs(queue, "scheduler")
        self.scheduler = scheduler[scheduler.find("[") + 1:scheduler.find("]")] if "[" in scheduler else scheduler
        #: Largest single write issued to the kernel (bytes); 0 = no limit (mq-deadline orders them).
        max_kb = int(_read_sysfs(queue, "max_sectors_kb", "0") or 0)
        self.max_write = 0 if self.scheduler == "mq-deadline" or not max_kb else max_kb * 1024
        geometry = Geometry(nr_zones=nr_zones, zone_size=self._zsize, zone_capacity=self._zcap,
                            block_size=block_size,
                            max_open=int(_read_sysfs(queue, "max_open_zones", "0") or 0),
                            max_active=int(_read_sysfs(queue, "max_active_zones", "0") or 0))
        self._info = DeviceInfo(geometry=geometry, kind="linux", path=path, payload=True, model=model)

    def _ioctl_get(self, request: int, path: str) -> int:
        try:
            return syscalls.ioctl_u32(self._fd, request)
        except OSError as e:
            if e.errno in (_errno.ENOTTY, _errno.EINVAL, _errno.EOPNOTSUPP):
                raise NotADeviceError(f"{path} is a block device but not a zoned one (the zone ioctls "
                                      f"answer {_errno.errorcode.get(e.errno, e.errno)})") from None
            raise

    # -- description -------------------------------------------------------------------------------
    @property
    def info(self) -> DeviceInfo:
        return self._info

    def _report_raw(self, start: int, count: int) -> tuple[int, list[RawZone]]:
        out: list[RawZone] = []
        flags = 0
        zone = start
        while len(out) < count:
            n = min(_REPORT_BATCH, count - len(out))
            flags, got = syscalls.report_zones(self._check_open(), zone * self._zone_sectors, n)
            if not got:
                break
            out.extend(got)
            zone = got[-1].start // self._zone_sectors + 1
        return flags, out

    def report_zones(self, start: int = 0, count: int = 0) -> list[Zone]:
        end = check_report_range(self.geometry, start, count)
        flags, raw = self._report_raw(start, end - start)
        zones = [raw_to_zone(r, flags, self._zone_sectors) for r in raw]
        for i, z in enumerate(zones):
            self._wp_cache[z.index] = z.written
            ahead = self._claims.pointer(z.index) if self._claims is not None else None
            if ahead is not None and ahead > z.written:     # the model's view: claims moved the pointer
                full = ahead >= self._zcap
                zones[i] = dataclasses.replace(
                    z, wp=z.start + (self._zsize if full else ahead),
                    cond=ZoneCond.FULL if full else (ZoneCond.IMP_OPEN if z.cond in (ZoneCond.EMPTY, ZoneCond.CLOSED)
                                                     else z.cond))
        return zones

    def _real_written(self, zone: int) -> int:
        """Bytes the device has written in ``zone`` now (a fresh report; claims not counted)."""
        flags, raw = self._report_raw(zone, 1)
        z = raw_to_zone(raw[0], flags, self._zone_sectors)
        self._wp_cache[zone] = z.written
        return z.written

    def _fill_zeros(self, zone: int, pos: int, length: int) -> None:
        """Write ``length`` zero bytes at byte ``pos`` of ``zone`` (its write pointer): the end of a
        lease its writer left (:meth:`ZoneClaims.fill`)."""
        fd = self._check_rw()
        buf = mmap.mmap(-1, -(-length // _PAGE) * _PAGE)
        try:
            with self._locks[zone]:
                self._write_locked(fd, zone, zone * self._zsize + pos, memoryview(buf)[:length], length)
        finally:
            buf.close()

    # -- claims (the node service: other processes write the extents) ------------------------------
    def claim(self, offset: int, length: int) -> None:
        """Lease ``length`` bytes at device byte ``offset`` (the zone's claim pointer) to another process
        that writes them with its own ``O_DIRECT`` descriptor, in its turn
        (:class:`~retainz.zoned.claims.ZoneClaims`; :meth:`claim_turn`).

        Raises:
            MisalignedIOError, OutOfRangeError; ZoneFullError, ZoneBoundaryError (past the capacity);
            ZoneInvalidWriteError (not the claim pointer); PermissionError (opened read-only).
        """
        if length.__class__ is not int or length <= 0:
            raise ValueError(f"claim length must be a positive int, not {length!r}")
        self._check_range(offset, length)
        self._check_rw()
        z = offset // self._zsize
        pos = offset - z * self._zsize
        ahead = self.claims.pointer(z)
        wp = ahead if ahead is not None else self._wp_cache.get(z)
        if wp is None:
            wp = self._real_written(z)
        if wp >= self._zcap:
            raise ZoneFullError(f"zone {z} is full", zone=z, offset=offset, length=length)
        if pos + length > self._zcap:
            raise ZoneBoundaryError(f"zone {z}: claim of {length} bytes at byte {pos} crosses the zone capacity "
                                    f"{self._zcap}", zone=z, offset=offset, length=length)
        self.claims.lease(z, pos, length, wp)

    def active_zone_budget(self) -> int:
        """The lower of the open and active limits (0 = no limit): every zone a store keeps active
        can be open at once, so no write ever needs the kernel to close a zone itself.  Node clients
        write claimed extents from their own processes at the same time; null_blk refuses a write to
        a Closed zone with ``ETOOMANYREFS`` when its open and active limits are both reached
        (drivers/block/null_blk/zoned.c: ``null_check_open`` closes an implicitly open zone only when
        ``null_check_active`` passes), and the host-side close this class retries with
        (:meth:`_close_implicitly_open`) sees only this process's writes.  ZenFS keeps the same rule
        with tokens: a writer holds an open token while it writes
        (``ZonedBlockDevice::WaitForOpenIOZoneToken``) and closes its zone when it stops
        (``Zone::Close``); the store closes no zone, so it keeps no more zones active than can be open."""
        g = self.geometry
        limits = [n for n in (g.max_active, g.max_open) if n]
        return min(limits) if limits else 0

    def direct_region(self) -> tuple[str, int] | None:
        """``(the device node, 0)``: a claimed extent at ``(zone, offset)`` is at device byte
        ``zone * zone_size + offset``, written with ``O_DIRECT`` in the claim's turn (:meth:`direct_io`)."""
        return (self._info.path, 0) if not self.readonly else None

    def direct_io(self) -> dict:
        """How another process writes a claimed extent here: ``O_DIRECT`` from a page-aligned buffer,
        padded to the block size, in pieces of at most ``max_write`` bytes (0: one piece), one after the
        other (the same discipline as :meth:`write`)."""
        return {"o_direct": True, "block_size": self._bs, "max_write": self.max_write}

    def claim_turn(self, extents) -> None:
        """Return once each zone of ``extents`` (``(zone, offset, length)``, as claimed) has its write
        pointer at the first of them (:meth:`ZoneClaims.wait_turn`)."""
        self.claims.wait_turn(extents)

    def claims_written(self, extents) -> list:
        """The claimed ``extents`` whose bytes the device does not hold yet (:meth:`ZoneClaims.settle`)."""
        return self.claims.settle(extents)

    def release_claims(self, extents) -> int:
        """End claimed ``extents`` their writer will not write: zero-fill what is left of each in its
        turn (:meth:`ZoneClaims.fill`); returns the bytes filled."""
        return self.claims.fill(extents)

    # -- zone management ---------------------------------------------------------------------------
    def zone_op(self, op: ZoneOp, zone: int) -> None:
        if not isinstance(zone, int) or zone < 0 or zone >= self._nz:
            raise OutOfRangeError(f"zone {zone} does not exist: the device has zones 0..{self._nz - 1}",
                                  zone=zone if isinstance(zone, int) else None)
        fd = self._check_rw()
        if op is not ZoneOp.RESET and self._claims is not None:
            self._claims.wait_settled(zone)
        with self._locks[zone]:
            if op is ZoneOp.FINISH and self.geometry.max_active:
                self._check_finish_of_empty(zone)
            self._wp_cache.pop(zone, None)
            try:
                self._ioctl_zone(fd, op, zone)
            except TooManyOpenZonesError:
                if op is ZoneOp.FINISH and self._finish_with_lent_open_resource(fd, zone):
                    pass
                elif op not in (ZoneOp.OPEN, ZoneOp.FINISH) or not self._close_implicitly_open(zone):
                    raise
                else:
                    self._ioctl_zone(fd, op, zone)
            if op is ZoneOp.RESET:
                self._wp_cache[zone] = 0
                if self._claims is not None:
                    self._claims.reset(zone)
            elif op is ZoneOp.FINISH:
                self._wp_cache[zone] = self._zcap
            elif op is ZoneOp.CLOSE:
                z = self.zone(zone)
                if z.cond == ZoneCond.CLOSED and z.wp == z.start:
                    # NVMe ZNS (QEMU) keeps a closed zone with nothing written Closed, holding an active
                    # resource; null_blk and the model make it Empty.  Nothing is lost by a reset.
                    self._ioctl_zone(fd, ZoneOp.RESET, zone)
                    self._wp_cache[zone] = 0

    def _ioctl_zone(self, fd: int, op: ZoneOp, zone: int) -> None:
        try:
            syscalls.zone_management(fd, _OP_IOCTL[op], zone * self._zone_sectors, self._zone_sectors)
        except OSError as e:
            raise classify_zone_op_error(op, e.errno, self.zone(zone)) from None

    def _check_finish_of_empty(self, zone: int) -> None:
        """The model (and null_blk) need a free active resource to finish an Empty zone; QEMU's NVMe
        ZNS takes Empty -> Full directly (a legal ZNS transition).  Refuse it here the model's way."""
        zones = self.report_zones()
        if zones[zone].cond != ZoneCond.EMPTY:
            return
        n_active = sum(z.cond.is_active for z in zones)
        if n_active >= self.geometry.max_active:
            raise TooManyActiveZonesError(
                f"zone {zone}: cannot finish an empty zone: {n_active} zones are active (open or "
                f"closed), the device allows {self.geometry.max_active}", zone=zone)

    def _finish_with_lent_open_resource(self, fd: int, zone: int) -> bool:
        """Finish ``zone`` (Empty or Closed) on a device that wants a free open resource for it
        (null_blk) while every open zone is explicitly open: close one explicitly open zone (the
        lender), finish, open the lender explicitly again.  The model needs no open resource for a
        finish, and leaves every other zone as it was; so does this, seen from outside.

        Returns False (nothing done) when no other zone is explicitly open.  Raises what the finish
        raises, after the lender is open again."""
        zones = self.report_zones()
        if zones[zone].cond not in (ZoneCond.EMPTY, ZoneCond.CLOSED):
            return False
        lenders = [z.index for z in zones if z.cond == ZoneCond.EXP_OPEN and z.index != zone]
        if not lenders:
            return False
        # A lender with data stays active when closed (Closed); an empty one becomes Empty and takes
        # its active resource back when reopened, which the finish of a Full-bound zone leaves free.
        lender = min(lenders, key=lambda z: (zones[z].written == 0, z))
        self._ioctl_zone(fd, ZoneOp.CLOSE, lender)
        try:
            self._ioctl_zone(fd, ZoneOp.FINISH, zone)
        finally:
            self._ioctl_zone(fd, ZoneOp.OPEN, lender)
        return True

    # -- data --------------------------------------------------------------------------------------
    def aligned_buffer(self, length: int) -> mmap.mmap:
        """A new page-aligned, zero-filled buffer of ``length`` bytes: fill it and pass it to
        :meth:`write` to skip the copy into the device's own aligned buffer."""
        return mmap.mmap(-1, max(length, 1))

    def _check_open(self) -> int:
        if self._fd < 0:
            raise ValueError(f"{self._info.path}: device is closed")
        return self._fd

    def _check_rw(self) -> int:
        fd = self._check_open()
        if self.readonly:
            raise PermissionError(f"{self._info.path}: device was opened read-only")
        return fd

    def _check_range(self, offset: int, length: int) -> None:
        check_io_range(self.geometry, offset, length)

    def _aligned_view(self, data: WriteData, length: int) -> memoryview:
        if isinstance(data, int):
            raise TypeError(f"{type(self).__name__} keeps payload: write bytes, not a byte count")
        view = memoryview(data).cast("B")
        if not view.readonly and view.c_contiguous and (syscalls.buffer_address(view) or 1) % _PAGE == 0:
            return view
        if self._buf is None or len(self._buf) < length:
            if self._buf is not None:
                self._buf.close()
            self._buf = mmap.mmap(-1, -(-length // _PAGE) * _PAGE)
        self._buf[:length] = view
        return memoryview(self._buf)[:length]

    def write(self, offset: int, data: WriteData) -> None:
        t = type(data)
        if t is mmap.mmap or t is bytes or t is bytearray:
            length = len(data)
        elif t is int:
            raise TypeError(f"{type(self).__name__} keeps payload: write bytes, not a byte count")
        else:
            length = memoryview(data).nbytes
        bs = self._bs
        if offset < 0 or length <= 0 or offset % bs or length % bs or offset + length > self._end:
            self._check_range(offset, length)
        fd = self._fd
        if fd < 0 or self.readonly:
            fd = self._check_rw()
        z = offset // self._zsize
        if self._claims is not None and self._claims.outstanding(z):
            self._claims.wait_settled(z)
        with self._locks[z]:
            self._write_locked(fd, z, offset, data, length)

    def _write_locked(self, fd: int, z: int, offset: int, data: WriteData, length: int, *,
                      _retried: bool = False) -> None:
        pos = offset - z * self._zsize
        if pos + length > self._zcap:
            # Decide from the zone's state, before any I/O: the kernel would land the first pieces.
            zone = self.zone(z)
            raise classify_write_error(_errno.EIO, zone, offset, length, block_size=self._bs,
                                       written_before=None if zone.cond == ZoneCond.FULL else zone.written)
        before = self._wp_cache.get(z)
        step = self.max_write or length
        done = 0
        # Fast path: an mmap is page aligned, and one request needs no splitting.
        view = data if type(data) is mmap.mmap and step >= length else self._aligned_view(data, length)
        try:
            if view is data:
                done = os.pwrite(fd, view, offset)
                if done != length:
                    raise OSError(_errno.EIO, "short write")
            else:
                while done < length:
                    n = os.pwrite(fd, view[done:done + step], offset + done)
                    if n <= 0:
                        raise OSError(_errno.EIO, "short write")
                    done += n
        except OSError as e:
            self._wp_cache.pop(z, None)
            if (e.errno == _errno.ETOOMANYREFS and done == 0 and not _retried
                    and self._close_implicitly_open(z)):
                return self._write_locked(fd, z, offset, data, length, _retried=True)
            zone = self.zone(z)
            err = classify_write_error(e.errno or _errno.EIO, zone, offset + done, length - done,
                                       block_size=self._bs, written_before=before)
            if done:
                err.strerror = f"{err.strerror} (after {done} of {length} bytes were written)"
            raise err from None
        finally:
            if view is not data:
                view.release()
        if before == pos:
            self._wp_cache[z] = pos + length
        elif before is not None:
            del self._wp_cache[z]
        self._tick += 1
        self._last_write[z] = self._tick

    def _close_implicitly_open(self, target: int) -> bool:
        """Host-side implicit close (NVMe ZNS 2.1.1.4.1): null_blk answers a write to (or an open or
        finish of) a Closed zone with ETOOMANYREFS when both the open and the active limits are reached
        (it wants a free active resource before closing an implicitly open zone, though the Closed zone
        already holds one).
        Close the implicitly open zone this device wrote least recently, so the write can be retried.
        Returns False when the target is not Closed or no zone is implicitly open."""
        zones = self.report_zones()
        if zones[target].cond != ZoneCond.CLOSED:
            return False
        imp = [z.index for z in zones if z.cond == ZoneCond.IMP_OPEN]
        if not imp:
            return False
        victim = min(imp, key=lambda z: self._last_write[z])
        self._ioctl_zone(self._check_rw(), ZoneOp.CLOSE, victim)
        return True

    def append(self, zone: int, data: WriteData) -> int:
        """Emulated zone append (Linux 6.1 has none from user space): under the zone's lock, write at
        the cached write pointer (read from the device when unknown) and return the device byte offset
        where the data landed.  Same errors as :meth:`write`, except never ZoneInvalidWriteError."""
        if not isinstance(zone, int) or zone < 0 or zone >= self._nz:
            raise OutOfRangeError(f"zone {zone} does not exist: the device has zones 0..{self._nz - 1}",
                                  zone=zone if isinstance(zone, int) else None)
        if isinstance(data, int):
            raise TypeError(f"{type(self).__name__} keeps payload: write bytes, not a byte count")
        length = memoryview(data).nbytes
        fd = self._check_rw()
        start = zone * self._zsize
        if self._claims is not None:
            self._claims.wait_settled(zone)
        with self._locks[zone]:
            for attempt in range(2):
                written = self._wp_cache.get(zone)
                if written is None:
                    written = self.zone(zone).written
                if written >= self._zcap:
                    raise ZoneFullError(f"zone {zone} is full", zone=zone, offset=start, length=length)
                self._check_range(start + written, length)
                try:
                    self._write_locked(fd, zone, start + written, data, length)
                except ZoneInvalidWriteError:
                    self._wp_cache.pop(zone, None)  # someone else moved the write pointer: re-read
                    if attempt:
                        raise
                    continue
                return start + written
        raise AssertionError("unreachable")

    def read(self, offset: int, length: int) -> bytes:
        self._check_range(offset, length)
        fd = self._check_open()
        buf = mmap.mmap(-1, -(-length // _PAGE) * _PAGE)
        try:
            view = memoryview(buf)
            done = 0
            while done < length:
                n = os.preadv(fd, [view[done:length]], offset + done)
                if n <= 0:
                    break
                done += n
            view.release()
            if done < length:
                raise OutOfRangeError(f"read {offset}+{length} ended after {done} bytes",
                                      offset=offset, length=length)
            self._zero_unwritten(buf, offset, length)
            return buf[:length]
        except OSError as e:
            if isinstance(e, ZonedDeviceError):
                raise
            z = offset // self._zsize
            zone = self.zone(z)
            if zone.cond == ZoneCond.OFFLINE:
                raise ZoneOfflineError(f"zone {z} is offline", zone=z, offset=offset, length=length,
                                       errno=e.errno) from None
            raise
        finally:
            buf.close()

    def _zero_unwritten(self, buf: mmap.mmap, offset: int, length: int) -> None:
        """Zero what the read returned past each zone's written data: devices differ there (QEMU
        returns the backing file's zeros, null_blk a 0xFF pattern); the model says zeros."""
        first, last = offset // self._zsize, (offset + length - 1) // self._zsize
        if any(z not in self._wp_cache for z in range(first, last + 1)):
            self.report_zones(first, last - first + 1)
        for z in range(first, last + 1):
            zstart = z * self._zsize
            valid_end = zstart + min(self._wp_cache.get(z, self._zcap), self._zcap)
            lo, hi = max(offset, valid_end), min(offset + length, zstart + self._zsize)
            if lo < hi:
                buf[lo - offset:hi - offset] = bytes(hi - lo)

    def flush(self) -> None:
        """``fsync`` the device: the kernel sends a cache flush, so every completed write is durable."""
        os.fsync(self._check_open())

    def close(self) -> None:
        """Close the device node.  Idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if getattr(self, "_buf", None) is not None:
            self._buf.close()
            self._buf = None

    def __del__(self):
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1
