"""Finding the journal chain at mount (``store/journal.scan``): the newest complete chain wins, a
crashed rollover falls back (and says how often), and every inconsistency among the meta zones'
superblocks is refused with a message naming the zones."""

from __future__ import annotations

import dataclasses

import pytest

from retainz.errors import CorruptJournalError, ForeignDeviceError
from retainz.store import Store
from retainz.store.format import Superblock
from retainz.store.journal import frame, parse_zone, scan
from retainz.zoned import Geometry, MemoryDevice, ZoneCond

KiB = 1024
GEOM = Geometry(nr_zones=16, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)


def store(n: int = 3) -> MemoryDevice:
    dev = MemoryDevice(GEOM)
    with Store.format(dev, meta_zones=4) as s:
        for i in range(n):
            w = s.begin_generation(f"g{i}", i)
            w.write_shard("s", [bytes([i]) * 5000])
            w.commit()
    return dev


def plant(dev: MemoryDevice, zone: int, sb: Superblock) -> None:
    """Write superblock ``sb`` (and nothing else) at the start of the empty meta zone ``zone``."""
    assert dev.zone(zone).cond is ZoneCond.EMPTY
    dev.write(zone * GEOM.zone_size, sb.encode())
    dev.flush()


def current(dev: MemoryDevice) -> tuple[Superblock, int, int]:
    """The chain's superblock, its first zone and the last empty meta zone (past an empty one:
    scan reads every meta zone, not up to the first empty one).  Format version 3 writes a spare
    superblock into every free meta zone: they are reset here, as version 2 left them empty."""
    found = scan(dev)
    for z in range(found.sb.meta_zones):
        if z not in found.chain and dev.zone(z).cond is not ZoneCond.EMPTY:
            dev.reset_zone(z)
    empty = max(z for z in range(found.sb.meta_zones) if dev.zone(z).cond is ZoneCond.EMPTY)
    assert any(dev.zone(z).cond is ZoneCond.EMPTY for z in range(empty))
    return found.sb, found.chain[0], empty


def test_a_healthy_store_has_one_chain_and_no_fallback():
    dev = store()
    found = scan(dev)
    assert (found.fallbacks, found.torn, found.stale, len(found.chain)) == (0, 0, [], 1)
    assert found.sb.sequence >= 1


def test_an_incomplete_newer_chain_is_skipped_and_counted():
    """A rollover cut after its superblock but before its snapshot's end: the newer chains are
    incomplete, mount falls back to the newest complete one (the older chain) and counts each."""
    dev = store()
    sb, first, empty = current(dev)
    plant(dev, empty, dataclasses.replace(sb, sequence=sb.sequence + 1, part=0))
    found = scan(dev)
    assert (found.chain, found.fallbacks, found.sb.sequence) == ([first], 1, sb.sequence)
    assert empty in found.stale                          # reset at mount
    other = next(z for z in range(sb.meta_zones) if dev.zone(z).cond is ZoneCond.EMPTY)
    plant(dev, other, dataclasses.replace(sb, sequence=sb.sequence + 2, part=0))
    found = scan(dev)
    assert (found.chain, found.fallbacks) == ([first], 2) and sorted(found.stale) == sorted([empty, other])
    with Store.open(dev) as s:                           # and the store opens from the old chain
        assert [g.id for g in s.generations()] == ["g0", "g1", "g2"]


def test_a_chain_with_a_missing_part_is_refused():
    """Beside an older complete chain, a newer one missing a part is a roll cut before its flush
    (zones keep their writes independently, so a later part can survive an earlier one): mount falls
    back.  Alone, it is refused."""
    dev = store()
    sb, first, empty = current(dev)
    plant(dev, empty, dataclasses.replace(sb, sequence=sb.sequence + 1, part=1))
    found = scan(dev)
    assert (found.chain, found.fallbacks) == ([first], 1) and empty in found.stale
    dev.reset_zone(first)
    with pytest.raises(CorruptJournalError) as e:
        scan(dev)
    assert str(e.value) == f"journal sequence {sb.sequence + 1} has parts [1]: a part is missing"


def test_two_zones_claiming_one_part_are_refused():
    dev = store()
    sb, first, empty = current(dev)
    plant(dev, empty, sb)
    with pytest.raises(CorruptJournalError) as e:
        scan(dev)
    a, b = sorted([first, empty])
    assert str(e.value) == f"meta zones {a} and {b} both claim part 0 of journal sequence {sb.sequence}"


def test_superblocks_of_two_stores_are_refused_naming_each_zone():
    dev, other = store(), store(1)
    sb, first, empty = current(dev)
    theirs = scan(other).sb
    assert theirs.uuid != sb.uuid
    plant(dev, empty, dataclasses.replace(theirs, meta_zones=sb.meta_zones))
    with pytest.raises(CorruptJournalError) as e:
        scan(dev)
    listed = sorted([(first, sb.uuid), (empty, theirs.uuid)])
    assert str(e.value) == ("meta zones hold superblocks of different stores: "
                            + ", ".join(f"zone {z}: {u}" for z, u in listed))


def test_a_bad_superblock_beside_a_good_one_and_alone():
    dev = store()
    sb, first, empty = current(dev)
    block = bytearray(sb.encode())
    block[40] ^= 0x10                                     # the magic survives, the checksum fails
    dev.write(empty * GEOM.zone_size, bytes(block))
    found = scan(dev)            # a lone damaged block (a spare's) beside the chain: noted, reset at mount
    assert found.chain == [first] and empty in found.stale and found.damaged
    assert f"meta zone {empty}: its one superblock block (a spare) is damaged; the chain's copies were used" \
        in found.notes
    dev._data[first][40] ^= 0x10                          # now no good copy is left (both of the chain's)
    dev._data[first][GEOM.block_size + 40] ^= 0x10
    with pytest.raises(CorruptJournalError) as e:
        scan(dev)
    assert str(e.value) == (f"meta zone(s) {sorted([first, empty])}: the RetainZ superblock fails its "
                            "checksum and no other copy exists: corrupt store")


def test_a_device_without_any_superblock_is_foreign():
    dev = MemoryDevice(GEOM)
    dev.write(0, b"\x07" * 4096)
    with pytest.raises(ForeignDeviceError) as e:
        scan(dev)
    assert str(e.value) == (f"{dev.name} holds no RetainZ store (no superblock in its first zones); "
                            f"format it with `retainz mkfs {dev.name}`")


def test_no_complete_chain_is_corruption():
    dev = MemoryDevice(GEOM)
    sb = scan(store()).sb
    plant(dev, 1, sb)                                     # a superblock and no snapshot after it
    with pytest.raises(CorruptJournalError) as e:
        scan(dev)
    assert str(e.value) == "no journal chain with a complete snapshot: corrupt store"


BS = 4096


def zone_image(*payloads: bytes) -> bytes:
    """A meta zone's bytes: a superblock block (parse_zone skips it) then the framed records."""
    return bytes(BS) + b"".join(frame(p, BS) for p in payloads)


def zeroed(img: bytes, block: int) -> bytes:
    out = bytearray(img)
    out[block * BS:(block + 1) * BS] = bytes(BS)
    return bytes(out)


def poked(img: bytes, at: int, value: int) -> bytes:
    out = bytearray(img)
    out[at] = value
    return bytes(out)


CORRUPT = {
    "zeroed block below the write pointer": (
        zeroed(zone_image(b"a", b"b"), 2), False, False,
        "meta zone 5: a zeroed block at byte 8192, below the write pointer (12288): corrupt journal"),
    "zeroed block hiding a record": (
        zeroed(zone_image(b"a", b"b", b"c"), 2), True, True,
        "meta zone 5: a zeroed block at byte 8192, below the write pointer (16384), hides the valid record at "
        "byte 12288: corrupt journal"),
    "a record past the end of a zone that is not the tail": (
        zone_image(b"a", b"y" * 9000)[:-BS], False, True,
        "meta zone 5: record at byte 8192 claims 9000 bytes, past the end of the written area (16384): "
        "corrupt journal"),
    "a record past the end with a valid one after it": (
        poked(zone_image(b"a", b"b", b"c"), 2 * BS + 6, 1), True, True,
        "meta zone 5: record at byte 8192 claims 65537 bytes, past the end of the written area (16384), and a "
        "valid record follows at byte 12288: corrupt journal"),
    "a checksum failure": (
        poked(zone_image(b"a", b"hello world", b"c"), 2 * BS + 10, ord("h") ^ 1), True, True,
        "meta zone 5: record at byte 8192 (11 bytes) fails its checksum: corrupt journal"),
    # a durable record (its last block holds payload bytes, here 'X's) with a bad checksum in the
    # finished tail zone: corruption, not a torn tail, whatever the payload bytes are
    "a checksum failure in a durable record of bytes 'X'": (
        poked(zone_image(b"a", b"X" * 6000), BS + BS + 20, ord("Y")), True, True,
        "meta zone 5: record at byte 8192 (6000 bytes) fails its checksum: corrupt journal"),
}


@pytest.mark.parametrize("what", CORRUPT)
def test_each_kind_of_journal_corruption_is_refused_with_its_exact_message(what):
    img, tail, full, message = CORRUPT[what]
    with pytest.raises(CorruptJournalError) as e:
        parse_zone(img, BS, len(img), BS, zone=5, tail=tail, full=full)
    assert str(e.value) == message


def test_a_zone_with_no_records_ends_where_it_starts():
    img = zone_image() + bytes(2 * BS)
    out = parse_zone(img, BS, len(img), BS, zone=0, tail=True)
    assert (out.payloads, out.end, out.torn) == ([], BS, 0)


def test_a_newer_chain_without_its_snapshot_end_or_head_is_incomplete():
    """A rollover cut inside its snapshot leaves a head without its end (or, torn otherwise, an end
    without its head): the chain is incomplete and mount falls back to the older one."""
    for payloads in ([b'snap {"now":9,"commit_seq":99,"metrics":{},"o":1}'], [b'send {"n":0}']):
        dev = store()
        sb, first, empty = current(dev)
        nsb = dataclasses.replace(sb, sequence=sb.sequence + 1, part=0)
        dev.write(empty * GEOM.zone_size, nsb.encode() + b"".join(frame(p, GEOM.block_size) for p in payloads))
        found = scan(dev)
        assert (found.chain, found.fallbacks, found.sb.sequence) == ([first], 1, sb.sequence), payloads


def test_a_superblock_past_the_meta_zones_is_never_read():
    """Only the first zones can be meta zones: a superblock image inside a data zone (a stored file
    that holds one) does not make a device a RetainZ store."""
    g = Geometry(nr_zones=100, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                 max_active=4)
    dev = MemoryDevice(g)
    sb = dataclasses.replace(scan(store()).sb, geometry=g)
    dev.write(80 * g.zone_size, sb.encode())
    with pytest.raises(ForeignDeviceError):
        scan(dev)


def test_a_superblock_of_an_unknown_version_is_refused_naming_the_zone():
    from retainz.errors import UnsupportedFormatError

    dev = store()
    sb, first, empty = current(dev)
    plant(dev, empty, dataclasses.replace(sb, version=99, sequence=sb.sequence + 1))
    with pytest.raises(UnsupportedFormatError) as e:
        scan(dev)
    assert str(e.value).startswith(f"{dev.name} meta zone {empty}: ")
