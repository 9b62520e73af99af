"""Admission at write time: a full device refuses the ``write``, never a later commit.

Each generation a namespace is writing holds a reservation in the store (the store contract's
``admit``) that covers every byte its files have accepted and not yet placed, plus one block for a
layout shard.  A ``write`` grows it first; the store refuses what its data zones cannot take after GC
(``NoSpaceError``: ``ENOSPC`` for the write), and nothing of the write is taken then.  The bytes not
placed are read under the store's lock, which the pump's thread holds while it places an extent and
shrinks the reservation, so what is placed and what is reserved are seen at one instant.
"""

from __future__ import annotations

from retainz.store.writer import WRITE_BUFFER

__all__ = ["Admission"]


class Admission:
    """The reservations of the generations one namespace writes (see the module docstring).

    Args:
        store: the open store (its ``lock``, ``admit``, ``df`` and device geometry).
    """

    def __init__(self, store):
        self.store = store

    @property
    def lock(self):
        """The store's lock, which its writers hold while they place extents and shrink their
        reservations (the store contract's ``lock``)."""
        return self.store.lock

    def pad(self, n: int) -> int:
        """``n`` bytes rounded up to whole device blocks."""
        bs = self.store.device.geometry.block_size
        return -(-n // bs) * bs

    def unplaced(self, h, size: int | None = None) -> int:
        """Device bytes open file ``h`` has accepted (or, with ``size``, will have) and not placed:
        its buffer, or, streamed, every byte past the shard's placed extents (those its pump still
        holds, and the tail the shard buffers before its next 1 MiB extent).  Read under :attr:`lock`."""
        size = h.size if size is None else max(size, h.size)
        sink = h.sink
        if sink is not None:
            return self.pad(size - (sink.written - sink.written % WRITE_BUFFER))
        return self.pad(size)

    def checkpoint_need(self, pd, h=None, size: int | None = None) -> int:
        """Bytes pending checkpoint ``pd`` must have reserved: its closed files held in memory, its
        open files' unplaced bytes (``h`` at ``size`` bytes), and one block for a layout shard."""
        need = sum(self.pad(len(b)) for b in pd.ready.values())
        need += sum(self.unplaced(o, size if o is h else None) for o in pd.writing.values())
        return need + self.pad(1)

    def file_need(self, h, size: int | None = None) -> int:
        """Bytes the generation of open file ``h`` (a file of its own) must have reserved, ``h`` at
        ``size`` bytes, with one block for a layout shard."""
        return self.unplaced(h, size) + self.pad(1)

    def admit(self, w, nbytes: int) -> None:
        """Grow writer ``w``'s reservation to ``nbytes`` (the store contract's ``admit``; a served
        store's service admits).

        Raises:
            NoSpaceError: the data zones cannot take it after GC, or the journal is full."""
        with self.store.lock:
            self.store.admit(w, nbytes)

    def space(self, writers) -> tuple[int, int, int, int]:
        """``(block size, capacity, available, generations)`` in bytes, ``writers`` being the
        ``GenerationWriter`` of every generation being written: available is admission's reach after
        GC (data capacity less live bytes, their reservations and the GC reserve) less the one block
        every new generation keeps for its layout record."""
        df = self.store.df()
        bs = self.store.device.geometry.block_size
        reserved = sum(w.reserve for w in writers)     # admitted for bytes accepted, not yet placed
        avail = max(0, df.capacity - df.used - df.gc_reserve - reserved - self.pad(1))
        return bs, df.capacity, avail, df.generations
