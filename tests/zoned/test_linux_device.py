"""LinuxZonedDevice on the host (no guest): refusing non-zoned paths, the blkzoned.h structs and ioctl
numbers, and the errno -> exception mapping (pure functions, tested with hand-made zone reports).

The device itself is exercised against real zoned devices by the guest lane (tests/vm/test_zns_guest.py).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from retainz.errors import (
    InvalidZoneTransitionError,
    MisalignedIOError,
    NotADeviceError,
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
from retainz.zoned import ZoneCond, ZoneOp, ZoneType, open_device
from retainz.zoned.blkzoned import (
    BLK_ZONE,
    BLK_ZONE_RANGE,
    BLK_ZONE_REP_CAPACITY,
    BLKCLOSEZONE,
    BLKFINISHZONE,
    BLKGETNRZONES,
    BLKGETZONESZ,
    BLKOPENZONE,
    BLKREPORTZONE,
    BLKRESETZONE,
    REPORT_HEADER,
    RawZone,
    classify_write_error,
    classify_zone_op_error,
    pack_report_request,
    pack_zone_range,
    parse_report,
    raw_to_zone,
)
from retainz.zoned.linux import LinuxZonedDevice
from retainz.zoned.model import Zone

MiB = 1 << 20


# -- refusing what is not a zoned block device ------------------------------------------------------

def test_regular_file_is_refused_with_a_clear_error(tmp_path):
    f = tmp_path / "plain.img"
    f.write_bytes(bytes(1 << 16))
    with pytest.raises(NotADeviceError, match=r"is a regular file, not a zoned block device.*file:PATH"):
        LinuxZonedDevice(f)
    with pytest.raises(NotADeviceError, match="regular file"):
        open_device(f"zbd:{f}")


def test_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        LinuxZonedDevice(tmp_path / "nope")


@pytest.fixture
def loop_device(tmp_path):
    if os.geteuid() != 0 or not shutil.which("losetup"):
        pytest.skip("losetup needs root")
    img = tmp_path / "loop.img"
    with open(img, "wb") as f:
        f.truncate(8 * MiB)
    r = subprocess.run(["losetup", "--find", "--show", str(img)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot attach a loop device here: {r.stderr.strip()}")
    dev = r.stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def test_loop_device_is_refused_as_not_zoned(loop_device):
    with pytest.raises(NotADeviceError, match="block device but not a zoned one") as ei:
        LinuxZonedDevice(loop_device)
    assert loop_device in str(ei.value)
    with pytest.raises(NotADeviceError, match="not a zoned one"):
        open_device(loop_device)  # /dev/* routes to LinuxZonedDevice


# -- ioctl numbers and struct layouts (include/uapi/linux/blkzoned.h) ------------------------------

def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (0x12 << 8) | nr


def test_ioctl_numbers_match_the_ioc_macros():
    write, read = 1, 2
    assert BLKREPORTZONE == _ioc(read | write, 130, 16) == 0xC0101282
    assert BLKRESETZONE == _ioc(write, 131, 16) == 0x40101283
    assert BLKGETZONESZ == _ioc(read, 132, 4) == 0x80041284
    assert BLKGETNRZONES == _ioc(read, 133, 4) == 0x80041285
    assert BLKOPENZONE == _ioc(write, 134, 16) == 0x40101286
    assert BLKCLOSEZONE == _ioc(write, 135, 16) == 0x40101287
    assert BLKFINISHZONE == _ioc(write, 136, 16) == 0x40101288


def test_struct_sizes():
    assert (REPORT_HEADER.size, BLK_ZONE.size, BLK_ZONE_RANGE.size) == (16, 64, 16)


def test_report_request_header_and_room():
    buf = pack_report_request(sector=4096, nr_zones=3)
    assert len(buf) == 16 + 3 * 64
    assert REPORT_HEADER.unpack_from(buf) == (4096, 3, 0)
    assert bytes(buf[16:]) == bytes(3 * 64)


def _filled_report(zones: list[tuple], flags: int) -> bytearray:
    buf = pack_report_request(0, len(zones) + 1)  # room for one more than reported
    REPORT_HEADER.pack_into(buf, 0, 0, len(zones), flags)
    for i, z in enumerate(zones):
        BLK_ZONE.pack_into(buf, 16 + 64 * i, *z)
    return buf


def test_parse_report_reads_the_kernel_layout():
    # start, len, wp, type, cond, non_seq, reset, capacity (sectors)
    buf = _filled_report([(0, 2048, 16, 2, 2, 0, 0, 1536), (2048, 2048, 4096, 2, 0xE, 0, 1, 1536)],
                         BLK_ZONE_REP_CAPACITY)
    # offsetof(struct blk_zone, capacity) == 32: after start, len, wp, 4 one-byte fields and resv[4]
    assert int.from_bytes(buf[16 + 32:16 + 40], "little") == 1536
    assert buf[16 + 25] == 2 and buf[16 + 64 + 25] == 0xE  # cond at offset 25
    flags, zones = parse_report(buf)
    assert flags == BLK_ZONE_REP_CAPACITY
    assert zones == [RawZone(0, 2048, 16, 2, 2, 0, 0, 1536), RawZone(2048, 2048, 4096, 2, 0xE, 0, 1, 1536)]


def test_parse_report_rejects_a_short_buffer():
    buf = _filled_report([(0, 2048, 0, 2, 1, 0, 0, 2048)], 0)
    REPORT_HEADER.pack_into(buf, 0, 0, 5, 0)
    with pytest.raises(ValueError, match="claims 5 zones"):
        parse_report(buf)


def test_raw_to_zone_converts_sectors_to_bytes_and_capacity_flag():
    raw = RawZone(start=2048, len=2048, wp=2048 + 16, type=2, cond=2, non_seq=0, reset=0, capacity=1536)
    z = raw_to_zone(raw, BLK_ZONE_REP_CAPACITY, zone_sectors=2048)
    assert z == Zone(index=1, start=MiB, size=MiB, capacity=768 * 1024, wp=MiB + 8192,
                     cond=ZoneCond.IMP_OPEN, type=ZoneType.SEQ_WRITE_REQUIRED)
    assert raw_to_zone(raw, 0, 2048).capacity == MiB  # no capacity flag: capacity = length


def test_raw_to_zone_full_zone_reports_start_plus_size():
    # null_blk leaves wp at start + capacity for a zone filled by writes
    raw = RawZone(start=0, len=4096, wp=2048, type=2, cond=0xE, non_seq=0, reset=0, capacity=2048)
    z = raw_to_zone(raw, BLK_ZONE_REP_CAPACITY, 4096)
    assert (z.cond, z.wp, z.written) == (ZoneCond.FULL, 2 * MiB, MiB)


def test_zone_range_packing():
    assert BLK_ZONE_RANGE.unpack(pack_zone_range(6144, 2048)) == (6144, 2048)


# -- errno -> exception ----------------------------------------------------------------------------

def _zone(cond=ZoneCond.IMP_OPEN, written=8192, index=2, size=MiB, cap=768 * 1024):
    start = index * size
    wp = start + size if cond == ZoneCond.FULL else start + written
    return Zone(index=index, start=start, size=size, capacity=cap, wp=wp, cond=cond)


def test_eio_write_not_at_wp_is_zone_invalid_write():
    z = _zone(written=8192)
    err = classify_write_error(errno.EIO, z, z.start + 4096, 4096, written_before=8192)
    assert type(err) is ZoneInvalidWriteError
    assert (err.zone, err.offset, err.length, err.errno) == (2, z.start + 4096, 4096, errno.EIO)
    assert "write pointer is at byte 8192" in str(err)


def test_eio_write_on_full_zone_is_zone_full():
    z = _zone(cond=ZoneCond.FULL)
    err = classify_write_error(errno.EIO, z, z.start + 768 * 1024, 4096)
    assert type(err) is ZoneFullError and err.zone == 2


def test_eio_write_at_wp_past_capacity_is_boundary_even_if_the_zone_filled():
    z = _zone(written=4096)
    err = classify_write_error(errno.EIO, z, z.start + 4096, 768 * 1024, written_before=4096)
    assert type(err) is ZoneBoundaryError
    full = _zone(cond=ZoneCond.FULL)  # the device wrote up to the capacity before failing
    err = classify_write_error(errno.EIO, full, full.start + 4096, 768 * 1024, written_before=4096)
    assert type(err) is ZoneBoundaryError


def test_eio_on_read_only_and_offline_zones():
    assert type(classify_write_error(errno.EIO, _zone(cond=ZoneCond.READONLY), 0, 4096)) is ZoneReadOnlyError
    assert type(classify_write_error(errno.EIO, _zone(cond=ZoneCond.OFFLINE), 0, 4096)) is ZoneOfflineError


def test_resource_errnos_map_to_limit_errors():
    z = _zone(cond=ZoneCond.EMPTY, written=0)
    e1 = classify_write_error(errno.ETOOMANYREFS, z, z.start, 4096)
    e2 = classify_write_error(errno.EOVERFLOW, z, z.start, 4096)
    assert type(e1) is TooManyOpenZonesError and e1.errno == errno.ETOOMANYREFS
    assert type(e2) is TooManyActiveZonesError and e2.errno == errno.EOVERFLOW


def test_einval_write_misaligned_or_out_of_range():
    z = _zone()
    assert type(classify_write_error(errno.EINVAL, z, z.start + 512, 4096)) is MisalignedIOError
    assert type(classify_write_error(errno.EINVAL, z, z.start, 4096)) is OutOfRangeError


def test_unexplained_eio_stays_a_generic_device_error_with_errno():
    z = _zone(written=8192)
    err = classify_write_error(errno.EIO, z, z.start + 8192, 4096, written_before=8192)
    assert type(err) is ZonedDeviceError and err.errno == errno.EIO
    assert "Input/output error" in str(err)


@pytest.mark.parametrize(("op", "cond"), [(ZoneOp.CLOSE, ZoneCond.EMPTY), (ZoneOp.CLOSE, ZoneCond.FULL),
                                          (ZoneOp.OPEN, ZoneCond.FULL)])
def test_eio_zone_op_from_wrong_state_is_invalid_transition(op, cond):
    err = classify_zone_op_error(op, errno.EIO, _zone(cond=cond, written=0))
    assert type(err) is InvalidZoneTransitionError
    assert err.zone == 2 and cond.long in str(err)


def test_zone_op_resource_and_support_errors():
    z = _zone(cond=ZoneCond.EMPTY, written=0)
    assert type(classify_zone_op_error(ZoneOp.OPEN, errno.ETOOMANYREFS, z)) is TooManyOpenZonesError
    assert type(classify_zone_op_error(ZoneOp.FINISH, errno.EOVERFLOW, z)) is TooManyActiveZonesError
    assert type(classify_zone_op_error(ZoneOp.RESET, errno.ENOTTY, z)) is ZoneOpNotSupportedError
    assert type(classify_zone_op_error(ZoneOp.OPEN, errno.EIO, _zone(cond=ZoneCond.READONLY))) \
        is ZoneReadOnlyError
    conv = Zone(index=0, start=0, size=MiB, capacity=MiB, wp=0, cond=ZoneCond.NOT_WP,
                type=ZoneType.CONVENTIONAL)
    assert type(classify_zone_op_error(ZoneOp.RESET, errno.EIO, conv)) is ZoneOpNotSupportedError
    generic = classify_zone_op_error(ZoneOp.RESET, errno.EIO, z)
    assert type(generic) is ZonedDeviceError and generic.errno == errno.EIO


# -- zone management against a fake null_blk (no kernel) -----------------------------------------------

class _FakeNullBlk:
    """null_blk's zone resource rules (drivers/block/null_blk/zoned.c, Linux 6.1) for the zone
    management ioctls: an Empty zone's finish checks the active limit, then the open limit; a
    Closed zone's finish checks the open limit; a full open limit is relieved by closing an
    implicitly open zone only while the active limit allows it (ETOOMANYREFS otherwise)."""

    E, IO, EO, C, F = ZoneCond.EMPTY, ZoneCond.IMP_OPEN, ZoneCond.EXP_OPEN, ZoneCond.CLOSED, ZoneCond.FULL

    def __init__(self, nz=8, max_open=3, max_active=4):
        self.cond = [self.E] * nz
        self.written = [0] * nz
        self.max_open, self.max_active = max_open, max_active
        self.log: list[tuple[str, int]] = []

    def _n(self, *conds):
        return sum(c in conds for c in self.cond)

    def _check_active(self):
        if self._n(self.IO, self.EO, self.C) >= self.max_active:
            raise TooManyActiveZonesError("active")

    def _check_open(self):
        if self._n(self.IO, self.EO) < self.max_open:
            return
        if self.IO in self.cond and self._n(self.IO, self.EO, self.C) < self.max_active:
            self.cond[self.cond.index(self.IO)] = self.C
            return
        raise TooManyOpenZonesError("open")

    def ioctl(self, _fd, op: ZoneOp, z: int) -> None:
        c = self.cond[z]
        if op is ZoneOp.OPEN and c in (self.E, self.C):
            if c == self.E:
                self._check_active()
            self._check_open()
        elif op is ZoneOp.FINISH and c in (self.E, self.C):
            if c == self.E:
                self._check_active()
            self._check_open()
        self.log.append((op.value, z))
        if op is ZoneOp.OPEN and c != self.F:
            self.cond[z] = self.EO
        elif op is ZoneOp.CLOSE and c in (self.IO, self.EO):
            self.cond[z] = self.C if self.written[z] else self.E
        elif op is ZoneOp.FINISH:
            self.cond[z] = self.F
        elif op is ZoneOp.RESET:
            self.cond[z], self.written[z] = self.E, 0


def _fake_linux_device(fake: _FakeNullBlk) -> LinuxZonedDevice:
    """A LinuxZonedDevice whose zone ioctls and reports go to ``fake`` (bypassing ``__init__``)."""
    import threading

    from retainz.zoned import Geometry
    from retainz.zoned.model import DeviceInfo

    nz, zsize, zcap = len(fake.cond), 2 * MiB, MiB
    dev = object.__new__(LinuxZonedDevice)
    dev._fd, dev.readonly, dev._buf = os.open(os.devnull, os.O_RDONLY), False, None  # closed by __del__
    dev._nz, dev._zone_sectors, dev._zsize, dev._zcap, dev._bs = nz, zsize // 512, zsize, zcap, 4096
    dev._end = nz * zsize
    dev._locks = [threading.Lock() for _ in range(nz)]
    dev._wp_cache, dev._last_write, dev._tick = {}, [0] * nz, 0
    g = Geometry(nr_zones=nz, zone_size=zsize, zone_capacity=zcap, block_size=4096,
                 max_open=fake.max_open, max_active=fake.max_active)
    dev._info = DeviceInfo(geometry=g, kind="linux", path="/dev/fake")
    dev._ioctl_zone = fake.ioctl

    def report(start=0, count=0):
        end = nz if count == 0 else start + count
        return [Zone(index=z, start=z * zsize, size=zsize, capacity=zcap,
                     wp=z * zsize + (zsize if fake.cond[z] == ZoneCond.FULL else fake.written[z]),
                     cond=fake.cond[z], type=ZoneType.SEQ_WRITE_REQUIRED) for z in range(start, end)]

    dev.report_zones = report
    return dev


@pytest.mark.parametrize("target", ["empty", "closed"])
def test_finish_with_every_open_zone_explicit_borrows_an_open_resource_on_null_blk(target):
    """null_blk refuses this finish (the model and QEMU do not): an explicitly open zone holding data
    is closed, the finish issued, and the zone opened explicitly again; nothing else changes."""
    fake = _FakeNullBlk()
    dev = _fake_linux_device(fake)
    if target == "closed":
        fake.cond[3], fake.written[3] = ZoneCond.CLOSED, 8192
    fake.cond[:3] = [ZoneCond.EXP_OPEN] * 3
    fake.written[1] = 4096                      # the lender: an explicitly open zone with data
    with pytest.raises(TooManyOpenZonesError):
        fake.ioctl(99, ZoneOp.FINISH, 3)        # what the kernel answers
    fake.log.clear()
    dev.finish_zone(3)
    assert fake.log == [("close", 1), ("finish", 3), ("open", 1)]
    assert fake.cond[:4] == [ZoneCond.EXP_OPEN] * 3 + [ZoneCond.FULL]
    assert fake.written[:4] == [0, 4096, 0, 8192 if target == "closed" else 0]
    assert dev._wp_cache[3] == MiB


def test_finish_of_a_closed_zone_without_a_lender_closes_the_oldest_implicitly_open_zone():
    fake = _FakeNullBlk()
    dev = _fake_linux_device(fake)
    fake.cond[:4] = [ZoneCond.IMP_OPEN] * 3 + [ZoneCond.CLOSED]    # open and active limits reached
    fake.written[:4] = [4096] * 4
    dev._last_write[:3] = [5, 2, 9]
    dev.finish_zone(3)
    assert fake.log == [("close", 1), ("finish", 3)]
    assert fake.cond[:4] == [ZoneCond.IMP_OPEN, ZoneCond.CLOSED, ZoneCond.IMP_OPEN, ZoneCond.FULL]


def test_finish_of_an_empty_zone_beyond_the_active_limit_is_refused_before_any_ioctl():
    fake = _FakeNullBlk()
    dev = _fake_linux_device(fake)
    fake.cond[:4] = [ZoneCond.EXP_OPEN] * 3 + [ZoneCond.CLOSED]
    fake.written[3] = 4096
    with pytest.raises(TooManyActiveZonesError):
        dev.finish_zone(4)
    assert fake.log == [] and fake.cond[4] == ZoneCond.EMPTY
