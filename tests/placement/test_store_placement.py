"""How the store executes placement: every policy through the real store on MemoryDevice and
FileDevice (issue 5, "Done when"), pending bytes, the active-zone reservation, finishes without a
zone, lifetime classes, GC through the policy's rule, skipped GC extents, and the opening order
across a remount."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import pytest

from retainz.errors import NoSpaceError
from retainz.hint import Hint, Lifetime, lifetime_class
from retainz.placement import NO_SPACE, POLICIES, Allocator, Decision, ExtentRequest
from retainz.placement.greedy import Greedy
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice, ZoneCond
from tests.placement.test_placement_retainz import mixed_trace
from tests.store_events import run

KiB, MiB = 1024, 1 << 20
GEOM = Geometry(nr_zones=16, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=6,
                max_active=6)
#: GEOM with the 32 zones ZenFS needs (ZENFS_MIN_ZONES).
GEOM32 = dataclasses.replace(GEOM, nr_zones=32)


def spy(store: Store) -> list[ExtentRequest]:
    """Record every request the store's allocator gets."""
    reqs: list[ExtentRequest] = []
    place = store.allocator.place

    def logged(req):
        reqs.append(req)
        return place(req)

    store.allocator.place = logged
    return reqs


def swap(store: Store, alloc: Allocator) -> Allocator:
    store.use_allocator(alloc)
    return alloc


def put(store, gid, step, sizes, **kw):
    w = store.begin_generation(gid, step, **kw)
    for i, n in enumerate(sizes):
        w.write_counted_shard(f"s{i}", n)
    return w.commit()


# -- 1a: ExtentRequest.pending ---------------------------------------------------------------------
def test_pending_is_declared_minus_placed_minus_the_request_counted():
    with Store.format(MemoryDevice(GEOM, payload=False)) as s:
        reqs = spy(s)
        put(s, "g", 1, [8 * KiB, 8 * KiB, 6 * KiB], declared_size=22 * KiB)
        # declared 22 KiB = 24 KiB in blocks; shards placed 8, 8 and 8 (6 KiB padded) KiB
        assert [(r.nbytes, r.pending) for r in reqs] == [(8 * KiB, 16 * KiB), (8 * KiB, 8 * KiB),
                                                         (8 * KiB, 0)]
        reqs.clear()
        put(s, "u", 2, [8 * KiB, 8 * KiB])            # nothing declared: pending 0
        assert [r.pending for r in reqs] == [0, 0]


def test_pending_of_a_split_request_and_of_streamed_buffers():
    g = Geometry(nr_zones=8, zone_size=4 * MiB, zone_capacity=5 * MiB // 2, max_open=6, max_active=6)
    with Store.format(MemoryDevice(g)) as s:
        reqs = spy(s)
        w = s.begin_generation("g", 1, declared_size=4 * MiB)
        w.write_shard("a", (b"x" * MiB for _ in range(2)))     # two 1 MiB buffers
        w.write_shard("b", [b"y" * (2 * MiB)])
        w.commit()
        # b's first buffer is split by the zone capacity (2.5 MiB): the rest is asked for again,
        # with the same pending bytes
        assert [(r.nbytes, r.pending) for r in reqs] == [
            (MiB, 3 * MiB), (MiB, 2 * MiB), (MiB, MiB), (MiB // 2, MiB), (MiB, 0)]
        assert s.fsck().ok


@pytest.mark.parametrize("payload", [False, True])
def test_gc_requests_have_no_pending(payload):
    with Store.format(MemoryDevice(GEOM, payload=payload), gc_reserve_zones=0) as s:
        for i in range(6):
            if payload:
                w = s.begin_generation(f"g{i}", i, declared_size=20 * KiB)
                w.write_shard("s0", [bytes([i]) * 20 * KiB])
                w.commit()
            else:
                put(s, f"g{i}", i, [20 * KiB], declared_size=20 * KiB)
        s.delete("g1")
        reqs = spy(s)
        rep = s.gc(force=True)
        assert rep.extents_moved and all(r.gc and r.pending == 0 for r in reqs)


@dataclass
class _PerFileGreedy(Greedy):
    """Greedy's zones, asked like ZenFS: once per zone a user shard spans (``keeps_file_zone``)."""

    name = "test-per-file-greedy"
    keeps_file_zone = True


@pytest.mark.parametrize("payload", [False, True])
def test_a_per_file_policy_is_asked_for_every_gc_copy(payload):
    """A per-file policy keeps a user shard's zone while it has room, but every GC copy is placed
    by its own decision (ZenFS: ``TakeMigrateZone`` per extent, ``ZenFS::MigrateExtents``), also
    the copies of one shard's consecutive extents."""
    with Store.format(MemoryDevice(GEOM, payload=payload), gc_reserve_zones=0) as s:
        swap(s, _PerFileGreedy())
        for i in range(4):                      # 36 KiB shards in 48 KiB zones: g1 and g2 span two zones
            w = s.begin_generation(f"g{i}", i)
            if payload:
                w.write_shard("s", [bytes([i]) * 36 * KiB])
            else:
                w.write_counted_shard("s", 36 * KiB)
            w.commit()
        two = [g.id for g in s.generations() if len(g.shards["s"].extents) == 2]
        assert two == ["g1", "g2"]
        s.delete("g0")
        s.delete("g2")                          # every zone g1 spans holds dead bytes: both its extents move
        reqs = spy(s)
        rep = s.gc(force=True)
        assert rep.victims == [3, 4, 5] and rep.extents_moved == 3
        # g1's two extents are copied one after the other into one zone: two decisions; g3's copy
        # fills that zone and asks again for the rest
        assert [(r.generation, r.nbytes, r.gc) for r in reqs] == [
            ("g1", 12 * KiB, True), ("g1", 24 * KiB, True), ("g3", 36 * KiB, True), ("g3", 24 * KiB, True)]
        assert [e[:3] for e in s.generation("g1").shards["s"].extents] == [(6, 0, 12 * KiB), (6, 12 * KiB, 24 * KiB)]
        if payload:
            assert b"".join(s.read_shard("g1", "s")) == b"\x01" * 36 * KiB


# -- 1b: reserved_active ----------------------------------------------------------------------------
def test_table_reserves_the_journal_zone_and_zenfs_gets_device_max_minus_two():
    g = Geometry(nr_zones=40, zone_size=64 * KiB, zone_capacity=48 * KiB, max_open=14, max_active=14)
    dev = MemoryDevice(g, payload=False)
    with Store.format(dev, policy="zenfs") as s:
        t = s.table
        assert (t.max_active, t.reserved_active, t.max_open) == (13, 1, 13)
        assert s.allocator.active_budget == 12
        # every shard of one lifetime class opens a zone while ZenFS has a token (difference 50)
        w = s.begin_generation("g", 1, hint=Hint(reclaim_step=5000, lifetime=Lifetime.MEDIUM))
        for i in range(20):
            w.write_counted_shard(f"s{i}", 4 * KiB)
        w.commit()
        assert len(t.open) == 12
        assert dev.open_counts()[1] == 13        # 12 data zones + the journal's zone
    u = Geometry(nr_zones=32, zone_size=64 * KiB, zone_capacity=48 * KiB)
    with Store.format(MemoryDevice(u, payload=False), policy="zenfs") as s:
        assert (s.table.max_active, s.table.reserved_active) == (0, 0)
        assert s.allocator.active_budget == len(s.table)


# -- 1c: finishes of a decision without a zone ------------------------------------------------------
@dataclass
class FinishThenFail(Allocator):
    """Greedy until ``fail`` is set; then finish every open zone and answer no zone."""

    name = "test-finish-then-fail"
    fail: bool = False

    def place(self, req):
        if self.fail:
            return Decision(None, finish=tuple(self.table.open))
        return Greedy.place(self, req)


def test_finishes_of_a_failed_decision_are_executed():
    dev = MemoryDevice(GEOM, payload=False)
    with Store.format(dev) as s:
        a = swap(s, FinishThenFail())
        put(s, "g", 1, [20 * KiB])
        (z,) = s.table.open
        a.fail = True
        with pytest.raises(NoSpaceError):
            put(s, "h", 2, [4 * KiB])
        assert s.table[z].cond == ZoneCond.FULL and dev.zone(z).cond == ZoneCond.FULL
        assert s.metrics.finishes == 1 and s.metrics.unused_capacity_bytes == 28 * KiB
        assert s.table.unused == 28 * KiB and s.table.key() == s.recompute_table().key()
    with Store.open(dev) as s:          # the finish was journaled
        assert s.table[z].cond == ZoneCond.FULL and s.table[z].written == 20 * KiB


# -- 1d: the lifetime class of an opened zone -------------------------------------------------------
def test_zone_lifetime_is_the_decisions_else_the_hints():
    dev = MemoryDevice(GEOM32, payload=False)
    with Store.format(dev, policy="zenfs") as s:
        put(s, "g", 100, [8 * KiB], hint=Hint(reclaim_step=20_000))   # no class: ZenFS derives one
        (z,) = s.table.open
        assert lifetime_class(20_000, 100) == Lifetime.LONG
        assert s.table[z].lifetime == Lifetime.LONG
    with Store.open(dev) as s:
        assert s.table[z].lifetime == Lifetime.LONG
        swap(s, Greedy())                           # Decision.lifetime None: the hint's class
        put(s, "h", 200, [48 * KiB], hint=Hint(reclaim_step=300, lifetime=Lifetime.MEDIUM))
        opened = [x for x in s.table.zones if x != z and s.table[x].written]
        assert opened and all(s.table[x].lifetime == Lifetime.MEDIUM for x in opened)


# -- 1e: forced GC goes through the policy's rule ---------------------------------------------------
@dataclass
class SpyGreedy(Greedy):
    name = "test-spy-greedy"

    def __post_init__(self):
        self.asked: list[int] = []

    def gc_victims(self, reserve_zones):
        self.asked.append(reserve_zones)
        return super().gc_victims(reserve_zones)


def fill_with_garbage(s, n=9):
    """``n`` 40 KiB saves, every other one deleted: full zones with dead bytes."""
    for i in range(n):
        put(s, f"g{i}", i, [40 * KiB], declared_size=40 * KiB)
    for i in range(0, n, 2):
        s.delete(f"g{i}")


def test_failed_admission_asks_the_policy_with_a_reserve_of_every_zone():
    with Store.format(MemoryDevice(GEOM, payload=False), gc_reserve_zones=0) as s:
        a = swap(s, SpyGreedy())
        fill_with_garbage(s)
        a.asked.clear()
        put(s, "big", 20, [400 * KiB], declared_size=400 * KiB)   # needs GC to be admitted
        assert a.asked and a.asked[0] == len(s.table)
        assert s.metrics.gc_bytes > 0


def test_forced_gc_of_zenfs_follows_its_start_level():
    """ZenFS collects only at or below 20 % free: where greedy's forced GC makes room, ZenFS's
    rule names nothing and the write stops in allocation (ZenFS has no admission control)."""
    stops = {}
    for policy in ("greedy", "zenfs"):
        with Store.format(MemoryDevice(GEOM32, payload=False), gc_reserve_zones=0, policy=policy) as s:
            fill_with_garbage(s, 27)
            free_pct, threshold = (s.allocator.gc_level() if policy == "zenfs" else (None, None))
            try:
                put(s, "big", 100, [400 * KiB], declared_size=400 * KiB)
                stops[policy] = None
            except NoSpaceError as e:
                stops[policy] = (s.metrics.gc_bytes, e.cause)
            if policy == "zenfs":
                assert free_pct > 20 and threshold is None
    assert stops == {"greedy": None, "zenfs": (0, "allocation")}


# -- 1f: a GC extent the policy has no room for is skipped alone ------------------------------------
@dataclass
class NoRoomFor(Greedy):
    """Greedy, but GC requests of generation ``refuse`` get NO_SPACE."""

    name = "test-no-room-for"
    refuse: str = ""

    def place(self, req):
        if req.gc and req.generation == self.refuse:
            return NO_SPACE
        return super().place(req)


def test_gc_skips_only_the_extent_without_room():
    dev = MemoryDevice(GEOM)
    blobs = {f"g{i}": random.Random(i).randbytes(8 * KiB) for i in range(6)}
    with Store.format(dev, gc_reserve_zones=0) as s:
        swap(s, NoRoomFor(refuse="g2"))
        for i, (gid, b) in enumerate(blobs.items()):
            w = s.begin_generation(gid, i)
            w.write_shard("s", [b])
            w.commit()
        (v,) = [z for z in s.table.zones if s.table[z].cond == ZoneCond.FULL]  # g0..g5 in one zone
        s.delete("g0")
        s.delete("g4")
        rep = s.gc(force=True)
        assert rep.victims == [] and rep.partial == [v] and rep.extents_skipped == 1
        assert rep.extents_moved == 3 and rep.bytes_copied == 24 * KiB
        sv = s.table[v]
        assert (sv.cond, sv.written, sv.live, sv.dead) == (ZoneCond.FULL, 48 * KiB, 8 * KiB, 40 * KiB)
        assert s.generation("g2").shards["s"].extents[0][0] == v
        assert all(e[0] != v for g in ("g1", "g3", "g5") for e in s.generation(g).shards["s"].extents)
        assert s.table.key() == s.recompute_table().key() and s.fsck().ok
        for gid in ("g1", "g2", "g3", "g5"):
            assert b"".join(s.read_shard(gid, "s")) == blobs[gid]
        key = s.table.key()
    with Store.open(dev) as s:
        assert s.table.key() == key and s.fsck().ok
        s.delete("g2")                        # the skipped extent's zone resets once it dies
        assert s.table[v].cond == ZoneCond.EMPTY


# -- 1g: the opening order survives a remount -------------------------------------------------------
@dataclass
class FirstFit(Allocator):
    """Test policy that depends on ``table.open`` order: the first open zone (in opening order)
    with room for the whole request, else a new zone while fewer than ``width`` are open, else the
    first open zone."""

    name = "test-first-fit"
    width: int = 3

    def place(self, req):
        t = self.table
        for s in t.open.values():
            if s.remaining >= req.nbytes:
                return Decision(s.index)
        if len(t.open) < self.width and t.can_open:
            return Decision(t.first_empty())
        for z in t.open:
            return Decision(z)
        z = t.first_empty()
        return NO_SPACE if z is None else Decision(z)


def churn(seed: int, n: int, start: int = 0):
    """Saves of 4..40 KiB, each kept for 1..4 saves: ``("save", gid, step, size)`` / ``("delete",
    gid, step)``."""
    rnd = random.Random(seed)
    events, due = [], {}
    for i in range(start, start + n):
        for gid in [g for g, d in due.items() if d <= i]:
            events.append(("delete", gid, i))
            del due[gid]
        gid = f"g{i}"
        events.append(("save", gid, i, rnd.randrange(1, 11) * 4 * KiB))
        due[gid] = i + rnd.randrange(1, 5)
    return events


def drive(s, events):
    for ev in events:
        if ev[0] == "save":
            w = s.begin_generation(ev[1], ev[2])
            w.write_counted_shard("s", ev[3])
            w.commit()
        elif ev[1] in s.catalog.gens:
            s.delete(ev[1], step=ev[2])


def decisions_after(dev, events, later, reopen: bool, policy: str):
    s = Store.format(dev, policy=policy)
    drive(s, events)
    if reopen:
        s.close()
        s = Store.open(dev)
    order = list(s.table.open)
    log = []
    place = s.allocator.place

    def logged(req):
        d = place(req)
        log.append((req.generation, req.nbytes, d.zone, d.finish))
        return d

    s.allocator.place = logged
    drive(s, later)
    s.close()
    return order, log


def test_opening_order_survives_a_remount(monkeypatch):
    monkeypatch.setitem(POLICIES, "test-first-fit", "tests.placement.test_store_placement:FirstFit")
    g = Geometry(nr_zones=24, zone_size=64 * KiB, zone_capacity=48 * KiB, max_open=8, max_active=8)
    full = churn(3, 70)
    first, later = full[:19], full[19:]      # cut where three zones are open out of index order
    a_order, a = decisions_after(MemoryDevice(g, payload=False), first, later, False, "test-first-fit")
    b_order, b = decisions_after(MemoryDevice(g, payload=False), first, later, True, "test-first-fit")
    assert a_order == [3, 5, 4]              # the opening order is not the zone order
    assert b_order == a_order
    assert a == b and len(a) > 20


@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"dedicated"}))
def test_every_policy_decides_the_same_after_a_remount(policy):
    """``dedicated`` keeps zone ownership privately (documented): excluded."""
    g = Geometry(nr_zones=40, zone_size=64 * KiB, zone_capacity=48 * KiB, max_open=6, max_active=6)
    events = mixed_trace(saves=40, interval=100, size=40 * KiB, every=4, keep=3)
    cut = 50

    def run(reopen):
        dev = MemoryDevice(g, payload=False)
        s = Store.format(dev, policy=policy)
        log = []
        for i, ev in enumerate(events):
            if i == cut and reopen:
                s.close()
                s = Store.open(dev)
            if i == cut:
                place = s.allocator.place
                s.allocator.place = lambda req, place=place: log.append(place(req)) or log[-1]
            if ev[0] == "save":
                _, gen, step, sizes, hint = ev
                w = s.begin_generation(gen, step, hint=hint, declared_size=sum(sizes))
                for j, n in enumerate(sizes):
                    w.write_counted_shard(f"s{j}", n)
                w.commit()
            else:
                s.delete(ev[1], step=ev[2])
        s.close()
        return log

    a, b = run(False), run(True)
    assert a == b and len(a) > 20


# -- 1g: every capacity stop says why ---------------------------------------------------------------
@dataclass
class RefuseData(Greedy):
    """Greedy, but once ``refuse`` is set every data (non-GC) request gets NO_SPACE."""

    name = "test-refuse-data"
    refuse: bool = False

    def place(self, req):
        if self.refuse and not req.gc:
            return NO_SPACE
        return super().place(req)


def test_stop_causes_name_admission_allocation_and_gc():
    """``admission``: the store's admission refused; ``allocation``: the policy's no space stood with
    nothing collected; ``gc``: a forced GC pass reclaimed space and the policy still had none.  Each
    carries the zone state at the refusal."""
    causes = {}
    with Store.format(MemoryDevice(GEOM, payload=False), gc_reserve_zones=2) as s:
        with pytest.raises(NoSpaceError) as e:
            s.begin_generation("big", 1, declared_size=s.table.free)
        causes["admission"] = e.value
    with Store.format(MemoryDevice(GEOM, payload=False), gc_reserve_zones=0) as s:
        put(s, "g", 1, [8 * KiB])
        swap(s, RefuseData(refuse=True))
        with pytest.raises(NoSpaceError) as e:
            put(s, "h", 2, [8 * KiB])
        causes["allocation"] = e.value
        assert s.metrics.gc_bytes == 0 and s.table.dead == 0
    with Store.format(MemoryDevice(GEOM, payload=False), gc_reserve_zones=0) as s:
        fill_with_garbage(s)
        resets = s.metrics.resets
        swap(s, RefuseData(refuse=True))
        with pytest.raises(NoSpaceError) as e:
            put(s, "h", 20, [8 * KiB])
        causes["gc"] = e.value
        assert s.metrics.resets > resets          # the pass did reclaim
    assert {k: v.cause for k, v in causes.items()} == {"admission": "admission", "allocation": "allocation",
                                                       "gc": "gc"}
    for err in causes.values():
        assert set(err.state) == {"empty_zones", "open_free_bytes", "dead_bytes", "live_bytes"}
        assert all(isinstance(v, int) and v >= 0 for v in err.state.values())
    assert causes["admission"].state["empty_zones"] == len(s.table)
    assert causes["gc"].state["dead_bytes"] < 5 * 40 * KiB     # the pass collected dead bytes first


#: The every-policy runs: 40 zones, keep the latest 3 saves plus every 4th permanently.
GEOM40 = Geometry(nr_zones=40, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=6,
                  max_active=6)


def events():
    """Keep the latest 3 saves plus every 4th permanently; 40 KiB saves in two shards."""
    return mixed_trace(saves=40, interval=100, size=40 * KiB, every=4, keep=3)


def device(kind, tmp_path):
    if kind == "memory":
        return MemoryDevice(GEOM40, payload=False)
    return FileDevice.create(tmp_path / "dev.img", GEOM40)


@pytest.mark.parametrize("kind", ["memory", "file"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_runs_through_the_store(policy, kind, tmp_path):
    dev = device(kind, tmp_path)
    r = run(policy, events(), device=dev, unit=1, payload=kind == "file")
    dev.close()
    m = r.metrics()
    assert r.stop is None, f"{policy} stopped at step {r.stop}"
    assert m["generations_committed"] == 40
    assert m["host_bytes"] == 40 * 40 * KiB
    assert m["decisions"] == len(r.decisions) > 40


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_store_verify_mode_gives_identical_decisions(policy):
    """The store's verify mode recomputes every summary from the catalog before each decision
    (raising if the cached ones differ) and restores the table from it: same decisions."""
    a = run(policy, events(), device=MemoryDevice(GEOM40, payload=False), unit=1)
    b = run(policy, events(), device=MemoryDevice(GEOM40, payload=False), unit=1, verify=True)
    assert repr(a.decisions) == repr(b.decisions)
    strip = {"decision_cpu_seconds"}
    assert {k: v for k, v in a.metrics().items() if k not in strip} == \
        {k: v for k, v in b.metrics().items() if k not in strip}
