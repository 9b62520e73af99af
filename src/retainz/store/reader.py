"""The read path: streaming (:meth:`Reader.read_shard`) and random access
(:meth:`Reader.read_shard_extent`) to committed shards, every extent verified against its crc32c.

One implementation for both stores of the contract (:mod:`.contract`): a :class:`Reader` is composed of
two parts given to its constructor, where a shard's extents are (:class:`ShardLookup`) and how an
extent's bytes are read (:class:`ExtentBytes`).  The in-process store gives it the catalog and its
device (:class:`CatalogShards`, :class:`DeviceExtents`) and its lock; a node service's client
(``retainz.node.client``) gives it the service's ``locations`` and its own reads of the device file,
and no lock.  :func:`verified_stream` is the streaming loop (a shard's bytes extent by extent, its
whole crc32c checked at the end), also for a client whose extents the service reads for it.
"""

from __future__ import annotations

import bisect
import contextlib
import operator
import threading
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Protocol

import crc32c

from retainz.errors import ChecksumError, GenerationNotFoundError, ShardNotFoundError
from retainz.store.catalog import Catalog
from retainz.store.crc import crc32c_combine
from retainz.store.types import GenerationInfo, GenState, ShardInfo
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import round_up

__all__ = ["Reader", "ShardLookup", "ExtentBytes", "CatalogShards", "DeviceExtents", "verified_stream",
           "unknown_message"]


def unknown_message(gen: GenerationInfo, dev: str = "DEV") -> str:
    """The refusal of a read or lookup of an unknown generation (``GenState.UNKNOWN``) on device
    ``dev``, naming the commands that inspect, restore and discard it."""
    return (f"generation {gen.id!r} (step {gen.step}) is unknown since a repair ({gen.unknown_reason}): it is "
            f"not read; inspect it with `retainz fsck {dev}`, restore it with `retainz fsck --restore {gen.id} "
            f"{dev}`, or discard it with `retainz rm {dev} {gen.id}`")


class ShardLookup(Protocol):
    """Where a committed shard is: its size, crc32c and extents ``(zone, offset, length, crc)``."""

    def shard(self, gen_id: str, name: str, allow_unknown: bool = False) -> ShardInfo:
        """The committed shard (of an unknown generation too with ``allow_unknown``).

        Raises:
            GenerationNotFoundError, ShardNotFoundError."""


class ExtentBytes(Protocol):
    """The bytes of one extent as the device holds them (unverified)."""

    #: The device's block size (bytes): :meth:`read_extent_into` reads whole blocks.
    block_size: int

    def read_extent(self, zone: int, offset: int, length: int) -> bytes:
        """``length`` data bytes from byte ``offset`` of ``zone``."""

    def read_extent_into(self, zone: int, offset: int, out: memoryview) -> None:
        """``len(out)`` bytes (a multiple of the block size) from byte ``offset`` of ``zone``, read
        straight into ``out``."""


class CatalogShards:
    """The in-process store's :class:`ShardLookup`: its catalog (called under the store's lock).

    Args:
        catalog: the committed generations.  device_name: the device as the refusal of an unknown
            generation names it (:func:`unknown_message`).
    """

    def __init__(self, catalog: Catalog, device_name: str):
        self.catalog = catalog
        self.device_name = device_name

    def shard(self, gen_id: str, name: str, allow_unknown: bool = False) -> ShardInfo:
        """The catalog's :class:`ShardInfo` itself (GC replaces its extents in place).

        Raises:
            GenerationNotFoundError: no committed generation ``gen_id`` (or an unknown one without
                ``allow_unknown``).  ShardNotFoundError: it has no shard ``name``.
        """
        gen = self.catalog.gens.get(gen_id)
        if gen is None:
            raise GenerationNotFoundError(f"no committed generation {gen_id!r}")
        if gen.state is GenState.UNKNOWN and not allow_unknown:
            raise GenerationNotFoundError(unknown_message(gen, self.device_name))
        shard = gen.shards.get(name)
        if shard is None:
            raise ShardNotFoundError(f"generation {gen_id!r} has no shard {name!r}")
        return shard


class DeviceExtents:
    """The in-process store's :class:`ExtentBytes`: ``device.read`` of the extent's blocks (a read is
    whole blocks: ``ZonedDevice.read``), cut to its data bytes."""

    def __init__(self, device: ZonedDevice):
        self.device = device
        g = device.geometry
        self._bs, self._zsize = g.block_size, g.zone_size
        self.block_size = g.block_size

    def read_extent(self, zone: int, offset: int, length: int) -> bytes:
        return self.device.read(zone * self._zsize + offset, round_up(length, self._bs))[:length]

    def read_extent_into(self, zone: int, offset: int, out: memoryview) -> None:
        """``ZonedDevice.read_into``: whole blocks straight into ``out``."""
        self.device.read_into(zone * self._zsize + offset, out)


def verified_stream(gen_id: str, name: str, size: int, crc: int | None,
                    extent_at: Callable[[int], tuple[int, bytes, int | None]]) -> Iterator[bytes]:
    """A shard's bytes from its first to its ``size``-th, extent by extent, and its whole crc32c checked.

    Args:
        gen_id, name: the shard (for the error).  size, crc: its data bytes and whole crc32c (``None``:
            not checked).
        extent_at: ``pos -> (at, data, extent crc)``: the verified extent holding data byte ``pos``,
            starting at data byte ``at <= pos``; its crc32c, or ``None`` when not known (then the
            shard's crc is extended over the bytes, else combined from the extents' crcs without a
            second pass over them).  GC may split extents at other boundaries meanwhile, so the
            extent may start before ``pos``.

    Raises:
        ChecksumError: the whole shard's crc32c does not match (extents each valid but wrong, or in
            the wrong order); what ``extent_at`` raises.
    """
    done = whole = 0
    while done < size:
        at, data, ecrc = extent_at(done)
        if done != at:           # a GC move split the extents at another boundary
            data, ecrc = data[done - at:], None
        if ecrc is None:
            whole = crc32c.crc32c(data, whole)
        else:
            whole = crc32c_combine(whole, ecrc, len(data)) if done else ecrc
        done += len(data)
        if done >= size and crc is not None and whole != crc:
            raise ChecksumError(f"generation {gen_id!r} shard {name!r}: whole-shard crc32c mismatch",
                                generation=gen_id, shard=name, expected=crc, actual=whole)
        yield data


def _offset(pos) -> int | None:
    """``pos`` as a byte offset (any integer but a bool), else ``None``."""
    if isinstance(pos, bool):
        return None
    try:
        return operator.index(pos)
    except TypeError:
        return None


class Reader:
    """Verified reads of committed shards from two parts: where a shard's extents are (``shards``) and
    how an extent's bytes are read (``extents``).

    Args:
        shards: the :class:`ShardLookup` (the catalog; a service's ``locations``).
        extents: the :class:`ExtentBytes` (the device; a client's reads of the device file).
        lock: held around each extent's lookup and read.  With a lock (the in-process store's), the
            shard is looked up again before every extent, so GC cannot move it between the lookup and
            the read; without one (a service's client, where a lookup is a round trip) it is looked
            up again only after an extent fails its crc32c: GC may have moved the shard meanwhile.
            Either way an extent that still fails, at the same place, is a ChecksumError.

    Finding the extent that holds a byte is a binary search over the shard's extent start offsets,
    computed once per extent list (GC replaces a shard's list when it moves it), so streaming a
    shard of n extents is O(n log n), not O(n^2).
    """

    def __init__(self, shards: ShardLookup, extents: ExtentBytes, lock: threading.RLock | None = None):
        self.shards = shards
        self.extents = extents
        self.lock = lock
        self._held = lock if lock is not None else contextlib.nullcontext()
        self._starts: dict[tuple[str, str], tuple[tuple, list[int]]] = {}

    def shard(self, gen_id: str, name: str, allow_unknown: bool = False) -> ShardInfo:
        """The committed shard (of an unknown generation too with ``allow_unknown``).

        Raises:
            GenerationNotFoundError, ShardNotFoundError.
        """
        with self._held:
            return self.shards.shard(gen_id, name, allow_unknown)

    def read_shard(self, gen_id: str, name: str, allow_unknown: bool = False) -> Iterator[bytes]:
        """Stream a committed shard's bytes, extent by extent, each verified before it is yielded.

        GC may move the shard while it is being read; the reader follows the move.

        Raises:
            GenerationNotFoundError, ShardNotFoundError: no such committed generation or shard (at
                the call); GenerationNotFoundError mid-stream when the generation is deleted while
                being read (and found so: a served client, which looks up only after a failed
                crc, may finish reading a deleted shard whose bytes are still intact).
            ChecksumError: an extent's or the whole shard's crc32c does not match (names generation,
                shard, zone and offset).
        """
        shard = self.shard(gen_id, name, allow_unknown)

        def extent_at(pos: int) -> tuple[int, bytes, int | None]:
            nonlocal shard
            at, data, ecrc, shard = self._extent(gen_id, name, shard, pos, allow_unknown)
            return at, data, ecrc

        return verified_stream(gen_id, name, shard.size, shard.crc, extent_at)

    def read_shard_extent(self, gen_id: str, name: str, pos: int) -> tuple[int, bytes]:
        """Random access: the verified extent holding data byte ``pos`` of a committed shard.

        With a lock (the in-process store's) it is held only to find the extent and, after the device
        read, to check that the shard still has that extent list; the read and the crc32c run outside
        it (both release the GIL), so the mount's request threads read in parallel.  A GC move or a
        deletion between the two looks is seen by the second: a move is read again at the new place;
        a deletion raises.  Sound because the catalog changes before any zone is reset
        (``Catalog.replace_extents`` before the victims' reset in ``gc._apply_moves``;
        ``Store._retire`` removes, then resets), and an extent list is replaced, never changed in place.

        Args:
            gen_id, name: the shard.
            pos: a data byte offset, ``0 <= pos < size``.

        Returns:
            ``(first data byte of the extent, its bytes)``; extents are at most 1 MiB of payload.

        Raises:
            GenerationNotFoundError, ShardNotFoundError; ValueError for ``pos`` outside the shard;
            ChecksumError: the extent fails its crc32c.
        """
        if self.lock is None:
            shard, _, _, _ = self._find(gen_id, name, pos)
            return self._extent(gen_id, name, shard, _offset(pos), False, looked_up=True)[:2]
        while True:
            shard, ext, starts, i = self._find(gen_id, name, pos)
            z, off, length, ecrc = ext[i]
            try:
                data = self.extents.read_extent(z, off, length)
                actual = None if ecrc is None else crc32c.crc32c(data)
            except Exception:
                if self._same(gen_id, name, shard, ext):
                    raise
                continue                       # moved or deleted meanwhile: look again
            if not self._same(gen_id, name, shard, ext):
                continue
            if actual != ecrc:
                raise self._bad(gen_id, name, ext[i], actual)
            return starts[i], data

    def read_shard_into(self, gen_id: str, name: str, pos: int, out) -> int:
        """Fill ``out`` with the whole extents of a committed shard that start at data byte ``pos``, read
        straight into it (no bytes object, no copy: the mount's read requests) and verified in place.

        Only whole extents are given, and only block-multiple ones (the device reads whole blocks):
        the result stops before the first extent that does not fit in ``out`` or is not a block
        multiple, and is 0 when ``pos`` is not the first byte of an extent; the caller reads the rest
        through :meth:`read_shard_extent`.  The lock, when there is one, is held only to find the
        extents and to check the shard after the reads (as :meth:`read_shard_extent`); without one
        (a served client) the shard is looked up again after a read that fails or an extent that
        fails its crc32c, and read again if GC moved it.

        Args:
            gen_id, name: the shard.
            pos: a data byte offset, ``0 <= pos < size``.
            out: a writable buffer.

        Returns:
            bytes filled (a multiple of the block size; 0 to ``len(out)``).

        Raises:
            GenerationNotFoundError, ShardNotFoundError; ValueError for ``pos`` outside the shard;
            ChecksumError: an extent fails its crc32c (``out`` then holds what was read).
        """
        out = memoryview(out).cast("B")
        bs = self.extents.block_size
        while True:
            shard, ext, starts, i = self._find(gen_id, name, pos)
            if starts[i] != pos:
                return 0
            n = 0
            bad = None
            try:
                for e in ext[i:]:
                    z, off, length, ecrc = e
                    if n + length > len(out) or length % bs:
                        break
                    part = out[n:n + length]
                    self.extents.read_extent_into(z, off, part)
                    n += length
                    if ecrc is not None and crc32c.crc32c(part) != ecrc:
                        bad = e, crc32c.crc32c(part)
                        break
            except Exception:
                if self._same(gen_id, name, shard, ext):
                    raise
                continue                       # moved or deleted meanwhile: look again
            if (self.lock is not None or bad is not None) and not self._same(gen_id, name, shard, ext):
                continue
            if bad is not None:
                raise self._bad(gen_id, name, *bad)
            return n

    def _find(self, gen_id: str, name: str, pos) -> tuple[ShardInfo, tuple, list[int], int]:
        """``(shard, its extents, their data start offsets, index of the extent holding pos)``, looked
        up under the lock.

        Raises:
            GenerationNotFoundError, ShardNotFoundError; ValueError for ``pos`` outside the shard.
        """
        with self._held:
            shard = self.shards.shard(gen_id, name)
            at = _offset(pos)
            if at is None or not 0 <= at < shard.size:
                raise ValueError(f"generation {gen_id!r} shard {name!r}: byte {pos} is outside its "
                                 f"{shard.size} bytes")
            ext = shard.extents
            starts = self._index(gen_id, name, ext)
            return shard, ext, starts, bisect.bisect_right(starts, at) - 1

    def _same(self, gen_id: str, name: str, shard: ShardInfo, ext: tuple) -> bool:
        """Whether ``gen_id``'s committed shard ``name`` is still ``shard`` with extent list ``ext``
        (under a lock: the same objects, as the catalog replaces a list; a served client's lookup
        answers new objects, so their values are compared)."""
        with self._held:
            try:
                fresh = self.shards.shard(gen_id, name)
            except (GenerationNotFoundError, ShardNotFoundError):
                return False
        if self.lock is not None:
            return fresh is shard and fresh.extents is ext
        return (fresh.size, fresh.crc, tuple(fresh.extents)) == (shard.size, shard.crc, tuple(ext))

    @staticmethod
    def _bad(gen_id: str, name: str, extent: tuple, actual: int | None) -> ChecksumError:
        """The :class:`ChecksumError` of ``extent`` (``(zone, offset, length, crc32c)``) read with crc32c ``actual``."""
        z, off, length, ecrc = extent
        return ChecksumError(f"generation {gen_id!r} shard {name!r}: extent at zone {z} offset {off} "
                             f"({length} bytes) fails its crc32c", generation=gen_id, shard=name,
                             zone=z, offset=off, length=length, expected=ecrc, actual=actual)

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

    def _again(self, gen_id: str, name: str, view: ShardInfo, allow_unknown: bool) -> ShardInfo:
        """The shard looked up again in the middle of a read of ``view``: moved by GC (same size and
        crc, other extents) it is read where it is now; gone or replaced, the read ends.

        Raises:
            GenerationNotFoundError: the generation was deleted (or the shard replaced) meanwhile.
        """
        try:
            fresh = self.shards.shard(gen_id, name, allow_unknown)
        except (GenerationNotFoundError, ShardNotFoundError):
            fresh = None
        if fresh is None or (fresh is not view and (fresh.size, fresh.crc) != (view.size, view.crc)):
            raise GenerationNotFoundError(f"generation {gen_id!r} was deleted while being read")
        return fresh

    def _extent(self, gen_id: str, name: str, view: ShardInfo, pos: int, allow_unknown: bool, *,
                looked_up: bool = False) -> tuple[int, bytes, int | None, ShardInfo]:
        """Read and verify the extent holding data byte ``pos`` of ``view`` (the shard as last looked
        up; ``looked_up``: just now).  Returns (its first data byte, data, its crc, the shard as read)."""
        with self._held:
            if self.lock is not None and not looked_up:
                view = self._again(gen_id, name, view, allow_unknown)
            for attempt in (0, 1):
                ext = view.extents
                starts = self._index(gen_id, name, ext)
                i = bisect.bisect_right(starts, pos) - 1
                z, off, length, ecrc = ext[i]
                data = self.extents.read_extent(z, off, length)
                actual = None if ecrc is None else crc32c.crc32c(data)
                if actual == ecrc:
                    return starts[i], data, ecrc, view
                if attempt or self.lock is not None:
                    break            # under the lock nothing moved it since the lookup
                view = self._again(gen_id, name, view, allow_unknown)
                if view.extents == ext:
                    break
        raise self._bad(gen_id, name, (z, off, length, ecrc), actual)
