"""The :class:`Store` front object: format, open, the generation/delete API and shared bookkeeping.

The read path lives in :mod:`.reader`, the write path in :mod:`.writer`, garbage collection in
:mod:`.gc`, mount and recovery in :mod:`.recovery`, fsck and df in :mod:`.check`; they are mixins
over the state kept here.
"""

from __future__ import annotations

import threading
import uuid as uuidlib
import weakref

from retainz.errors import (
    ForeignDeviceError,
    GenerationExistsError,
    GenerationNotFoundError,
    NoSpaceError,
    ReadOnlyStoreError,
    StoreLockedError,
)
from retainz.hint import Hint
from retainz.placement import make_allocator
from retainz.placement.base import ZoneSummary, ZoneTable
from retainz.store.catalog import dumps, encode
from retainz.store.check import CheckMixin
from retainz.store.format import Superblock, check_id, round_up
from retainz.store.gc import GCMixin
from retainz.store.journal import (
    MAX_META_ZONES,
    default_meta_zones,
    frame,
)
from retainz.store.journal_space import JournalSpaceMixin
from retainz.store.reader import ReadMixin
from retainz.store.recovery import RecoveryMixin
from retainz.store.types import GenerationInfo, GenState, StoreMetrics
from retainz.store.writer import GenerationWriter, WriteMixin
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import ZoneCond

_FULL = ZoneCond.FULL

__all__ = ["Store", "GenerationWriter"]

#: Stores open in this process, by device path (or device identity for a path-less device).  Weak
#: values: a store dropped without close() no longer counts, and an id() is never reused while its
#: store (which holds the device) is alive.
_OPEN_STORES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_OPEN_LOCK = threading.Lock()


def _release(key, store) -> None:
    with _OPEN_LOCK:
        if _OPEN_STORES.get(key) is store:
            del _OPEN_STORES[key]


def _device_key(device: ZonedDevice):
    return device.info.path or id(device)


def superblock_zones(device: ZonedDevice) -> list[int]:
    """Indices of the zones that start with a RetainZ superblock (magic ``RETAINZS``): non-empty
    means the device holds a store.  Only the first ``MAX_META_ZONES`` non-empty zones are read
    (a store's meta zones come first); zones with nothing written are skipped.

    Raises:
        ZonedDeviceError: a read the device refuses.
    """
    bs = device.geometry.block_size
    used = [z for z in device.report_zones() if z.cond != ZoneCond.EMPTY][:MAX_META_ZONES]
    return [z.index for z in used if z.wp > z.start and Superblock.has_magic(device.read(z.start, bs))]


class Store(ReadMixin, WriteMixin, GCMixin, RecoveryMixin, CheckMixin, JournalSpaceMixin):
    """A checkpoint store on a zoned device.

    Create one with :meth:`format` or :meth:`open` (never the constructor).  Call sequence::

        store = Store.open(device)                 # replays the journal, recovers
        w = store.begin_generation(id, step, hint=..., declared_size=...)   # admission
        w.write_shard(name, chunks); ...; w.commit()  # or w.abort()
        store.generations(); store.read_shard(id, name)
        store.advance(step); store.delete(id)       # retire; all-dead zones are reset
        store.gc()                                  # copying GC when empty zones < reserve
        store.close()

    Thread safety: every public method takes one ``threading.RLock``; several writers may be open
    at once, and a reader thread sees only committed generations.

    Attributes:
        device: the zoned device.
        table: the :class:`~retainz.placement.base.ZoneTable` of data-zone summaries (maintained
            incrementally; equal to :meth:`recompute_table` after every operation).
        allocator: the placement policy (selected by name, ``policy=``).
        metrics: :class:`~retainz.store.types.StoreMetrics`.
        uuid: the store's identity.
        meta_zones: meta zones at the start of the device.
        gc_reserve_zones: GC runs when fewer data zones than this are empty; admission keeps
            :attr:`admission_reserve_zones` (the policy's share of it) free.
        policy: the allocator spec in use.
        recovery: what the last open found and did (a :class:`~retainz.store.recovery.RecoveryReport`).
    """

    # -- creation ----------------------------------------------------------------------------------
    def __init__(self, *_args, **_kw):
        raise TypeError("use Store.format(device) or Store.open(device)")

    @classmethod
    def format(cls, device: ZonedDevice, *, meta_zones: int | None = None, policy: str = "greedy",
               gc_reserve_zones: int = 2, force: bool = False, verify_summaries: bool = False) -> Store:
        """Write a fresh, empty store on ``device`` and open it.

        Args:
            device: the zoned device (all zones empty, or ``force``).
            meta_zones: zones reserved for the journal (2 .. 64; ZenFS uses 3).  A rollover needs
                the snapshot to fit the meta zones the current chain does not use, so more meta
                zones allow a bigger catalog (admission keeps the journal able to delete
                everything: :meth:`begin_generation`).  ``None`` picks the count from the geometry
                (:func:`~retainz.store.journal.default_meta_zones`: 3 for large zones, more for
                many small zones).
            policy: allocator spec ``NAME[:param=value,...]`` (recorded in the superblock).
            gc_reserve_zones: copying GC starts when fewer data zones than this are empty; admission
                keeps this many zones' capacity free for it.
            force: reset every zone first, whatever it holds.
            verify_summaries: see :meth:`open`.

        Raises:
            ForeignDeviceError: a zone is not empty and ``force`` is False (the message says whether
                it already holds a RetainZ store).  Nothing is written.
            ValueError: an unknown policy, a device the policy refuses (``Allocator.check_device``:
                ZenFS needs 32 zones), or a geometry too small (fewer than meta zones + reserve
                + 2 zones, zone capacity under 4 blocks, max active zones under 2).
        """
        g = device.geometry
        make_allocator(policy).check_device(g.nr_zones)
        if meta_zones is None:
            meta_zones = default_meta_zones(g.nr_zones, g.zone_capacity, g.block_size, gc_reserve_zones)
        if not 2 <= meta_zones <= MAX_META_ZONES:
            raise ValueError(f"meta_zones must be 2..{MAX_META_ZONES}, not {meta_zones}")
        if gc_reserve_zones < 0:
            raise ValueError(f"gc_reserve_zones cannot be negative ({gc_reserve_zones})")
        if g.nr_zones < meta_zones + gc_reserve_zones + 2:
            raise ValueError(f"the device has {g.nr_zones} zones; a store needs at least "
                             f"{meta_zones + gc_reserve_zones + 2} ({meta_zones} meta, {gc_reserve_zones} "
                             "GC reserve, 2 data)")
        if g.zone_capacity < 4 * g.block_size:
            raise ValueError(f"zone capacity {g.zone_capacity} is under 4 blocks: too small for a journal")
        if g.max_active and g.max_active < 2:
            raise ValueError("the device allows fewer than 2 active zones (one is the journal's)")
        zones = device.report_zones()
        used = [z.index for z in zones if z.cond != ZoneCond.EMPTY]
        if used and not force:
            ours = superblock_zones(device)
            if ours:
                raise ForeignDeviceError(f"{device!r} already holds a RetainZ store (superblock in zone "
                                         f"{ours[0]}); pass force=True (--force) to erase it")
            raise ForeignDeviceError(f"{device!r} holds data RetainZ does not recognise ({len(used)} "
                                     f"non-empty zones, first {used[0]}); pass force=True (--force) to "
                                     "erase it")
        for z in used:
            device.reset_zone(z)
        sb = Superblock(uuid=uuidlib.uuid4(), sequence=1, part=0, geometry=g, meta_zones=meta_zones,
                        gc_reserve_zones=gc_reserve_zones, policy=policy)
        snap = [encode("snap", {"now": 0, "commit_seq": 0, "metrics": {}}), encode("sz", {"z": []}),
                encode("send", {"n": 0})]
        device.write(0, sb.encode() + b"".join(frame(p, g.block_size) for p in snap))
        device.flush()
        return cls.open(device, verify_summaries=verify_summaries)

    @classmethod
    def open(cls, device: ZonedDevice, *, policy: str | None = None, verify_summaries: bool = False,
             readonly: bool = False) -> Store:
        """Open the store on ``device``: replay the journal and recover (see :mod:`.recovery`).

        Args:
            device: the device (a FileDevice already holds the file's exclusive lock, or a shared
                one when opened ``readonly=True``).
            policy: allocator spec; ``None`` uses the one recorded at format.
            verify_summaries: rebuild the zone summaries from the catalog before every allocation
                decision and check them against the cached ones (slow; decisions must be identical
                to the cached mode).
            readonly: replay the journal and reconcile with the device without writing anything:
                no zone reset, no journal rollover, no stale meta zone reset, no sync record at
                close.  What a read-write open would repair is listed in ``recovery.repairs`` (and
                by :meth:`fsck`); zones it would reset are summarised as holding only dead bytes.
                ``generations``, ``generation``, ``read_shard``, ``fsck`` and ``df`` work;
                ``begin_generation``, ``delete`` and ``gc`` raise :class:`ReadOnlyStoreError`.

        Raises:
            StoreLockedError: the store on this device is already open in this process.
            ForeignDeviceError: the device holds no RetainZ store.
            CorruptJournalError: the journal or superblock is damaged, or committed data is missing.
        """
        key = _device_key(device)
        self = object.__new__(cls)
        self._key = key
        self._closed = True
        with _OPEN_LOCK:
            if _OPEN_STORES.get(key) is not None:
                raise StoreLockedError(f"{device!r}: the store is already open in this process")
            _OPEN_STORES[key] = self
        try:
            self._init_state(device, verify_summaries)
            self.readonly = readonly
            self._mount(policy)
        except BaseException:
            _release(key, self)
            raise
        return self

    def _init_state(self, device: ZonedDevice, verify: bool) -> None:
        g = device.geometry
        self.device = device
        self._lock = threading.RLock()
        self._bs = g.block_size
        self._zsize = g.zone_size
        self._cap = g.zone_capacity
        self._verify = verify
        self._writers: dict[str, GenerationWriter] = {}
        self._dirty: set[int] = set()
        self._reserved = 0
        self._now = 0
        self._in_gc = False
        self._partial: dict | None = None
        self._inflight: list[list] = []  # extent lists written but not yet in any shard
        self._jgen: dict[str, int] = {}  # committed generation -> bytes of its snapshot entry
        self._jgen_total = 0             # sum of _jgen
        self._jbig = 0                   # the largest snapshot entry seen (bytes)
        self._jreserved = 0              # estimated snapshot bytes of the writers in flight
        self.metrics = StoreMetrics()

    def _new_table(self) -> ZoneTable:
        g = self.device.geometry
        caps = {z: g.zone_capacity for z in range(self.meta_zones, g.nr_zones)}
        # The journal keeps one meta zone active (a rollover finishes the old zone before it opens
        # the next), so data gets the device's limits minus one, and ``reserved_active`` tells
        # policies (ZenFS's "device max - 2") what the device's own limit is.
        return ZoneTable(caps, max_open=max(g.max_open - 1, 0) if g.max_open else 0,
                         max_active=self._max_active, reserved_active=1 if self._max_active else 0)

    def close(self) -> None:
        """Abort open writers, journal the zone attributes and metrics (a ``sync`` record), flush and
        release the store.  The device stays open (the caller owns it).  Idempotent.

        If the sync record cannot be appended because the journal is full (:class:`NoSpaceError`),
        it is skipped: recovery derives the same zone state from the device, and only the metrics of
        this session since the last record are lost."""
        with self._lock:
            if self._closed:
                return
            try:
                for w in list(self._writers.values()):
                    w.abort()
                if not self.readonly:
                    try:
                        self._append("x", {"now": self._now, "metrics": self._metrics_state()})
                    except NoSpaceError:
                        pass
            finally:
                self._closed = True
                _release(self._key, self)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Store({self.device!r}, policy={self.policy!r}, generations={len(self.catalog.gens)}, "
                f"{'closed' if self._closed else 'open'})")

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the store is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyStoreError(f"{self.device!r}: the store was opened read-only")

    # -- generations -------------------------------------------------------------------------------
    def begin_generation(self, gen_id: str, step: int, *, hint: Hint | None = None,
                         declared_size: int | None = None) -> GenerationWriter:
        """Admit a new generation and return its writer.

        Admission reserves ``declared_size`` bytes (rounded up to a block): the data zones' free
        bytes, less the policy's GC reserve (:attr:`admission_reserve_zones` zones of capacity)
        and other writers' reservations, must cover it, after a GC pass if needed; otherwise the
        generation is refused before anything is written.  A policy without admission control
        (``Allocator.admission_control`` False: ZenFS) has its generations admitted without
        this check or a reservation; its writes stop where its allocation fails.  The store's logical time advances to
        ``step`` if it is later.

        Journal space is admitted too (:meth:`_check_journal`): the generation is refused when,
        with it (estimated: ``EXTENT_BYTES`` per 1 MiB extent of its declared size, or per zone
        on a payload-less device) and every writer in flight committed, a journal snapshot could
        not be rolled over twice: once into the meta zones the current chain leaves free, and
        once more after that.  Deleting shrinks the snapshot, so this keeps the room for the
        records that delete everything and for GC moves (12.5 % slack for extents GC splits): a
        full journal never blocks the deletions that would shrink it.

        Args:
            gen_id: the generation id (see :func:`~retainz.store.format.check_id`).
            step: the training step of the save (>= 0).
            hint: what the runtime knows about the generation's death (journaled with the commit).
            declared_size: bytes of shard data the generation will write (``None``: no reservation
                and no size check).

        Raises:
            InvalidIdError: a bad id.  GenerationExistsError: the id is committed or being written.
            NoSpaceError: the declared size cannot be reserved (``needed``/``available`` bytes;
                ``cause`` ``"admission"``), or the journal could not hold the generation's records
                and those that delete everything (the message names the journal; ``needed``/
                ``available`` in bytes of snapshot; ``cause`` ``"journal"``).  ``state`` is
                :meth:`stop_state` at the refusal.
            ValueError: a negative step or size.
        """
        with self._lock:
            self._check_writable()
            check_id(gen_id)
            if not isinstance(step, int) or step < 0:
                raise ValueError(f"step must be a non-negative int, not {step!r}")
            if declared_size is not None and (not isinstance(declared_size, int) or declared_size < 0):
                raise ValueError(f"declared_size must be a non-negative int, not {declared_size!r}")
            if gen_id in self.catalog.gens or gen_id in self._writers:
                raise GenerationExistsError(f"generation {gen_id!r} already exists")
            self._advance(step)
            if self.table.n_empty < self.gc_reserve_zones and self.table.dead:
                self._gc(force=False)
            need = round_up(declared_size, self._bs) if declared_size else 0
            control = self.allocator.admission_control
            if need and control:
                avail = self._admittable()
                if need > avail and self.table.dead:
                    self._gc(force=True)
                    avail = self._admittable()
                if need > avail:
                    raise NoSpaceError(f"generation {gen_id!r} needs {need} bytes; {max(avail, 0)} can be "
                                       f"reserved ({self._free()} free, {self._reserved} reserved by other "
                                       f"writers, {self.admission_reserve_zones} zones kept for GC)",
                                       needed=need, available=max(avail, 0), cause="admission",
                                       state=self.stop_state())
            est = self._journal_estimate(gen_id, need)
            try:
                self._check_journal(est, f"generation {gen_id!r}")
            except NoSpaceError as e:
                e.state = self.stop_state()
                raise
            gen = GenerationInfo(id=gen_id, step=step, hint=hint or Hint())
            w = GenerationWriter(self, gen, declared_size, need)
            if not control:          # nothing reserved: the policy's allocation decides
                w._reserve = 0
            w._jest = est
            self._jreserved += est
            self._reserved += w._reserve
            self._writers[gen_id] = w
            return w

    def generations(self) -> list[GenerationInfo]:
        """Committed generations, ascending step then id."""
        with self._lock:
            return self.catalog.ordered()

    def generation(self, gen_id: str) -> GenerationInfo:
        """The committed generation ``gen_id``.

        Raises:
            GenerationNotFoundError: no committed generation has that id.
        """
        with self._lock:
            gen = self.catalog.gens.get(gen_id)
            if gen is None:
                raise GenerationNotFoundError(f"no committed generation {gen_id!r}")
            return gen

    def delete(self, gen_id: str, *, step: int | None = None) -> None:
        """Retire a committed generation: journal a deletion record (flushed), then reset the zones
        it leaves with no live data.  Other zones keep its bytes as dead until GC.

        Args:
            step: the training step of the retirement; logical time advances to it if later.

        Raises:
            GenerationNotFoundError: no committed generation has that id.
        """
        with self._lock:
            self._check_writable()
            if step is not None:
                self._advance(step)
            gen = self.catalog.gens.get(gen_id)
            if gen is None:
                raise GenerationNotFoundError(f"no committed generation {gen_id!r}")
            bs = self._bs
            zb: dict[int, int] = {}
            get = zb.get
            for s in gen.shards.values():
                for e in s.extents:
                    zb[e[0]] = get(e[0], 0) - (-e[2] // bs) * bs
            zones = self.table.zones
            resets = [z for z, n in zb.items() if zones[z].live == n]
            self._append("d", {"g": gen_id, "r": resets, "now": self._now})
            self.catalog.remove(gen_id)
            self._jgen_total -= self._jgen.pop(gen_id, 0)
            gen.state = GenState.DELETED
            on_kill = self.table.on_kill
            if len(resets) == len(zb):
                pass                   # every zone resets: the reset drops its live bytes
            elif resets:
                gone = set(resets)
                for z, n in zb.items():
                    if z not in gone:
                        on_kill(z, n)
            else:
                for z, n in zb.items():
                    on_kill(z, n)
            self._reset_journaled(resets)
            self.metrics.generations_deleted += 1

    def advance(self, step: int) -> None:
        """Move logical time to training step ``step`` (no-op if not later than the current step).
        Dead-space and unused-capacity byte-steps integrate over it."""
        with self._lock:
            self._advance(step)

    @property
    def now(self) -> int:
        """The latest training step the store has seen."""
        return self._now

    def _advance(self, step: int) -> None:
        dt = step - self._now
        if dt > 0:
            m = self.metrics
            m.dead_space_byte_steps += self.table.dead * dt
            m.unused_capacity_byte_steps += self.table.unused * dt
            self._now = step
            self.table.now = step

    # -- shared bookkeeping --------------------------------------------------------------------------
    def _free(self) -> int:
        """Bytes writable without a reset, O(1): capacity - written - capacity lost to finishes."""
        t = self.table
        return self._data_capacity - t.written - t.unused

    @property
    def admission_reserve_zones(self) -> int:
        """Empty zones' capacity admission keeps free for GC: the policy's own need
        (``Allocator.admission_reserve(gc_reserve_zones)``; 0 for ZenFS, whose GC never writes
        into an empty zone)."""
        return self.allocator.admission_reserve(self.gc_reserve_zones)

    def stop_state(self) -> dict:
        """The data zones' state, as a capacity stop records it (bytes; O(open zones)):
        ``empty_zones``, ``open_free_bytes`` (writable capacity left in partly filled zones:
        stranded when the policy will not use it), ``dead_bytes``, ``live_bytes``."""
        t = self.table
        return {"empty_zones": t.n_empty, "open_free_bytes": sum(s.remaining for s in t.open.values()),
                "dead_bytes": t.dead, "live_bytes": t.live}

    def _admittable(self) -> int:
        return self._free() - self._reserved - self.admission_reserve_zones * self._cap

    def _attrs(self, z: int) -> list:
        """Zone ``z``'s journaled attributes: ``[zone] + _attrs_of(summary)``."""
        return [z] + self._attrs_of(self.table.zones[z])

    @staticmethod
    def _attrs_of(s: ZoneSummary) -> list:
        """``[written, full, reclaim_step, lifetime, opened_step, open_seq, last_write_step]``
        (catalog module)."""
        return [s.written, 1 if s.cond == ZoneCond.FULL else 0, s.reclaim_step, s.lifetime, s.opened_step,
                s.open_seq, s.last_write_step]

    def _append(self, kind: str, body: dict, raw: bytes = b"") -> None:
        """Append a record carrying the zone attributes changed since the last one (flushed).

        ``raw``, if given, is a pre-encoded JSON member (``b'"g":[...]'``) spliced in first, so a
        commit encodes its generation once."""
        dirty = self._dirty
        self._dirty = set()
        zones = self.table.zones
        attrs = []
        for z in sorted(dirty):
            s = zones[z]
            attrs.append([z, s.written, 1 if s.cond is _FULL else 0, s.reclaim_step, s.lifetime,
                          s.opened_step, s.open_seq, s.last_write_step])
        body["z"] = attrs
        body["o"] = self.table.open_seq
        j = self.journal
        try:
            if raw:
                j.append(kind.encode() + b' {' + raw + b',' + dumps(body)[1:].encode())
            else:
                j.append(encode(kind, body))
        except BaseException:
            self._dirty |= dirty
            raise
        m = self.metrics
        m.journal_bytes, m.journal_records, m.rollovers = j.bytes_written, j.records, j.rollovers

    def _reset_zone(self, z: int) -> None:
        """Reset data zone ``z``.  A zone reset while part-empty (not full) is charged its unused
        capacity (:class:`~retainz.store.types.StoreMetrics`)."""
        s = self.table.zones[z]
        self.device.reset_zone(z)
        self._charge_part_empty(s.capacity, s.written, s.cond is ZoneCond.FULL, s.last_write_step)
        self.table.on_reset(z)
        self.metrics.resets += 1
        self._dirty.add(z)

    def _reset_journaled(self, zs: list[int]) -> None:
        """Reset data zones a journaled record already names for reset (``r`` of a deletion or a
        GC move): one batched device reset, and no re-journaling of their (empty) attributes,
        since replaying that record resets them."""
        if not zs:
            return
        self.device.reset_zones(zs)
        zones, on_reset, m, now = self.table.zones, self.table.on_reset, self.metrics, self._now
        for z in zs:
            s = zones[z]
            if s.cond is not _FULL and s.written:
                unused = s.capacity - s.written
                m.unused_capacity_bytes += unused
                m.unused_capacity_byte_steps += unused * max(0, now - s.last_write_step)
            on_reset(z)
        m.resets += len(zs)

    def _charge_part_empty(self, capacity: int, written: int, full: bool, last_write_step: int) -> None:
        """Unused capacity of a zone reset while part-empty: ``capacity - written`` bytes, held
        from its last write to now (byte-steps).  A full zone was charged at its finish (or has
        none)."""
        if full or not written:
            return
        m = self.metrics
        unused = capacity - written
        m.unused_capacity_bytes += unused
        m.unused_capacity_byte_steps += unused * max(0, self._now - last_write_step)

    def _reset_dead(self, zones) -> int:
        """Reset the zones among ``zones`` that hold bytes but no live data."""
        n = 0
        for z in list(zones):
            s = self.table.zones[z]
            if s.written and not s.live:
                self._reset_zone(z)
                n += 1
        return n

    def _metrics_state(self) -> dict:
        m = self.metrics.to_dict()
        m.pop("waf")
        m["journal_bytes"] = self.journal.bytes_written
        m["journal_records"] = self.journal.records
        m["rollovers"] = self.journal.rollovers
        return m
