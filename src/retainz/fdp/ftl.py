"""A page-mapped FTL model of a conventional NVMe namespace on flash with Flexible Data Placement.

What it models (NVMe TP4146 "Flexible Data Placement", NVMe 2.x base specification; terms as in
Allison et al., EuroSys'25, section 3.2):

* **Pages** are the mapping unit (``page_bytes``): every logical page (LPN) maps to at most one physical
  page.  A flash page is 4-16 KiB; a coarser unit is exact whenever every write and Deallocate of the
  workload is aligned to it and a whole multiple of it (checkpoint extents are MiB-aligned), because then
  no unit is ever partly valid.  The byte interface refuses anything else.
* **Erase blocks** of ``pages_per_block`` pages are grouped into **reclaim units** (RUs) of
  ``blocks_per_ru`` blocks.  The RU is the unit garbage collection (GC) reclaims: it erases all the blocks
  of an RU together (a superblock, as on the PM9D3 of EuroSys'25 section 6.1).  Desnoyers' "pages per
  block" Np is therefore this model's pages per RU.
* **Reclaim groups** (RGs) each own ``rus_per_rg`` RUs and their own GC: data never moves between RGs.
  (Real devices have equal RGs; the model also takes one RU count per RG, which makes two RGs two pools
  with a fixed split of the spare space: Desnoyers' Eqs. 20-22.)
* **Reclaim unit handles** (RUHs): each handle points, per RG, at the RU it is filling.  A handle is
  *initially isolated* (II: GC may gather the valid data of every II handle's RUs into one shared GC
  destination per RG) or *persistently isolated* (PI: GC moves a PI handle's data only into that handle's
  own GC destination).  A write names a placement identifier ``(rg, handle)``; an RU that fills is closed
  and the handle moves to a fresh RU (writes cross RU boundaries freely).
* **Over-provisioning**: the namespace has ``logical_pages`` pages; the flash holds (RUs of all RGs) x
  ``pages_per_ru`` physical pages.  ``reserve_rus`` free RUs per RG are kept for GC: a host write that
  needs a fresh RU first runs GC until more than ``reserve_rus`` RUs are free.
* **Where GC's copies go** (``gc_copies_to``): ``"gc_ru"`` (default), into a GC RU of their own per isolation
  domain and RG (one shared by all II handles, one per PI handle), as FDP firmware and FEMU/WARP do; or
  ``"host_ru"``, appended to the RU the domain's handle is filling (for II data the first II handle's):
  one write frontier per pool, the assumption of Desnoyers' model (SYSTOR'12, section 3).  The two agree on
  uniform traffic; on skewed traffic GC RUs hold older, colder data, which lowers write amplification.
* **GC victim selection**: ``"greedy"`` (the closed RU with the fewest valid pages; ties to the oldest) or
  ``"fifo"`` (the oldest closed RU, Desnoyers' LRU), among the closed RUs of the RG.  A fully invalid RU is
  erased without copying.
* **Statistics** as the FDP statistics log page (log identifier 0x22) reports them: host bytes with
  metadata written (HBMW), media bytes with metadata written (MBMW), media bytes erased (MBE), plus the
  controller's Media Reallocated events (FDP event type 0x80, with the number of LBAs moved) and, per
  handle, the host bytes written through it and the bytes GC relocated of data it wrote.  Device write
  amplification is MBMW / HBMW over a window (:meth:`FdpStatistics.minus`).
* **RUH Update** (I/O Management Send): a handle leaves its partly written RU early; as QEMU's
  ``nvme_update_ruh`` does, the unwritten remainder is charged to MBMW (the device pads it) and an
  "RU Not Fully Written" event is counted.

Not modelled: reads, timing, wear levelling, the FDP event log's contents beyond counts, power loss.
State is numpy arrays; operations work on whole runs of pages, so a sequential extent of any length costs a
few numpy calls per RU it touches and uniform random traffic costs a few numpy calls per RU GC reclaims.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field, fields

import numpy as np

from retainz.errors import ReclaimGroupFullError

__all__ = [
    "RuhType",
    "FlashGeometry",
    "FdpStatistics",
    "FlashTranslationLayer",
]


class RuhType(enum.Enum):
    """Reclaim unit handle types (NVMe TP4146; the FDP configuration's RUH descriptors)."""

    INITIALLY_ISOLATED = "II"
    PERSISTENTLY_ISOLATED = "PI"


@dataclass(frozen=True)
class FlashGeometry:
    """The flash behind one namespace.  Sizes in bytes; counts are whole numbers >= 1.  ``rus_per_rg`` is
    one count for ``nr_rgs`` equal reclaim groups, or a tuple with one count per group (then ``nr_rgs`` is
    its length).

    Raises ValueError for a count below 1, a tuple whose length is not ``nr_rgs`` (when given) or a page
    size that is not a positive multiple of 512.
    """

    page_bytes: int
    pages_per_block: int
    blocks_per_ru: int
    rus_per_rg: int | tuple[int, ...]
    nr_rgs: int = 1

    def __post_init__(self) -> None:
        if self.page_bytes <= 0 or self.page_bytes % 512:
            raise ValueError(f"page size must be a positive multiple of 512 bytes, got {self.page_bytes}")
        if isinstance(self.rus_per_rg, tuple):
            if self.nr_rgs not in (1, len(self.rus_per_rg)):
                raise ValueError(f"{len(self.rus_per_rg)} RU counts given for {self.nr_rgs} reclaim groups")
            object.__setattr__(self, "nr_rgs", len(self.rus_per_rg))
        for name in ("pages_per_block", "blocks_per_ru", "nr_rgs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', ' ')} must be >= 1, got {getattr(self, name)}")
        if min(self.rg_rus) < 1:
            raise ValueError(f"RUs per reclaim group must be >= 1, got {self.rus_per_rg}")

    @property
    def rg_rus(self) -> tuple[int, ...]:
        """The number of RUs of each reclaim group."""
        r = self.rus_per_rg
        return tuple(r) if isinstance(r, tuple) else (r,) * self.nr_rgs

    @property
    def rg_first_ru(self) -> tuple[int, ...]:
        """The global index of each reclaim group's first RU (RUs are numbered group after group)."""
        out, n = [], 0
        for c in self.rg_rus:
            out.append(n)
            n += c
        return tuple(out)

    @property
    def pages_per_ru(self) -> int:
        return self.pages_per_block * self.blocks_per_ru

    @property
    def ru_bytes(self) -> int:
        return self.pages_per_ru * self.page_bytes

    @property
    def nr_rus(self) -> int:
        return sum(self.rg_rus)

    @property
    def physical_pages(self) -> int:
        return self.nr_rus * self.pages_per_ru

    @property
    def physical_bytes(self) -> int:
        return self.physical_pages * self.page_bytes


@dataclass
class FdpStatistics:
    """Counters of the FDP statistics log page (0x22) and the model's per-handle attribution, in bytes
    unless named otherwise.  :meth:`minus` gives a window (the log is read twice, as EuroSys'25 section
    6.1 polls it); :attr:`waf` is MBMW / HBMW (device-level write amplification, DLWA)."""

    host_bytes_written: int = 0  # HBMW
    media_bytes_written: int = 0  # MBMW: host pages, GC relocations, RUH Update padding
    media_bytes_erased: int = 0  # MBE
    media_reallocated_events: int = 0  # FDP event 0x80, one per RU GC relocated valid data from
    media_reallocated_bytes: int = 0  # the bytes those events moved
    ru_not_fully_written_events: int = 0  # FDP event 0x00 (RUH Update on a partly written RU)
    padding_bytes: int = 0  # unwritten remainders charged to MBMW by RUH Update
    ru_erases: int = 0  # RUs erased (MBE / RU size)
    host_bytes_by_handle: list[int] = field(default_factory=list)
    relocated_bytes_by_handle: list[int] = field(default_factory=list)  # by the handle that wrote the data

    @property
    def waf(self) -> float:
        """MBMW / HBMW; NaN before any host write."""
        return self.media_bytes_written / self.host_bytes_written if self.host_bytes_written else float("nan")

    def handle_waf(self, handle: int) -> float:
        """(host + relocated bytes of data written through ``handle``) / its host bytes; NaN if none."""
        host = self.host_bytes_by_handle[handle]
        return (host + self.relocated_bytes_by_handle[handle]) / host if host else float("nan")

    def copy(self) -> FdpStatistics:
        out = FdpStatistics(**{f.name: getattr(self, f.name) for f in fields(self)})
        out.host_bytes_by_handle = list(self.host_bytes_by_handle)
        out.relocated_bytes_by_handle = list(self.relocated_bytes_by_handle)
        return out

    def minus(self, earlier: FdpStatistics) -> FdpStatistics:
        """The counters accumulated since ``earlier`` (a :meth:`copy` taken before)."""
        out = FdpStatistics()
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(earlier, f.name)
            setattr(out, f.name, [x - y for x, y in zip(a, b, strict=True)] if isinstance(a, list) else a - b)
        return out


_FREE, _OPEN, _CLOSED = 0, 1, 2
_II_DOMAIN = -1  # the isolation domain of every initially isolated handle's data


class FlashTranslationLayer:
    """The FTL of one namespace: a logical-to-physical page map over RUs in reclaim groups, written through
    reclaim unit handles, cleaned by greedy or FIFO GC.  See the module docstring for the model.

    Args:
        geometry: the flash (:class:`FlashGeometry`).
        logical_pages: the namespace size in pages (< the physical pages: the rest is over-provisioning).
        handles: the type of each reclaim unit handle, by placement handle index ("II"/"PI" or
            :class:`RuhType`); every handle has an RU in every reclaim group.
        victim: GC victim selection, "greedy" or "fifo".
        reserve_rus: free RUs per reclaim group kept for GC (>= 1).
        gc_copies_to: "gc_ru" or "host_ru" (see the module docstring).

    Raises ValueError for a namespace that does not fit (the logical pages must leave, in every reclaim
    group's share, room for the reserve and the RUs that can be open at once: :meth:`open_rus_per_rg`), an
    unknown victim policy or handle type.
    """

    @staticmethod
    def open_rus_per_rg(handles, gc_copies_to: str = "gc_ru") -> int:
        """The most RUs of one reclaim group that can be open (partly written) at once: a host RU per
        handle, and with ``gc_copies_to="gc_ru"`` a GC RU per isolation domain (one shared by every
        initially isolated handle, one per persistently isolated handle)."""
        types = [h if isinstance(h, RuhType) else RuhType(h) for h in handles]
        if gc_copies_to != "gc_ru":
            return len(types)
        pi = sum(t is RuhType.PERSISTENTLY_ISOLATED for t in types)
        return len(types) + pi + (pi < len(types))

    def __init__(self, geometry: FlashGeometry, logical_pages: int, handles=("II",), *,
                 victim: str = "greedy", reserve_rus: int = 1, gc_copies_to: str = "gc_ru"):
        self.geometry = g = geometry
        self.handles = tuple(h if isinstance(h, RuhType) else RuhType(h) for h in handles)
        if not self.handles:
            raise ValueError("an FDP configuration needs at least one reclaim unit handle")
        if victim not in ("greedy", "fifo"):
            raise ValueError(f"GC victim selection must be 'greedy' or 'fifo', got {victim!r}")
        if gc_copies_to not in ("gc_ru", "host_ru"):
            raise ValueError(f"GC copies go to 'gc_ru' or 'host_ru', got {gc_copies_to!r}")
        self.gc_copies_to = gc_copies_to
        self._ii_frontier = next((h for h, t in enumerate(self.handles) if t is RuhType.INITIALLY_ISOLATED), 0)
        if reserve_rus < 1:
            raise ValueError(f"reserve RUs must be >= 1, got {reserve_rus}")
        open_rus = self.open_rus_per_rg(self.handles, gc_copies_to)
        room = sum(c - reserve_rus - open_rus for c in g.rg_rus) * g.pages_per_ru
        if min(g.rg_rus) <= reserve_rus + open_rus or not 1 <= logical_pages <= room:
            raise ValueError(
                f"namespace of {logical_pages} pages does not fit reclaim group(s) of {g.rus_per_rg} "
                f"RUs x {g.pages_per_ru} pages with {reserve_rus} reserve RU(s) and {open_rus} open RUs each")
        self.victim = victim
        self.reserve_rus = reserve_rus
        self.logical_pages = logical_pages
        self._ppr = g.pages_per_ru
        self.l2p = np.full(logical_pages, -1, dtype=np.int64)
        self.p2l = np.full(g.physical_pages, -1, dtype=np.int64)
        self._writer = np.zeros(logical_pages, dtype=np.int16)  # the handle that last wrote each LPN
        self.ru_valid = np.zeros(g.nr_rus, dtype=np.int64)
        self.ru_wp = np.zeros(g.nr_rus, dtype=np.int64)  # pages programmed (or padded) in each RU
        self.ru_state = np.zeros(g.nr_rus, dtype=np.int8)
        self.ru_domain = np.zeros(g.nr_rus, dtype=np.int32)  # isolation domain: a PI handle, or _II_DOMAIN
        self.ru_closed_at = np.zeros(g.nr_rus, dtype=np.int64)  # close order, for FIFO and greedy's ties
        self.ru_erase_count = np.zeros(g.nr_rus, dtype=np.int64)
        self._close_seq = 0
        self._valid_count = 0
        #: the most pages valid at once (after any host write), the FTL's fullest moment
        self.peak_valid_pages = 0
        self._free = [deque(range(first, first + c)) for first, c in zip(g.rg_first_ru, g.rg_rus, strict=True)]
        self._host_ru: dict[tuple[int, int], int] = {}  # (rg, handle) -> open RU
        self._gc_ru: dict[tuple[int, int], int] = {}  # (rg, isolation domain) -> open GC RU
        self.stats = FdpStatistics(host_bytes_by_handle=[0] * len(self.handles),
                                   relocated_bytes_by_handle=[0] * len(self.handles))

    # ---- the byte interface (what a device kind speaks) ----

    def write(self, offset: int, length: int, handle: int = 0, rg: int = 0) -> None:
        """Write ``length`` bytes at byte ``offset`` through placement identifier (``rg``, ``handle``).
        Raises ValueError unless both are multiples of the page size and inside the namespace."""
        self.write_pages(self._range(offset, length), handle, rg, unique=True)

    def deallocate(self, offset: int, length: int) -> None:
        """Deallocate (TRIM) ``length`` bytes at ``offset``: their pages become invalid.  Same checks as
        :meth:`write`."""
        self.deallocate_pages(self._range(offset, length))

    def _range(self, offset: int, length: int) -> np.ndarray:
        pb = self.geometry.page_bytes
        if offset < 0 or length <= 0 or offset % pb or length % pb:
            raise ValueError(f"offset {offset} and length {length} must be whole {pb}-byte pages")
        if offset + length > self.logical_pages * pb:
            raise ValueError(f"bytes {offset}..{offset + length} pass the namespace end {self.logical_pages * pb}")
        return np.arange(offset // pb, (offset + length) // pb, dtype=np.int64)

    # ---- the page interface ----

    def write_pages(self, lpns, handle: int = 0, rg: int = 0, *, unique: bool = False) -> None:
        """Write the logical pages ``lpns`` (1-D integer array, in order) through (``rg``, ``handle``).
        ``unique=True`` promises no LPN repeats (skips the duplicate check).  A later write of an LPN in the
        same call supersedes an earlier one, as on a device.  Raises ValueError for an LPN outside the
        namespace or an unknown handle or reclaim group; :class:`ReclaimGroupFullError` when GC cannot free
        an RU."""
        lpns = np.asarray(lpns, dtype=np.int64)
        if not 0 <= handle < len(self.handles):
            raise ValueError(f"placement handle {handle} is not one of the {len(self.handles)} handles")
        if not 0 <= rg < self.geometry.nr_rgs:
            raise ValueError(f"reclaim group {rg} is not one of the {self.geometry.nr_rgs} groups")
        if lpns.size == 0:
            return
        if lpns.min() < 0 or lpns.max() >= self.logical_pages:
            raise ValueError(f"logical page outside the namespace of {self.logical_pages} pages")
        key = (rg, handle)
        pos, n = 0, lpns.size
        while pos < n:
            ru = self._host_ru.get(key, -1)
            if ru < 0:
                ru = self._open_ru(rg, self._domain(handle), for_gc=False)
                if key in self._host_ru:  # GC's copies opened this handle's RU meanwhile ("host_ru")
                    self._free[rg].appendleft(ru)
                    self.ru_state[ru] = _FREE
                    ru = self._host_ru[key]
                else:
                    self._host_ru[key] = ru
            take = min(self._ppr - int(self.ru_wp[ru]), n - pos)
            self._program_host(ru, lpns[pos:pos + take], handle, unique)
            pos += take
            if self.ru_wp[ru] == self._ppr:
                self._close(ru)
                del self._host_ru[key]
        pb = self.geometry.page_bytes
        self.peak_valid_pages = max(self.peak_valid_pages, self._valid_count)
        self.stats.host_bytes_written += n * pb
        self.stats.media_bytes_written += n * pb
        self.stats.host_bytes_by_handle[handle] += n * pb

    def deallocate_pages(self, lpns) -> None:
        """Deallocate the logical pages ``lpns`` (unmapped ones are ignored, as Deallocate allows)."""
        lpns = np.unique(np.asarray(lpns, dtype=np.int64))
        if lpns.size and (lpns[0] < 0 or lpns[-1] >= self.logical_pages):
            raise ValueError(f"logical page outside the namespace of {self.logical_pages} pages")
        old = self.l2p[lpns]
        old = old[old >= 0]
        self._invalidate(old)
        self.l2p[lpns] = -1

    def ruh_update(self, handle: int = 0, rg: int = 0) -> None:
        """RUH Update (I/O Management Send): ``handle`` moves to a fresh RU in ``rg`` at its next write.  A
        partly written RU is closed; its unwritten pages are charged to MBMW and an RU Not Fully Written
        event is counted (QEMU ``nvme_update_ruh``)."""
        ru = self._host_ru.pop((rg, handle), -1)
        if ru < 0:
            return
        pad = self._ppr - int(self.ru_wp[ru])
        if pad:
            self.stats.ru_not_fully_written_events += 1
            self.stats.padding_bytes += pad * self.geometry.page_bytes
            self.stats.media_bytes_written += pad * self.geometry.page_bytes
            self.ru_wp[ru] = self._ppr
        self._close(ru)

    # ---- inspection ----

    @property
    def valid_pages(self) -> int:
        """Pages mapped (live) in the namespace."""
        return int(self.ru_valid.sum())

    def free_rus(self, rg: int = 0) -> int:
        return len(self._free[rg])

    def check(self) -> None:
        """Recompute every cached count from the maps and raise AssertionError on a mismatch (tests)."""
        mapped = self.l2p[self.l2p >= 0]
        assert np.array_equal(self.p2l[mapped], np.flatnonzero(self.l2p >= 0)), "l2p and p2l disagree"
        assert np.count_nonzero(self.p2l >= 0) == mapped.size, "p2l maps pages no LPN points at"
        per_ru = np.bincount(mapped // self._ppr, minlength=self.geometry.nr_rus)
        assert np.array_equal(per_ru, self.ru_valid), "cached valid counts differ from the map"
        assert np.all(self.ru_valid <= self.ru_wp), "an RU holds more valid pages than it was written"
        assert self._valid_count == mapped.size, "the running count of valid pages differs from the map"
        assert mapped.size <= self.peak_valid_pages, "more pages valid than the peak recorded"
        assert all(self.ru_state[r] == _FREE and self.ru_wp[r] == 0 for q in self._free for r in q)

    # ---- internals ----

    def _domain(self, handle: int) -> int:
        return handle if self.handles[handle] is RuhType.PERSISTENTLY_ISOLATED else _II_DOMAIN

    def _open_ru(self, rg: int, domain: int, for_gc: bool) -> int:
        free = self._free[rg]
        if not for_gc:
            while len(free) <= self.reserve_rus:
                self._collect(rg)
        if not free:
            raise ReclaimGroupFullError(rg, f"reclaim group {rg} has no free RU for GC's copies")
        ru = free.popleft()
        self.ru_state[ru] = _OPEN
        self.ru_domain[ru] = domain
        return ru

    def _close(self, ru: int) -> None:
        self.ru_state[ru] = _CLOSED
        self.ru_closed_at[ru] = self._close_seq
        self._close_seq += 1

    def _invalidate(self, phys: np.ndarray) -> None:
        if phys.size == 0:
            return
        self.p2l[phys] = -1
        rus = phys // self._ppr
        if phys.size > 64:
            self.ru_valid -= np.bincount(rus, minlength=self.geometry.nr_rus)
        else:
            np.subtract.at(self.ru_valid, rus, 1)
        self._valid_count -= phys.size

    def _program_host(self, ru: int, lpns: np.ndarray, handle: int, unique: bool) -> None:
        n = lpns.size
        base = ru * self._ppr + int(self.ru_wp[ru])
        newp = np.arange(base, base + n, dtype=np.int64)
        if not unique and n > 1:
            order = np.argsort(lpns, kind="stable")
            s = lpns[order]
            dup = s[1:] == s[:-1]
            if dup.any():  # keep the last write of each LPN; the earlier copies are born invalid
                keep = np.ones(n, dtype=bool)
                keep[order[:-1][dup]] = False
                lpns, newp = lpns[keep], newp[keep]
        old = self.l2p[lpns]
        self._invalidate(old[old >= 0])
        self.l2p[lpns] = newp
        self.p2l[newp] = lpns
        self._writer[lpns] = handle
        self.ru_valid[ru] += lpns.size
        self._valid_count += lpns.size
        self.ru_wp[ru] += n

    def _collect(self, rg: int) -> None:
        """Reclaim one RU of ``rg``: pick the victim, relocate its valid pages, erase it."""
        g = self.geometry
        lo = g.rg_first_ru[rg]
        hi = lo + g.rg_rus[rg]
        closed = self.ru_state[lo:hi] == _CLOSED
        valid = self.ru_valid[lo:hi]
        if not (closed & (valid < self._ppr)).any():
            raise ReclaimGroupFullError(
                rg, f"reclaim group {rg} is full of valid data: GC found no RU with an invalid page")
        if self.victim == "greedy":
            # fewest valid pages first, the oldest among equals
            score = np.where(closed, valid * (self._close_seq + 1) + self.ru_closed_at[lo:hi],
                             np.iinfo(np.int64).max)
        else:  # FIFO: the oldest closed RU, even a fully valid one (it is copied whole)
            score = np.where(closed, self.ru_closed_at[lo:hi], np.iinfo(np.int64).max)
        victim = lo + int(np.argmin(score))
        nvalid = int(self.ru_valid[victim])
        if nvalid:
            seg = self.p2l[victim * self._ppr:(victim + 1) * self._ppr]
            lpns = seg[seg >= 0].copy()
            self._relocate(rg, int(self.ru_domain[victim]), lpns)
            moved = np.bincount(self._writer[lpns], minlength=len(self.handles))
            pb = g.page_bytes
            self.stats.media_reallocated_events += 1
            self.stats.media_reallocated_bytes += nvalid * pb
            self.stats.media_bytes_written += nvalid * pb
            for h in np.flatnonzero(moved):
                self.stats.relocated_bytes_by_handle[h] += int(moved[h]) * pb
        # erase
        self.p2l[victim * self._ppr:(victim + 1) * self._ppr] = -1
        self.ru_valid[victim] = 0
        self.ru_wp[victim] = 0
        self.ru_state[victim] = _FREE
        self.ru_erase_count[victim] += 1
        self._free[rg].append(victim)
        self.stats.media_bytes_erased += g.ru_bytes
        self.stats.ru_erases += 1

    def _relocate(self, rg: int, domain: int, lpns: np.ndarray) -> None:
        if self.gc_copies_to == "gc_ru":
            frontier, key = self._gc_ru, (rg, domain)
        else:
            frontier, key = self._host_ru, (rg, self._ii_frontier if domain == _II_DOMAIN else domain)
        pos, n = 0, lpns.size
        while pos < n:
            ru = frontier.get(key, -1)
            if ru < 0:
                ru = self._open_ru(rg, domain, for_gc=True)
                frontier[key] = ru
            take = min(self._ppr - int(self.ru_wp[ru]), n - pos)
            base = ru * self._ppr + int(self.ru_wp[ru])
            part = lpns[pos:pos + take]
            newp = np.arange(base, base + take, dtype=np.int64)
            self.l2p[part] = newp
            self.p2l[newp] = part
            self.ru_valid[ru] += take
            self.ru_wp[ru] += take
            pos += take
            if self.ru_wp[ru] == self._ppr:
                self._close(ru)
                del frontier[key]
