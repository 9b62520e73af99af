"""FileDevice starts the kernel's writeback every ``WRITEBACK_BYTES`` written (so a flush's
``fdatasync`` finds little left), without changing what a flush makes durable."""

from __future__ import annotations

import retainz.zoned.file as file_mod
from retainz.zoned import FileDevice, Geometry

KiB = 1024
G = Geometry(nr_zones=4, zone_size=256 * KiB, zone_capacity=256 * KiB, block_size=4096)


def test_writeback_starts_every_writeback_bytes_across_zones(tmp_path, monkeypatch):
    starts = []
    monkeypatch.setattr(file_mod, "WRITEBACK_BYTES", 64 * KiB)
    monkeypatch.setattr(file_mod, "start_writeback", lambda fd: starts.append(fd))
    dev = FileDevice.create(tmp_path / "d.img", G)
    dev.write(0, b"\x01" * (48 * KiB))
    assert starts == []                               # 48 KiB: below the threshold
    dev.write(G.zone_size, b"\x02" * (32 * KiB))      # 80 KiB in all, another zone: one start
    assert len(starts) == 1
    dev.write(48 * KiB, b"\x03" * (200 * KiB))        # 32 + 200 KiB since: one more
    assert len(starts) == 2 and starts[0] == starts[1] == dev._fd
    dev.close()


def test_started_writeback_does_not_make_unflushed_writes_durable(tmp_path, monkeypatch):
    monkeypatch.setattr(file_mod, "WRITEBACK_BYTES", 4096)   # the real sync_file_range on every write
    path = tmp_path / "d.img"
    dev = FileDevice.create(path, G)
    dev.write(0, b"\xaa" * (64 * KiB))
    dev.flush()
    dev.write(64 * KiB, b"\xbb" * (64 * KiB))         # written back by the kernel, never flushed
    dev.power_loss()
    assert dev.zone(0).wp == 64 * KiB                 # the power cut keeps only the flushed part
    dev.close()
    with FileDevice(path) as again:
        assert again.zone(0).wp == 64 * KiB
        assert again.read(0, 64 * KiB) == b"\xaa" * (64 * KiB)


def test_a_host_file_system_error_names_the_device_file(tmp_path, monkeypatch):
    """ENOSPC (or EIO) from the host file system comes back naming the device file, same errno, for
    writes, flushes and state writes alike (the CLI prints ``PATH: No space left on device``)."""
    import errno
    import os

    import pytest

    path = tmp_path / "d.img"
    dev = FileDevice.create(path, G)
    real_pwrite, real_sync = os.pwrite, file_mod._datasync

    def full(*a):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    for target, name in ((os, "pwrite"), (file_mod, "_datasync")):
        monkeypatch.setattr(target, name, full)
        with pytest.raises(OSError) as info:
            dev.write(0, b"\x01" * 4096) if name == "pwrite" else dev.flush()
        assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(path))
        assert f"{info.value.filename}: {info.value.strerror}" == f"{path}: No space left on device"
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        monkeypatch.setattr(file_mod, "_datasync", real_sync)
        if name == "pwrite":
            dev.write(0, b"\x01" * 4096)             # the device still works once space is back
    dev.close()
