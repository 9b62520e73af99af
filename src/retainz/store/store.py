"""The :class:`Store` front object and :class:`GenerationWriter` (skeleton: contract first)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from retainz.placement.base import Allocator, Hint, ZoneTable
from retainz.store.types import FsckReport, GCReport, GenerationInfo, ShardInfo, SpaceReport, StoreMetrics
from retainz.zoned.device import ZonedDevice

__all__ = ["Store", "GenerationWriter"]


class GenerationWriter:
    """Writes one generation: ``write_shard`` any number of times, then ``commit()`` or ``abort()``.

    Several writers may be open at once (async saves overlap); every call takes the store's lock.
    """

    def write_shard(self, name: str, chunks: Iterable[bytes | bytearray | memoryview] | None = None, *,
                    size: int | None = None) -> ShardInfo:
        """Stream a shard into the store (never holds the whole shard in memory).

        Args:
            name: shard name (same rules as generation ids).
            chunks: the shard's bytes, in order.  ``None`` with ``size=`` on a payload-less device
                writes a counted extent with no checksum (trace replay).
            size: the shard's length in bytes, if known; the chunks must add up to exactly it.

        Raises:
            InvalidIdError, ShardSizeError, NoSpaceError, ValueError (duplicate shard, size without
            chunks on a payload device, writer already committed or aborted).
        """
        raise NotImplementedError

    def commit(self) -> GenerationInfo:
        """Flush the data, then append and flush the commit record (the commit point)."""
        raise NotImplementedError

    def abort(self) -> None:
        """Drop the generation; its bytes become dead and all-dead zones are reset."""
        raise NotImplementedError


class Store:
    """A checkpoint store on a zoned device (see the package docstring)."""

    @classmethod
    def format(cls, device: ZonedDevice, *, meta_zones: int = 3, policy: str = "greedy",
               gc_reserve_zones: int = 2, force: bool = False, verify_summaries: bool = False) -> Store:
        """Write a fresh store on ``device`` and open it."""
        raise NotImplementedError

    @classmethod
    def open(cls, device: ZonedDevice, *, policy: str | None = None, verify_summaries: bool = False) -> Store:
        """Open (and recover) the store on ``device``."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def begin_generation(self, gen_id: str, step: int, *, hint: Hint | None = None,
                         declared_size: int | None = None) -> GenerationWriter:
        raise NotImplementedError

    def generations(self) -> list[GenerationInfo]:
        raise NotImplementedError

    def generation(self, gen_id: str) -> GenerationInfo:
        raise NotImplementedError

    def read_shard(self, gen_id: str, name: str) -> Iterator[bytes]:
        raise NotImplementedError

    def delete(self, gen_id: str, *, step: int | None = None) -> None:
        raise NotImplementedError

    def advance(self, step: int) -> None:
        raise NotImplementedError

    def gc(self, *, force: bool = False) -> GCReport:
        raise NotImplementedError

    def fsck(self) -> FsckReport:
        raise NotImplementedError

    def df(self) -> SpaceReport:
        raise NotImplementedError

    metrics: StoreMetrics
    table: ZoneTable
    allocator: Allocator

    def recompute_table(self) -> ZoneTable:
        raise NotImplementedError
