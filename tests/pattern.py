"""Deterministic data for tests at real sizes: every byte of a stream is a function of the stream's
seed and the byte's offset, so a 16 GiB shard is written, and later verified byte by byte, without a
copy of it anywhere.

Byte ``i`` of stream ``seed`` is byte ``i % 8`` (little endian) of the 64-bit word ``mix(seed, i // 8)``
(a splitmix64-style mix of the word index and the seed), so streams of different seeds differ
everywhere, and a block read from the wrong offset or the wrong stream does not match.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import numpy as np

#: Bytes produced or compared at a time.
CHUNK = 8 << 20

_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def seed_of(*parts: object) -> int:
    """A 64-bit seed from names (``seed_of("g3", "shard-0")``)."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little")


def block(seed: int, offset: int, length: int) -> bytes:
    """Bytes ``[offset, offset + length)`` of stream ``seed``."""
    if length <= 0:
        return b""
    first, last = offset // 8, (offset + length + 7) // 8
    with np.errstate(over="ignore"):
        z = np.arange(first, last, dtype=np.uint64) * _GOLD + np.uint64(seed)
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z ^= z >> np.uint64(31)
    raw = z.tobytes()
    start = offset - first * 8
    return raw[start:start + length]


def chunks(seed: int, size: int, chunk: int = CHUNK) -> Iterator[bytes]:
    """Stream ``seed``'s first ``size`` bytes in pieces of ``chunk`` bytes."""
    for off in range(0, size, chunk):
        yield block(seed, off, min(chunk, size - off))


def write_file(path: str | os.PathLike, seed: int, size: int) -> None:
    """Make ``path`` hold stream ``seed``'s first ``size`` bytes (rewritten in place, then truncated)."""
    with open(path, "r+b" if os.path.exists(path) else "wb") as f:
        for piece in chunks(seed, size):
            f.write(piece)
        f.truncate(size)


class Checker:
    """Compares a stream read back in pieces of any size against stream ``seed`` of ``size`` bytes.

    ``feed`` each piece in order, then ``done``; a mismatch raises :class:`AssertionError` naming the
    first differing byte offset."""

    def __init__(self, seed: int, size: int, what: str = "stream"):
        self.seed, self.size, self.what, self.pos = seed, size, what, 0

    def feed(self, piece) -> None:
        piece = memoryview(piece).cast("B")
        n = len(piece)
        if self.pos + n > self.size:
            raise AssertionError(f"{self.what}: more than {self.size:,} bytes read back")
        want = block(self.seed, self.pos, n)
        if piece != want:
            a = np.frombuffer(piece, dtype=np.uint8)
            b = np.frombuffer(want, dtype=np.uint8)
            bad = int(np.flatnonzero(a != b)[0])
            raise AssertionError(f"{self.what}: byte {self.pos + bad:,} differs (of {self.size:,})")
        self.pos += n

    def done(self) -> None:
        if self.pos != self.size:
            raise AssertionError(f"{self.what}: {self.pos:,} bytes read back, {self.size:,} written")


def verify_file(path: str | os.PathLike, seed: int, size: int, what: str | None = None) -> None:
    """``path`` holds exactly stream ``seed``'s first ``size`` bytes."""
    check = Checker(seed, size, what or str(path))
    with open(path, "rb", buffering=0) as f:
        while piece := f.read(CHUNK):
            check.feed(piece)
    check.done()
