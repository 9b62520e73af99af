"""FileDevice: reset zones' blocks are punched at trim/close, not on the reset itself; a zone written
again before its trim keeps its new data."""

from __future__ import annotations

import os

from retainz.zoned import FileDevice, Geometry

KiB = 1024
G = Geometry(nr_zones=6, zone_size=256 * KiB, zone_capacity=256 * KiB, block_size=4096)


def blocks(path) -> int:
    return os.stat(path).st_blocks


def test_reset_defers_the_hole_punch_to_trim(tmp_path):
    path = tmp_path / "d.img"
    dev = FileDevice.create(path, G)
    for z in (1, 2):
        dev.write(z * G.zone_size, b"\xab" * (256 * KiB))
    dev.flush()
    full = blocks(path)
    dev.reset_zones([1, 2])
    assert blocks(path) >= full                            # nothing punched yet (a state slot may grow)
    assert dev.read(G.zone_size, 4096) == bytes(4096)       # yet it reads as zeros
    dev.write(2 * G.zone_size, b"\xcd" * 8192)              # zone 2 reused before its trim
    before = blocks(path)
    assert dev.trim() == 1                                  # only zone 1 is punched
    assert blocks(path) == before - 256 * KiB // 512
    assert dev.read(2 * G.zone_size, 8192) == b"\xcd" * 8192
    dev.reset_zone(2)
    before = blocks(path)
    dev.close()                                             # close trims zone 2
    assert blocks(path) == before - 256 * KiB // 512
    with FileDevice(path) as again:
        assert again.zone(1).wp == again.zone(1).start and again.read(2 * G.zone_size, 8192) == bytes(8192)
