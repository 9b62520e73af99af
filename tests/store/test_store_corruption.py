"""Corruption: flipped bits in data, journal records and the superblock give clear errors, never
silent wrong data."""

from __future__ import annotations

import random
import re
import uuid

import crc32c
import pytest

from retainz.errors import (
    ChecksumError,
    CorruptJournalError,
    GenerationNotFoundError,
    RetainZError,
    ShardNotFoundError,
)
from retainz.store import Store
from retainz.store.format import Superblock
from retainz.store.records import empty_snapshot, frame
from retainz.zoned import Geometry, MemoryDevice
from retainz.zoned.faulty import FaultyDevice

KiB = 1024
GEOM = Geometry(nr_zones=12, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)


def blob(i, n=20 * KiB):
    return random.Random(i).randbytes(n)


def make(dev):
    s = Store.format(dev)
    for i in range(3):
        w = s.begin_generation(f"g{i}", i)
        w.write_shard("a", [blob(i)])
        w.write_shard("b", [blob(i + 10, 3000)])
        w.commit()
    return s


def flip(dev: MemoryDevice, offset: int, mask: int = 0x10) -> None:
    """Flip bits of the stored bytes (silent media corruption that survives a reopen)."""
    z, pos = divmod(offset, dev.geometry.zone_size)
    dev._data[z][pos] ^= mask


def test_flipped_bit_in_a_data_block_raises_checksum_error_naming_where():
    dev = MemoryDevice(GEOM)
    s = make(dev)
    z, off, length, _ = s.generation("g1").shards["a"].extents[0]
    flip(dev, z * GEOM.zone_size + off + 777)
    with pytest.raises(ChecksumError) as e:
        b"".join(s.read_shard("g1", "a"))
    err = e.value
    assert (err.generation, err.shard, err.zone, err.offset) == ("g1", "a", z, off)
    assert f"zone {z} offset {off}" in str(err) and isinstance(err, RetainZError)
    chunks = []
    with pytest.raises(ChecksumError):
        for c in s.read_shard("g1", "a"):
            chunks.append(c)
    assert chunks == []                       # nothing of the bad extent was handed out
    assert b"".join(s.read_shard("g2", "a")) == blob(2)
    rep = s.fsck()
    assert not rep.ok and len(rep.problems) == 2   # the extent and the whole-shard crc
    assert f"zone {z} offset {off}" in rep.problems[0]
    s.close()


def test_corrupt_read_from_the_device_is_caught_on_every_path():
    dev = FaultyDevice(MemoryDevice(GEOM))
    s = make(dev)
    z, off, _, _ = s.generation("g0").shards["b"].extents[0]
    dev.corrupt(z * GEOM.zone_size + off + 5)
    with pytest.raises(ChecksumError):
        b"".join(s.read_shard("g0", "b"))
    assert not s.fsck().ok
    dev.corruptions.clear()
    assert s.fsck().ok
    s.close()


def test_flipped_bit_in_a_journal_record_fails_the_mount_clearly():
    """The first commit record (after 2 superblock copies and the empty snapshot's 3 records, each
    written twice: format version 5) flipped in one copy: its other copy is used, and named; in both
    copies: a clear refusal naming the first."""
    dev = MemoryDevice(GEOM)
    make(dev).close()
    with Store.open(dev, readonly=True) as s:
        z = s.journal.chain[0]
    flip(dev, z * GEOM.zone_size + 8 * 4096 + 20)        # copy 0 of the first commit record
    with Store.open(dev, readonly=True) as s:
        assert [g.id for g in s.generations()] == ["g0", "g1", "g2"]
        assert s.recovery.copies == [f"meta zone {z}: a record copy at byte 32768 is damaged; its other copy was used"]
    flip(dev, z * GEOM.zone_size + 9 * 4096 + 20)        # and its copy 1
    with pytest.raises(CorruptJournalError, match=f"meta zone {z}: record at byte 32768 .* fails its checksum"):
        Store.open(dev)


def test_flipped_bits_in_every_superblock_copy_fail_the_mount_clearly():
    """Both copies of the chain zone's superblock flipped: the spares and the previous chain's
    superblocks in the other meta zones stand for it (issue 41 item 3); every copy of it flipped,
    spares and the previous chain's included: a clear refusal."""
    dev = MemoryDevice(GEOM)
    make(dev).close()
    with Store.open(dev, readonly=True) as s:
        z = s.journal.chain[0]
    flip(dev, z * GEOM.zone_size + 40)
    flip(dev, z * GEOM.zone_size + 4096 + 40)             # both copies (one alone is survived: test_metadata_redundancy)
    with Store.open(dev, readonly=True) as s:
        assert len(s.generations()) == 3
        assert any(f"meta zone {z}: both superblock copies are lost" in n for n in s.recovery.copies)
    for spare in (i for i in range(3) if i != z and dev._data[i]):   # spares, and the previous chain's two copies
        flip(dev, spare * GEOM.zone_size + 40)
        if Superblock.has_magic(bytes(dev._data[spare][4096:4104])):
            flip(dev, spare * GEOM.zone_size + 4096 + 40)
    with pytest.raises(CorruptJournalError, match="fails its checksum and no other copy exists"):
        Store.open(dev)


def test_corrupt_journal_is_not_mistaken_for_an_empty_device():
    dev = MemoryDevice(GEOM)
    make(dev).close()
    z = next(i for i in range(3) if dev._data[i])
    flip(dev, z * GEOM.zone_size + 40)
    from retainz.errors import ForeignDeviceError

    with pytest.raises(ForeignDeviceError, match="already holds a RetainZ store"):
        Store.format(dev)                      # still recognised: no accidental reformat


def test_extents_each_valid_but_in_the_wrong_order_fail_the_whole_shard_crc():
    """Metadata that maps a shard's extents in the wrong order (a bug in a GC move or a commit's
    extent list) passes every extent's crc32c; the whole-shard crc32c is what catches it."""
    import dataclasses

    dev = MemoryDevice(GEOM)
    s = Store.format(dev)
    w = s.begin_generation("g", 1)
    data = blob(7, 70 * KiB)                  # more than a zone's capacity: two extents at least
    w.write_shard("s", [data])
    w.commit()
    gen = s.generation("g")
    shard = gen.shards["s"]
    assert len(shard.extents) >= 2
    assert b"".join(s.read_shard("g", "s")) == data
    ext = list(shard.extents)
    ext[0], ext[1] = ext[1], ext[0]
    gen.shards["s"] = dataclasses.replace(shard, extents=tuple(ext))
    with pytest.raises(ChecksumError, match="generation 'g' shard 's': whole-shard crc32c mismatch") as e:
        b"".join(s.read_shard("g", "s"))
    n0, n1 = shard.extents[0][2], shard.extents[1][2]
    swapped = data[n0:n0 + n1] + data[:n0] + data[n0 + n1:]
    assert (e.value.expected, e.value.actual) == (shard.crc, crc32c.crc32c(swapped))
    assert (e.value.generation, e.value.shard) == ("g", "s")
    s.close()


@pytest.mark.parametrize("payload, why", [(b'd {"r":[],"now":3}', "KeyError: 'g'"),
                                          (b'c {"g":[1,2]}', "ValueError: not enough values to unpack "
                                                             "(expected at least 5, got 2)")])
def test_a_record_with_a_valid_checksum_that_does_not_decode_fails_the_mount_naming_it(payload, why):
    """A record whose checksum matches but whose body is not a record (written by other code, or a
    bug) is corruption: the mount names the record, its first bytes and what is wrong."""
    dev = MemoryDevice(GEOM)
    sb = Superblock(uuid=uuid.uuid4(), sequence=1, part=0, geometry=GEOM, meta_zones=3, gc_reserve_zones=2,
                    policy="greedy")
    records = [*empty_snapshot(), payload]
    dev.write(0, sb.encode() * 2 + b"".join(frame(p, GEOM.block_size) for p in records))
    dev.flush()
    # the snapshot's head, zone batch and end are each written twice and replayed once (format 5)
    want = f"journal record 3 ({payload[:8]!r}...) does not decode: {why}"
    for readonly in (False, True):
        with pytest.raises(CorruptJournalError, match=f"^{re.escape(want)}$"):
            Store.open(dev, readonly=readonly)


def test_every_read_path_names_the_corrupt_extent_exactly():
    """A flipped bit in g1's second extent (its shard spans two zones): the stream hands out the
    first extent, then refuses the second; random access refuses exactly the bytes of that extent;
    the error carries where, how long and both checksums."""
    dev = FaultyDevice(MemoryDevice(GEOM))
    s = Store.format(dev)
    data = blob(9, 70 * KiB)
    w = s.begin_generation("g1", 1)
    w.write_shard("a", [data])
    w.commit()
    (z0, off0, n0, _), (z, off, n, ecrc) = s.generation("g1").shards["a"].extents
    assert (z0, off0, n0, z, off, n) == (3, 0, 48 * KiB, 4, 0, 22 * KiB)
    dev.corrupt(z * GEOM.zone_size + off + 777, 0x04)
    bad = bytearray(data[n0:])
    bad[777] ^= 0x04
    want = f"generation 'g1' shard 'a': extent at zone {z} offset {off} ({n} bytes) fails its crc32c"
    got = []
    with pytest.raises(ChecksumError, match=f"^{re.escape(want)}$") as e:
        for chunk in s.read_shard("g1", "a"):
            got.append(chunk)
    assert got == [data[:n0]]
    err = e.value
    assert (err.generation, err.shard, err.zone, err.offset, err.length) == ("g1", "a", z, off, n)
    assert (err.expected, err.actual) == (ecrc, crc32c.crc32c(bytes(bad)))
    assert s.read_shard_extent("g1", "a", n0 - 1) == (0, data[:n0])
    for pos in (n0, len(data) - 1):
        with pytest.raises(ChecksumError, match=f"^{re.escape(want)}$"):
            s.read_shard_extent("g1", "a", pos)
    dev.corruptions.clear()
    assert s.read_shard_extent("g1", "a", n0) == (n0, data[n0:])
    assert s.read_shard_extent("g1", "a", len(data) - 1) == (n0, data[n0:])
    assert s.read_shard_extent("g1", "a", 0) == (0, data[:n0])
    assert list(s.read_shard("g1", "a")) == [data[:n0], data[n0:]]
    s.close()


def test_reads_of_what_does_not_exist_say_what_is_missing():
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 1)
        w.write_shard("a", [b"x" * 100])
        with pytest.raises(GenerationNotFoundError, match=r"^no committed generation 'g'$"):
            s.read_shard("g", "a")                   # not committed yet
        w.commit()
        with pytest.raises(ShardNotFoundError, match=r"^generation 'g' has no shard 'b'$"):
            s.read_shard("g", "b")
        with pytest.raises(ShardNotFoundError, match=r"^generation 'g' has no shard 'b'$"):
            s.read_shard_extent("g", "b", 0)
        for pos in (-1, 100):
            with pytest.raises(ValueError, match=rf"^generation 'g' shard 'a': byte {pos} is outside its 100 bytes$"):
                s.read_shard_extent("g", "a", pos)
        assert s.read_shard_extent("g", "a", 99) == (0, b"x" * 100)
        stream = s.read_shard("g", "a")
        s.delete("g")
        with pytest.raises(GenerationNotFoundError, match=r"^generation 'g' was deleted while being read$"):
            next(stream)
