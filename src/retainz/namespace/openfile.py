"""An open file of the namespace: a writer's life as a state machine, and a reader.

A file open for writing (:class:`OpenWrite`) has two states, each changed only by the transitions
below, all in this module:

**Its life** (:class:`Life`), what its next ``close``/``fsync`` does::

    OPENED --write/truncate--> CHANGED --close: committed or joined its checkpoint--> SETTLED
    SETTLED --write/truncate again (a duplicate descriptor)--> OPENED --> CHANGED ...
    OPENED, CHANGED --a call returned an error--> FAILED --close reported it--> REPORTED
    SETTLED --an error returned after it settled--> REPORTED
    any live state --unlink, discard--> DROPPED ;  any state --release--> RELEASED

``OPENED`` and ``CHANGED`` differ at close: an ``OPENED`` file that has a committed version makes no
new version.  ``FAILED`` and ``REPORTED`` never commit, and every later call returns the error;
``FAILED`` still has its refusal to carry out at close (its stream aborted, its checkpoint refused).
``DROPPED`` takes bytes and commits nothing.  An illegal transition is a bug (``AssertionError``).

**How its bytes are kept** (:class:`Keeping`)::

    BUFFERED --past the stream threshold, written in order--> STREAMING --shard closed--> BUFFERED
    BUFFERED --a write skipping into a length set ahead--> AHEAD --written to its end--> STREAMING
    BUFFERED, AHEAD --extended past its bytes (a hole)--> HELD   (in memory until it commits)

A streaming file's bytes go into a store shard (``ShardWriter``) through its :class:`Pump`.

A file open for reading (:class:`OpenRead`) reads bytes held in memory (a writer's buffer, a closed
file of a checkpoint not committed yet) or a committed shard, with the verified extents it read
lately and, once its local copy failed, the shard's durable copy.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import itertools
import threading

from retainz.errors import ChecksumError, GenerationNotFoundError
from retainz.namespace.errors import NamespaceError
from retainz.namespace.pump import Pump
from retainz.store.writer import WRITE_BUFFER

__all__ = ["Life", "Keeping", "OpenWrite", "OpenRead", "OpenFiles"]


class Life(enum.Enum):
    """Where an open write file is in its life (see the module docstring)."""

    OPENED = "opened"        # nothing changed since it was opened, or since it settled and was written again
    CHANGED = "changed"      # written or truncated since it was opened or last settled
    SETTLED = "settled"      # committed, or joined its checkpoint, since its last change
    FAILED = "failed"        # a call returned an error: it never commits; its close has not reported it
    REPORTED = "reported"    # failed, and the error was reported (its close) or logged (its release)
    DROPPED = "dropped"      # unlinked or discarded while open: takes bytes, commits nothing
    RELEASED = "released"    # its last descriptor was released


#: The transitions of :class:`Life` (a state may also stay as it is).
_NEXT = {
    Life.OPENED: {Life.CHANGED, Life.SETTLED, Life.FAILED, Life.DROPPED, Life.RELEASED},
    Life.CHANGED: {Life.SETTLED, Life.FAILED, Life.DROPPED, Life.RELEASED},
    Life.SETTLED: {Life.OPENED, Life.REPORTED, Life.DROPPED, Life.RELEASED},
    Life.FAILED: {Life.REPORTED, Life.DROPPED, Life.RELEASED},
    Life.REPORTED: {Life.DROPPED, Life.RELEASED},
    Life.DROPPED: {Life.RELEASED},
    Life.RELEASED: set(),
}


class Keeping(enum.Enum):
    """How an open write file's bytes are kept (see the module docstring)."""

    BUFFERED = "buffered"    # in memory; streams once past the threshold and written in order
    AHEAD = "ahead"          # in memory; a write skipped into a length set ahead: streams at its end only
    HELD = "held"            # in memory until it commits (extended past its bytes: a hole); never streams
    STREAMING = "streaming"  # pushed into a store shard through a pump


_KEEP_NEXT = {
    Keeping.BUFFERED: {Keeping.AHEAD, Keeping.HELD, Keeping.STREAMING},
    Keeping.AHEAD: {Keeping.HELD, Keeping.STREAMING},
    Keeping.HELD: set(),
    Keeping.STREAMING: {Keeping.BUFFERED},
}


class OpenWrite:
    """A file open for writing: its bytes, its life and how they are kept (see the module docstring).

    Args:
        path: its path now (a rename while open changes it).
        buf: its bytes so far (a rewrite of a small committed file starts with them).
        pending: the pending checkpoint directory it belongs to, or ``None`` (a file generation).
        rel: its path inside that directory.
        changed: it starts ``CHANGED`` (an ``O_TRUNC`` of a committed file: it is empty now).

    Attributes:
        size: its length in bytes (a length set ahead can exceed what is written).
        writer: the ``GenerationWriter`` of its file generation (``None``: not admitted yet, or a file
            of a checkpoint, whose writer is the checkpoint's).
        sink: the ``ShardWriter`` it streams into (``STREAMING`` only); ``shard_name``: its shard.
        put: bytes pushed into the sink (its data end).
        writer_process: the process of the last write (a close by another process commits nothing).
        flushed: a descriptor was closed since the last write.
        done: set when it is released.
        lock: held by each call on it.
    """

    write_mode = True

    def __init__(self, path: str, *, buf: bytearray | None = None, pending=None, rel: str = "",
                 changed: bool = False):
        self.path = path
        self.pending, self.rel = pending, rel
        self.buf = buf if buf is not None else bytearray()
        self.size = len(self.buf)
        self.writer = None
        self.sink = None
        self.pump: Pump | None = None
        self.shard_name = ""
        self.put = 0
        self.writer_process = None
        self.flushed = False
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.life = Life.CHANGED if changed else Life.OPENED
        self.keeping = Keeping.BUFFERED
        self.error: BaseException | None = None

    # -- its life ------------------------------------------------------------------------------------
    def _to(self, life: Life) -> None:
        if life is not self.life and life not in _NEXT[self.life]:
            raise AssertionError(f"{self.path}: an open file cannot go from {self.life.value} to {life.value}")
        self.life = life

    @property
    def live(self) -> bool:
        """It is the path's open writer (not dropped, not released)."""
        return self.life not in (Life.DROPPED, Life.RELEASED)

    @property
    def unsettled(self) -> bool:
        """It may hold bytes its path's committed version does not (not settled, not reported)."""
        return self.life in (Life.OPENED, Life.CHANGED, Life.FAILED)

    @property
    def to_finish(self) -> bool:
        """A close by its writer has work to do: commit, join, or report an error."""
        return self.life in (Life.CHANGED, Life.FAILED, Life.REPORTED)

    def wrote_by(self, process) -> None:
        """A write by ``process`` arrives."""
        self.flushed = False
        self.writer_process = process

    def change(self) -> None:
        """Its bytes or length changed (``OPENED`` -> ``CHANGED``; a settled file is reopened first)."""
        self._to(Life.CHANGED)

    def reopen(self) -> None:
        """More bytes after it settled (a duplicate descriptor's close committed it): ``OPENED``."""
        self._to(Life.OPENED)

    def settle(self) -> None:
        """Its close is done: committed or joined (``SETTLED``), or its error reported (``REPORTED``);
        a dropped file stays dropped."""
        if self.life in (Life.OPENED, Life.CHANGED):
            self._to(Life.SETTLED)
        elif self.life is Life.FAILED:
            self._to(Life.REPORTED)

    def fail(self, e: BaseException) -> None:
        """A call on it returned (or will return) ``e``: it never commits.  The first error is kept."""
        if self.life in (Life.DROPPED, Life.RELEASED):
            return
        if self.error is None:
            self.error = e
        if self.life in (Life.OPENED, Life.CHANGED):
            self._to(Life.FAILED)
        elif self.life is Life.SETTLED:
            self._to(Life.REPORTED)

    def drop(self) -> bool:
        """Unlinked or discarded while open: what it wrote is dropped; whether a stream was aborted
        (the caller gives the store slot back)."""
        aborted = self.abort_stream()
        self.buf = bytearray()
        self._to(Life.DROPPED)
        return aborted

    def release(self) -> None:
        """Its last descriptor was released."""
        self._to(Life.RELEASED)
        self.done.set()

    def pieces(self, size: int, offset: int, store=None, tier=None):
        """The bytes at ``offset`` (up to ``size``) of what it holds in memory (a writer reads its own
        buffer), as one piece; ``store`` and ``tier`` are not used."""
        return _held(self.buf, len(self.buf), size, offset)

    # -- how its bytes are kept ----------------------------------------------------------------------
    def _keep(self, keeping: Keeping) -> None:
        if keeping is not self.keeping and keeping not in _KEEP_NEXT[self.keeping]:
            raise AssertionError(f"{self.path}: bytes {self.keeping.value} cannot become {keeping.value}")
        self.keeping = keeping

    @property
    def streaming(self) -> bool:
        """Its bytes go into a store shard."""
        return self.keeping is Keeping.STREAMING

    def skip_ahead(self) -> None:
        """A write skipped part of a length set ahead: it streams only once written to its end."""
        if self.keeping is Keeping.BUFFERED:
            self._keep(Keeping.AHEAD)

    def hold(self) -> None:
        """Extended past its bytes (a hole, written later in any order): held in memory until it commits."""
        self._keep(Keeping.HELD)

    def may_stream(self, threshold: int, end: int) -> bool:
        """Whether a write ending at byte ``end`` lets it start streaming: its buffer reached
        ``threshold``, the write ended at the buffer's end, it is not held, and a file written ahead
        has reached its length."""
        return (self.keeping in (Keeping.BUFFERED, Keeping.AHEAD) and len(self.buf) >= threshold
                and end == len(self.buf) and (self.keeping is Keeping.BUFFERED or end == self.size))

    def streams_from_caller(self, threshold: int, offset: int, nbytes: int) -> bool:
        """Whether a write of ``nbytes`` at ``offset`` should start streaming before it is buffered, so
        that it goes into the shard from the caller's buffer (:meth:`Pump.put` of :attr:`Pump.LIMIT`
        bytes or more: no namespace copy, no pump copy; issue 44.7): not streaming yet, not held nor
        written ahead, the write appends at the end, holds at least ``Pump.LIMIT`` bytes and takes the
        file to ``threshold`` or past it."""
        return (self.keeping is Keeping.BUFFERED and offset == len(self.buf) == self.size
                and nbytes >= Pump.LIMIT and offset + nbytes >= threshold)

    def start_stream(self, sink, name: str) -> None:
        """Stream into shard ``name`` through ``sink`` (a ``ShardWriter``): the buffer goes first.

        Raises:
            the sink's error (nothing streams then: the sink is aborted)."""
        try:
            sink.write(self.buf)
        except BaseException:
            with contextlib.suppress(Exception):
                sink.abort()
            raise
        self.shard_name = name
        self.sink = sink
        self.put = len(self.buf)
        self.buf = bytearray()
        self.pump = Pump(sink)
        self._keep(Keeping.STREAMING)

    def stop_pump(self, *, discard: bool = False) -> None:
        """Write what the pump holds into the shard (``discard``: drop it) and end its thread.

        Raises:
            the shard's first error (not with ``discard``)."""
        pump, self.pump = self.pump, None
        if pump is not None:
            pump.stop(discard=discard)
            if pump.error is not None and not discard:
                raise pump.error

    def close_stream(self):
        """Write what the pump holds and the zeros of a length set ahead (``ftruncate`` up, never
        written), a block-multiple piece at a time, then close the shard; its ``ShardInfo``.

        Raises:
            the shard's first error (its bytes are not kept)."""
        try:
            self.stop_pump()
            if self.put < self.size:
                zeros = bytes(min(WRITE_BUFFER, self.size - self.put))
                while self.put < self.size:
                    n = min(len(zeros), self.size - self.put)
                    self.sink.write(zeros if n == len(zeros) else memoryview(zeros)[:n])
                    self.put += n
            return self.sink.close()
        finally:
            self._end_stream()

    def abort_stream(self) -> bool:
        """Drop the shard being streamed, if any (its pump's bytes discarded); whether there was one."""
        if self.sink is None:
            return False
        self.stop_pump(discard=True)
        with contextlib.suppress(Exception):
            self.sink.abort()
        self._end_stream()
        return True

    def _end_stream(self) -> None:
        self.sink = None
        self.buf = bytearray()
        if self.keeping is Keeping.STREAMING:
            self._keep(Keeping.BUFFERED)


class OpenRead:
    """A file open for reading.

    Args:
        path: its path.
        buf: bytes held in memory it reads (``None``: it reads a committed shard).
        source: the writer whose buffer it shares (reads what is written so far).
        gen: the committed generation (``CommittedGeneration``) whose ``shard`` it reads.

    Attributes:
        windows: verified extents read lately: first data byte -> bytes.
        durable: the shard's durable copy (a file), once the local one failed.
    """

    write_mode = False

    def __init__(self, path: str, *, buf: bytearray | None = None, source: OpenWrite | None = None,
                 gen=None, shard: str = ""):
        self.path = path
        self.buf = buf if buf is not None else bytearray()
        self.source = source
        self.gen, self.shard = gen, shard
        self.windows: dict[int, bytes] = {}
        self.durable = None
        self.lock = threading.Lock()

    #: Verified extents a reader keeps (1 MiB each): the kernel's read-ahead sends requests for one
    #: file from several threads, out of order, so one window would be evicted and read again.
    WINDOWS = 8

    def pieces(self, size: int, offset: int, store, tier):
        """The bytes at ``offset`` (up to ``size``), in order, as views of what is held: its bytes in
        memory, or the committed shard's extents read through ``store.read_shard_extent`` (each
        extent's crc32c verified), or, once the local copy failed and ``tier`` is given, the shard's
        durable copy (``DurableTier.durable_copy``).

        Raises:
            NamespaceError: ``EIO`` (a checksum mismatch), ``ESTALE`` (retired meanwhile), when there
                is no usable durable copy either."""
        if self.gen is None:
            length = self.source.size if self.source is not None and self.source.buf is self.buf else len(self.buf)
            yield from _held(self.buf, length, size, offset)
            return
        end = min(offset + size, self.gen.sizes[self.shard])
        if self.durable is not None:
            yield self._read_durable(tier, offset, end, None)
            return
        pos = offset
        try:
            while pos < end:
                start, data = self._window(store, pos)
                stop = min(end, start + len(data))
                yield data if pos == start and stop - start == len(data) else memoryview(data)[pos - start:stop - start]
                pos = stop
        except ChecksumError as e:
            if tier is None:
                raise NamespaceError(errno.EIO, f"{self.path}: {e}") from e
            yield self._read_durable(tier, pos, end, e)     # the rest, from the verified durable copy
        except GenerationNotFoundError as e:
            if tier is None:
                raise NamespaceError(errno.ESTALE, f"{self.path}: {e}") from e
            yield self._read_durable(tier, pos, end, e)

    def _read_durable(self, tier, offset: int, end: int, why: BaseException | None) -> bytes:
        """Bytes ``offset:end`` of its shard from the durable copy, fetched and verified whole at the
        first local failure ``why`` and kept while it is open."""
        with self.lock:
            if self.durable is None:
                try:
                    self.durable = tier.durable_copy(self.gen.id, self.shard, why)
                except Exception as e:   # noqa: BLE001 - no durable copy: the local failure stands
                    code = errno.EIO if isinstance(why, ChecksumError) else errno.ESTALE
                    raise NamespaceError(code, f"{self.path}: {why}; no durable copy either: {e}") from e
            self.durable.seek(offset)
            return self.durable.read(max(end - offset, 0))

    def _window(self, store, pos: int) -> tuple[int, bytes]:
        """The verified extent of its shard holding data byte ``pos``: ``(first byte, bytes)``."""
        with self.lock:
            for start, data in self.windows.items():
                if start <= pos < start + len(data):
                    return start, data
        start, data = store.read_shard_extent(self.gen.id, self.shard, pos)
        with self.lock:
            if len(self.windows) >= self.WINDOWS:
                del self.windows[next(iter(self.windows))]
            self.windows[start] = data
        return start, data

    def close(self) -> None:
        """Released: its durable copy, if any, is closed."""
        if self.durable is not None:
            self.durable.close()


def _held(buf: bytearray, length: int, size: int, offset: int):
    """Bytes ``offset`` (up to ``size``) of ``buf`` as one piece, with the zeros of a length set
    ahead (``length`` past the buffer)."""
    out = bytes(buf[offset:offset + size])
    if len(out) < size and offset + len(out) < length:
        out += bytes(min(size - len(out), length - offset - len(out)))
    yield out


class OpenFiles:
    """The open files of one namespace, by handle (the number a face returns for an ``open``: a FUSE
    file handle, an fsspec file's)."""

    def __init__(self):
        self._next = itertools.count(1)
        self._open: dict[int, OpenWrite | OpenRead] = {}

    def add(self, h: OpenWrite | OpenRead) -> int:
        """Open ``h``; its handle (never reused)."""
        fh = next(self._next)
        self._open[fh] = h
        return fh

    def get(self, fh: int | None) -> OpenWrite | OpenRead | None:
        """The open file of handle ``fh`` (``None`` once released, or for ``None``)."""
        return self._open.get(fh) if fh is not None else None

    def pop(self, fh: int) -> OpenWrite | OpenRead | None:
        """Release handle ``fh``; its open file, or ``None``."""
        return self._open.pop(fh, None)

    def writing(self) -> list[OpenWrite]:
        """The open, unreleased writers (not dropped)."""
        return [h for h in self._open.values() if h.write_mode and h.live]

    def writer_of(self, path: str) -> OpenWrite | None:
        """The open, unreleased writer of ``path``, if any."""
        for h in self._open.values():
            if h.write_mode and h.live and h.path == path:
                return h
        return None

    def readers_of(self, path: str, *, but: int | None = None) -> tuple[int, ...]:
        """The open handles other than ``but`` that read ``path``."""
        return tuple(fh for fh, h in self._open.items() if fh != but and not h.write_mode and h.path == path)

    def writers(self) -> list:
        """The ``GenerationWriter`` of every open file of its own being written (a file of a checkpoint
        uses its checkpoint's)."""
        return [h.writer for h in self._open.values() if h.write_mode and h.writer is not None]
