"""``crc32c_combine`` (store/crc.py): the crc32c of two adjacent pieces from theirs, for every
length (the write path combines a shard's crc from its 1 MiB extents' without reading them twice)."""

from __future__ import annotations

import random

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from retainz.store.crc import crc32c_combine


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_combining_two_pieces_gives_the_crc_of_both(a, b):
    assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 255, 256, 4095, 4096, 65537, 1 << 20, (1 << 20) + 1])
def test_combining_at_every_power_of_two_and_its_neighbours(n):
    rnd = random.Random(n)
    a, b = rnd.randbytes(rnd.randrange(1, 100)), rnd.randbytes(n)
    assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), n) == crc32c.crc32c(a + b)
    # the crc of an empty first piece is 0: combining onto it gives the second piece's crc
    assert crc32c_combine(0, crc32c.crc32c(b), n) == crc32c.crc32c(b)


def test_an_empty_second_piece_leaves_the_crc_unchanged():
    c = crc32c.crc32c(b"abc")
    assert crc32c_combine(c, 0, 0) == c and crc32c_combine(c, 12345, -1) == c
