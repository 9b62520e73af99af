"""The foreign calls (``retainz.zoned.syscalls``): 64-bit offsets whatever was called first, every
return code checked, best-effort failures logged and counted, and no foreign call made anywhere else.

The bug this guards against: ``fallocate`` was given its prototype only when it was the first user of
a shared ctypes handle; once ``sync_file_range`` had loaded the handle, offsets went through as 32-bit
``int``s, so punching a reset zone at 5 GiB punched 1 GiB (someone else's data) and offsets in
[2, 4) GiB failed with ``EINVAL``, ignored."""

from __future__ import annotations

import ast
import errno
import os
from pathlib import Path

import pytest

from retainz.zoned import FileDevice, Geometry, syscalls
from tests.conftest import GiB

SRC = Path(__file__).resolve().parents[2] / "src" / "retainz"
MiB = 1 << 20


def data_ranges(path) -> list[tuple[int, int]]:
    """The file's allocated ranges ``[(start, end)]`` (``SEEK_DATA`` / ``SEEK_HOLE``)."""
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size
        pos = 0
        while pos < end:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    break
                raise
            pos = os.lseek(fd, start, os.SEEK_HOLE)
            out.append((start, pos))
    finally:
        os.close(fd)
    return out


@pytest.mark.parametrize("first", ["sync_file_range", "fallocate"])
def test_punch_hole_lands_at_64_bit_offsets_whichever_call_came_first(tmp_path, first, monkeypatch):
    monkeypatch.setattr(syscalls, "_libc", syscalls._Libc())     # a handle no call has used yet
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 6 * GiB)
        spots = [1 * GiB, 3 * GiB, 5 * GiB]                       # below 2^31, in [2^31, 2^32), past 2^32
        for off in spots:
            os.pwrite(fd, b"\xab" * MiB, off)
        os.fsync(fd)
        if first == "sync_file_range":
            syscalls.start_writeback(fd)
        syscalls.punch_hole(fd, 5 * GiB, MiB)                     # truncated to 32 bits: 1 GiB
        syscalls.punch_hole(fd, 3 * GiB, MiB)                     # as a C int: negative, EINVAL
        if first == "fallocate":
            syscalls.start_writeback(fd)
    finally:
        os.close(fd)
    assert data_ranges(path) == [(1 * GiB, 1 * GiB + MiB)]
    with open(path, "rb") as f:
        f.seek(1 * GiB)
        assert f.read(MiB) == b"\xab" * MiB


def test_a_failed_call_raises_its_errno_and_best_effort_logs_and_counts_it(tmp_path, caplog):
    path = tmp_path / "f"
    path.write_bytes(bytes(8192))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            syscalls.punch_hole(fd, 0, 4096)                      # not open for writing
        assert info.value.errno == errno.EBADF and "fallocate" in str(info.value)
        with pytest.raises(ValueError, match="offset -1"):
            syscalls.punch_hole(fd, -1, 4096)
        before = syscalls.FAILURES["fallocate"]
        with caplog.at_level("WARNING", logger="retainz.zoned"):
            assert syscalls.best_effort("fallocate", syscalls.punch_hole, fd, 0, 4096) is False
            assert syscalls.best_effort("fallocate", syscalls.punch_hole, fd, 0, 4096) is False
        assert syscalls.FAILURES["fallocate"] == before + 2
        assert syscalls.best_effort("sync_file_range", syscalls.start_writeback, fd) is True
    finally:
        os.close(fd)
    with pytest.raises(OSError) as info:
        syscalls.start_writeback(fd)                              # closed
    assert info.value.errno == errno.EBADF


def test_every_libc_function_has_its_full_prototype():
    for name, (_symbols, argtypes, restype) in syscalls._PROTOTYPES.items():
        f = syscalls._libc.fn(name)
        assert f is not None, name
        assert list(f.argtypes) == argtypes and f.restype is restype, name
    offs = [a for _, (_, args, _) in syscalls._PROTOTYPES.items() for a in args]
    assert all(a in (syscalls.ctypes.c_int, syscalls.ctypes.c_uint, syscalls.ctypes.c_ulong,
                     syscalls.ctypes.c_int64) for a in offs)


def test_no_module_but_syscalls_makes_a_foreign_call():
    """ctypes (libc) and ioctls are made in ``zoned/syscalls.py`` only."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "syscalls.py" and path.parent.name == "zoned":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ctypes" for a in node.names):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} imports ctypes")
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ctypes":
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} imports ctypes")
            if (isinstance(node, ast.Attribute) and node.attr == "ioctl" and isinstance(node.value, ast.Name)
                    and node.value.id == "fcntl"):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} calls fcntl.ioctl")
    assert offenders == []


# -- a FileDevice past 4 GiB, in one process that has written, reset and reopened -------------------------

def test_resets_and_power_cuts_past_4_gib_punch_only_their_own_zones(tmp_path):
    """More than ``WRITEBACK_BYTES`` written (the writeback hint has run), then zones reset at 3, 9 and
    15 GiB and a power cut dropping an unflushed tail at 12 GiB: every other zone's data survives the
    trim, the close and a reopen, and the file's allocated ranges are exactly the live data."""
    g = Geometry(nr_zones=6, zone_size=3 * GiB, zone_capacity=4 * MiB, block_size=4096, max_open=6,
                 max_active=6)
    path = tmp_path / "d.img"
    dev = FileDevice.create(path, g)
    data = {z: bytes([z + 1]) * g.zone_capacity for z in range(6)}
    for z, d in data.items():
        dev.write(dev.zone(z).start, d[:MiB])
    dev.flush()
    for z, d in data.items():
        dev.write(dev.zone(z).start + MiB, d[MiB:])               # 24 MiB in all: writeback started
    dev.flush()
    failures = dict(syscalls.FAILURES)
    dev.reset_zones([1, 3, 5])
    assert dev.trim() == 3
    # a power cut that keeps zone 4's flushed data and drops an unflushed tail (the tail's blocks punched)
    dev.reset_zone(4)
    dev.write(dev.zone(4).start, data[4][:MiB])
    dev.flush()
    dev.write(dev.zone(4).start + MiB, data[4][MiB:2 * MiB])
    dev.power_loss()
    dev.close()
    assert dict(syscalls.FAILURES) == failures                     # no punch failed (no EINVAL)
    with FileDevice(path) as again:
        for z in (0, 2):
            assert again.zone(z).written == g.zone_capacity
            assert again.read(again.zone(z).start, g.zone_capacity) == data[z], z
        assert again.zone(4).written == MiB
        assert again.read(again.zone(4).start, MiB) == data[4][:MiB]
        for z in (1, 3, 5):
            assert again.zone(z).written == 0
        base = again._data_offset
    # the label and state slots, then zone 0 (contiguous), zone 2, zone 4's flushed MiB, and the label
    # copy at the end of the file (device format 3): nothing else
    end = base + g.nr_zones * g.zone_size
    assert data_ranges(path) == [(0, base + g.zone_capacity),
                                 (base + 2 * g.zone_size, base + 2 * g.zone_size + g.zone_capacity),
                                 (base + 4 * g.zone_size, base + 4 * g.zone_size + MiB), (end, end + 4096)]
