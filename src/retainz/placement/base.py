"""The placement interface: allocators decide, the store acts.

An :class:`Allocator` is a decision function over a :class:`ZoneTable`, the store's incrementally
maintained summary of every data zone.  The store calls, in order:

1. ``allocator.bind(table)`` once per store open (after recovery has rebuilt the table);
2. for every extent to place: ``allocator.place(request) -> Decision``; the store executes the
   decision (finishes the zones it names, then writes ``min(request.nbytes, zone.remaining)`` bytes
   into ``decision.zone``) and asks again for the rest of the shard;
3. after deletions and before admitting a generation: ``allocator.gc_victims()``; the store copies the
   live extents of each victim (placing each copy with ``request.gc = True``), journals the move and
   resets the victim.

Allocators never touch the device nor mutate the table; they may keep private indexes, updated from
:meth:`Allocator.zone_changed`, which the table calls after every change to a zone.  Everything an
allocator's decisions depend on must be derivable from the table (which the store journals), so a
remounted store decides exactly as before.

Logical time: ``step`` values are training steps the runtime reports (never wall time); the
store never passes wall time.
"""

from __future__ import annotations

import abc
import gc
import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from retainz.hint import Hint
from retainz.zoned.model import DeviceInfo, Geometry, ZoneCond

__all__ = [
    "PERMANENT",
    "ExtentRequest",
    "Decision",
    "NO_SPACE",
    "ZoneSummary",
    "ZoneTable",
    "Allocator",
]

#: The reclaim step of data that never retires.
PERMANENT = math.inf
_EMPTY_C, _OPEN_C, _FULL_C = ZoneCond.EMPTY, ZoneCond.IMP_OPEN, ZoneCond.FULL


@dataclass(slots=True, unsafe_hash=True)
class ExtentRequest:
    """An extent the store needs a zone for.

    Built once per extent on the replay hot path, so a plain slots dataclass (its ``__init__``
    assigns; a frozen dataclass's costs about five times more): treat it as immutable.  Construct
    it by position or keyword; ``dataclasses.replace`` works.

    Attributes:
        nbytes: bytes still to place for the current shard (> 0).  The store writes at most the
            chosen zone's remaining capacity and asks again for the rest.
        generation: the generation id.
        step: the generation's training step.
        hint: the generation's :class:`~retainz.hint.Hint`.
        now: the current training step (the latest step the store has seen).
        gc: True when the bytes are live data being migrated by garbage collection.
        pending: bytes of the same generation still to be placed after this request (its other
            shards): the declared size (block-rounded) less the bytes already placed for the
            generation and less ``nbytes``; 0 when no size was declared, and for GC requests.
            Policies use ``nbytes + pending`` as the size of the group still to come (how much
            of a fresh zone the group will fill).
    """

    nbytes: int
    generation: str
    step: int
    hint: Hint
    now: int
    gc: bool = False
    pending: int = 0


@dataclass(slots=True, unsafe_hash=True)
class Decision:
    """An allocator's answer (a lean slots dataclass like :class:`ExtentRequest`: treat it as
    immutable; :data:`NO_SPACE` is shared).

    Attributes:
        zone: write into this zone: an active data zone with remaining capacity, or an empty data zone
            to open; ``None`` means no space (the store then tries GC, then refuses).
        finish: zones to finish before writing (their unwritten capacity becomes unusable until
            reset: "unused capacity").  Finishing releases active-zone resources.
        reclaim_step: the reclaim step the allocator assigns to these bytes (its view of the hint:
            exact, coarse, noisy, none or oracle).  The store records it as the zone's reclaim step
            (the max over the zone's data) and journals it.
        lifetime: the ZenFS lifetime class to record for the zone when this decision opens it
            (``ZoneSummary.lifetime``); ``None`` means ``request.hint.lifetime``.

    A decision with ``zone=None`` may still name zones in ``finish``: ZenFS finishes a zone and
    then fails to find an empty one ("Zone allocation failure"); the store finishes them anyway.
    """

    zone: int | None
    finish: tuple[int, ...] = ()
    reclaim_step: float | None = None
    lifetime: int | None = None


NO_SPACE = Decision(None)


@dataclass(slots=True)
class ZoneSummary:
    """What the store knows about one data zone.  Owned by the store; allocators only read it.

    Attributes:
        index: device zone index.
        capacity: writable bytes (zone capacity).
        cond: ``EMPTY``, ``FULL`` or ``IMP_OPEN`` (the table's view: any non-empty, non-full zone is
            "open" for placement, whether the device reports it open or closed).
        written: bytes written since the last reset.
        live: bytes of data that is still needed (committed and not retired, or being written).
        dead: bytes of data no longer needed (retired generations, aborted writes, copies left behind
            by GC) that a reset would reclaim.
        reclaim_step: the latest reclaim step of any data placed in the zone since its last reset
            (``None`` for an empty zone or when every placement was hint-less).
        lifetime: the ZenFS lifetime class given to the zone when it was opened (ZenFS sets it once,
            from the first file that gets the empty zone).
        opened_step: the training step at which the zone was opened (0 when empty).
        open_seq: the zone's place in the table's opening order (the table's count of zone
            openings when this zone was opened; 0 when empty).  ``ZoneTable.open`` iterates open
            zones in this order, and the store journals it, so the order survives a remount.
        last_write_step: the training step of the zone's latest write (0 when empty): the store
            charges a zone reset while part-empty ``(capacity - written) x (reset step -
            last_write_step)`` byte-steps of unused capacity.
    """

    index: int
    capacity: int
    cond: ZoneCond = ZoneCond.EMPTY
    written: int = 0
    live: int = 0
    dead: int = 0
    reclaim_step: float | None = None
    lifetime: int = 0
    opened_step: int = 0
    open_seq: int = 0
    last_write_step: int = 0

    @property
    def remaining(self) -> int:
        """Bytes that can still be written (0 for a full zone)."""
        return 0 if self.cond == ZoneCond.FULL else self.capacity - self.written

    @property
    def unused(self) -> int:
        """Capacity lost to an early finish (``capacity - written`` of a full zone, else 0)."""
        return self.capacity - self.written if self.cond == ZoneCond.FULL else 0

    def key(self) -> tuple:
        """Every field, for equality checks against a recomputation."""
        return (self.index, self.capacity, int(self.cond), self.written, self.live, self.dead,
                self.reclaim_step, self.lifetime, self.opened_step, self.open_seq, self.last_write_step)


class _EmptySet:
    """Empty zone indexes with O(log n) lowest-index lookup (a min-heap with lazy deletion)."""

    __slots__ = ("_heap", "_member", "count")

    def __init__(self, n: int, zones=()):
        """Zone indexes below ``n``; ``zones`` (ascending: a sorted list is a min-heap) start in it."""
        self._heap: list[int] = list(zones)
        self._member = member = bytearray(n)
        for z in self._heap:
            member[z] = 1
        self.count = len(self._heap)

    def add(self, z: int) -> None:
        if not self._member[z]:
            self._member[z] = 1
            self.count += 1
            heapq.heappush(self._heap, z)

    def discard(self, z: int) -> None:
        if self._member[z]:
            self._member[z] = 0
            self.count -= 1

    def __contains__(self, z: int) -> bool:
        return bool(self._member[z])

    def first(self) -> int | None:
        heap, member = self._heap, self._member
        while heap and not member[heap[0]]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def __iter__(self) -> Iterator[int]:
        return (z for z in range(len(self._member)) if self._member[z])


class ZoneTable:
    """Incrementally maintained summaries of the data zones (meta zones are not in it).

    Args:
        capacities: ``{zone index: zone capacity}`` for every data zone.
        max_open: open-zone budget for data (0 = unlimited), after the store's own reservations.
        max_active: active-zone budget for data (0 = unlimited), likewise.
        reserved_active: active zones the store keeps for itself (meta zones), so that
            ``max_active + reserved_active`` is the device's limit (0 when ``max_active`` is 0).
            The ZenFS port needs it to apply ZenFS's own "device max - 2" rule.

    Attributes:
        zones: ``{index: ZoneSummary}`` for every data zone (ascending index order).
        open: ``{index: ZoneSummary}`` of zones that hold data and are not full (the placement
            candidates; each holds one active resource), in opening order (``open_seq``), also
            after :meth:`restore`: a policy may depend on it (greedy writes to the first).
        open_seq: zone openings counted so far (the last ``ZoneSummary.open_seq`` handed out).
        live, dead, written, unused: totals over all data zones, in bytes.
        now: the latest training step the store has reported.
        writing: ``{generation id: open zones it has written into}`` for every group (generation)
            in flight: begun and still able to write (:meth:`on_group_begin` to
            :meth:`on_group_end`: its declared bytes all written and its shards closed, or its
            commit or abort).  Several saves overlap in time on a shared device (the ranks of a
            job, jobs saving at once, asynchronous checkpointing), so an open zone of an older
            group may still be filled by it.  Not journaled: a remount aborts every writer in flight.
        filling: ``{open zone: generation ids in flight that wrote into it}`` (the inverse of
            ``writing``; a zone leaves it when it is full, finished or reset).

    The store reports every change through the ``on_*`` methods; each notifies listeners
    (:meth:`Allocator.zone_changed`).  :meth:`key` is the whole state, for the cached-summary
    equivalence test.
    """

    def __init__(self, capacities: dict[int, int], *, max_open: int = 0, max_active: int = 0,
                 reserved_active: int = 0):
        # A summary per zone: a million of them at the largest device.  They hold no references,
        # so the cyclic collector's passes over them while they are made (half the time at
        # 1,048,576 zones, issue 44) find nothing: it waits until they are built.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.zones: dict[int, ZoneSummary] = {z: ZoneSummary(z, capacities[z]) for z in sorted(capacities)}
        finally:
            if collecting:
                gc.enable()
        self.max_open = max_open
        self.max_active = max_active
        self.reserved_active = reserved_active
        self.open: dict[int, ZoneSummary] = {}
        self._empty = _EmptySet(max(self.zones, default=-1) + 1, self.zones)
        self.live = self.dead = self.written = self.unused = 0
        self.now = 0
        self.open_seq = 0
        self.writing: dict[str, set[int]] = {}
        self.filling: dict[int, set[str]] = {}
        self.listeners: list[Callable[[ZoneSummary], None]] = []

    # -- queries -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.zones)

    def __iter__(self) -> Iterator[ZoneSummary]:
        return iter(self.zones.values())

    def __getitem__(self, z: int) -> ZoneSummary:
        return self.zones[z]

    @property
    def n_empty(self) -> int:
        return self._empty.count

    @property
    def reclaimable(self) -> int:
        """Bytes that resets could return to the free space beyond the live data, O(1): dead bytes
        plus the capacity lost to finishes (``unused``).  A finished zone's unwritten capacity
        comes back only with a reset (NVMe ZNS: Finish Zone makes the zone Full; Reset Zone makes
        it Empty), exactly as its dead bytes do, so a copying pass can free both: ZenFS's
        ``GCWorker`` (fs/fs_zenfs.cc) rates a full zone's garbage ``100 - 100 * used_capacity /
        max_capacity``, unwritten capacity included.  0 means no GC pass can free anything."""
        return self.dead + self.unused

    def first_empty(self) -> int | None:
        """Lowest-index empty data zone (ZenFS AllocateEmptyZone order), O(log zones)."""
        return self._empty.first()

    def is_empty(self, z: int) -> bool:
        return z in self._empty

    def empty_zones(self) -> Iterator[int]:
        return iter(self._empty)

    def filled_by_others(self, z: int, generation: str) -> bool:
        """True when a group in flight other than ``generation`` has written into open zone ``z``
        (it may write there again: the zone is not the older group's leftover capacity)."""
        f = self.filling.get(z)
        return bool(f) and (len(f) > 1 or generation not in f)

    @property
    def can_open(self) -> bool:
        """True when an empty zone can be opened without finishing one (active budget)."""
        return self._empty.count > 0 and (not self.max_active or len(self.open) < self.max_active)

    @property
    def capacity(self) -> int:
        return sum(s.capacity for s in self.zones.values())

    @property
    def free(self) -> int:
        """Bytes writable without a reset: remaining capacity of open zones plus empty zones."""
        return (sum(s.remaining for s in self.open.values())
                + sum(self.zones[z].capacity for z in self._empty))

    def key(self) -> tuple:
        """The whole state (every summary and total), for equality with a recomputation."""
        return (tuple(s.key() for s in self.zones.values()), tuple(self.open),
                tuple(sorted(self._empty)), self.live, self.dead, self.written, self.unused)

    # -- updates (store only) ----------------------------------------------------------------------
    def _changed(self, s: ZoneSummary) -> None:
        for fn in self.listeners:
            fn(s)

    def on_group_begin(self, generation: str) -> None:
        """A group (generation) is admitted and may write from now on (``Store.begin_generation``)."""
        self.writing.setdefault(generation, set())

    def on_fill(self, z: int, generation: str) -> None:
        """Group ``generation`` (in flight) wrote into zone ``z``, which is still open."""
        zones = self.writing.get(generation)
        if zones is not None and z in self.open:
            zones.add(z)
            f = self.filling.get(z)
            if f is None:
                self.filling[z] = {generation}
            else:
                f.add(generation)

    def on_group_end(self, generation: str) -> None:
        """Group ``generation`` writes no more: every declared byte written and its shards closed,
        or it was committed or aborted."""
        for z in self.writing.pop(generation, ()):
            f = self.filling.get(z)
            if f is not None:
                f.discard(generation)
                if not f:
                    del self.filling[z]

    def on_group_rename(self, old: str, new: str) -> None:
        """An uncommitted group got another id (``GenerationWriter.rename``)."""
        zones = self.writing.pop(old, None)
        if zones is None:
            return
        self.writing[new] = zones
        for z in zones:
            f = self.filling[z]
            f.discard(old)
            f.add(new)

    def _closed(self, z: int) -> None:
        """Zone ``z`` is no longer open (full, finished or reset): nobody fills it."""
        for g in self.filling.pop(z, ()):
            self.writing[g].discard(z)

    def on_write(self, z: int, nbytes: int, reclaim_step: float | None, lifetime: int, step: int,
                 live: bool = True) -> None:
        """``nbytes`` were written at zone ``z``'s write pointer (live data unless ``live=False``,
        e.g. bytes that are garbage from the start) at training step ``step`` (the zone's opening
        step if it was empty, and its last write step).  O(log zones) when it opens the zone,
        O(1) otherwise (the replay hot path)."""
        s = self.zones[z]
        if s.cond is _EMPTY_C:
            self._empty.discard(z)
            self.open[z] = s
            s.cond = _OPEN_C
            s.lifetime = lifetime
            s.opened_step = step
            self.open_seq += 1
            s.open_seq = self.open_seq
        if reclaim_step is not None:
            r = s.reclaim_step
            if r is None or reclaim_step > r:
                s.reclaim_step = reclaim_step
        w = s.written + nbytes
        s.written = w
        s.last_write_step = step
        self.written += nbytes
        if live:
            s.live += nbytes
            self.live += nbytes
        else:
            s.dead += nbytes
            self.dead += nbytes
        if w >= s.capacity:
            s.cond = _FULL_C
            del self.open[z]
            if z in self.filling:
                self._closed(z)
        if self.listeners:
            for fn in self.listeners:
                fn(s)

    def on_finish(self, z: int) -> None:
        """Zone ``z`` was finished: its remaining capacity is unused until reset."""
        s = self.zones[z]
        if s.cond == ZoneCond.FULL:
            return
        if s.cond == ZoneCond.EMPTY:
            self._empty.discard(z)
        else:
            del self.open[z]
            if z in self.filling:
                self._closed(z)
        s.cond = ZoneCond.FULL
        self.unused += s.capacity - s.written
        self._changed(s)

    def on_kill(self, z: int, nbytes: int) -> None:
        """``nbytes`` of live data in zone ``z`` became dead (retired, aborted, or moved by GC)."""
        s = self.zones[z]
        s.live -= nbytes
        s.dead += nbytes
        self.live -= nbytes
        self.dead += nbytes
        if self.listeners:
            self._changed(s)

    def on_reclaim_step(self, z: int, reclaim_step: float | None) -> None:
        """Zone ``z``'s reclaim step changed (a generation's hint was updated)."""
        s = self.zones[z]
        s.reclaim_step = reclaim_step
        self._changed(s)

    def on_reset(self, z: int) -> None:
        """Zone ``z`` was reset: empty again."""
        s = self.zones[z]
        cond = s.cond
        if cond is _EMPTY_C and s.written == 0:
            return
        if cond is _FULL_C:
            self.unused -= s.capacity - s.written
        else:
            self.open.pop(z, None)
            if z in self.filling:
                self._closed(z)
        self.written -= s.written
        self.live -= s.live
        self.dead -= s.dead
        s.cond = _EMPTY_C
        s.written = s.live = s.dead = s.lifetime = s.opened_step = s.open_seq = s.last_write_step = 0
        s.reclaim_step = None
        self._empty.add(z)
        if self.listeners:
            self._changed(s)

    def restore(self, summaries: list[ZoneSummary]) -> None:
        """Replace the summaries of the zones in ``summaries`` (recovery: every zone that is not
        empty, the others keeping the fresh table's empty summaries; a check: every zone),
        updating the open/empty sets and totals zone by zone: O(summaries), not O(zones).

        ``open`` is rebuilt in opening order (``open_seq``, then index), and the opening counter
        continues from the highest ``open_seq`` (or the current count, if higher).  Listeners are
        told of every zone given."""
        zones, empty, open_ = self.zones, self._empty, self.open
        for s in summaries:
            z = s.index
            old = zones.get(z)
            if old is not None:
                self.live -= old.live
                self.dead -= old.dead
                self.written -= old.written
                self.unused -= old.unused
                if old.cond == ZoneCond.EMPTY:
                    empty.discard(z)
                elif old.cond != ZoneCond.FULL:
                    open_.pop(z, None)
            zones[z] = s
            if s.cond == ZoneCond.EMPTY:
                empty.add(z)
            elif s.cond != ZoneCond.FULL:
                open_[z] = s
            if s.open_seq > self.open_seq:
                self.open_seq = s.open_seq
            self.live += s.live
            self.dead += s.dead
            self.written += s.written
            self.unused += s.unused
        opened = sorted(open_.values(), key=lambda s: (s.open_seq, s.index))
        open_.clear()
        for s in opened:
            open_[s.index] = s
        for s in summaries:
            self._changed(s)


@dataclass
class Allocator(abc.ABC):
    """A placement policy.  Subclasses are dataclasses whose fields are their parameters
    (``--policy NAME:param=value``).

    Contract:
      * :meth:`place` is deterministic given the table state and the request (seeded randomness
        only, e.g. the noisy-hint control), and must not modify the table.
      * A returned zone is either in ``table.open`` with ``remaining > 0`` or empty; zones in
        ``finish`` are open; if the zone is empty, ``len(table.open) - len(finish) <
        table.max_active`` (or no limit).  The store checks and raises ``ValueError`` otherwise.

    Example, the simplest policy (one log)::

        @dataclass
        class Greedy(Allocator):
            name = "greedy"
            def place(self, req):
                for z in self.table.open:  # the single open zone, if any
                    return Decision(z, reclaim_step=req.hint.reclaim_step)
                z = self.table.first_empty()
                return Decision(z, reclaim_step=req.hint.reclaim_step) if z is not None else NO_SPACE
    """

    name = "abstract"
    #: True for a per-file policy: a shard keeps the zone it was given until that zone is full, and
    #: the store asks again only then (ZenFS ``ZoneFile::AllocateNewZone`` runs on a file's first
    #: write and when its active zone is full, fs/io_zenfs.cc ``BufferedAppend``).  False: the
    #: store asks on every extent it writes (each 1 MiB buffer on a payload device).
    keeps_file_zone = False
    #: False for a policy whose upstream has no admission control (ZenFS: a write proceeds until
    #: ``AllocateIOZone`` fails): the store then admits every generation without reserving or
    #: checking data bytes, and a capacity stop comes from allocation.  The journal's own check
    #: stays (it guards the store's metadata, not the policy's data).
    admission_control = True
    table: ZoneTable = field(init=False, repr=False, compare=False)

    def bind(self, table: ZoneTable) -> None:
        """Attach to the store's table (once per store open, after recovery).  Override to build
        private indexes; call ``super().bind(table)``.  :meth:`zone_changed` is registered as a
        table listener only when the policy overrides it (no call per change otherwise)."""
        self.table = table
        if type(self).zone_changed is not Allocator.zone_changed:
            table.listeners.append(self.zone_changed)

    def use_device(self, info: DeviceInfo) -> None:  # noqa: B027 - optional hook
        """Called by the store with the device it places on (``DeviceInfo``: geometry and kind),
        after :meth:`bind`, for a policy whose costs depend on the kind of device.  The default
        ignores it."""

    def zone_changed(self, zone: ZoneSummary) -> None:  # noqa: B027 - optional hook
        """Called after every change to a zone summary (incremental indexes)."""

    @abc.abstractmethod
    def place(self, req: ExtentRequest) -> Decision:
        """Choose where ``req`` goes (see the class contract)."""

    def gc_victims(self, reserve_zones: int) -> list[int]:
        """Zones to garbage-collect now, most urgent first (empty list: no GC).

        The default collects while fewer than ``reserve_zones`` zones are empty: full zones with
        dead bytes, most dead bytes first (ties: lowest index), until enough would be freed.
        """
        t = self.table
        if t.n_empty >= reserve_zones:
            return []
        full = [s for s in t if s.cond == ZoneCond.FULL and s.dead > 0]
        full.sort(key=lambda s: (-s.dead, s.index))
        return [s.index for s in full[:reserve_zones - t.n_empty]]

    def admission_reserve(self, store_reserve: int) -> int:
        """Empty zones the store's admission keeps free for this policy's GC.

        Args:
            store_reserve: the store's configured reserve (``gc_reserve_zones``, zones).

        Returns:
            zones (``0 <= n <= store_reserve``).  The default keeps ``store_reserve``: the base GC
            rule copies victims into zones it may have to open.  A policy whose GC never writes into
            an empty zone returns 0 (a reserve would only refuse data the policy could place).
        """
        return store_reserve

    def reclaim_step_of(self, req: ExtentRequest) -> float | None:
        """The reclaim step this policy records for data of ``req`` (``Decision.reclaim_step``),
        asked by the store when a generation's hint changes (``Store.update_hint``).  The default:
        the hint's own."""
        return req.hint.reclaim_step

    def migrates(self, shard: str) -> bool:
        """Whether GC may move the extents of the shard (file) named ``shard``; the default: every
        shard.  An extent GC may not move stays in its zone, which then cannot be reset."""
        del shard  # Ignored by the default rule.
        return True

    def check_device(self, geometry: Geometry) -> None:
        """Refuse a device this policy's upstream refuses or cannot run on (called by
        ``Store.format``/``open`` with the device's geometry, meta zones included, before anything
        is written).  The default accepts any device.

        Raises:
            ValueError: the device cannot be used with this policy (one line saying why).
        """
        del geometry  # Ignored by the default rule.

    def check_finite(self, param: str, lo: float, hi: float = math.inf) -> None:
        """``check_param`` for a real number: finite and ``lo <= value <= hi``."""
        v = getattr(self, param)
        self.check_param(param, math.isfinite(v) and lo <= v <= hi,
                         f"a finite number >= {lo:g}" + (f" and <= {hi:g}" if hi != math.inf else ""))

    def check_int(self, param: str, lo: int, hi: int | None = None) -> None:
        """``check_param`` for an integer: ``lo <= value <= hi``."""
        v = getattr(self, param)
        self.check_param(param, isinstance(v, int) and v >= lo and (hi is None or v <= hi),
                         f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""))

    def check_param(self, param: str, ok: bool, valid: str) -> None:
        """Raise ``ValueError`` naming the policy, ``param``, its value and the ``valid`` range
        unless ``ok`` (for ``__post_init__`` validation of the dataclass fields)."""
        if not ok:
            raise ValueError(f"policy {self.name}: {param}={getattr(self, param)!r} is out of range; "
                             f"valid: {valid}")

    def describe(self) -> str:
        """``NAME:param=value,...`` as given on the command line."""
        params = {k: v for k, v in self.__dict__.items() if k != "table" and not k.startswith("_")}
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
