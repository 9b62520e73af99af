"""The read path: streaming (:meth:`ReadMixin.read_shard`) and random access
(:meth:`ReadMixin.read_shard_extent`) to committed shards, every extent verified against its crc32c."""

from __future__ import annotations

from collections.abc import Iterator

import crc32c

from retainz.errors import ChecksumError, GenerationNotFoundError, ShardNotFoundError
from retainz.store.format import round_up

__all__ = ["ReadMixin"]


class ReadMixin:
    """Read-path methods of :class:`~retainz.store.store.Store` (state lives on the store)."""

    def read_shard(self, gen_id: str, name: str) -> Iterator[bytes]:
        """Stream a committed shard's bytes, extent by extent, each verified before it is yielded.

        GC may move the shard while it is being read; the reader follows the move.

        Raises:
            GenerationNotFoundError, ShardNotFoundError: no such committed generation or shard
                (also raised mid-stream if the generation is deleted while being read).
            ChecksumError: an extent's or the whole shard's crc32c does not match (names generation,
                shard, zone and offset).
            NoPayloadError: a counted (payload-less) shard.
        """
        shard = self._shard(gen_id, name)
        return self._read_iter(gen_id, name, shard)

    def _shard(self, gen_id: str, name: str):
        gen = self.generation(gen_id)
        shard = gen.shards.get(name)
        if shard is None:
            raise ShardNotFoundError(f"generation {gen_id!r} has no shard {name!r}")
        return shard

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
        with self._lock:
            shard = self._shard(gen_id, name)
            if not 0 <= pos < shard.size:
                raise ValueError(f"generation {gen_id!r} shard {name!r}: byte {pos} is outside its "
                                 f"{shard.size} bytes")
            start, data, _ = self._read_extent(gen_id, name, shard, pos)
            return start, data

    def _read_extent(self, gen_id: str, name: str, shard, pos: int) -> tuple[int, bytes, int | None]:
        """Read and verify the extent holding data byte ``pos`` (under the lock; GC may have split
        or moved extents since the caller looked).  Returns (its first data byte, data, its crc)."""
        gen = self.catalog.gens.get(gen_id)
        if gen is None or gen.shards.get(name) is not shard:
            raise GenerationNotFoundError(f"generation {gen_id!r} was deleted while being read")
        at = 0
        for e in shard.extents:
            if at + e[2] > pos:
                break
            at += e[2]
        z, off, length, ecrc = e
        data = self.device.read(z * self._zsize + off, round_up(length, self._bs))[:length]
        if ecrc is not None and crc32c.crc32c(data) != ecrc:
            raise ChecksumError(f"generation {gen_id!r} shard {name!r}: extent at zone {z} offset {off} "
                                f"({length} bytes) fails its crc32c", generation=gen_id, shard=name,
                                zone=z, offset=off, length=length, expected=ecrc,
                                actual=crc32c.crc32c(data))
        return at, data, ecrc

    def _read_iter(self, gen_id: str, name: str, shard) -> Iterator[bytes]:
        done = 0
        crc = 0
        while done < shard.size:
            with self._lock:
                at, data, _ = self._read_extent(gen_id, name, shard, done)
            data = data[done - at:]  # GC may have split an extent at a different boundary
            crc = crc32c.crc32c(data, crc)
            done += len(data)
            if done >= shard.size and shard.crc is not None and crc != shard.crc:
                raise ChecksumError(f"generation {gen_id!r} shard {name!r}: whole-shard crc32c mismatch",
                                    generation=gen_id, shard=name, expected=shard.crc, actual=crc)
            yield data
