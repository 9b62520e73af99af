"""What a namespace is told by the parts around it, given to its constructor.

A :class:`~retainz.namespace.Namespace` is configured once, when it is made: the face over it (the
FUSE mount, ``retainz://``) passes a :class:`Face`, and a face that promotes to a durable tier passes
the tier (a :class:`DurableTier`).  Nothing is assigned to a namespace after it is made.

* :class:`Face`: who is calling (the process of a FUSE request), how a generation is begun (the ranks
  of a served device join one), a series' first save, whether this process leaves a joined generation
  to another rank, and the page-cache bookkeeping of a kernel mount (commits, failed writes, renames).
  Its defaults are a face with none of these needs (a namespace in a test, a single process).
* :class:`DurableTier`: what promotion to a durable tier needs (docs/tiers.md): every commit handed
  to the promoter, the runtime's deletions kept until durable, those deferred deletions out of the
  view, and a shard's durable copy when its local copy fails.  Implemented by
  ``retainz.jobs.tiering.NamespaceTier``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, Protocol

__all__ = ["Face", "DurableTier"]


class Face:
    """The face over a namespace, as the namespace sees it; subclass and override what the face needs."""

    def caller(self) -> int | None:
        """The process id of the calling process (``None`` when unknown).  A close commits only when
        made by the process that wrote last, so a forked child or a close-on-exec of an inherited
        descriptor never commits a file half written."""
        return None

    def begin(self, store, gid: str, step: int, hint, path: str):
        """Begin generation ``gid`` (training step ``step``, retention ``hint``) for ``path`` and
        return its ``GenerationWriter`` (the store contract's ``begin_generation``).

        Raises:
            what ``begin_generation`` raises (``NoSpaceError``, ``GenerationExistsError``)."""
        return store.begin_generation(gid, step, hint=hint)

    def series_begins(self, series: str) -> None:
        """Called once per series with a retention rule, before this namespace's first save into it
        (``retainz://`` re-hints the series' committed generations: ``retainz.jobs.life.rehint``)."""

    def leaves(self, writer) -> bool:
        """Whether this process hands the joined generation of ``writer`` (a pending checkpoint all
        of whose files it has closed) to another rank instead of committing it (``retainz://``: a
        rank other than the coordinator).  The namespace then writes its buffered files as shards,
        forgets it and calls ``writer.leave()``."""
        return False

    def committed(self, path: str, gid: str, shard: str) -> None:
        """``path`` committed as ``shard`` of ``gid`` (the mount's page cache may keep its pages)."""

    def written(self, path: str) -> None:
        """A write to ``path`` failed: what a page cache holds of it may not be the file's bytes."""

    def moved(self, a: str, b: str) -> None:
        """``a`` (a file or a directory) was renamed to ``b``."""


class DurableTier(Protocol):
    """A durable tier's part in a namespace (docs/tiers.md, "The mount and retainz://")."""

    def committed(self, gid: str) -> None:
        """Generation ``gid`` was committed by the namespace (the promoter queues it)."""

    def retire(self, gid: str) -> bool:
        """The runtime retires ``gid`` (``rm -r``, ``unlink``): delete it now (True) or defer the
        deletion until its durable copy is verified (False; it stays out of the view meanwhile)."""

    def retiring(self) -> Iterable[str]:
        """Ids of generations whose deletion is deferred (by any face of the store)."""

    def durable_copy(self, gid: str, shard: str, why: BaseException | None) -> IO[bytes]:
        """A seekable binary file of shard ``shard`` of ``gid`` from the durable copy, verified whole,
        for a read whose local copy failed with ``why``.

        Raises:
            any error: no usable durable copy (the read then fails with the local error's errno)."""
