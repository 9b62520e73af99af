"""The :class:`Store`: a thin facade over the parts that own the store's state.

========================  ==========================================================================
part                      owns
========================  ==========================================================================
:mod:`.zonebook`          the data zones: zone table, logical time, space accounting, finish/reset,
                          the attributes changed since the last record
:mod:`.metalog`           the metadata log: journal records and the journal's space budget
:mod:`.catalog`           committed generations -> shards -> extents, per-zone index
:mod:`.writer`            placement execution (``WritePath``), shards and generations being written
:mod:`.gc`                the copying garbage collector
:mod:`.reader`            verified reads of committed shards
:mod:`.recovery`          mount: scan, replay, reconcile, tidy the journal
:mod:`.check`             fsck, df, the recomputation the cached summaries must equal
:mod:`.records`           the on-disk record format (used by the journal, recovery, the crash test)
:mod:`.journal`           meta-zone chains: append, rollover, the mount scan
:mod:`.contract`          what integrations and the replay driver may call (Protocols)
:mod:`.format`            the superblock, format versions, id rules
:mod:`.types`            what the store hands back (generations, shards, metrics, reports)
:mod:`.crc`               crc32c combination (a shard's crc from its extents' crcs)
========================  ==========================================================================

The store itself keeps only what spans parts: the lock, the open writers and admission (the
reservation of space for them), and the open/closed state.
"""

from __future__ import annotations

import threading
import uuid as uuidlib
import weakref
from collections.abc import Iterator

from retainz.errors import (
    ForeignDeviceError,
    GenerationExistsError,
    GenerationNotFoundError,
    NoSpaceError,
    ReadOnlyStoreError,
    StoreLockedError,
    SummaryMismatchError,
)
from retainz.hint import Hint
from retainz.placement import DEFAULT_POLICY, make_allocator
from retainz.placement.base import Allocator, ExtentRequest, ZoneTable
from retainz.store import check
from retainz.store.catalog import Catalog
from retainz.store.format import SPARE, Superblock, check_id
from retainz.store.gc import Collector
from retainz.store.journal import MAX_META_ZONES, Journal, default_meta_zones
from retainz.store.metalog import MetadataLog
from retainz.store.reader import CatalogShards, DeviceExtents, Reader, unknown_message
from retainz.store.records import empty_snapshot, frame, gen_entry_bytes
from retainz.store.recovery import RecoveryReport, mount
from retainz.store.types import FsckReport, GCReport, GenerationInfo, GenState, SpaceReport, StoreMetrics
from retainz.store.writer import GenerationWriter, WritePath
from retainz.store.zonebook import ZoneBook
from retainz.zoned.device import ZonedDevice
from retainz.zoned.model import Geometry, ZoneCond, round_up

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


#: The largest training step the store takes (a signed 64-bit integer, as the runtimes count).
MAX_STEP = (1 << 63) - 1


def check_step(value, what: str = "step") -> int:
    """A training step: an int (not a bool), ``0 <= value <= MAX_STEP``.

    Raises:
        ValueError: anything else (one line naming ``what`` and the value).
    """
    if type(value) is not int or not 0 <= value <= MAX_STEP:
        raise ValueError(f"{what} must be an int from 0 to {MAX_STEP}, not {value!r}")
    return value


def check_hint(hint) -> Hint:
    """A :class:`~retainz.hint.Hint` whose reclaim steps are ``None`` or a number that is not NaN,
    an int no larger than :data:`MAX_STEP` (a step; readers of ``--json`` take int64).

    Raises:
        ValueError: anything else (one line).
    """
    if not isinstance(hint, Hint):
        raise ValueError(f"hint must be a retainz.hint.Hint, not {type(hint).__name__}")
    for name in ("reclaim_step", "actual_reclaim_step"):
        v = getattr(hint, name)
        if v is not None and (type(v) not in (int, float) or v != v):
            raise ValueError(f"hint {name} must be a number or None, not {v!r}")
        if type(v) is int and v > MAX_STEP:
            raise ValueError(f"hint {name} {v} is beyond the largest step, {MAX_STEP}")
    return hint


def superblock_zones(device: ZonedDevice) -> list[int]:
    """Indices of the zones that start with a RetainZ superblock (magic ``RETAINZS``): non-empty
    means the device holds a store.  Only the first ``MAX_META_ZONES`` non-empty zones are read
    (a store's meta zones come first); zones with nothing written are skipped.

    Raises:
        ZonedDeviceError: a read the device refuses.
    """
    bs = device.geometry.block_size
    used = device.report_used_zones()[:MAX_META_ZONES]
    return [z.index for z in used if z.wp > z.start and Superblock.has_magic(device.read(z.start, bs))]


def _erase_order(device: ZonedDevice, used: list[int]) -> list[int]:
    """The order in which ``format(force=True)`` resets the non-empty zones ``used``, so that a format
    stopped at any reset (Ctrl-C, a killed process) leaves either the old store as it was or no store:
    first the meta zones holding spare superblocks, then the journal chains oldest first (the previous
    chain, kept as the snapshot's copy, must never outlive the current one and stand in for it: it
    would bring back what the current chain deleted), the current chain's zones last part first, and
    only then the data zones.  A chain of several parts cut between its resets is refused by ``open``
    as a chain missing a part (the old store is then gone either way; ``mkfs --force`` again).

    Args:
        device: the device being formatted.
        used: indices of its non-empty zones.

    Returns:
        ``used`` reordered (the same zones).

    Raises:
        ZonedDeviceError: a read the device refuses.
    """
    g = device.geometry
    bs = g.block_size
    rank: dict[int, tuple] = {}
    for z in superblock_zones(device):
        start = z * g.zone_size
        sb = Superblock.decode(device.read(start, bs), g)
        zone = device.zone(z)
        if sb is None and (zone.cond == ZoneCond.FULL or zone.wp >= start + 2 * bs):
            sb = Superblock.decode(device.read(start + bs, bs), g)     # a chain zone's copy 1
        rank[z] = (0,) if sb is None or sb.flags & SPARE else (1, sb.sequence, -sb.part)
    return sorted(used, key=lambda z: rank.get(z, (2,)))


class Store:
    """A checkpoint store on a zoned device.

    Create one with :meth:`format` or :meth:`open` (never the constructor).  Call sequence::

        store = Store.open(device)                 # replays the journal, recovers
        w = store.begin_generation(id, step, hint=..., declared_size=...)   # admission
        w.write_shard(name, chunks); ...; w.commit()  # or w.abort()
        store.generations(); store.read_shard(id, name)
        store.advance(step); store.delete(id)       # retire; all-dead zones are reset
        store.gc()                                  # copying GC when empty zones < reserve
        store.close()

    Thread safety: every public method takes one ``threading.RLock`` (``lock``); several writers may be open
    at once, and a reader thread sees only committed generations.

    Attributes:
        device: the zoned device.
        zones: the :class:`~retainz.store.zonebook.ZoneBook` (data zones, time, space);
            ``table`` is its :class:`~retainz.placement.base.ZoneTable` (maintained
            incrementally; equal to :meth:`recompute_table` after every operation).
        catalog: the committed generations (:class:`~retainz.store.catalog.Catalog`).
        log: the :class:`~retainz.store.metalog.MetadataLog`; ``journal`` is its journal.
        write_path, collector, reader: the write path, the garbage collector, the read path.
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

    @staticmethod
    def check_geometry(g: Geometry, *, policy: str = DEFAULT_POLICY, meta_zones: int | None = None,
                       gc_reserve_zones: int = 2) -> int:
        """Refuse a geometry a store cannot be formatted on, before anything is written (what
        :meth:`format` checks first; ``retainz run`` checks every case of a manifest with it).

        Returns:
            the meta zone count (``meta_zones``, or the geometry's default when None).

        Raises:
            ValueError: an unknown policy, a device the policy refuses (``Allocator.check_device``:
                ZenFS needs 32 zones), a meta zone count outside 2..64, a negative reserve, fewer
                zones than meta zones + reserve + 2 data zones, zone capacity under 8 blocks (the
                empty journal chain, its superblock and snapshot copies, takes 7), max active zones
                under 2 (one is the journal's).
        """
        make_allocator(policy).check_device(g)
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
        if g.zone_capacity < 8 * g.block_size:   # the empty chain takes 7 (format version 3)
            raise ValueError(f"zone capacity {g.zone_capacity} is under 8 blocks: too small for a journal")
        if g.max_active and g.max_active < 2:
            raise ValueError("the device allows fewer than 2 active zones (one is the journal's)")
        return meta_zones

    @classmethod
    def format(cls, device: ZonedDevice, *, meta_zones: int | None = None, policy: str = DEFAULT_POLICY,
               gc_reserve_zones: int = 2, force: bool = False, verify_summaries: bool = False,
               progress=None) -> Store:
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
            progress: ``progress(done, total)`` in meta zones written (the superblock's zone, then
                each spare's; the CLI's bar for ``mkfs`` of a large device, whose every zone-state
                change is a write of the whole zone state).

        Raises:
            ForeignDeviceError: a zone is not empty and ``force`` is False (the message says whether
                it already holds a RetainZ store).  Nothing is written.
            ValueError: a geometry :meth:`check_geometry` refuses.
        """
        g = device.geometry
        meta_zones = cls.check_geometry(g, policy=policy, meta_zones=meta_zones,
                                        gc_reserve_zones=gc_reserve_zones)
        used = [z.index for z in device.report_used_zones()]
        if used and not force:
            ours = superblock_zones(device)
            found = (f"{device.name} already holds a RetainZ store (superblock in zone {ours[0]})" if ours else
                     f"{device.name} holds data RetainZ does not recognise ({len(used)} non-empty zones, first "
                     f"{used[0]})")
            raise ForeignDeviceError(f"{found}; pass force=True to erase it", found=found)
        for z in _erase_order(device, used):
            device.reset_zone(z)
        sb = Superblock(uuid=uuidlib.uuid4(), sequence=1, part=0, geometry=g, meta_zones=meta_zones,
                        gc_reserve_zones=gc_reserve_zones, policy=policy)
        block = sb.encode()     # two copies (format version 3), then the empty snapshot
        device.write(0, block * 2 + b"".join(frame(p, g.block_size) for p in empty_snapshot()))
        # durable before any spare: a spare's finish is durable on completion, and spares without
        # the chain they stand beside read as a corrupt store, not as no store (a format killed there)
        device.flush()
        journal = Journal(device, sb, [0], 0)
        if progress is not None:
            progress(1, meta_zones)
        for z in range(1, meta_zones):   # a spare superblock in every other meta zone (finished)
            journal.write_spare(z)
            if progress is not None:
                progress(z + 1, meta_zones)
        device.flush()
        return cls.open(device, verify_summaries=verify_summaries)

    @classmethod
    def open(cls, device: ZonedDevice, *, policy: str | None = None, verify_summaries: bool = False,
             readonly: bool = False, repair: bool = False, upgrade: bool = False, progress=None) -> Store:
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
            repair: salvage a damaged store (``fsck --repair``; not with ``readonly``): damaged
                journal records are skipped, generations whose data is gone dropped, and the journal
                rolls over, rewriting every metadata copy (:func:`~retainz.store.recovery.mount`);
                ``recovery.lost`` lists what was lost and ``recovery.dropped`` every generation not
                kept as committed (generations a lost record could concern are kept as unknown:
                :meth:`unknown`, :meth:`restore`).  A repair of an older format version migrates it.
            upgrade: migrate a store of an older format version (``fsck --upgrade``); without it a
                read-write open of one raises :class:`~retainz.errors.OldFormatError`.
            progress: ``progress(done, total)`` in journal records replayed (the CLI's bar for
                opening a store whose journal holds many records).

        Raises:
            StoreLockedError: the store on this device is already open in this process.
            ForeignDeviceError: the device holds no RetainZ store.
            UnsupportedFormatError: a format version or flags this code does not know (nothing is
                written, also read-write); :class:`~retainz.errors.OldFormatError`, a subclass: a
                read-write open of an older version without ``upgrade`` or ``repair``.
            CorruptJournalError: the journal or superblock is damaged, or committed data is missing.
        """
        key = _device_key(device)
        self = object.__new__(cls)
        self._key = key
        self._closed = True
        with _OPEN_LOCK:
            if _OPEN_STORES.get(key) is not None:
                raise StoreLockedError(f"{device.name}: the store is already open in this process")
            _OPEN_STORES[key] = self
        try:
            self._assemble(device, policy, verify_summaries, readonly, repair, progress, upgrade)
        except BaseException:
            _release(key, self)
            raise
        return self

    def _assemble(self, device: ZonedDevice, policy: str | None, verify: bool, readonly: bool,
                  repair: bool = False, progress=None, upgrade: bool = False) -> None:
        """Mount (recovery builds the catalog, zone book and metadata log) and compose the rest."""
        m = mount(device, readonly=readonly, repair=repair, upgrade=upgrade, progress=progress)
        sb = m.sb
        self.device = device
        self.readonly = readonly
        self.uuid = sb.uuid
        self.meta_zones = sb.meta_zones
        self.gc_reserve_zones = sb.gc_reserve_zones
        self.policy = policy or sb.policy
        allocator = make_allocator(self.policy)
        allocator.check_device(device.geometry)
        self.recovery: RecoveryReport = m.report
        self.metrics: StoreMetrics = m.metrics
        self.catalog: Catalog = m.catalog
        self.zones: ZoneBook = m.zones
        self.log: MetadataLog = m.log
        self.lock = threading.RLock()
        self._writers: dict[str, GenerationWriter] = {}
        self.allocator: Allocator = allocator
        allocator.bind(self.zones.table)
        allocator.use_device(device.info)
        self.write_path = WritePath(self.zones, allocator, self.metrics,
                                    verify=self._verify_summaries if verify else None)
        self.collector = Collector(self.zones, self.catalog, self.log, self.write_path, allocator,
                                   self.gc_reserve_zones, self._busy_zones)
        self.write_path.collector = self.collector
        self.reader = Reader(CatalogShards(self.catalog, device.name), DeviceExtents(device), self.lock)
        self._closed = False

    def use_allocator(self, allocator: Allocator) -> None:
        """Place with ``allocator`` from now on (a policy instance not reachable by a spec string:
        tests, scripted policies).  It is bound to the zone table; the write path and the collector
        use it.  Not journaled: a reopen uses the policy given to :meth:`open` or the recorded one."""
        with self.lock:
            allocator.bind(self.zones.table)
            allocator.use_device(self.device.info)
            self.allocator = self.write_path.allocator = self.collector.allocator = allocator

    # -- what the parts expose -----------------------------------------------------------------------
    @property
    def table(self) -> ZoneTable:
        """The zone table (:attr:`ZoneBook.table`): cached summaries of every data zone."""
        return self.zones.table

    @property
    def journal(self) -> Journal:
        """The metadata journal (:attr:`MetadataLog.journal`)."""
        return self.log.journal

    @property
    def format_version(self) -> int:
        """The format version of the journal chain in use (:mod:`.format`, "Format versions")."""
        return self.log.journal.sb.version

    @property
    def now(self) -> int:
        """The latest training step the store has seen."""
        return self.zones.now

    def close(self) -> None:
        """Abort open writers, journal the zone attributes and metrics (a ``sync`` record), flush and
        release the store.  The device stays open (the caller owns it).  Idempotent.

        If the sync record cannot be appended because the journal is full (:class:`NoSpaceError`),
        it is skipped: recovery derives the same zone state from the device, and only the metrics of
        this session since the last record are lost."""
        with self.lock:
            if self._closed:
                return
            try:
                for w in list(self._writers.values()):
                    w.abort()
                if not self.readonly:
                    try:
                        self.log.sync()
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

    def check_open(self) -> None:
        """Raises ValueError when the store is closed."""
        if self._closed:
            raise ValueError("the store is closed")

    def _check_writable(self) -> None:
        self.check_open()
        if self.readonly:
            raise ReadOnlyStoreError(f"{self.device.name}: the store was opened read-only")

    # -- generations -------------------------------------------------------------------------------
    def begin_generation(self, gen_id: str, step: int, *, hint: Hint | None = None,
                         declared_size: int | None = None, replace: bool = False,
                         join: str | None = None) -> GenerationWriter:
        """Admit a new generation and return its writer.

        ``join`` (the store contract's token by which the processes sharing a served device write one
        generation: ``NodeStore.begin_generation``) has no other writer to join here: this store is
        owned by this one process (its lock on the device), so every writer it begins is its caller's
        alone and ``joined`` is false.

        Admission reserves ``declared_size`` bytes (rounded up to a block): the data zones' free
        bytes, less the policy's GC reserve (:attr:`admission_reserve_zones` zones of capacity)
        and other writers' reservations, must cover it, after forced GC passes if needed (repeated
        while each frees space: :meth:`Collector.make_room`); otherwise the
        generation is refused before anything is written.  A policy without admission control
        (``Allocator.admission_control`` False: ZenFS) has its generations admitted without
        this check or a reservation; its writes stop where its allocation fails.  The store's
        logical time advances to ``step`` if it is later.

        Journal space is admitted too (:meth:`MetadataLog.check_room`): the generation is refused
        when, with it (estimated: ``EXTENT_BYTES`` per 1 MiB extent of its declared size, or per
        zone on a payload-less device) and every writer in flight committed, a journal snapshot
        could not be rolled over twice: once into the meta zones the current chain leaves free,
        and once more after that.  Deleting shrinks the snapshot, so this keeps the room for the
        records that delete everything and for GC moves (12.5 % slack for extents GC splits): a
        full journal never blocks the deletions that would shrink it.

        Args:
            gen_id: the generation id (see :func:`~retainz.store.format.check_id`).
            step: the training step of the save (>= 0).
            hint: what the runtime knows about the generation's death (journaled with the commit).
            declared_size: bytes of shard data the generation will write (``None``: no reservation
                and no size check).
            replace: ``gen_id`` may be committed already: the new generation replaces it at its
                commit (replace-on-commit).  Until then readers see the old one, intact; the commit
                record retires the old one and commits the new one in one record, so a crash at any
                point leaves exactly one of the two.  A deletion of the old one meanwhile makes the
                commit a plain one.

        Raises:
            InvalidIdError: a bad id.  GenerationExistsError: the id is being written, or committed
                (without ``replace``).
            NoSpaceError: the declared size cannot be reserved (``needed``/``available`` bytes;
                ``cause`` ``"admission"``), or the journal could not hold the generation's records
                and those that delete everything (the message names the journal; ``needed``/
                ``available`` in bytes of snapshot; ``cause`` ``"journal"``).  ``state`` is
                :meth:`stop_state` at the refusal.
            ValueError: a step that is not an int from 0 to :data:`MAX_STEP`, a negative size, a hint
                that is not a ``Hint`` or carries a NaN, or a reclaim step before ``step``.
        """
        with self.lock:
            self._check_writable()
            check_id(gen_id)
            check_step(step)
            if hint is not None:
                check_hint(hint)
            if declared_size is not None and (not isinstance(declared_size, int) or declared_size < 0):
                raise ValueError(f"declared_size must be a non-negative int, not {declared_size!r}")
            if hint is not None and hint.reclaim_step is not None and hint.reclaim_step < step:
                raise ValueError(f"generation {gen_id!r}: reclaim step {hint.reclaim_step} is before its own "
                                 f"step {step} (a generation cannot be retired before it is saved)")
            if gen_id in self._writers:
                raise GenerationExistsError(f"generation {gen_id!r} is being written")
            if gen_id in self.catalog.gens and not replace:
                raise GenerationExistsError(f"generation {gen_id!r} already exists (to replace it at the new "
                                            "one's commit: replace=True, `retainz put --replace`)")
            zones = self.zones
            zones.advance(step)
            if zones.table.n_empty < self.gc_reserve_zones and zones.table.dead:
                self.collector.collect(force=False)
            bs = zones.block_size
            need = round_up(declared_size, bs) if declared_size else 0
            control = self.allocator.admission_control
            if need and control:
                self._reserve_or_refuse(gen_id, need, "")
            extent = (1 << 20) if self.device.info.payload else zones.zone_capacity
            est = self.log.estimate(gen_id, need, extent)
            try:
                self.log.check_room(est, f"generation {gen_id!r}", self._estimates())
            except NoSpaceError as e:
                e.state = self.stop_state()
                raise
            gen = GenerationInfo(id=gen_id, step=step, hint=hint or Hint())
            w = GenerationWriter(self, gen, declared_size, reserve=need if control else 0, journal_estimate=est,
                                 block_size=bs, payload=self.device.info.payload)
            self._writers[gen_id] = w
            zones.table.on_group_begin(gen_id)
            return w

    def admit(self, w: GenerationWriter, nbytes: int) -> None:
        """Admission as bytes arrive, for a generation begun without a declared size (fsspec, a
        mount, DCP without a plan): before ``nbytes`` more device bytes are placed, the writer's
        reservation grows to cover them, under the same rule as :meth:`begin_generation` (after
        forced GC passes if needed), so no path writes into the GC reserve.  A declared generation
        was admitted whole at its start; a policy without admission control is not checked.

        Raises:
            NoSpaceError: ``cause`` ``"admission"``; nothing of the ``nbytes`` was written.
        """
        if w.declared_size is not None or not self.allocator.admission_control:
            return
        deficit = nbytes - w.reserve
        if deficit > 0:
            self._reserve_or_refuse(w.gen.id, deficit, " more")
            w.reserve += deficit

    def _reserve_or_refuse(self, gen_id: str, need: int, more: str) -> None:
        """The admission rule: ``need`` bytes must fit what can be reserved (free bytes less the
        writers' reservations and the GC reserve), after forced GC passes if not, repeated while
        each frees space (:meth:`Collector.make_room`: a generation is refused only when GC can
        make no more room).

        Raises:
            NoSpaceError: ``cause`` ``"admission"``, ``state`` the zones' state at the refusal.
        """
        self.collector.make_room(lambda: need <= self._admittable())
        avail = self._admittable()
        if need > avail:
            raise NoSpaceError(f"generation {gen_id!r} needs {need}{more} bytes; {max(avail, 0)} can be "
                               f"reserved ({self.zones.free()} free, {self._reserved()} reserved by other "
                               f"writers, {self.admission_reserve_zones} zones kept for GC)",
                               needed=need, available=max(avail, 0), cause="admission", state=self.stop_state())

    def _reserved(self) -> int:
        """Bytes reserved by the open writers' admissions and not yet written."""
        return sum(w.reserve for w in self._writers.values())

    def _estimates(self, exclude: GenerationWriter | None = None) -> list[int]:
        """The open writers' journal estimates (snapshot bytes), ``exclude`` left out."""
        return [w.journal_estimate for w in self._writers.values() if w is not exclude]

    def _admittable(self) -> int:
        return self.zones.free() - self._reserved() - self.admission_reserve_zones * self.zones.zone_capacity

    def commit_writer(self, w: GenerationWriter) -> GenerationInfo:
        """Commit ``w``'s generation (:meth:`GenerationWriter.commit` calls this; see there)."""
        with self.lock:
            self.check_open()
            gen = w.gen
            if gen.state is not GenState.WRITING:
                raise ValueError(f"generation {gen.id!r} is {gen.state.value}: cannot commit it")
            gen.commit_seq = self.catalog.commit_seq + 1
            entry = gen_entry_bytes(gen)
            n = len(entry) + 1
            journal = self.log.journal
            records = journal.records
            try:
                if n + 256 > journal.max_record:    # the append would refuse it: say so first
                    raise NoSpaceError(f"journal record of about {n} bytes (generation {gen.id!r}) does not "
                                       f"fit a meta zone ({journal.max_record} bytes)",
                                       needed=n, available=journal.max_record, cause="journal")
                self.log.check_room(n, f"commit of generation {gen.id!r}", self._estimates(exclude=w))
                old = self.catalog.gens.get(gen.id)
                retire = self._retirement(old) if old is not None else None
                self.device.flush()
                self.log.commit(entry, retire[1] if retire else None)
            except BaseException:
                gen.commit_seq = 0
                if journal.fenced or journal.records != records:
                    self._withdraw_commit(w)
                raise
            if retire:
                self._retire(old, *retire)
            gen.state = GenState.COMMITTED
            self.catalog.add(gen)
            self.log.track(gen, entry)
            self._writers.pop(gen.id, None)
            self.zones.table.on_group_end(gen.id)
            self.metrics.generations_committed += 1
            return gen

    def _withdraw_commit(self, w: GenerationWriter) -> None:
        """The commit record of ``w``'s generation may be on the device although its write or its
        flush failed (the caller is told the commit failed): roll the journal over to a fresh chain
        (:meth:`Journal.roll`, flushed) whose snapshot does not hold the generation, so the error the
        caller saw decides it and the generation is absent after a restart too.  If the rollover
        fails as well, ``w``'s zones are kept at its abort (:attr:`GenerationWriter.in_doubt`): the
        next mount then finds either the commit with its data intact, or garbage it reclaims; never
        a commit whose zones were reset.  Called under the store's lock."""
        journal = self.log.journal
        try:
            journal.fenced = True
            journal.roll()
            journal.fenced = False
        except Exception:  # noqa: BLE001 - the commit's own error is what the caller gets
            w.in_doubt = True

    def rename_writer(self, w: GenerationWriter, gen_id: str) -> None:
        """Re-key ``w``'s uncommitted generation to ``gen_id`` (:meth:`GenerationWriter.rename`; see there);
        its journal estimate grows by the longer id."""
        with self.lock:
            self._check_writable()
            check_id(gen_id)
            if gen_id in self._writers:
                raise GenerationExistsError(f"generation {gen_id!r} is being written")
            if gen_id in self.catalog.gens:
                raise GenerationExistsError(f"generation {gen_id!r} already exists")
            old = w.gen.id
            if self._writers.get(old) is not w:
                raise ValueError(f"generation {old!r} is not being written by this writer")
            del self._writers[old]
            w.gen.id = gen_id
            self.zones.table.on_group_rename(old, gen_id)
            w.journal_estimate += max(0, len(gen_id.encode()) - len(old.encode()))
            self._writers[gen_id] = w

    def abort_writer(self, w: GenerationWriter) -> None:
        """Drop ``w``'s generation (:meth:`GenerationWriter.abort` calls this; see there)."""
        with self.lock:
            gen = w.gen
            if gen.state is not GenState.WRITING:
                if gen.state is GenState.ABORTED:
                    return
                raise ValueError(f"generation {gen.id!r} is {gen.state.value}: cannot abort it")
            gen.state = GenState.ABORTED
            self._writers.pop(gen.id, None)
            self.zones.table.on_group_end(gen.id)
            if self._closed or w.in_doubt:
                return
            self.write_path.drop(w.zone_bytes)
            self.metrics.generations_aborted += 1

    def generations(self) -> list[GenerationInfo]:
        """Committed generations, ascending step then id (never an unknown one: :meth:`unknown`)."""
        with self.lock:
            return [g for g in self.catalog.ordered() if g.state is GenState.COMMITTED]

    def unknown(self) -> list[GenerationInfo]:
        """Generations a repair made unknown (:attr:`GenState.UNKNOWN`: a lost journal record could
        have deleted or changed them), ascending step then id; each names why
        (``unknown_reason``).  Their bytes stay on the device; they are neither listed by
        :meth:`generations` nor read until :meth:`restore`."""
        with self.lock:
            return [g for g in self.catalog.ordered() if g.state is GenState.UNKNOWN]

    def generation(self, gen_id: str) -> GenerationInfo:
        """The committed generation ``gen_id``.

        Raises:
            GenerationNotFoundError: no committed generation has that id (an unknown one included:
                the message says how to inspect and restore it).
        """
        with self.lock:
            gen = self.catalog.gens.get(gen_id)
            if gen is None:
                raise GenerationNotFoundError(f"no committed generation {gen_id!r}")
            if gen.state is GenState.UNKNOWN:
                raise GenerationNotFoundError(unknown_message(gen, self.device.name))
            return gen

    def restore(self, gen_id: str) -> GenerationInfo:
        """Commit an unknown generation again (``retainz fsck --restore``): an explicit decision that
        it was not deleted.  Its bytes are checked first (every extent's crc32c); the journal gets a
        replacing commit of its entry, so a remount lists it.

        Raises:
            GenerationNotFoundError: no unknown generation ``gen_id``.
            ChecksumError: its data no longer reads back as committed (it is left unknown).
            ReadOnlyStoreError: the store is open read-only.
        """
        with self.lock:
            self._check_writable()
            gen = self.catalog.gens.get(gen_id)
            if gen is None or gen.state is not GenState.UNKNOWN:
                raise GenerationNotFoundError(f"no unknown generation {gen_id!r} (see `retainz fsck`)")
            for name in gen.shards:
                for _ in self.reader.read_shard(gen_id, name, allow_unknown=True):
                    pass
            gen.state, why = GenState.COMMITTED, gen.unknown_reason
            gen.unknown_reason = ""
            try:
                self.log.commit(gen_entry_bytes(gen), [])
            except BaseException:
                gen.state, gen.unknown_reason = GenState.UNKNOWN, why
                raise
            return gen

    def delete(self, gen_id: str, *, step: int | None = None) -> None:
        """Retire a committed generation: journal a deletion record (flushed), then reset the zones
        it leaves with no live data.  Other zones keep its bytes as dead until GC.

        Args:
            step: the training step of the retirement; logical time advances to it if later.

        Raises:
            GenerationNotFoundError: no committed generation has that id.
            ValueError: ``step`` is before the generation's own step.
        """
        with self.lock:
            self._check_writable()
            zones = self.zones
            gen = self.catalog.gens.get(gen_id)
            if gen is None:
                raise GenerationNotFoundError(f"no committed generation {gen_id!r}")
            if step is not None and check_step(step) < gen.step:
                raise ValueError(f"generation {gen_id!r}: retirement step {step} is before its own step "
                                 f"{gen.step} (a generation cannot be retired before it is saved)")
            if step is not None:
                zones.advance(step)
            zb, resets = self._retirement(gen)
            self.log.delete(gen_id, resets)
            self._retire(gen, zb, resets)

    def _retirement(self, gen: GenerationInfo) -> tuple[dict[int, int], list[int]]:
        """What retiring committed ``gen`` frees: ``({zone: its device bytes there}, the zones it
        leaves with no live data)``."""
        bs = self.zones.block_size
        zb: dict[int, int] = {}
        get = zb.get
        for s in gen.shards.values():
            for e in s.extents:
                zb[e[0]] = get(e[0], 0) - (-e[2] // bs) * bs
        summaries = self.zones.table.zones
        return zb, [z for z, n in zb.items() if summaries[z].live == n]

    def _retire(self, gen: GenerationInfo, zb: dict[int, int], resets: list[int]) -> None:
        """Apply a journaled retirement: the catalog drops ``gen``, its bytes die, then the zones
        the record names are reset (a failed reset leaves them all dead, still consistent)."""
        self.catalog.remove(gen.id)
        self.log.forget(gen.id)
        gen.state = GenState.DELETED
        self.zones.kill(zb)
        self.zones.reset_journaled(resets)
        self.metrics.generations_deleted += 1

    def update_hint(self, gen_id: str, hint: Hint, *, step: int | None = None) -> None:
        """Give generation ``gen_id`` a new retention hint: the runtime's rule changed (on resume,
        ``keep_latest_k`` 10 -> 3; a top-k metric re-ranked).  A committed generation's new hint is
        journaled (an ``h`` record) and replayed identically after a remount; one being written
        takes it with its commit.

        The zones holding the generation take the reclaim step the policy records for the new hint
        (``Allocator.reclaim_step_of``) where it is the zone's only live generation; elsewhere a
        later reclaim step raises the zone's (a zone's reclaim step bounds every live byte's death).

        Args:
            step: the training step of the change; logical time advances to it if later.

        Raises:
            GenerationNotFoundError: no such generation.
            ValueError: the hint's reclaim step is before the generation's own step.
        """
        with self.lock:
            self._check_writable()
            check_hint(hint)
            if step is not None:
                check_step(step)
            w = self._writers.get(gen_id)
            gen = w.gen if w is not None else self.catalog.gens.get(gen_id)
            if gen is None:
                raise GenerationNotFoundError(f"no generation {gen_id!r}")
            if hint.reclaim_step is not None and hint.reclaim_step < gen.step:
                raise ValueError(f"generation {gen_id!r}: reclaim step {hint.reclaim_step} is before its own "
                                 f"step {gen.step} (a generation cannot be retired before it is saved)")
            if step is not None:
                self.zones.advance(step)
            if w is not None:
                gen.hint = hint
                return
            table = self.zones.table
            old_hint, before = gen.hint, {}
            gen.hint = hint
            req = ExtentRequest(0, gen.id, gen.step, hint, self.zones.now)
            r = self.allocator.reclaim_step_of(req)
            busy = self._busy_zones()
            for z in {e[0] for sh in gen.shards.values() for e in sh.extents}:
                s = table.zones[z]
                alone = len(self.catalog.zone_gens.get(z, ())) == 1 and z not in busy
                new = r if alone else (r if r is not None and (s.reclaim_step is None or r > s.reclaim_step)
                                       else s.reclaim_step)
                if new != s.reclaim_step:
                    before[z] = s.reclaim_step
                    table.on_reclaim_step(z, new)
                    self.zones.changed.add(z)
            try:
                self.log.hint(gen_id, hint)
            except BaseException:
                gen.hint = old_hint
                for z, v in before.items():
                    table.on_reclaim_step(z, v)
                raise

    def advance(self, step: int) -> None:
        """Move logical time to training step ``step`` (no-op if not later than the current step).
        Dead-space and unused-capacity byte-steps integrate over it.

        Raises:
            ValueError: not a step (:func:`check_step`)."""
        with self.lock:
            self.zones.advance(check_step(step))

    @property
    def admission_reserve_zones(self) -> int:
        """Empty zones' capacity admission keeps free for GC: the policy's own need
        (``Allocator.admission_reserve(gc_reserve_zones)``; 0 for ZenFS, whose GC never writes
        into an empty zone)."""
        return self.allocator.admission_reserve(self.gc_reserve_zones)

    def stop_state(self) -> dict:
        """The data zones' state at a capacity stop (:meth:`ZoneBook.stop_state`)."""
        return self.zones.stop_state()

    # -- GC, reads, checks -------------------------------------------------------------------------------
    def gc(self, *, force: bool = False, progress=None) -> GCReport:
        """Run one pass of copying GC (:meth:`Collector.collect`).

        Args:
            force: ask the policy for victims as if every data zone had to be empty, not only when
                fewer than ``gc_reserve_zones`` zones are empty.
            progress: called with (victim zones done, victim zones) as the pass goes (a progress bar).
        """
        with self.lock:
            self._check_writable()
            return self.collector.collect(force=force, progress=progress)

    def _busy_zones(self) -> set[int]:
        """Zones holding data of generations being written (GC leaves them alone)."""
        busy: set[int] = set()
        for w in self._writers.values():
            busy.update(w.zone_bytes)
            for s in w.open_shards:
                busy.update(s.zone_bytes)
        return busy

    def read_shard(self, gen_id: str, name: str) -> Iterator[bytes]:
        """Stream a committed shard, every extent verified (:meth:`Reader.read_shard`)."""
        return self.reader.read_shard(gen_id, name)

    def read_shard_extent(self, gen_id: str, name: str, pos: int) -> tuple[int, bytes]:
        """The verified extent holding data byte ``pos`` (:meth:`Reader.read_shard_extent`)."""
        return self.reader.read_shard_extent(gen_id, name, pos)

    def read_shard_into(self, gen_id: str, name: str, pos: int, out) -> int:
        """Whole verified extents from data byte ``pos`` straight into ``out``; bytes filled
        (:meth:`Reader.read_shard_into`)."""
        return self.reader.read_shard_into(gen_id, name, pos, out)

    def fsck(self, *, progress=None) -> FsckReport:
        """Check the whole store (:func:`~retainz.store.check.fsck`); nothing is written.
        ``progress``: called with the data bytes of each extent as it is checked."""
        with self.lock:
            self.check_open()
            rep = check.fsck(self.device, self.catalog, self.zones, self.recompute_table(),
                             self.recovery.repairs, progress=progress)
            rep.notes += self.recovery.copies
            rep.notes += self.log.journal.previous_damage()
            rep.notes += [f"salvage: {line}" for line in self.recovery.lost]
            if self.recovery.upgraded_from is not None:
                rep.notes.append(f"upgraded: the store from format version {self.recovery.upgraded_from} to "
                                 f"{self.format_version} (its journal rolled over at the new version)")
            rep.dropped = [d for d in self.recovery.dropped if not d.get("unknown")]
            rep.unknown = [{"id": g.id, "step": g.step, "reason": g.unknown_reason, "bytes": g.size}
                           for g in self.catalog.ordered() if g.state is GenState.UNKNOWN]
            rep.generations -= len(rep.unknown)
            return rep

    def df(self) -> SpaceReport:
        """Space report, like ``zenfs df`` (:func:`~retainz.store.check.space`), with what admission
        can reserve now and the capacity it keeps for GC."""
        with self.lock:
            reserve = self.admission_reserve_zones * self.zones.zone_capacity
            return check.space(self.zones, len(self.catalog.gens), admissible=max(self._admittable(), 0),
                               gc_reserve=reserve if self.allocator.admission_control else 0)

    def recompute_table(self) -> ZoneTable:
        """The zone table rebuilt from scratch (:func:`~retainz.store.check.recompute_table`) from
        everything live: committed extents, the open writers' shards, GC copies in flight.
        ``store.table.key() == store.recompute_table().key()`` must always hold."""
        with self.lock:
            lists = [s.extents for gen in self.catalog.gens.values() for s in gen.shards.values()]
            for w in self._writers.values():
                lists += [s.extents for s in w.gen.shards.values()]
                lists += [s.extents for s in w.open_shards]
            lists.append(self.collector.inflight)
            return check.recompute_table(self.zones, lists)

    def _verify_summaries(self) -> None:
        """``verify_summaries``: the cached summaries must equal a recomputation before every decision."""
        fresh = self.recompute_table()
        t = self.zones.table
        if fresh.key() != t.key():
            bad = [z for z in t.zones if fresh.zones[z].key() != t.zones[z].key()]
            raise SummaryMismatchError(f"cached zone summaries differ from a recomputation in zones {bad[:8]}")
        t.restore(list(fresh.zones.values()))
