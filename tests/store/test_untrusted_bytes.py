"""A device is input (issue 27 item 8; docs/format.md, "Bounds"): crafted counts and lengths with valid
checksums are refused with one clear error before memory is allocated for them."""

from __future__ import annotations

import json
import socket
import struct
import tracemalloc

import pytest

from retainz.errors import CorruptJournalError
from retainz.store import Store
from retainz.store.format import Superblock
from retainz.store.records import frame
from retainz.zoned import FileDevice, MemoryDevice
from retainz.zoned.model import Geometry
from retainz.zoned.remote import RemoteDeviceError, SocketStream, _Link

MiB = 1 << 20
GEOM = Geometry(nr_zones=16, zone_size=64 * 1024, zone_capacity=48 * 1024, block_size=4096, max_open=3,
                max_active=4)


def _peak(fn) -> tuple[object, int]:
    """``(what fn raised or returned, peak traced bytes)``."""
    tracemalloc.start()
    try:
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - the caller asserts on it
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_superblock_claiming_millions_of_meta_zones_is_refused_unsized():
    dev = MemoryDevice(GEOM)
    Store.format(dev).close()
    sb = Superblock.decode(dev.read(0, 4096), GEOM)
    crafted = Superblock(uuid=sb.uuid, sequence=sb.sequence + 1, part=0, geometry=GEOM, meta_zones=1 << 24,
                         gc_reserve_zones=2, policy="greedy")
    dev.reset_zone(2)
    dev.write(2 * GEOM.zone_size, crafted.encode() * 2)
    err, peak = _peak(lambda: Store.open(dev, readonly=True))
    assert isinstance(err, CorruptJournalError), err
    assert "impossible 16777216 meta zones" in str(err)
    assert peak < 4 * MiB


def test_a_record_claiming_more_than_a_record_holds_is_refused_before_it_is_read(tmp_path):
    """A 200 MiB record inside a 256 MiB meta zone (what main read whole before refusing)."""
    g = Geometry(nr_zones=8, zone_size=256 * MiB, zone_capacity=256 * MiB, block_size=4096, max_open=3,
                 max_active=4)
    dev = FileDevice.create(tmp_path / "big.img", g)
    Store.format(dev, meta_zones=3).close()
    dev.write(dev.zone(0).wp, struct.pack("<II", 0x12345678, 200 * MiB).ljust(4096, b"\0"))
    dev.finish_zone(0)
    dev.flush()
    err, peak = _peak(lambda: Store.open(dev, readonly=True))
    dev.close()
    assert isinstance(err, CorruptJournalError), err
    assert "claims 209715200 bytes, more than a record holds" in str(err)
    assert peak < 16 * MiB


def test_a_deeply_nested_record_with_a_valid_checksum_is_one_clear_error():
    dev = MemoryDevice(GEOM)
    Store.format(dev).close()
    with Store.open(dev, readonly=True) as s:
        at = dev.zone(s.journal.chain[-1]).wp
    dev.write(at, frame(b"c " + b"[" * 6_000, 4096))    # two blocks: what the chain zone has left
    dev.flush()
    with pytest.raises(CorruptJournalError, match="does not decode: RecursionError"):
        Store.open(dev, readonly=True)


def test_a_device_label_claiming_a_billion_zones_is_refused_unread(tmp_path):
    path = tmp_path / "d.img"
    FileDevice.create(path, GEOM).close()
    from retainz.zoned.file import _LABEL, state_slot_size
    raw = bytearray(path.read_bytes()[:_LABEL.size])
    fields = list(_LABEL.unpack(bytes(raw)))
    fields[5], fields[8] = 1 << 30, state_slot_size(1 << 30)
    import crc32c
    label = _LABEL.pack(*fields)
    label += struct.pack("<I", crc32c.crc32c(label))
    with open(path, "r+b") as f:
        f.write(label)
        f.seek(2048)
        f.write(label)
    err, peak = _peak(lambda: FileDevice(path))
    assert "1,073,741,824 zones, over the limit" in str(err), err
    assert peak < 4 * MiB


@pytest.mark.parametrize("claim", [1 << 40, (16 << 20) + 1, -1, True, "9"])
def test_a_remote_message_claiming_a_huge_or_bad_data_length_is_refused_unallocated(claim):
    a, b = socket.socketpair()
    try:
        body = json.dumps({"op": "read", "data": claim}).encode()
        a.sendall(struct.pack("<I", len(body)) + body)
        link = _Link(SocketStream(b, timeout=2))
        err, peak = _peak(link.recv)
        assert isinstance(err, RemoteDeviceError), err
        assert "a data length of" in str(err)
        assert peak < 4 * MiB
    finally:
        a.close()
        b.close()
