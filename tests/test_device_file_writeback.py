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
