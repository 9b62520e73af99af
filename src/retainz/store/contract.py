"""The store contract: what integrations (DCP, fsspec, the mount, the CLI) and the trace replay driver
may call on a store, a generation being written and a shard being streamed.  :class:`~.store.Store`,
:class:`~.writer.GenerationWriter` and :class:`~.writer.ShardWriter` implement it; anything else on
them (their parts, ``use_allocator``, the writer-host calls) is the store's own business, and
``tests/test_store_contract.py`` checks that callers outside the store keep to this list.

Semantics, errors and units are documented on the implementing methods.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from retainz.hint import Hint
from retainz.placement.base import Allocator, ZoneTable
from retainz.store.types import (
    FsckReport,
    GCReport,
    GenerationInfo,
    GenState,
    ShardInfo,
    SpaceReport,
    StoreMetrics,
)
from retainz.zoned.device import ZonedDevice

__all__ = ["ShardStream", "GenerationWriting", "CheckpointStore"]


@runtime_checkable
class ShardStream(Protocol):
    """One shard being written, push-style (:class:`~.writer.ShardWriter`)."""

    name: str
    written: int

    def write(self, chunk: bytes | bytearray | memoryview) -> None: ...

    def close(self, crcs: Sequence[int] | None = None) -> ShardInfo: ...

    def abort(self) -> None: ...


@runtime_checkable
class GenerationWriting(Protocol):
    """A generation being written (:class:`~.writer.GenerationWriter`)."""

    gen: GenerationInfo
    declared_size: int | None

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> GenState: ...

    def open_shard(self, name: str, *, size: int | None = None) -> ShardStream: ...

    def write_shard(self, name: str, chunks: Iterable[bytes | bytearray | memoryview], *,
                    size: int | None = None) -> ShardInfo: ...

    def write_counted_shard(self, name: str, size: int) -> ShardInfo: ...

    def commit(self) -> GenerationInfo: ...

    def abort(self) -> None: ...


@runtime_checkable
class CheckpointStore(Protocol):
    """An open store (:class:`~.store.Store`)."""

    device: ZonedDevice
    uuid: uuid.UUID
    policy: str
    meta_zones: int
    gc_reserve_zones: int
    metrics: StoreMetrics
    allocator: Allocator
    #: The store's lock (reentrant): a caller that checks and then admits or writes holds it across both.
    lock: threading.RLock

    @property
    def table(self) -> ZoneTable: ...

    @property
    def now(self) -> int: ...

    @property
    def admission_reserve_zones(self) -> int: ...

    def begin_generation(self, gen_id: str, step: int, *, hint: Hint | None = None,
                         declared_size: int | None = None, replace: bool = False) -> GenerationWriting: ...

    def generations(self) -> list[GenerationInfo]: ...

    def generation(self, gen_id: str) -> GenerationInfo: ...

    def unknown(self) -> list[GenerationInfo]: ...

    def restore(self, gen_id: str) -> GenerationInfo: ...

    def delete(self, gen_id: str, *, step: int | None = None) -> None: ...

    def update_hint(self, gen_id: str, hint: Hint, *, step: int | None = None) -> None: ...

    def advance(self, step: int) -> None: ...

    def read_shard(self, gen_id: str, name: str) -> Iterator[bytes]: ...

    def read_shard_extent(self, gen_id: str, name: str, pos: int) -> tuple[int, bytes]: ...

    def admit(self, w: GenerationWriting, nbytes: int) -> None: ...

    def gc(self, *, force: bool = False, progress=None) -> GCReport: ...

    def fsck(self, *, progress=None) -> FsckReport: ...

    def df(self) -> SpaceReport: ...

    def stop_state(self) -> dict: ...

    def close(self) -> None: ...
