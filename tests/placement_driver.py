"""A small stand-in for the store, for placement tests and the placement benchmark.

:class:`Driver` applies allocator decisions to a :class:`ZoneTable` exactly as the store does
(finish first, write ``min(nbytes, remaining)``, ask again; GC copies live extents with ``gc=True``
and skips an extent on ``NO_SPACE``; resets zones whose data is all dead, ZenFS's
ResetUnusedIOZones), keeps a catalog of extents, and integrates the DESIGN.md metrics over steps.

``recompute=True`` recomputes every zone summary from the catalog before every decision, checks it
equals the incrementally maintained table (cached-summary equivalence) and restores the table from
the recomputation, so the allocator decides on freshly rebuilt state.

:func:`keep_latest_trace` generates a TorchTitan ``keep_latest_k`` run (synchronous saves; the save at
``s`` is purged when the save at ``s + k * interval`` commits; the last save is model-only and
permanent).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from retainz.hint import Hint, lifetime_class
from retainz.placement import Allocator, Decision, ExtentRequest, ZoneSummary, ZoneTable, make_allocator
from retainz.zoned.model import ZoneCond

MiB = 1 << 20


@dataclass
class Extent:
    gen: str
    zone: int
    nbytes: int
    live: bool = True


@dataclass
class Gen:
    step: int
    hint: Hint
    extents: list[Extent] = field(default_factory=list)


@dataclass
class ZoneLog:
    """What the store journals per zone since its last reset."""

    extents: list[Extent] = field(default_factory=list)
    finished: bool = False
    reclaim_step: float | None = None
    lifetime: int = 0
    opened_step: int = 0
    open_seq: int = 0
    last_write_step: int = 0


class CapacityStop(Exception):
    pass


class Driver:
    """Applies decisions to a ZoneTable like the store (see the module docstring)."""

    def __init__(self, policy: str | Allocator, *, zones: int, capacity: int, max_active: int = 0,
                 reserved_active: int = 0, reserve_zones: int = 2, recompute: bool = False,
                 timed: bool = False):
        self.alloc = make_allocator(policy) if isinstance(policy, str) else policy
        self.capacity = capacity
        self.table = ZoneTable({z: capacity for z in range(zones)}, max_active=max_active,
                               reserved_active=reserved_active)
        self.alloc.bind(self.table)
        self.reserve_zones = reserve_zones
        self.recompute = recompute
        self.timed = timed
        self.now = 0
        self.gens: dict[str, Gen] = {}
        self.zlog: dict[int, ZoneLog] = {z: ZoneLog() for z in range(zones)}
        self.decisions: list[tuple] = []
        self.opens = 0  # zones opened so far (the opening order, ZoneSummary.open_seq)
        self.m = dict(host_bytes=0, gc_bytes=0, resets=0, finished_unused=0, dead_space_time=0,
                      unused_time=0, peak_occupancy=0, decisions=0, decision_ns=0, stop_step=None,
                      skipped_gc_extents=0)

    # -- time and metrics ---------------------------------------------------------------------------
    def advance(self, step: int) -> None:
        dt = step - self.now
        if dt > 0:
            self.m["dead_space_time"] += self.table.dead * dt
            self.m["unused_time"] += self.table.unused * dt
            self.now = step
        self.table.now = self.now

    def metrics(self) -> dict:
        m = dict(self.m)
        m["waf"] = (m["host_bytes"] + m["gc_bytes"]) / m["host_bytes"] if m["host_bytes"] else 1.0
        return m

    # -- summaries from the catalog -----------------------------------------------------------------
    def recomputed(self) -> list[ZoneSummary]:
        out = []
        for z, log in self.zlog.items():
            written = sum(e.nbytes for e in log.extents)
            live = sum(e.nbytes for e in log.extents if e.live)
            if log.finished or written >= self.capacity:
                cond = ZoneCond.FULL
            elif written:
                cond = ZoneCond.IMP_OPEN
            else:
                cond = ZoneCond.EMPTY
            out.append(ZoneSummary(index=z, capacity=self.capacity, cond=cond, written=written,
                                   live=live, dead=written - live, reclaim_step=log.reclaim_step,
                                   lifetime=log.lifetime, opened_step=log.opened_step,
                                   open_seq=log.open_seq, last_write_step=log.last_write_step))
        return out

    def check_summaries(self) -> list[ZoneSummary]:
        summaries = self.recomputed()
        fresh = ZoneTable({z: self.capacity for z in self.zlog})
        fresh.restore([ZoneSummary(**{k: getattr(s, k) for k in s.__slots__}) for s in summaries])
        assert fresh.key() == self.table.key(), "cached summaries differ from the catalog"
        return summaries

    # -- decisions ----------------------------------------------------------------------------------
    def decide(self, req: ExtentRequest) -> Decision:
        if self.recompute:
            self.table.restore(self.check_summaries())
        if self.timed:
            t0 = time.perf_counter_ns()
            d = self.alloc.place(req)
            self.m["decision_ns"] += time.perf_counter_ns() - t0
        else:
            d = self.alloc.place(req)
        self.m["decisions"] += 1
        self.decisions.append((req.generation, req.nbytes, req.gc, d))
        return d

    def _finish(self, zones: tuple[int, ...]) -> None:
        t = self.table
        for z in zones:
            if z not in t.open:
                raise ValueError(f"decision finishes zone {z}, which is not open")
            self.m["finished_unused"] += t[z].remaining
            self.zlog[z].finished = True
            t.on_finish(z)

    def write(self, gen: str, nbytes: int, *, gc: bool = False, pending: int = 0) -> int:
        """Place ``nbytes`` of ``gen``; returns the bytes placed (less on no space)."""
        g, t = self.gens[gen], self.table
        left = nbytes
        while left:
            req = ExtentRequest(nbytes=left, generation=gen, step=g.step, hint=g.hint, now=self.now,
                                gc=gc, pending=pending)
            d = self.decide(req)
            self._finish(d.finish)
            if d.zone is None:
                break
            s = t[d.zone]
            if s.cond == ZoneCond.EMPTY:
                if t.max_active and len(t.open) >= t.max_active:
                    raise ValueError(f"decision opens zone {d.zone} beyond the active budget")
            elif d.zone not in t.open:
                raise ValueError(f"decision names zone {d.zone}, which is full")
            n = min(left, s.remaining)
            log = self.zlog[d.zone]
            lifetime = g.hint.lifetime if d.lifetime is None else d.lifetime
            if s.cond == ZoneCond.EMPTY:
                self.opens += 1
                log.lifetime, log.opened_step, log.open_seq = lifetime, self.now, self.opens
            log.last_write_step = self.now
            if d.reclaim_step is not None and (log.reclaim_step is None
                                               or d.reclaim_step > log.reclaim_step):
                log.reclaim_step = d.reclaim_step
            t.on_write(d.zone, n, reclaim_step=d.reclaim_step, lifetime=lifetime, step=self.now)
            ext = Extent(gen, d.zone, n)
            log.extents.append(ext)
            g.extents.append(ext)
            left -= n
        self.m["peak_occupancy"] = max(self.m["peak_occupancy"], t.written)
        return nbytes - left

    def _kill(self, ext: Extent) -> None:
        if ext.live:
            ext.live = False
            self.table.on_kill(ext.zone, ext.nbytes)

    def reset_unused(self, zones) -> None:
        """The store's reset rule (ZenFS ResetUnusedIOZones): non-empty zones with no live data."""
        for z in sorted(set(zones)):
            s = self.table[z]
            if s.cond != ZoneCond.EMPTY and s.live == 0:
                self.zlog[z] = ZoneLog()
                self.table.on_reset(z)
                self.m["resets"] += 1

    # -- store operations ---------------------------------------------------------------------------
    def save(self, gen: str, step: int, shards: list[int], hint: Hint) -> None:
        """Write a generation shard by shard; raises :class:`CapacityStop` when no space is left."""
        self.advance(step)
        self.gens[gen] = Gen(step, hint)
        self.gc()
        for i, n in enumerate(shards):
            pending = sum(shards[i + 1:])
            done = self.write(gen, n, pending=pending)
            if done < n:
                self.gc()
                done += self.write(gen, n - done, pending=pending)
            if done < n:
                self.delete(gen)  # the aborted generation's bytes are garbage
                self.m["stop_step"] = step
                raise CapacityStop(step)
            self.m["host_bytes"] += n

    def delete(self, gen: str) -> None:
        g = self.gens.pop(gen)
        for ext in g.extents:
            self._kill(ext)
        self.reset_unused(e.zone for e in g.extents)

    def gc(self) -> None:
        """Collect the allocator's victims: copy each live extent (``gc=True``), skipping what
        cannot be placed, then reset the victim if nothing live is left."""
        for v in self.alloc.gc_victims(self.reserve_zones):
            log = self.zlog[v]
            for ext in [e for e in log.extents if e.live]:
                moved = self.write(ext.gen, ext.nbytes, gc=True)
                self.m["gc_bytes"] += moved
                if moved < ext.nbytes:
                    self.m["skipped_gc_extents"] += 1
                if moved:  # the copied part is garbage in the victim; the rest stays live there
                    ext.nbytes -= moved
                    log.extents.append(Extent(ext.gen, v, moved, live=False))
                    self.table.on_kill(v, moved)
                    if ext.nbytes == 0:
                        log.extents.remove(ext)
                        self.gens[ext.gen].extents.remove(ext)
            self.reset_unused([v])


def keep_latest_trace(*, saves: int, gen_bytes: int, shards: int = 8, interval: int = 500,
                      k: int = 10, final_fraction: float = 1 / 3):
    """TorchTitan ``keep_latest_k`` events: ``("save", gen, step, shard_sizes, hint)`` and
    ``("delete", gen, step)``.  Saves at ``interval, 2*interval, ...``; the save at ``s`` is purged
    once the save at ``s + k*interval`` commits (predicted and actual reclaim step ``s +
    k*interval``; saves alive at the end have no actual step); the last save is model-only
    (``final_fraction`` of a full one) and permanent."""
    events = []
    for i in range(1, saves + 1):
        step = i * interval
        last = i == saves
        size = int(gen_bytes * final_fraction) if last else gen_bytes
        per = size // shards
        sizes = [per] * (shards - 1) + [size - per * (shards - 1)]
        r = float("inf") if last else float(step + k * interval)
        actual = r if (last or i + k <= saves - 1) else None
        hint = Hint(reclaim_step=r, lifetime=lifetime_class(r, step),
                    condition="permanent" if last else f"after_newer:k={k}",
                    actual_reclaim_step=actual)
        events.append(("save", f"g{step}", step, sizes, hint))
        old = step - k * interval
        if not last and old > 0:
            events.append(("delete", f"g{old}", step))
    return events


def run(policy: str | Allocator, events, **kw) -> Driver:
    """Replay ``events`` through a :class:`Driver`; stops at the first capacity stop."""
    d = Driver(policy, **kw)
    try:
        for ev in events:
            if ev[0] == "save":
                _, gen, step, sizes, hint = ev
                d.save(gen, step, sizes, hint)
            else:
                d.advance(ev[2])
                d.delete(ev[1])
    except CapacityStop:
        pass
    return d


def replay_store(policy: str, events, device, *, verify: bool = False, payload: bool = False,
                 gc_reserve_zones: int = 2):
    """Replay ``events`` through the real store on ``device``; returns ``(store metrics dict,
    decision log, capacity stop step or None)``.  ``payload=True`` writes real bytes (needed on a
    device that keeps payload)."""
    from retainz.errors import NoSpaceError
    from retainz.store import Store

    st = Store.format(device, policy=policy, verify_summaries=verify,
                      gc_reserve_zones=gc_reserve_zones)
    log: list = []
    place = st.allocator.place

    def logged(req):
        d = place(req)
        log.append((req.generation, req.nbytes, req.gc, d))
        return d

    st.allocator.place = logged
    stop = None
    try:
        for ev in events:
            if ev[0] == "save":
                _, gen, step, sizes, hint = ev
                w = st.begin_generation(gen, step, hint=hint, declared_size=sum(sizes))
                for i, n in enumerate(sizes):
                    if payload:
                        w.write_shard(f"s{i}", [bytes([i % 251]) * n])
                    else:
                        w.write_counted_shard(f"s{i}", n)
                w.commit()
            else:
                st.delete(ev[1], step=ev[2])
    except NoSpaceError:
        stop = ev[2]
    m = st.metrics.to_dict()
    st.close()
    return m, log, stop
