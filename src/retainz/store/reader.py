"""The read path: streaming (:meth:`Reader.read_shard`) and random access
(:meth:`Reader.read_shard_extent`) to committed shards, every extent verified against its crc32c."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from itertools import accumulate

import crc32c

from retainz.errors import ChecksumError, GenerationNotFoundError, ShardNotFoundError
from retainz.store.catalog import Catalog
from retainz.store.types import GenerationInfo, GenState, ShardInfo
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import round_up

__all__ = ["Reader", "unknown_message"]


def unknown_message(gen: GenerationInfo, dev: str = "DEV") -> str:
    """The refusal of a read or lookup of an unknown generation (``GenState.UNKNOWN``) on device
    ``dev``, naming the commands that inspect, restore and discard it."""
    return (f"generation {gen.id!r} (step {gen.step}) is unknown since a repair ({gen.unknown_reason}): it is "
            f"not read; inspect it with `retainz fsck {dev}`, restore it with `retainz fsck --restore {gen.id} "
            f"{dev}`, or discard it with `retainz rm {dev} {gen.id}`")


class Reader:
    """Reads committed shards of ``catalog`` from ``device`` under the store's ``lock``.

    Finding the extent that holds a byte is a binary search over the shard's extent start offsets,
    computed once per extent list (GC replaces a shard's list when it moves it), so streaming a
    shard of n extents is O(n log n), not O(n^2).
    """

    def __init__(self, device: ZonedDevice, catalog: Catalog, lock: threading.RLock):
        self.device = device
        self.catalog = catalog
        self.lock = lock
        g = device.geometry
        self._bs, self._zsize = g.block_size, g.zone_size
        self._starts: dict[tuple[str, str], tuple[tuple, list[int]]] = {}

    def shard(self, gen_id: str, name: str, allow_unknown: bool = False) -> ShardInfo:
        """The committed shard (of an unknown generation too with ``allow_unknown``).

        Raises:
            GenerationNotFoundError, ShardNotFoundError.
        """
        gen = self.catalog.gens.get(gen_id)
        if gen is None:
            raise GenerationNotFoundError(f"no committed generation {gen_id!r}")
        if gen.state is GenState.UNKNOWN and not allow_unknown:
            raise GenerationNotFoundError(unknown_message(gen, self.device.name))
        shard = gen.shards.get(name)
        if shard is None:
            raise ShardNotFoundError(f"generation {gen_id!r} has no shard {name!r}")
        return shard

    def read_shard(self, gen_id: str, name: str, allow_unknown: bool = False) -> Iterator[bytes]:
        """Stream a committed shard's bytes, extent by extent, each verified before it is yielded.

        GC may move the shard while it is being read; the reader follows the move.

        Raises:
            GenerationNotFoundError, ShardNotFoundError: no such committed generation or shard
                (also raised mid-stream if the generation is deleted while being read).
            ChecksumError: an extent's or the whole shard's crc32c does not match (names generation,
                shard, zone and offset).
        """
        with self.lock:
            shard = self.shard(gen_id, name, allow_unknown)
        return self._stream(gen_id, name, shard)

    def read_shard_extent(self, gen_id: str, name: str, pos: int) -> tuple[int, bytes]:
        """Random access: the verified extent holding data byte ``pos`` of a committed shard.

        Args:
            gen_id, name: the shard.
            pos: a data byte offset, ``0 <= pos < size``.

        Returns:
            ``(first data byte of the extent, its bytes)``; extents are at most 1 MiB of payload.

        Raises:
            GenerationNotFoundError, ShardNotFoundError; ValueError for ``pos`` outside the shard;
            ChecksumError: the extent fails its crc32c.
        """
        with self.lock:
            shard = self.shard(gen_id, name)
            if not 0 <= pos < shard.size:
                raise ValueError(f"generation {gen_id!r} shard {name!r}: byte {pos} is outside its "
                                 f"{shard.size} bytes")
            return self._extent(gen_id, name, shard, pos)

    def _index(self, gen_id: str, name: str, extents: tuple) -> list[int]:
        """Data offset where each extent starts (cached per extent list)."""
        key = (gen_id, name)
        hit = self._starts.get(key)
        if hit is not None and hit[0] is extents:
            return hit[1]
        starts = [0, *accumulate(e[2] for e in extents)][:-1] if extents else []
        if len(self._starts) >= 256:
            self._starts.clear()
        self._starts[key] = (extents, starts)
        return starts

    def _extent(self, gen_id: str, name: str, shard: ShardInfo, pos: int) -> tuple[int, bytes]:
        """Read and verify the extent holding data byte ``pos`` (under the lock; GC may have split
        or moved extents since the caller looked).  Returns (its first data byte, data)."""
        gen = self.catalog.gens.get(gen_id)
        if gen is None or gen.shards.get(name) is not shard:
            raise GenerationNotFoundError(f"generation {gen_id!r} was deleted while being read")
        extents = shard.extents
        starts = self._index(gen_id, name, extents)
        i = bisect.bisect_right(starts, pos) - 1
        z, off, length, ecrc = extents[i]
        data = self.device.read(z * self._zsize + off, round_up(length, self._bs))[:length]
        if ecrc is not None and crc32c.crc32c(data) != ecrc:
            raise ChecksumError(f"generation {gen_id!r} shard {name!r}: extent at zone {z} offset {off} "
                                f"({length} bytes) fails its crc32c", generation=gen_id, shard=name,
                                zone=z, offset=off, length=length, expected=ecrc,
                                actual=crc32c.crc32c(data))
        return starts[i], data

    def _stream(self, gen_id: str, name: str, shard: ShardInfo) -> Iterator[bytes]:
        done = 0
        crc = 0
        while done < shard.size:
            with self.lock:
                at, data = self._extent(gen_id, name, shard, done)
            data = data[done - at:]  # GC may have split an extent at a different boundary
            crc = crc32c.crc32c(data, crc)
            done += len(data)
            if done >= shard.size and shard.crc is not None and crc != shard.crc:
                raise ChecksumError(f"generation {gen_id!r} shard {name!r}: whole-shard crc32c mismatch",
                                    generation=gen_id, shard=name, expected=shard.crc, actual=crc)
            yield data
