"""crc32c helpers: combining the checksums of adjacent pieces (zlib's ``crc32_combine`` for the
Castagnoli polynomial), so a shard's crc32c comes from its extents' without reading the bytes twice."""

from __future__ import annotations

from functools import lru_cache

__all__ = ["crc32c_combine"]

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected


def _times(mat: tuple, vec: int) -> int:
    s = 0
    i = 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _square(mat: tuple) -> tuple:
    return tuple(_times(mat, mat[n]) for n in range(32))


@lru_cache(maxsize=64)
def _shift_operator(nbytes: int) -> tuple:
    """The GF(2) matrix that appends ``nbytes`` zero bytes to a crc register (cached per length)."""
    odd = (_POLY,) + tuple(1 << n for n in range(31))   # one zero bit
    op = tuple(1 << n for n in range(32))               # identity
    sq = _square(_square(_square(odd)))                 # eight zero bits: one byte
    n = nbytes
    while n:
        if n & 1:
            op = tuple(_times(sq, op[i]) for i in range(32))
        n >>= 1
        if n:
            sq = _square(sq)
    return op


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """crc32c of ``A + B`` from ``crc1 = crc32c(A)``, ``crc2 = crc32c(B)`` and ``len2 = len(B)``."""
    if len2 <= 0:
        return crc1
    return _times(_shift_operator(len2), crc1) ^ crc2
