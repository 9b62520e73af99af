"""The store contract: what the faces (DCP, fsspec, the mount, the CLI, the jobs layer) may call on a
store, a generation being written and a shard being streamed.  Two implementations keep it: the
in-process :class:`~.store.Store` (with :class:`~.writer.GenerationWriter`, :class:`~.writer.ShardWriter`)
and a node service's client :class:`retainz.node.client.NodeStore` (with ``NodeGenerationWriter``,
``NodeShardStream``), so a face never asks which one it holds.  ``tests/store/test_store_contract.py`` runs
one suite on both and checks that callers outside the store keep to these lists.

:class:`PlacementView` is not part of the faces' contract: the zone table, the allocator and the
admission reserve live where the store runs (a node service keeps them to itself), and only the
trace replay driver and the experiments, which run the store in process, read them.

Semantics, errors and units are documented on the implementing methods.  What the contract defines
from its own calls, one implementation for both stores, is here too: :func:`write_shard` (a shard
streamed from chunks) and :func:`exit_writing` (a generation writer's context-manager exit).
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

__all__ = ["ShardStream", "GenerationWriting", "CheckpointStore", "PlacementView", "write_shard", "exit_writing"]


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
    """A generation being written (:class:`~.writer.GenerationWriter`, ``NodeGenerationWriter``)."""

    gen: GenerationInfo
    declared_size: int | None
    #: Other processes write this generation too (begun with a ``join`` token on a served device):
    #: one of them commits, the others :meth:`leave`.  Always false on an in-process store.
    joined: bool

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> GenState: ...

    def open_shard(self, name: str, *, size: int | None = None) -> ShardStream: ...

    def write_shard(self, name: str, chunks: Iterable[bytes | bytearray | memoryview], *,
                    size: int | None = None) -> ShardInfo: ...

    def write_counted_shard(self, name: str, size: int) -> ShardInfo: ...

    def commit(self) -> GenerationInfo: ...

    def rename(self, gen_id: str) -> None:
        """Give the uncommitted generation another id (a file renamed while written commits under its
        final name).  Raises GenerationExistsError (also for a joined generation on a served device)."""

    def leave(self) -> None:
        """Let go of a joined generation (the last process to leave without a commit aborts it; an
        in-process writer is its only holder, so it aborts)."""

    def abort(self) -> None: ...


@runtime_checkable
class CheckpointStore(Protocol):
    """An open store, in process (:class:`~.store.Store`) or served (``NodeStore``).

    ``device`` gives the geometry and name (a served device's is a ``ServedDevice``: no zone
    operations through it).  ``lock`` is reentrant: a caller that checks and then admits holds it
    across both (in process it is the store's own lock; a served store's client holds its own and the
    service takes the store's for each request).  ``readonly``: opened read-only (changes raise
    ReadOnlyStoreError).
    """

    device: ZonedDevice
    uuid: uuid.UUID
    policy: str
    #: The store format version of the journal in use (:mod:`retainz.store.format`, "Format versions"):
    #: older than ``FORMAT_VERSION`` only on a store opened read-only (a read-write open migrates or
    #: refuses it), so a served store's is the current one (its service's ``hello`` says it).
    format_version: int
    meta_zones: int
    gc_reserve_zones: int
    metrics: StoreMetrics
    readonly: bool
    lock: threading.RLock

    @property
    def now(self) -> int: ...

    def begin_generation(self, gen_id: str, step: int, *, hint: Hint | None = None,
                         declared_size: int | None = None, replace: bool = False,
                         join: str | None = None) -> GenerationWriting:
        """Admit a generation and return its writer.  ``join``: a token the processes sharing a served
        device give to write one generation together (the first begins it, the others join it); an
        in-process store's writers are its one process's own."""

    def generations(self) -> list[GenerationInfo]: ...

    def generation(self, gen_id: str) -> GenerationInfo: ...

    def unknown(self) -> list[GenerationInfo]: ...

    def restore(self, gen_id: str) -> GenerationInfo: ...

    def delete(self, gen_id: str, *, step: int | None = None) -> None: ...

    def update_hint(self, gen_id: str, hint: Hint, *, step: int | None = None) -> None: ...

    def advance(self, step: int) -> None: ...

    def read_shard(self, gen_id: str, name: str) -> Iterator[bytes]: ...

    def read_shard_extent(self, gen_id: str, name: str, pos: int) -> tuple[int, bytes]: ...

    def read_shard_into(self, gen_id: str, name: str, pos: int, out) -> int: ...

    def admit(self, w: GenerationWriting, nbytes: int) -> None: ...

    def gc(self, *, force: bool = False, progress=None) -> GCReport: ...

    def fsck(self, *, progress=None) -> FsckReport: ...

    def df(self) -> SpaceReport: ...

    def close(self) -> None: ...


@runtime_checkable
class PlacementView(CheckpointStore, Protocol):
    """An in-process store's placement state (:class:`~.store.Store` only): the trace replay driver and
    the experiments read it; the faces do not (a served store keeps it in its service)."""

    allocator: Allocator

    @property
    def table(self) -> ZoneTable: ...

    @property
    def admission_reserve_zones(self) -> int: ...

    def stop_state(self) -> dict: ...


def write_shard(writer: GenerationWriting, name: str, chunks: Iterable[bytes | bytearray | memoryview], *,
                size: int | None = None) -> ShardInfo:
    """Stream one shard through ``writer`` from an iterable of bytes-like chunks: ``open_shard``, every
    chunk to :meth:`ShardStream.write`, then ``close``; its :class:`ShardInfo`.  On any error the shard
    is aborted (its bytes become dead, the writer stays usable) and the error raised again.  Both
    implementations' ``write_shard``.

    Raises:
        ValueError: ``chunks`` is ``None`` (a counted shard, sizes without bytes, is
            ``write_counted_shard``); the errors of ``open_shard``, ``write`` and ``close``.
    """
    if chunks is None:
        raise ValueError(f"shard {name!r}: no chunks given (a counted shard on a payload-less device "
                         "is write_counted_shard)")
    s = writer.open_shard(name, size=size)
    try:
        for chunk in chunks:
            s.write(chunk)
    except BaseException:
        s.abort()
        raise
    return s.close()


def exit_writing(writer: GenerationWriting, failed: bool) -> None:
    """A generation writer's context-manager exit (both implementations' ``__exit__``): nothing once it
    is no longer writing, else commit after a normal exit and abort after an exception (``failed``)."""
    if writer.state is not GenState.WRITING:
        return
    if failed:
        writer.abort()
    else:
        writer.commit()
