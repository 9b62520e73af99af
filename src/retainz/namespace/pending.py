"""A pending checkpoint: a checkpoint directory being written, before its commit point.

One :class:`PendingCheckpoint` per directory a runtime is saving (``run/step-5/``): one generation
(its id, step, retention hint and, once admitted, its ``GenerationWriter``) and the state of each
of its files, which is exactly one of

* **open**: a file open for writing (an :class:`~retainz.namespace.openfile.OpenWrite`);
* **closed in memory**: a small file closed, its bytes held until the commit writes them as a shard;
* **streamed**: a large file closed, its shard in the store already (its size recorded).

Its files move between these states only through the methods below.  A pending checkpoint may be
**refused** (a call on one of its files returned an error, see docs/mount.md): its files are dropped,
its open files fail their next call with the same errno, and it never commits.  Its **commit point**
(:func:`retainz.namespace.names.commit_point`) follows from its name and its files.  The commit
protocol runs around it: admission, the commit, the refusal, the abort (:mod:`retainz.namespace.commit`).
"""

from __future__ import annotations

from retainz.namespace import names as L
from retainz.namespace.openfile import OpenWrite

__all__ = ["PendingCheckpoint"]


class PendingCheckpoint:
    """A checkpoint directory being written (see the module docstring).

    Args:
        root: its path (no leading ``/``).
        gid: the id of its generation (its path's id; renamed with it before the commit).
        step: the training step its name carries (0 if none).
        hint: its retention hint.
        mtime_ns: its time (ns since the epoch).

    Attributes:
        writer: its ``GenerationWriter`` (begun when a shard streams or at commit).
        relabelled: a file of it was renamed or removed after its shard was written (the commit
            writes a layout shard).
        commit_requested: its commit point came while files of it were open: it commits when the
            last one closes.
        then: ``fn(committed)`` run at its commit (True) or abort (False).
        refused: the first error a call on one of its files returned (``None``: not refused).
        refused_by: the processes that got such an error.
        aborted: its writer was aborted.
    """

    def __init__(self, root: str, gid: str, step: int, hint=None, *, mtime_ns: int = 0):
        self.root, self.gid, self.step, self.hint, self.mtime_ns = root, gid, step, hint, mtime_ns
        self.writer = None
        self.writing: dict[str, OpenWrite] = {}       # rel -> open file
        self.ready: dict[str, bytearray] = {}         # rel -> closed file's bytes, held in memory
        self.streamed: dict[str, str] = {}            # shard -> rel (in the store already)
        self.sizes: dict[str, int] = {}               # shard -> bytes, of the streamed files
        self.relabelled = False
        self.commit_requested = False
        self.then: list = []
        self.refused: BaseException | None = None
        self.refused_by: set = set()
        self.aborted = False

    # -- its files ----------------------------------------------------------------------------------
    def files(self) -> list[str]:
        """The relative paths of its files (open, closed in memory, streamed)."""
        return list(self.streamed.values()) + list(self.ready) + list(self.writing)

    def closed_files(self) -> dict:
        """``{rel: ...}`` of its closed files (what its commit point is judged on)."""
        return self.ready | dict.fromkeys(self.streamed.values())

    def commit_point(self) -> str:
        """Its commit point (a key of :data:`retainz.namespace.names.COMMIT_POINTS`), from its name and
        its closed files."""
        return L.commit_point(self.root, self.closed_files())

    def size(self, rel: str) -> int | None:
        """Bytes of its closed file ``rel`` (``None``: no such closed file)."""
        if rel in self.ready:
            return len(self.ready[rel])
        for s, r in self.streamed.items():
            if r == rel:
                return self.sizes[s]
        return None

    def is_streamed(self, rel: str) -> bool:
        """Whether ``rel`` was streamed into the store (append-only: it cannot be opened again)."""
        return rel in self.streamed.values()

    def take_back(self, rel: str) -> bytearray | None:
        """The bytes of closed file ``rel`` held in memory, no longer closed (it is opened again);
        ``None``: no such file."""
        return self.ready.pop(rel, None)

    def open(self, rel: str, h: OpenWrite) -> None:
        """``rel`` is open for writing through ``h``."""
        self.writing[rel] = h

    def close(self, rel: str, *, shard: str | None = None, size: int = 0, data: bytearray | None = None) -> None:
        """Its open file ``rel`` closed: streamed as ``shard`` of ``size`` bytes, or held (``data``)."""
        self.writing.pop(rel, None)
        if shard is not None:
            self.streamed[shard] = rel
            self.sizes[shard] = size
        else:
            self.ready[rel] = data

    def forget_open(self, rel: str) -> None:
        """Its open file ``rel`` was dropped (unlinked or discarded)."""
        self.writing.pop(rel, None)

    def remove(self, rel: str) -> None:
        """Its closed file ``rel`` was removed (``unlink``, or replaced by a rename)."""
        self.ready.pop(rel, None)
        for s, r in list(self.streamed.items()):
            if r == rel:
                del self.streamed[s]
                self.relabelled = True

    def move(self, ra: str, rb: str) -> None:
        """Its closed file ``ra`` was renamed to ``rb`` (replacing what ``rb`` held)."""
        if ra in self.ready:
            self.ready[rb] = self.ready.pop(ra)
        for s, r in list(self.streamed.items()):
            if r == rb:
                del self.streamed[s]
            if r == ra:
                self.streamed[s] = rb
                self.relabelled = True

    def move_open(self, h: OpenWrite, rb: str) -> None:
        """Its open file ``h`` was renamed to ``rb`` (replacing what ``rb`` held)."""
        self.writing.pop(h.rel, None)
        self.remove(rb)
        h.rel = rb
        self.writing[rb] = h

    def shard_name(self, rel: str, taken) -> str:
        """The shard name for file ``rel`` (:func:`retainz.ids.shard_name`), made unique against the
        names in ``taken`` and the layout shard."""
        from retainz import ids

        name = ids.shard_name(rel)
        if name in taken or name == L.LAYOUT_SHARD:
            name = f"{name}%{len(taken)}"
        return name

    # -- refusal ------------------------------------------------------------------------------------
    def refuse(self, e: BaseException, who) -> bool:
        """A call on one of its files by process ``who`` returned ``e``: it never commits; its closed
        files are dropped and its open files fail their next call with the first error.  Whether
        this is its first refusal."""
        first = self.refused is None
        if first:
            self.refused = e
        self.refused_by.add(who)
        self.ready.clear()
        self.streamed.clear()
        self.sizes.clear()
        for o in self.writing.values():
            o.fail(self.refused)
        return first
