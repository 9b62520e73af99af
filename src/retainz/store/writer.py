"""The write path: placement execution (:class:`WritePath`), streaming shards (:class:`ShardWriter`)
and generations (:class:`GenerationWriter`).

Per extent the write path asks the allocator once (``place``), executes the decision (finishes the
zones it names, writes at the chosen zone's write pointer) and updates the zone table incrementally.
No journal record and no flush is issued per extent: a generation's extents are buffered in memory
and journaled with its commit record.  Durability order of a commit (a generation exists once its commit record is durable):

1. every data write of the generation is flushed (``device.flush``);
2. the commit record (the generation, its shards and extents, the zone attributes changed since the
   last record) is appended to the journal and flushed;
3. only then does ``commit()`` return.  A generation is committed iff its commit record is durable.

Payload writes are cut into extents of at most :data:`WRITE_BUFFER` bytes (each one device write
with its own crc32c), so a reader verifies every extent before handing out a byte of it.  A
payload-less device (trace replay) takes counted shards (:meth:`GenerationWriter.write_counted_shard`):
sizes without bytes or checksums.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from time import thread_time
from typing import Protocol

import crc32c

from retainz.errors import NoSpaceError, ShardExistsError, ShardSizeError, ZonedDeviceError
from retainz.placement.base import Allocator, Decision, ExtentRequest, ZoneSummary
from retainz.store import contract
from retainz.store.crc import crc32c_combine
from retainz.store.format import check_id
from retainz.store.types import GenerationInfo, GenState, ShardInfo, StoreMetrics
from retainz.store.zonebook import ZoneBook
from retainz.zoned.model import ZoneCond, round_up

__all__ = ["GenerationWriter", "ShardWriter", "WritePath", "WriteUnits", "WRITE_BUFFER"]

#: Bytes per payload extent (one device write, one crc32c): ZenFS's 1 MiB write buffer.
WRITE_BUFFER = 1 << 20
_EMPTY, _FULL, _IO = ZoneCond.EMPTY, ZoneCond.FULL, ZoneCond.IMP_OPEN
#: A shard's further bytes in the open zone it holds: the zone's reclaim step already covers them
#: (set by the decision that gave the shard the zone), and its lifetime class is set.
_KEEP = Decision(None)


class _Collector(Protocol):
    running: bool

    def collect(self, *, force: bool): ...


class WritePath:
    """Places bytes extent by extent and writes them (the one place decisions are executed).

    Args:
        zones: the zone book.
        allocator: the bound placement policy.
        metrics: the store's counters (decisions and their CPU time).
        verify: called before every decision (``verify_summaries``: rebuild and check the cached
            summaries), or ``None``.

    Attributes:
        collector: the store's garbage collector (set by the store): a placement that finds no
            space runs one forced pass before giving up.
    """

    def __init__(self, zones: ZoneBook, allocator: Allocator, metrics: StoreMetrics,
                 verify: Callable[[], None] | None = None):
        self.zones = zones
        self.allocator = allocator
        self.metrics = metrics
        self.verify = verify
        self.collector: _Collector | None = None

    def _execute(self, d: Decision) -> Decision | None:
        """Check a decision against the contract and perform its finishes, also those of a
        decision without a zone (ZenFS finishes zones, then finds no empty one: "Zone allocation
        failure"; the finishes stand)."""
        t = self.zones.table
        name = self.allocator.name
        for f in d.finish:
            if f not in t.open:
                raise ValueError(f"allocator {name} asked to finish zone {f}, which is not an open data zone")
            self.zones.finish(f)
        z = d.zone
        if z is None:
            return None
        s = t.zones.get(z)
        if s is None or s.cond is _FULL:
            raise ValueError(f"allocator {name} chose zone {z}, which is not a data zone with room")
        budget = self.zones.max_active
        if s.cond is _EMPTY and budget and len(t.open) >= budget:
            raise ValueError(f"allocator {name} opened zone {z} beyond the active-zone budget {budget}")
        return d

    def _decide(self, req: ExtentRequest) -> Decision | None:
        if self.verify:
            self.verify()
        t0 = thread_time()
        d = self.allocator.place(req)
        m = self.metrics
        m.decision_cpu_seconds += thread_time() - t0
        m.decisions += 1
        return self._execute(d)

    def _decide_or_gc(self, req: ExtentRequest, d: Decision) -> Decision:
        """Execute ``d``; on no space, one forced GC pass and one more decision.

        Raises:
            NoSpaceError: still no space.  ``cause`` is ``"gc"`` when the GC pass reclaimed
                something (reset a zone or copied bytes) and the policy still found no space,
                else ``"allocation"`` (the policy's own no-space answer stands: nothing reclaimable
                (no dead bytes, no capacity lost to finishes: ``ZoneTable.reclaimable``), or
                its GC rule named nothing it could move); ``state`` is the zone book's
                ``stop_state`` at the refusal.
        """
        d = self._execute(d)
        freed = False
        gc = self.collector
        if d is None and not req.gc and gc is not None and not gc.running and self.zones.table.reclaimable:
            rep = gc.collect(force=True)
            freed = bool(rep.zones_reset or rep.bytes_copied)
            d = self._decide(req)
        if d is None:
            free = self.zones.free()
            raise NoSpaceError(f"no zone can take {req.nbytes} bytes of generation {req.generation!r} "
                               f"({free} bytes free in zones)", needed=req.nbytes, available=free,
                               cause="gc" if freed else "allocation", state=self.zones.stop_state())
        return d

    def _zone(self, gen: GenerationInfo, left: int, gc: bool, pending: int, extents: list,
              keep: bool) -> tuple[int, ZoneSummary, Decision]:
        """The zone the next ``left`` bytes go to: ``(zone, summary, decision)``; a decision asked
        of the policy is counted in the metrics (with its CPU time) even when it ends in no space.

        A per-file policy (``allocator.keeps_file_zone``, e.g. ZenFS: ``ZoneFile::AllocateNewZone``
        runs only on a file's first write and when its active zone is full, fs/io_zenfs.cc) is not
        asked while the shard's current zone (that of its last extent in ``extents``) has room: the
        bytes go there, so a shard costs one decision per zone it spans whether it arrives whole
        (payload-less device) or in 1 MiB buffers (payload device).  GC copies are always placed
        by a decision (``TakeMigrateZone`` per extent)."""
        zones = self.zones.table.zones
        if keep and extents and zones[extents[-1][0]].cond is _IO:
            z = extents[-1][0]
            return z, zones[z], _KEEP
        if self.verify:
            self.verify()
        req = ExtentRequest(left, gen.id, gen.step, gen.hint, self.zones.now, gc, pending)
        t0 = thread_time()
        d = self.allocator.place(req)
        m = self.metrics
        m.decision_cpu_seconds += thread_time() - t0
        m.decisions += 1
        z = d.zone
        s = zones.get(z)
        if s is None or d.finish or (s.cond is not _IO and (
                s.cond is not _EMPTY or (self.zones.max_active
                                         and len(self.zones.table.open) >= self.zones.max_active))):
            d = self._decide_or_gc(req, d)  # finishes, no space, contract errors
            z = d.zone
            s = zones[z]
        return z, s, d

    def write(self, gen: GenerationInfo, data, data_len: int, extents: list, zone_bytes: dict, *,
              gc: bool = False, shard_crc: int | None = None, pending: int = 0,
              claim: bool = False) -> tuple[int, int | None]:
        """Write ``data`` (a bytes-like object, a multiple of the block size, holding ``data_len``
        bytes of shard data then zero padding) at zones the allocator picks; append ``(zone,
        offset, length, crc)`` extents and add to ``zone_bytes`` (zone -> device bytes).  Returns
        ``(device bytes written, shard_crc extended over the data)``.

        Args:
            gc: GC copies (``ExtentRequest.gc``).
            shard_crc: the crc32c of the shard's bytes before these, to extend over the
                ``data_len`` bytes (each byte read once); ``None``: not wanted (GC copies).
            pending: ``ExtentRequest.pending``: bytes of the generation still to come after these.
            claim: ``data`` is a byte count whose bytes another process writes: each extent is
                claimed on the device (:meth:`~retainz.zoned.device.ZonedDevice.claim`) instead of
                written, and carries no crc until that process reports it (:meth:`ShardWriter.claim`).

        Every decision's zone gets ``decision.lifetime`` as its lifetime class when the decision
        opens it, or the generation's ``hint.lifetime`` when that is ``None``.

        Raises:
            NoSpaceError: no zone can take the rest even after a GC pass (extents written so far
                stay in ``extents``).
            ValueError: the allocator broke its contract.
        """
        counted = isinstance(data, int)
        left = total = data if counted else len(data)
        pos = 0
        dev, zsize, now = self.zones.device, self.zones.zone_size, self.zones.now
        on_write = self.zones.table.on_write
        on_fill = self.zones.table.on_fill
        dirty = self.zones.changed.add
        lifetime = gen.hint.lifetime
        keep = self.allocator.keeps_file_zone and not gc
        while left:
            z, s, d = self._zone(gen, left, gc, pending, extents, keep)
            off = s.written
            n = s.capacity - off
            if n > left:
                n = left
            el = n if data_len - pos >= n else data_len - pos
            piece = n if counted else data[pos:pos + n]
            try:
                if claim:
                    dev.claim(z * zsize + off, n)
                else:
                    dev.write(z * zsize + off, piece)
            except ZonedDeviceError:
                self.zones.reconcile_quietly(z)
                raise
            if counted:
                crc = None
            else:
                crc = crc32c.crc32c(piece[:el]) if el < n else crc32c.crc32c(piece)
                if shard_crc is not None:
                    shard_crc = (crc32c_combine(shard_crc, crc, el) if el == WRITE_BUFFER
                                 else crc32c.crc32c(piece[:el], shard_crc))
            lt = d.lifetime
            on_write(z, n, d.reclaim_step, lifetime if lt is None else lt, now)
            if not gc:
                on_fill(z, gen.id)
            dirty(z)
            zone_bytes[z] = zone_bytes.get(z, 0) + n
            extents.append((z, off, el, crc))
            pos += n
            left -= n
        return total, shard_crc

    def shard_written(self, padded: int) -> None:
        """A shard of ``padded`` device bytes was written for a user: host bytes, peak occupancy."""
        m, t = self.metrics, self.zones.table
        m.host_bytes += padded
        occ = t.live + t.dead
        if occ > m.peak_occupancy:
            m.peak_occupancy = occ

    def drop(self, zone_bytes: dict[int, int]) -> None:
        """Bytes written and given up (a failed shard, an aborted generation): dead now; zones
        left with no live data are reset."""
        self.zones.kill(zone_bytes)
        self.zones.reset_dead(zone_bytes)


class _WriterHost(Protocol):
    """What a :class:`GenerationWriter` may call on its store (the store implements it)."""

    lock: threading.RLock
    write_path: WritePath

    def check_open(self) -> None: ...

    def admit(self, w: GenerationWriter, nbytes: int) -> None: ...

    def commit_writer(self, w: GenerationWriter) -> GenerationInfo: ...

    def abort_writer(self, w: GenerationWriter) -> None: ...

    def rename_writer(self, w: GenerationWriter, gen_id: str) -> None: ...


class WriteUnits:
    """A shard's bytes cut into units as they arrive, the write batching of both stores of the
    contract: the in-process :class:`ShardWriter` (a unit of :data:`WRITE_BUFFER` bytes is placed and
    written at a zone's write pointer) and a node service's client (``retainz.node.client``: a unit of
    its batch is claimed in one request and written at the claimed extents).

    Each whole unit goes to ``emit`` as soon as it is complete: a slice of the caller's chunk where
    the chunk holds a whole unit (no copy), else the buffer the pieces were gathered in.  The rest
    waits for the next chunk or :meth:`flush`.

    Args:
        unit: bytes per unit (> 0).
        emit: ``emit(data, n)`` writes one unit: ``data`` (a memoryview) holds ``n`` data bytes, then
            the zero padding of the tail (:meth:`flush`).
        pad: the tail is padded with zeros to a multiple of this many bytes (the block size; 1: not
            padded).
    """

    __slots__ = ("unit", "emit", "pad", "_buf")

    def __init__(self, unit: int, emit: Callable[[memoryview, int], None], *, pad: int = 1):
        self.unit = unit
        self.emit = emit
        self.pad = pad
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes taken and not yet emitted."""
        return len(self._buf)

    def take(self, mv: memoryview) -> None:
        """Take the next bytes (a byte-format memoryview): emit every unit they complete, keep the rest."""
        n, unit = mv.nbytes, self.unit
        buf, pos = self._buf, 0
        if buf:
            pos = min(unit - len(buf), n)
            buf += mv[:pos]
            if len(buf) == unit:
                self._buf = bytearray()
                self.emit(memoryview(buf), unit)
        while n - pos >= unit:
            self.emit(mv[pos:pos + unit], unit)
            pos += unit
        if pos < n:
            self._buf += mv[pos:]

    def flush(self) -> None:
        """Emit the bytes left (the shard's tail, shorter than a unit) padded to :attr:`pad`; nothing
        when none are left."""
        buf = self._buf
        if buf:
            self._buf = bytearray()
            n = len(buf)
            buf += bytes(-n % self.pad)
            self.emit(memoryview(buf), n)

    def drop(self) -> None:
        """Forget the bytes left (an aborted shard)."""
        self._buf = bytearray()


class ShardWriter:
    """One shard being written, push-style: :meth:`write` chunks as they arrive, then :meth:`close`
    (or :meth:`abort`).  Returned by :meth:`GenerationWriter.open_shard`.

    Chunks are written in extents of up to :data:`WRITE_BUFFER` bytes as they arrive; the shard is
    never held in memory whole.  It becomes visible to readers with its generation's commit.
    Until it is closed, GC leaves the zones holding its bytes alone.

    Attributes:
        name: the shard name.  size: the size given at open (``None``: not given).
        written: data bytes taken so far.
    """

    __slots__ = ("_w", "name", "size", "written", "_units", "_crc", "extents", "zone_bytes", "_padded", "_open",
                 "_claims", "_counted")

    def __init__(self, writer: GenerationWriter, name: str, size: int | None):
        self._w = writer
        self.name = name
        self.size = size
        self.written = 0
        self._units = WriteUnits(WRITE_BUFFER, self._put, pad=writer._block_size)
        self._crc = 0                   # the shard's crc32c so far, extended extent by extent
        self.extents: list = []         # written, not yet in any committed shard (live)
        self.zone_bytes: dict[int, int] = {}
        self._padded = 0
        self._open = True
        self._claims = 0                # 0: bytes come through write(); 1: claimed; 2: the tail claimed
        self._counted = 0               # 1: placed by count() (sizes without bytes); 2: its tail counted

    def _put(self, data, data_len: int, claim: bool = False) -> None:
        """Admit and place one unit: ``data`` (bytes-like: written at the write pointer) holding
        ``data_len`` data bytes, or an int of device bytes (claimed with ``claim``, else counted)."""
        w = self._w
        sized = data.__class__ is int
        n = data if sized else len(data)
        w._host.admit(w, n)
        padded, crc = w._host.write_path.write(w.gen, data, data_len, self.extents, self.zone_bytes,
                                               shard_crc=None if sized else self._crc,
                                               pending=w._pending(n), claim=claim)
        if not sized:
            self._crc = crc
        self._padded += padded
        w._placed += n
        w.reserve -= min(n, w.reserve)

    def _grow(self, nbytes: int) -> None:
        """Count ``nbytes`` more data bytes of the shard against its ``size`` and its generation's
        declared size (ShardSizeError)."""
        self.written += nbytes
        if self.size is not None and self.written > self.size:
            raise ShardSizeError(f"shard {self.name!r}: more than the {self.size} bytes given as its size")
        self._w._check_declared(self.name, self.written)

    def _place(self, nbytes: int, claim: bool) -> None:
        """Place ``nbytes`` data bytes without their bytes, in units of :data:`WRITE_BUFFER` as
        :meth:`write` places bytes (each padded to a block): claimed for another process's writer,
        or counted (a payload-less device)."""
        bs, left = self._w._block_size, nbytes
        while left:
            n = min(left, WRITE_BUFFER)
            self._put(round_up(n, bs), n, claim=claim)
            left -= n

    def write(self, chunk: bytes | bytearray | memoryview) -> None:
        """Take the next bytes of the shard.

        Raises:
            ShardSizeError: the shard exceeds its ``size``, or the generation its declared size.
                The shard is aborted (its bytes become dead); the writer stays usable.
            NoSpaceError: no zone could take the data even after GC (the shard is aborted likewise).
            ValueError: the shard is closed.
        """
        w = self._w
        with w._host.lock:
            if not self._open:
                raise ValueError(f"shard {self.name!r} of generation {w.gen.id!r} is closed")
            if self._claims or self._counted:
                raise ValueError(f"shard {self.name!r}: its bytes are claimed for another process or counted; "
                                 "it takes no bytes through write()")
            try:
                mv = memoryview(chunk).cast("B")
                self._grow(mv.nbytes)
                self._units.take(mv)
            except BaseException:
                self._fail()
                raise

    def claim(self, nbytes: int) -> list[tuple[int, int, int]]:
        """Place the next ``nbytes`` data bytes of the shard for a writer in another process, which
        writes them itself (the node service, :mod:`retainz.node`): the allocator places them exactly
        as :meth:`write` would (extents of at most :data:`WRITE_BUFFER` bytes, admission, the zone
        table), the device's write pointers advance over them (``ZonedDevice.claim``), and nothing
        is written here.  The writer reports each extent's crc32c at :meth:`close` (``crcs``).

        A claim that is not a multiple of the block size is the shard's tail (its last extent is
        padded to a block); no claim follows it.  A shard takes claims or bytes, not both.

        Returns:
            the new extents, ``(zone, offset in the zone, data bytes)`` each, in data order: the
            writer puts data byte ``i`` of an extent at device byte ``zone * zone_size + offset + i``.

        Raises:
            ShardSizeError, NoSpaceError: as :meth:`write` (the shard is aborted).
            ZoneOpNotSupportedError: the device cannot be written by another process (the shard is
                aborted).
            ValueError: ``nbytes`` is not a positive int, the tail was claimed, the shard took bytes
                through :meth:`write`, or it is closed.
        """
        w = self._w
        with w._host.lock:
            if not self._open:
                raise ValueError(f"shard {self.name!r} of generation {w.gen.id!r} is closed")
            if nbytes.__class__ is not int or nbytes <= 0:
                raise ValueError(f"shard {self.name!r}: a claim is a positive int of bytes, not {nbytes!r}")
            if self._claims == 2:
                raise ValueError(f"shard {self.name!r}: its tail was claimed; no claim follows it")
            if self.written and not self._claims:
                raise ValueError(f"shard {self.name!r} took bytes through write(); it takes no claims")
            first = len(self.extents)
            try:
                self._claims = 1
                self._grow(nbytes)
                self._place(nbytes, claim=True)
                if nbytes % w._block_size:
                    self._claims = 2
            except BaseException:
                self._fail()
                raise
            return [(e[0], e[1], e[2]) for e in self.extents[first:]]

    def count(self, nbytes: int) -> None:
        """Place the next ``nbytes`` data bytes of the shard without their bytes, on a payload-less
        device (timed trace replay, :mod:`retainz.trace.replay`: a shard written unit by unit while
        other saves are in flight): placed as :meth:`write` and :meth:`claim` place them
        (admission, extents of at most :data:`WRITE_BUFFER` bytes, one allocator decision each),
        no checksum.  A count that is not a
        multiple of the block size is the shard's tail (padded to a block); no count follows it.
        A shard takes counts or bytes, not both; its :class:`ShardInfo` has no crc, like
        :meth:`GenerationWriter.write_counted_shard`.

        Raises:
            ShardSizeError, NoSpaceError: as :meth:`write` (the shard is aborted).
            ValueError: the device keeps payload, ``nbytes`` is not a positive int, the tail was
                counted, the shard took bytes or claims, or it is closed.
        """
        w = self._w
        with w._host.lock:
            if not self._open:
                raise ValueError(f"shard {self.name!r} of generation {w.gen.id!r} is closed")
            if w._payload:
                raise ValueError(f"shard {self.name!r}: counted bytes (sizes without bytes) need a payload-less "
                                 "device; this device keeps payload")
            if nbytes.__class__ is not int or nbytes <= 0:
                raise ValueError(f"shard {self.name!r}: a count is a positive int of bytes, not {nbytes!r}")
            if self._counted == 2:
                raise ValueError(f"shard {self.name!r}: its tail was counted; no count follows it")
            if (self.written or self._claims) and not self._counted:
                raise ValueError(f"shard {self.name!r} took bytes or claims; it takes no counts")
            try:
                self._counted = 1
                self._grow(nbytes)
                self._place(nbytes, claim=False)
                if nbytes % w._block_size:
                    self._counted = 2
            except BaseException:
                self._fail()
                raise

    def close(self, crcs: Sequence[int] | None = None) -> ShardInfo:
        """Write the buffered tail and add the shard to its generation.

        Args:
            crcs: for a claimed shard (:meth:`claim`), the crc32c of every claimed extent's data
                bytes, in order, as the writer computed them over what it wrote; the shard's crc32c
                is combined from them.  ``None`` for a shard that took its bytes through :meth:`write`.

        Raises:
            ShardSizeError: fewer bytes than the ``size`` given (the shard is aborted).
            NoSpaceError: as :meth:`write`.  ValueError: the shard is closed; ``crcs`` missing for a
                claimed shard, given for another, or not one int in 0 .. 2**32 - 1 per claimed extent
                (the shard is aborted).
        """
        w = self._w
        with w._host.lock:
            if not self._open:
                raise ValueError(f"shard {self.name!r} of generation {w.gen.id!r} is closed")
            try:
                if self.size is not None and self.written != self.size:
                    raise ShardSizeError(f"shard {self.name!r}: {self.written} bytes, not the {self.size} "
                                         "given as its size")
                if self._claims or crcs:
                    self._take_crcs(crcs)
                self._units.flush()
            except BaseException:
                self._fail()
                raise
            return w._add_shard(self, ShardInfo(self.name, self.written, None if self._counted else self._crc,
                                                tuple(self.extents)), self._padded)

    def _take_crcs(self, crcs) -> None:
        """Give the claimed extents the crcs their writer reported and combine the shard's crc."""
        ext = self.extents
        if not self._claims:
            raise ValueError(f"shard {self.name!r} took its bytes through write(); it takes no crcs")
        if crcs is None or len(crcs) != len(ext):
            got = "none" if crcs is None else len(crcs)
            raise ValueError(f"shard {self.name!r}: {len(ext)} claimed extents need as many crcs, not {got}")
        crc = 0
        out = []
        for e, c in zip(ext, crcs, strict=True):
            if c.__class__ is not int or not 0 <= c < 1 << 32:
                raise ValueError(f"shard {self.name!r}: a crc32c is an int in 0 .. 2**32 - 1, not {c!r}")
            crc = crc32c_combine(crc, c, e[2]) if out else c
            out.append((e[0], e[1], e[2], c))
        self.extents = out
        self._crc = crc

    def abort(self) -> None:
        """Drop the shard: its bytes become dead.  A no-op on a closed shard."""
        with self._w._host.lock:
            if self._open:
                self._fail()

    def _fail(self) -> None:
        self._open = False
        self._w._shard_failed(self)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._open:
            return
        if exc_type is None:
            self.close()
        else:
            self.abort()


class GenerationWriter:
    """Writes one generation.  Returned by :meth:`Store.begin_generation`.

    Call sequence: shards (``write_shard`` streamed from an iterable, ``open_shard`` pushed chunk by
    chunk, or ``write_counted_shard`` on a payload-less device) any number of times, then exactly one
    of ``commit()`` or ``abort()``.  Several writers may be open at once (overlapping async saves);
    every call takes the store's lock, so readers never see a generation before its commit record
    is durable.  As a context manager it commits on a normal exit and aborts on an exception.

    Attributes:
        gen: the :class:`GenerationInfo` being written (state ``WRITING`` until committed).
        declared_size: bytes declared at admission (``None``: none declared).
        reserve: bytes of the admission reservation not yet written (a generation declared
            without a size reserves as its bytes arrive: ``Store.admit``).
        journal_estimate: snapshot bytes reserved in the journal for the generation (an estimate).
        zone_bytes: ``{zone: device bytes}`` of the generation's closed shards.
        in_doubt: its commit failed after its record may have reached the device and could not be
            withdrawn (``Store._withdraw_commit``): its zones are kept at its abort.
        joined: always false: no other process shares a generation of an in-process store (the store
            contract's attribute; a served device's ranks do: ``NodeGenerationWriter``).
    """

    joined = False

    def __init__(self, host: _WriterHost, gen: GenerationInfo, declared_size: int | None, *, reserve: int,
                 journal_estimate: int, block_size: int, payload: bool):
        self._host = host
        self.gen = gen
        self.declared_size = declared_size
        self.reserve = reserve
        self.journal_estimate = journal_estimate
        self.zone_bytes: dict[int, int] = {}
        self._need = round_up(declared_size, block_size) if declared_size else 0
        self._data = 0        # shard bytes of closed shards
        self._placed = 0      # device bytes placed so far (open shards included)
        self._block_size = block_size
        self._payload = payload
        self._open: list[ShardWriter] = []
        self.in_doubt = False

    @property
    def id(self) -> str:
        return self.gen.id

    @property
    def state(self) -> GenState:
        return self.gen.state

    @property
    def open_shards(self) -> list[ShardWriter]:
        """Shards opened and not yet closed or aborted."""
        return list(self._open)

    def _pending(self, n: int) -> int:
        """``ExtentRequest.pending`` for the next ``n`` bytes: declared bytes still to come after them."""
        return max(0, self._need - self._placed - n)

    def _check_writing(self) -> None:
        self._host.check_open()
        if self.gen.state is not GenState.WRITING:
            raise ValueError(f"generation {self.gen.id!r} is {self.gen.state.value}, not writing")

    def _check_declared(self, name: str, shard_bytes: int) -> None:
        total = self._data + sum(s.written for s in self._open if s.name != name) + shard_bytes
        if self.declared_size is not None and total > self.declared_size:
            raise ShardSizeError(f"generation {self.gen.id!r}: shard {name!r} brings it to {total} "
                                 f"bytes, more than the {self.declared_size} declared")

    def _check_name(self, name: str, size: int | None) -> None:
        check_id(name, "shard name")
        if name in self.gen.shards or any(s.name == name for s in self._open):
            raise ShardExistsError(f"generation {self.gen.id!r} already has a shard {name!r}")
        if size is not None and (not isinstance(size, int) or size < 0):
            raise ValueError(f"shard {name!r}: size must be a non-negative int, not {size!r}")

    def open_shard(self, name: str, *, size: int | None = None) -> ShardWriter:
        """Open a shard for push-style writing (:class:`ShardWriter`).

        Args:
            name: shard name (same rules as generation ids: :func:`retainz.store.format.check_id`).
            size: the shard's length in bytes, if known; the chunks must add up to exactly it.

        Raises:
            InvalidIdError: a bad name.  ShardExistsError (a ValueError): a duplicate name.
                ValueError: a negative size, or a writer that is no longer writing.
        """
        with self._host.lock:
            self._check_writing()
            self._check_name(name, size)
            s = ShardWriter(self, name, size)
            self._open.append(s)
            return s

    def write_shard(self, name: str, chunks: Iterable[bytes | bytearray | memoryview], *,
                    size: int | None = None) -> ShardInfo:
        """Stream one shard into the store from an iterable of bytes-like chunks; returns its
        :class:`ShardInfo` (extents, crc32c).  See :meth:`open_shard` and :class:`ShardWriter`.

        Raises:
            InvalidIdError: a bad name.
            ShardSizeError: the chunks exceed ``size`` (or fall short of it), or the generation
                exceeds its ``declared_size``.  The shard's bytes written so far become dead; the
                writer stays usable.
            NoSpaceError: no zone could take the data even after GC (the shard is dropped likewise).
            ValueError: a duplicate shard name, a negative size, or a writer that is no longer
                writing.
        """
        return contract.write_shard(self, name, chunks, size=size)

    def write_counted_shard(self, name: str, size: int) -> ShardInfo:
        """Place a shard of ``size`` bytes without its bytes (a payload-less device: trace replay).
        The shard carries no checksum.

        Raises:
            ValueError: the device keeps payload, a bad size, a duplicate name.  InvalidIdError,
                ShardSizeError, NoSpaceError: as :meth:`write_shard`.
        """
        with self._host.lock:
            self._check_writing()
            self._check_name(name, size)
            if size is None:
                raise ValueError(f"shard {name!r}: a counted shard needs its size")
            if self._payload:
                raise ValueError(f"shard {name!r}: a counted shard (size without bytes) needs a payload-less "
                                 "device; this device keeps payload")
            self._check_declared(name, size)
            s = ShardWriter(self, name, size)
            s.written = size
            self._open.append(s)
            padded = round_up(size, self._block_size)
            try:
                if padded:
                    self._host.admit(self, padded)
                    s._padded = self._host.write_path.write(self.gen, padded, size, s.extents, s.zone_bytes,
                                                            pending=self._pending(padded))[0]
                    self._placed += padded
                    self.reserve -= min(padded, self.reserve)
            except BaseException:
                s._fail()
                raise
            return self._add_shard(s, ShardInfo(name, size, None, tuple(s.extents)), padded)

    # -- what the shards report --------------------------------------------------------------------------
    def _add_shard(self, s: ShardWriter, info: ShardInfo, padded: int) -> ShardInfo:
        s._open = False
        self._open.remove(s)
        self._data += info.size
        zb = self.zone_bytes
        for z, n in s.zone_bytes.items():
            zb[z] = zb.get(z, 0) + n
        self.gen.shards[info.name] = info
        wp = self._host.write_path
        wp.shard_written(padded)
        if self.declared_size is not None and not self._open and self._data >= self.declared_size:
            wp.zones.table.on_group_end(self.gen.id)   # every declared byte written: it writes no more
        return info

    def _shard_failed(self, s: ShardWriter) -> None:
        if s in self._open:
            self._open.remove(s)
        self._host.write_path.drop(s.zone_bytes)

    # -- the generation -----------------------------------------------------------------------------------
    def commit(self) -> GenerationInfo:
        """Make the generation durable and visible: flush its data, then append and flush its commit
        record (see the module docstring).

        Raises:
            NoSpaceError: the commit record does not fit the journal, or the journal could not
                also hold the records that delete everything (see ``Store.begin_generation``);
                the generation stays uncommitted and can be aborted.
            ValueError: the writer is not writing (already committed or aborted), or a shard is still
                open.
        """
        with self._host.lock:
            if self._open:
                raise ValueError(f"generation {self.gen.id!r}: shard {self._open[0].name!r} is still open; "
                                 "close or abort it before the commit")
            return self._host.commit_writer(self)

    def rename(self, gen_id: str) -> None:
        """Give the uncommitted generation another id (a file renamed while it was being written keeps
        its data where it is and commits under its final name).  Nothing is journaled: the id is written
        with the commit record.

        Raises:
            InvalidIdError: a bad id.  GenerationExistsError: ``gen_id`` is being written or committed.
            ValueError: the writer is not writing.
        """
        with self._host.lock:
            self._check_writing()
            self._host.rename_writer(self, gen_id)

    def leave(self) -> None:
        """Let go of the generation (the store contract's call for a writer other processes joined:
        ``NodeGenerationWriter.leave``).  This writer is never joined (:attr:`joined`): the last to
        leave without a commit aborts, and this caller is the only one, so it aborts."""
        self.abort()

    def abort(self) -> None:
        """Drop the generation: its bytes become dead and zones left with no live data are reset.
        Nothing is journaled (after a crash an uncommitted generation is garbage anyway).  A no-op
        on an aborted writer."""
        with self._host.lock:
            if self.gen.state is GenState.WRITING:
                for s in list(self._open):
                    s.abort()
            self._host.abort_writer(self)

    def __enter__(self) -> GenerationWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        contract.exit_writing(self, exc_type is not None)

    def __repr__(self) -> str:
        return f"GenerationWriter({self.gen.id!r}, step={self.gen.step}, {self.gen.state.value})"
