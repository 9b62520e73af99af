"""The write path: :class:`GenerationWriter`, placement execution, commit and abort.

Per extent the store asks the allocator once (``place``), executes the decision (finishes the zones
it names, writes at the chosen zone's write pointer) and updates the zone table incrementally.  No
journal record and no flush is issued per extent: a generation's extents are buffered in memory and
journaled with its commit record.  Durability order of a commit (DESIGN.md principle 5):

1. every data write of the generation is flushed (``device.flush``);
2. the commit record (the generation, its shards and extents, the zone attributes changed since the
   last record) is appended to the journal and flushed;
3. only then does ``commit()`` return.  A generation is committed iff its commit record is durable.

Payload writes are cut into extents of at most :data:`WRITE_BUFFER` bytes (each one device write
with its own crc32c), so a reader verifies every extent before handing out a byte of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from time import thread_time

import crc32c

from retainz.errors import NoSpaceError, ShardSizeError
from retainz.placement.base import Decision, ExtentRequest
from retainz.store.catalog import dumps, encode_gen
from retainz.store.crc import crc32c_combine
from retainz.store.format import check_id, round_up
from retainz.store.types import GenerationInfo, GenState, ShardInfo
from retainz.zoned.model import ZoneCond

__all__ = ["GenerationWriter", "WRITE_BUFFER", "WriteMixin"]

#: Bytes per payload extent (one device write, one crc32c): ZenFS's 1 MiB write buffer.
WRITE_BUFFER = 1 << 20
_EMPTY, _FULL, _IO = ZoneCond.EMPTY, ZoneCond.FULL, ZoneCond.IMP_OPEN
#: A shard's further bytes in the open zone it holds: the zone's reclaim step already covers them
#: (set by the decision that gave the shard the zone), and its lifetime class is set.
_KEEP = Decision(None)


class GenerationWriter:
    """Writes one generation.  Returned by :meth:`Store.begin_generation`.

    Call sequence: ``write_shard`` any number of times (one shard per call, streamed), then exactly
    one of ``commit()`` or ``abort()``.  Several writers may be open at once (overlapping async
    saves); every call takes the store's lock, so readers never see a generation before its commit
    record is durable.  As a context manager it commits on a normal exit and aborts on an exception.

    Attributes:
        gen: the :class:`GenerationInfo` being written (state ``WRITING`` until committed).
        declared_size: bytes declared at admission (``None``: none declared).
    """

    __slots__ = ("_store", "gen", "declared_size", "_reserve", "_data", "_zone_bytes", "_need", "_placed",
                 "_jest")

    def __init__(self, store, gen: GenerationInfo, declared_size: int | None, reserve: int):
        self._store = store
        self.gen = gen
        self.declared_size = declared_size
        self._reserve = reserve        # bytes of the admission reservation not yet written
        self._data = 0                 # shard bytes written so far
        self._zone_bytes: dict[int, int] = {}  # zone -> device bytes this generation holds there
        self._need = reserve           # the declared size, block-rounded (0: none declared)
        self._placed = 0               # device bytes placed for the generation so far
        self._jest = 0                 # snapshot bytes reserved in the journal (an estimate)

    @property
    def id(self) -> str:
        return self.gen.id

    @property
    def state(self) -> GenState:
        return self.gen.state

    def write_shard(self, name: str, chunks: Iterable[bytes | bytearray | memoryview] | None = None, *,
                    size: int | None = None) -> ShardInfo:
        """Stream one shard into the store; returns its :class:`ShardInfo` (extents, crc32c).

        The shard is never held in memory whole: chunks are written in extents of up to 1 MiB as
        they arrive.  It becomes visible to readers with the generation's commit.

        Args:
            name: shard name (same rules as generation ids: :func:`retainz.store.format.check_id`).
            chunks: the shard's bytes, in order (any bytes-like objects).  ``None`` together with
                ``size=`` on a payload-less device (``info.payload`` False) writes a counted shard
                with no checksum (trace replay).
            size: the shard's length in bytes, if known; the chunks must add up to exactly it.

        Raises:
            InvalidIdError: a bad name.
            ShardSizeError: the chunks exceed ``size`` (or fall short of it), or the generation
                exceeds its ``declared_size``.  The shard's bytes written so far become dead; the
                writer stays usable.
            NoSpaceError: no zone could take the data even after GC (the shard is dropped likewise).
            ValueError: a duplicate shard name, a negative size, ``size`` without chunks on a device
                that keeps payload, or a writer that is no longer writing.
        """
        return self._store._write_shard(self, name, chunks, size)

    def commit(self) -> GenerationInfo:
        """Make the generation durable and visible: flush its data, then append and flush its commit
        record (see the module docstring).

        Raises:
            NoSpaceError: the commit record does not fit the journal, or the journal could not
                also hold the records that delete everything (see ``Store.begin_generation``);
                the generation stays uncommitted and can be aborted.
            ValueError: the writer is not writing (already committed or aborted).
        """
        return self._store._commit(self)

    def abort(self) -> None:
        """Drop the generation: its bytes become dead and zones left with no live data are reset.
        Nothing is journaled (after a crash an uncommitted generation is garbage anyway).  A no-op
        on an aborted writer."""
        self._store._abort(self)

    def __enter__(self) -> GenerationWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.gen.state is not GenState.WRITING:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def __repr__(self) -> str:
        return f"GenerationWriter({self.gen.id!r}, step={self.gen.step}, {self.gen.state.value})"


class WriteMixin:
    """Write-path methods of :class:`~retainz.store.store.Store` (state lives on the store)."""

    # -- placement -----------------------------------------------------------------------------------
    def _decide(self, gen: GenerationInfo, nbytes: int, gc: bool, pending: int = 0) -> Decision | None:
        """Ask the allocator where ``nbytes`` go and execute its finishes; ``None`` = no space."""
        if self._verify:
            self._rebuild_summaries()
        t0 = thread_time()
        d = self.allocator.place(ExtentRequest(nbytes, gen.id, gen.step, gen.hint, self._now, gc, pending))
        m = self.metrics
        m.decision_cpu_seconds += thread_time() - t0
        m.decisions += 1
        return self._execute(d)

    def _execute(self, d: Decision) -> Decision | None:
        """Check a decision against the contract and perform its finishes, also those of a
        decision without a zone (ZenFS finishes zones, then finds no empty one: "Zone allocation
        failure"; the finishes stand)."""
        for f in d.finish:
            self._finish_zone(f)
        z = d.zone
        if z is None:
            return None
        s = self.table.zones.get(z)
        if s is None or s.cond is _FULL:
            raise ValueError(f"allocator {self.allocator.name} chose zone {z}, which is not a data zone "
                             "with room")
        if s.cond is _EMPTY and self._max_active and len(self.table.open) >= self._max_active:
            raise ValueError(f"allocator {self.allocator.name} opened zone {z} beyond the active-zone "
                             f"budget {self._max_active}")
        return d

    def _decide_or_gc(self, gen: GenerationInfo, nbytes: int, gc: bool, d: Decision | None = None,
                      pending: int = 0) -> Decision:
        """Execute ``d`` (or ask for one); on no space, one forced GC pass and one more decision.

        Raises:
            NoSpaceError: still no space.  ``cause`` is ``"gc"`` when the GC pass reclaimed
                something (reset a zone or copied bytes) and the policy still found no space,
                else ``"allocation"`` (the policy's own no-space answer stands: no dead bytes, or
                its GC rule named nothing it could move); ``state`` is :meth:`stop_state` at the
                refusal.
        """
        d = self._decide(gen, nbytes, gc, pending) if d is None else self._execute(d)
        freed = False
        if d is None and not gc and not self._in_gc:
            if self.table.dead:
                rep = self._gc(force=True)
                freed = bool(rep.zones_reset or rep.bytes_copied)
                d = self._decide(gen, nbytes, gc, pending)
        if d is None:
            raise NoSpaceError(f"no zone can take {nbytes} bytes of generation {gen.id!r} "
                               f"({self._free()} bytes free in zones)", needed=nbytes,
                               available=self._free(), cause="gc" if freed else "allocation",
                               state=self.stop_state())
        return d

    def _finish_zone(self, z: int) -> None:
        s = self.table.zones.get(z)
        if s is None or z not in self.table.open:
            raise ValueError(f"allocator {self.allocator.name} asked to finish zone {z}, which is not "
                             "an open data zone")
        self.device.finish_zone(z)
        self.metrics.finishes += 1
        self.metrics.unused_capacity_bytes += s.capacity - s.written
        self.table.on_finish(z)
        self._dirty.add(z)

    def _put(self, gen: GenerationInfo, data, data_len: int, extents: list, zone_bytes: dict,
             gc: bool, acc: list | None = None, pending: int = 0) -> int:
        """Write ``data`` (bytes-like of a block multiple, or an int count) at zones the allocator
        picks; append ``(zone, offset, length, crc)`` extents.  Returns device bytes written.
        ``acc[0]``, if given, accumulates the crc32c of the data (the shard's), each byte read once.
        ``pending`` is ``ExtentRequest.pending``: bytes of the generation still to come after
        these (constant over the call: what one piece places, ``nbytes`` loses).

        Every decision's zone gets ``decision.lifetime`` as its lifetime class when the decision
        opens it, or the generation's ``hint.lifetime`` when that is ``None``.

        A per-file policy (``allocator.keeps_file_zone``, e.g. ZenFS: ``ZoneFile::AllocateNewZone``
        runs only on a file's first write and when its active zone is full, fs/io_zenfs.cc) is not
        asked while the shard's current zone (that of its last extent in ``extents``) has room:
        the bytes go there, so a shard costs one decision per zone it spans whether it arrives
        whole (payload-less device) or in 1 MiB buffers (payload device).  GC copies are always
        placed by a decision (``TakeMigrateZone`` per extent).

        The hot path of trace replay: one ``place`` call, one device write and one table update per
        extent, nothing proportional to the number of zones."""
        counted = data.__class__ is int
        left = data if counted else len(data)
        total = left
        pos = 0
        table, dev, zsize, dirty = self.table, self.device, self._zsize, self._dirty
        zones, opened = table.zones, table.open
        max_active = self._max_active
        gid, step, hint, now = gen.id, gen.step, gen.hint, self._now
        lifetime = hint.lifetime
        place = self.allocator.place
        on_write = table.on_write
        verify = self._verify
        m = self.metrics
        cpu = 0.0
        ndec = 0
        keep = self.allocator.keeps_file_zone and not gc
        try:
            while left:
                if keep and extents and zones[extents[-1][0]].cond is _IO:
                    z = extents[-1][0]        # the shard keeps its zone while it has room
                    s = zones[z]
                    d = _KEEP
                else:
                    if verify:
                        self._rebuild_summaries()
                    t0 = thread_time()
                    d = place(ExtentRequest(left, gid, step, hint, now, gc, pending))
                    cpu += thread_time() - t0
                    ndec += 1
                    z = d.zone
                    s = zones.get(z)
                    if s is None or d.finish or (s.cond is not _IO and (
                            s.cond is not _EMPTY or (max_active and len(opened) >= max_active))):
                        d = self._decide_or_gc(gen, left, gc, d, pending)  # finishes, no space, errors
                        z = d.zone
                        s = zones[z]
                off = s.written
                n = s.capacity - off
                if n > left:
                    n = left
                if counted:
                    el = n if data_len - pos >= n else data_len - pos
                    dev.write(z * zsize + off, n)
                    crc = None
                else:
                    el = n if data_len - pos >= n else data_len - pos
                    piece = data[pos:pos + n]
                    dev.write(z * zsize + off, piece)
                    crc = crc32c.crc32c(piece[:el]) if el < n else crc32c.crc32c(piece)
                    if acc is not None:
                        acc[0] = (crc32c_combine(acc[0], crc, el) if el == WRITE_BUFFER
                                  else crc32c.crc32c(piece[:el], acc[0]))
                lt = d.lifetime
                on_write(z, n, d.reclaim_step, lifetime if lt is None else lt, now)
                dirty.add(z)
                zone_bytes[z] = zone_bytes.get(z, 0) + n
                extents.append((z, off, el, crc))
                pos += n
                left -= n
        finally:
            m.decision_cpu_seconds += cpu
            m.decisions += ndec
        return total

    # -- shards ------------------------------------------------------------------------------------
    def _write_shard(self, w: GenerationWriter, name: str, chunks, size: int | None) -> ShardInfo:
        with self._lock:
            self._check_open()
            gen = w.gen
            if gen.state is not GenState.WRITING:
                raise ValueError(f"generation {gen.id!r} is {gen.state.value}, not writing")
            check_id(name, "shard name")
            if name in gen.shards:
                raise ValueError(f"generation {gen.id!r} already has a shard {name!r}")
            if size is not None and (not isinstance(size, int) or size < 0):
                raise ValueError(f"shard {name!r}: size must be a non-negative int, not {size!r}")
            extents: list = []
            zb: dict[int, int] = {}
            self._partial = zb  # GC must not collect zones holding this shard's bytes
            self._inflight.append(extents)  # recompute_table counts them (live, not yet in a shard)
            try:
                if chunks is None:
                    if size is None:
                        raise ValueError(f"shard {name!r}: give chunks, or size= on a payload-less device")
                    if self.device.info.payload:
                        raise ValueError(f"shard {name!r}: size= without chunks needs a payload-less "
                                         f"device; {self.device!r} keeps payload")
                    self._check_declared(w, name, size)
                    padded = round_up(size, self._bs)
                    if padded:
                        self._put(gen, padded, size, extents, zb, False,
                                  pending=max(0, w._need - w._placed - padded))
                        w._placed += padded
                    total, crc = size, None
                else:
                    total, crc, padded = self._write_stream(w, name, chunks, size, extents, zb)
            except BaseException:
                self._partial = None
                self._inflight.remove(extents)
                self._drop_partial(zb)
                raise
            self._partial = None
            self._inflight.remove(extents)
            w._data += total
            self._take_reserve(w, padded)
            self.metrics.host_bytes += padded
            wz = w._zone_bytes
            for z, n in zb.items():
                wz[z] = wz.get(z, 0) + n
            shard = ShardInfo(name, total, crc, tuple(extents))
            gen.shards[name] = shard
            occ = self.table.live + self.table.dead
            if occ > self.metrics.peak_occupancy:
                self.metrics.peak_occupancy = occ
            return shard

    def _check_declared(self, w: GenerationWriter, name: str, total: int) -> None:
        if w.declared_size is not None and w._data + total > w.declared_size:
            raise ShardSizeError(f"generation {w.gen.id!r}: shard {name!r} brings it to {w._data + total} "
                                 f"bytes, more than the {w.declared_size} declared")

    def _write_stream(self, w: GenerationWriter, name: str, chunks, size: int | None, extents: list,
                      zb: dict) -> tuple[int, int, int]:
        bs, wbuf, gen = self._bs, WRITE_BUFFER, w.gen
        buf = bytearray()
        total = padded = 0
        acc = [0]   # the shard's crc32c, accumulated extent by extent
        for chunk in chunks:
            mv = memoryview(chunk).cast("B")
            n = mv.nbytes
            total += n
            if size is not None and total > size:
                raise ShardSizeError(f"shard {name!r}: more than the {size} bytes given as its size")
            self._check_declared(w, name, total)
            pos = 0
            if buf:
                pos = min(wbuf - len(buf), n)
                buf += mv[:pos]
                if len(buf) == wbuf:
                    padded += self._put(gen, buf, wbuf, extents, zb, False, acc,
                                        max(0, w._need - w._placed - wbuf))
                    w._placed += wbuf
                    buf = bytearray()
            while n - pos >= wbuf:
                padded += self._put(gen, mv[pos:pos + wbuf], wbuf, extents, zb, False, acc,
                                    max(0, w._need - w._placed - wbuf))
                w._placed += wbuf
                pos += wbuf
            if pos < n:
                buf += mv[pos:]
        if size is not None and total != size:
            raise ShardSizeError(f"shard {name!r}: {total} bytes, not the {size} given as its size")
        if buf:
            data_len = len(buf)
            buf += bytes(-data_len % bs)
            padded += self._put(gen, buf, data_len, extents, zb, False, acc,
                                max(0, w._need - w._placed - len(buf)))
            w._placed += len(buf)
        return total, acc[0], padded

    def _drop_partial(self, zb: dict[int, int]) -> None:
        """A shard failed part-way: its bytes are dead now; reset zones left all dead."""
        for z, n in zb.items():
            self.table.on_kill(z, n)
        self._reset_dead(zb)

    def _take_reserve(self, w: GenerationWriter, n: int) -> None:
        take = min(n, w._reserve)
        w._reserve -= take
        self._reserved -= take

    # -- commit / abort ----------------------------------------------------------------------------
    def _commit(self, w: GenerationWriter) -> GenerationInfo:
        with self._lock:
            self._check_open()
            gen = w.gen
            if gen.state is not GenState.WRITING:
                raise ValueError(f"generation {gen.id!r} is {gen.state.value}: cannot commit it")
            gen.commit_seq = self.catalog.commit_seq + 1
            item = dumps(encode_gen(gen)).encode()
            n = len(item) + 1
            try:
                if n + 256 > self.journal.max_record:    # the append would refuse it: say so first
                    raise NoSpaceError(f"journal record of about {n} bytes (generation {gen.id!r}) does not "
                                       f"fit a meta zone ({self.journal.max_record} bytes)",
                                       needed=n, available=self.journal.max_record, cause="journal")
                self._check_journal(n, f"commit of generation {gen.id!r}", exclude=w)
                self.device.flush()
                self._append("c", {"now": self._now}, raw=b'"g":' + item)
            except BaseException:
                gen.commit_seq = 0
                raise
            gen.state = GenState.COMMITTED
            self.catalog.add(gen)
            self._jgen[gen.id] = n
            self._jgen_total += n
            if n > self._jbig:
                self._jbig = n
            self._end_writer(w)
            self.metrics.generations_committed += 1
            return gen

    def _abort(self, w: GenerationWriter) -> None:
        with self._lock:
            gen = w.gen
            if gen.state is not GenState.WRITING:
                if gen.state is GenState.ABORTED:
                    return
                raise ValueError(f"generation {gen.id!r} is {gen.state.value}: cannot abort it")
            gen.state = GenState.ABORTED
            self._end_writer(w)
            if self._closed:
                return
            for z, n in w._zone_bytes.items():
                self.table.on_kill(z, n)
            self._reset_dead(w._zone_bytes)
            self.metrics.generations_aborted += 1

    def _end_writer(self, w: GenerationWriter) -> None:
        self._reserved -= w._reserve
        w._reserve = 0
        self._jreserved -= w._jest
        w._jest = 0
        self._writers.pop(w.gen.id, None)
