"""Mount reads a meta zone a window at a time (:class:`ZoneWindow`): the records, torn tails and
corruption it finds are exactly those of the zone read whole, for windows smaller than a record,
of a block, and of the zone; and no read is larger than the window or the record being read."""

from __future__ import annotations

import random

import pytest

from retainz.errors import CorruptJournalError
from retainz.store.journal import ZoneWindow, frame, parse_zone

BS = 4096


def zone_image(rnd: random.Random, n: int) -> tuple[bytes, list[bytes]]:
    """A superblock block then ``n`` records of 0 to ~5 blocks each."""
    payloads = [bytes([i % 251]) * rnd.choice((0, 1, 100, BS - 8, BS, 3 * BS + 17, 5 * BS)) for i in range(n)]
    return bytes(BS) + b"".join(frame(p, BS) for p in payloads), payloads


def windowed(img: bytes, window: int, reads: list[int] | None = None) -> ZoneWindow:
    def read(pos: int, n: int) -> bytes:
        if reads is not None:
            reads.append(n)
        assert 0 <= pos and pos + n <= len(img)
        return img[pos:pos + n]
    return ZoneWindow(read, len(img), window)


def outcome(buf, end: int, **kw):
    try:
        p = parse_zone(buf, BS, end, BS, zone=1, **kw)
    except CorruptJournalError as e:
        return "error", str(e)
    return p.payloads, p.end, p.torn


@pytest.mark.parametrize("window", [BS, 2 * BS, 3 * BS + BS // 2, 64 * BS, 1 << 30])
def test_windowed_parse_equals_the_whole_zone_parse(window):
    rnd = random.Random(window)
    for _ in range(30):
        img, payloads = zone_image(rnd, rnd.randint(1, 25))
        reads: list[int] = []
        got = outcome(windowed(img, window, reads), len(img), tail=True)
        assert got == outcome(img, len(img), tail=True) == (payloads, len(img), 0)
        biggest = max(len(frame(p, BS)) for p in payloads)
        assert max(reads) <= max(window, biggest)      # never the whole zone unless it fits a window


@pytest.mark.parametrize("window", [BS, 3 * BS, 1 << 30])
def test_every_damage_is_judged_the_same_read_whole_or_by_window(window):
    """A torn tail at every block boundary, a flipped bit in every block and a zeroed block
    anywhere, in a zone that is the tail or not, Full or not: the same outcome both ways."""
    img, _ = zone_image(random.Random(7), 6)
    damaged = []
    for cut in range(2 * BS, len(img), BS):
        damaged.append((img[:cut], cut))                                  # torn: the rest never written
        damaged.append((img[:cut] + bytes(len(img) - cut), len(img)))     # finished after the cut
    for blk in range(1, len(img) // BS):
        flipped = bytearray(img)
        flipped[blk * BS + 12] ^= 0x10
        damaged.append((bytes(flipped), len(img)))
        zeroed = bytearray(img)
        zeroed[blk * BS:(blk + 1) * BS] = bytes(BS)
        damaged.append((bytes(zeroed), len(img)))
    kinds = set()
    for buf, end in damaged:
        for tail in (True, False):
            for full in (True, False):
                whole = outcome(buf, end, tail=tail, full=full)
                assert outcome(windowed(buf[:end], window), end, tail=tail, full=full) == whole
                kinds.add(whole[0] if whole[0] == "error" else "torn" if whole[2] else "clean")
    assert kinds == {"error", "torn", "clean"}        # the damage reached every outcome


def test_a_device_read_that_comes_back_short_is_refused_not_looped_on():
    img, _ = zone_image(random.Random(3), 4)
    win = ZoneWindow(lambda pos, n: img[pos:pos + n][:BS // 2], len(img), BS)
    with pytest.raises(CorruptJournalError, match="returned 2048"):
        parse_zone(win, BS, len(img), BS, zone=0, tail=True)
