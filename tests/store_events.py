"""Scripted runs through the real store, for the placement tests.

A placement test scripts a run as a list of events and :func:`run` drives
:class:`retainz.store.Store` with them on a payload-less :class:`retainz.zoned.MemoryDevice` (the one
backend: this is replay without a trace file, not a model of the store):

=====================================  ============================================================
event                                  what :func:`run` does
=====================================  ============================================================
``("save", gen, step, sizes, hint)``   ``begin_generation(gen, step, hint=hint, declared_size=sum)``,
                                       ``write_counted_shard(f"s{i}", n)`` per size, ``commit()``
``("delete", gen, step)``              ``store.delete(gen, step=step)``
=====================================  ============================================================

Sizes are in ``unit`` bytes (a block by default), zones hold ``capacity`` units.  A
:class:`~retainz.errors.NoSpaceError` is the capacity stop: the run ends there (the writer in flight
is aborted).  What the tests read back is what the store recorded: its metrics, its catalog and zone
table, and the decisions its allocator handed it (:attr:`Run.decisions`, recorded as the store asks).

:func:`keep_latest_trace` generates a TorchTitan ``keep_latest_k`` run (synchronous saves; the save at
``s`` is purged when the save at ``s + k * interval`` commits; the last save is model-only and
permanent).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from retainz.errors import NoSpaceError
from retainz.hint import Hint, lifetime_class
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice, ZonedDevice

BLOCK = 4096


def geometry(zones: int, capacity: int, *, max_active: int = 0, meta_zones: int = 3,
             unit: int = BLOCK) -> Geometry:
    """``zones`` data zones of ``capacity * unit`` bytes after ``meta_zones`` journal zones; an
    active-zone budget of ``max_active`` data zones (the device allows one more, the journal's;
    0 = unlimited)."""
    limit = max_active + 1 if max_active else 0
    return Geometry(nr_zones=zones + meta_zones, zone_size=capacity * unit, zone_capacity=capacity * unit,
                    block_size=BLOCK, max_open=limit, max_active=limit)


@dataclass
class Run:
    """What a run through the store left behind.

    Attributes:
        store: the store (closed; its catalog, zone table and metrics stay readable).
        decisions: ``(generation, nbytes, gc, Decision)`` for every ``place`` call the store made,
            in order.
        stop: the step of the event refused with ``NoSpaceError`` (the capacity stop), or None.
        zone_gens: ``(zone, open_seq) -> generations`` ever seen committed in that zone between its
            opening and its reset (sampled from the catalog after every event; GC copies included).
    """

    store: Store
    decisions: list = field(default_factory=list)
    stop: int | None = None
    zone_gens: dict = field(default_factory=dict)

    def metrics(self) -> dict:
        """The store's own metrics (``StoreMetrics.to_dict``), ``stop_step`` added."""
        return dict(self.store.metrics.to_dict(), stop_step=self.stop)

    def gens_by_zone(self) -> dict[int, set[str]]:
        """Zone -> the committed generations with extents there now (from the catalog)."""
        out: dict[int, set[str]] = {}
        for g in self.store.generations():
            for sh in g.shards.values():
                for e in sh.extents:
                    out.setdefault(e[0], set()).add(g.id)
        return out


def run(policy: str, events, *, zones: int = 0, capacity: int = 0, max_active: int = 0,
        device: ZonedDevice | None = None, unit: int = BLOCK, verify: bool = False,
        payload: bool = False, gc_reserve_zones: int = 2, meta_zones: int | None = None) -> Run:
    """Run ``events`` (see the module docstring) through a store formatted with ``policy`` on
    ``device``, or on a new payload-less MemoryDevice of :func:`geometry` ``(zones, capacity,
    max_active)`` with ``meta_zones`` (default 3) journal zones (on a given device, ``None`` is the
    store's default count).  ``verify`` is the store's ``verify_summaries`` mode; ``payload`` writes real
    bytes (a device that keeps them).

    Raises:
        ValueError: a device the policy or the store refuses (ZenFS: fewer than 32 zones).
    """
    if device is None:
        meta_zones = 3 if meta_zones is None else meta_zones
        device = MemoryDevice(geometry(zones, capacity, max_active=max_active, meta_zones=meta_zones,
                                       unit=unit), payload=False)
    st = Store.format(device, policy=policy, verify_summaries=verify, gc_reserve_zones=gc_reserve_zones,
                      meta_zones=meta_zones)
    out = Run(st)
    place = st.allocator.place

    def recorded(req):
        d = place(req)
        out.decisions.append((req.generation, req.nbytes, req.gc, d))
        return d

    st.allocator.place = recorded
    try:
        for ev in events:
            try:
                if ev[0] == "save":
                    _, gen, step, sizes, hint = ev
                    w = st.begin_generation(gen, step, hint=hint, declared_size=sum(sizes) * unit)
                    for i, n in enumerate(sizes):
                        if payload:
                            w.write_shard(f"s{i}", [bytes([i % 251]) * (n * unit)])
                        else:
                            w.write_counted_shard(f"s{i}", n * unit)
                    w.commit()
                else:
                    st.delete(ev[1], step=ev[2])
            except NoSpaceError:
                out.stop = ev[2]
                break
            table = st.table.zones
            for z, gens in out.gens_by_zone().items():
                out.zone_gens.setdefault((z, table[z].open_seq), set()).update(gens)
    finally:
        st.close()
    return out


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
