"""Power-cut campaigns: run a scripted workload, cut the power at every write boundary, recover,
check (LevelDB ``fault_injection_test``, on a zoned device).

A campaign first runs the workload once on a :class:`~retainz.zoned.faulty.FaultyDevice` to count its
write boundaries and label each (what the store was doing: shard data, commit record, rollover...).
Then for every boundary ``k`` it formats a fresh device, runs the workload until the power is cut
right after write ``k``, and tries the device states that cut can leave
(:func:`~retainz.zoned.faulty.power_cut_states`): every zone independently keeps a prefix of its
unflushed writes, torn at a block, so a commit record can persist while the data it commits is lost
and the other way round.  States are enumerated when a cut leaves few (``enumerate_up_to``), else
sampled with a random source seeded by the workload seed and ``k``.  For every state it reboots the
device into it, opens the store and checks:

* the committed set is exactly the generations whose ``commit()`` returned and whose ``delete()``
  did not, except the one operation cut mid-way: a generation whose commit was in flight may be
  present (it is committed iff its commit record is durable), one whose deletion was in flight may
  be absent;
* every committed shard reads back byte-identical with matching checksums; nothing else is visible;
* ``fsck`` is clean and the zone summaries equal a recomputation;
* the store is writable: a new generation commits and reads back, and a clean reopen keeps it all.
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from retainz.errors import PowerCutError
from retainz.hint import Hint
from retainz.store import Store
from retainz.store.format import MAGIC
from retainz.store.records import FRAME_HEADER, Kind, kind_of
from retainz.zoned.faulty import FaultyDevice, power_cut_states
from retainz.zoned.memory import MemoryDevice
from retainz.zoned.model import Geometry

__all__ = ["GEOMETRY", "WORKLOADS", "ENUMERATE_UP_TO", "SAMPLES", "workload", "campaign", "campaign_series",
           "distinct_points", "lane_budget", "CampaignReport"]

#: Small zones and meta zones so that every code path (GC, rollover, spill) runs within ~100 writes.
GEOMETRY = Geometry(nr_zones=12, zone_size=64 * 1024, zone_capacity=48 * 1024, block_size=4096,
                    max_open=3, max_active=4)
#: Power-cut states tried per write boundary: all of them when a cut can leave at most this many,
#: else a sample (both extremes, each zone alone kept and alone lost, ``SAMPLES`` random states).
ENUMERATE_UP_TO = 16
SAMPLES = 4
WORKLOADS = ("basic", "gc", "rollover", "spill", "mixed", "shared", "replace", "hint")
#: Meta zones per workload (``spill`` needs room for a snapshot spread over two zones).
META_ZONES = {"spill": 8}
#: The placement the campaigns format with: the one log, named because the workloads are scripted
#: for it (generations of different lifetimes share zones, so the scripted GC passes copy live
#: data and the cut lands inside GC copies and move records); not the store's default policy.
CAMPAIGN_POLICY = "greedy"


def workload(name: str, seed: int = 0) -> list[tuple]:
    """The operations of a scripted workload: ``("begin", gid, step, reclaim)``, ``("replace", gid,
    step, reclaim)`` (a ``begin`` with ``replace=True``), ``("write", gid, shard, nbytes)``,
    ``("commit", gid)``, ``("abort", gid)``, ``("delete", gid, step)``, ``("hint", gid, step,
    reclaim)`` (``Store.update_hint``), ``("gc",)``, ``("reopen",)``.

    ``replace``: one id (``last``, Lightning's ``last.ckpt``) replaced at every save beside
    keep-2 saves, one replacement aborted; ``hint``: every survivor's reclaim step moves earlier
    after each save (a rule that changed on resume), with deletions, GC and a reopen.

    Seed 0 is each workload's reference script; another seed varies its sizes (and so its write
    boundaries and the states a cut leaves) while keeping its shape, so every seed adds distinct
    power-cut points (``shared``: several jobs interleaving their writers on one device).

    Raises:
        ValueError: an unknown workload name.
    """
    rnd = random.Random(seed)

    def vary(n: int, spread: int) -> int:   # seed 0: the reference sizes
        return n + (rnd.randrange(-spread, spread + 1) if seed else 0)

    ops: list[tuple] = []
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
    if name == "basic":
        for i in range(4):
            ops += [("begin", f"g{i}", 10 * i, 10 * i + 20), ("write", f"g{i}", "model", vary(9000 + 1000 * i, 6000)),
                    ("write", f"g{i}", "optim", vary(5000, 4000)), ("commit", f"g{i}")]
        ops += [("begin", "x", 50, 60), ("write", "x", "model", vary(7000, 5000)), ("abort", "x"),
                ("delete", "g0", 60), ("delete", "g2", 60), ("reopen",)]
    elif name == "gc":
        for i in range(7):
            ops += [("begin", f"g{i}", 10 * i, 10 * i + 20), ("write", f"g{i}", "model", vary(30000 + 997 * i, 12000)),
                    ("commit", f"g{i}")]
            if i >= 2:
                ops += [("delete", f"g{i - 2}", 10 * i), ("gc",)]
    elif name == "spill":  # long shard names: 2-block commit records; the snapshot spills
        for i in range(14):
            ops.append(("begin", f"g{i}", i, i + 100))
            ops += [("write", f"g{i}", f"{j:02d}-" + "n" * vary(220, 30), 0) for j in range(20)]
            ops.append(("commit", f"g{i}"))
            if i == 8:
                ops += [("delete", "g0", i), ("reopen",)]
            if i >= 10:     # format 6 keeps a close record's room in every zone: the journal's limit
                ops.append(("delete", f"g{i - 9}", i))
    elif name == "rollover":
        for i in range(14):
            ops += [("begin", f"g{i}", i, i + 3), ("write", f"g{i}", "s", vary(100 + i, 99) + (rnd.randrange(3) * 4096 if seed else 0)),
                    ("commit", f"g{i}")]
            if i >= 3:
                ops.append(("delete", f"g{i - 3}", i))
            if i == 7:
                ops.append(("reopen",))
    elif name == "shared":  # three jobs on one device, their writers interleaved shard by shard
        jobs = {"a": (2, 11000), "b": (3, 6000), "c": (1, 17000)}   # keep-latest k, shard size
        live: dict[str, list[str]] = {j: [] for j in jobs}
        for i in range(5):
            gids = {j: f"{j}{i}" for j in jobs}
            for j, gid in gids.items():
                ops.append(("begin", gid, 10 * i, 10 * i + 10 * jobs[j][0]))
            for part in range(2):
                for j, gid in gids.items():
                    ops.append(("write", gid, f"r{part}", vary(jobs[j][1], jobs[j][1] // 2)))
            for j in (("c", "a", "b") if i % 2 else ("b", "c", "a")):
                if j == "c" and i == 2:
                    ops.append(("abort", gids[j]))
                    continue
                ops.append(("commit", gids[j]))
                live[j].append(gids[j])
                while len(live[j]) > jobs[j][0]:
                    ops.append(("delete", live[j].pop(0), 10 * i + 5))
            if i == 2:
                ops.append(("gc",))
            if i == 3:
                ops.append(("reopen",))
    elif name == "replace":
        for i in range(7):
            ops += [("replace" if i else "begin", "last", 10 * i, 10 * i + 1000),
                    ("write", "last", "model", vary(9000 + 1500 * i, 6000)),
                    ("write", "last", "optim", vary(3000, 2500)), ("commit", "last"),
                    ("begin", f"s{i}", 10 * i + 1, 10 * i + 21), ("write", f"s{i}", "m", vary(6000, 4000)),
                    ("commit", f"s{i}")]
            if i >= 2:
                ops.append(("delete", f"s{i - 2}", 10 * i + 2))
            if i == 3:
                ops += [("replace", "last", 10 * i + 3, 10 * i + 1003), ("write", "last", "model", vary(5000, 3000)),
                        ("abort", "last")]
            if i == 4:
                ops.append(("gc",))
            if i == 5:
                ops.append(("reopen",))
    elif name == "hint":
        for i in range(9):
            ops += [("begin", f"g{i}", 10 * i, 10 * i + 100), ("write", f"g{i}", "s", vary(12000 + 997 * i, 8000)),
                    ("commit", f"g{i}")]
            if i >= 1:
                ops.append(("hint", f"g{i - 1}", 10 * i + 1, 10 * i + 30))
            if i >= 3:
                ops.append(("delete", f"g{i - 3}", 10 * i + 31))
            if i == 5:
                ops.append(("reopen",))
            if i == 6:
                ops.append(("gc",))
    else:  # mixed: random sizes, overlapping writers, aborts, deletes, GC, a reopen
        live: list[str] = []
        for i in range(10):
            a, b = f"a{i}", f"b{i}"
            ops.append(("begin", a, 10 * i, 10 * i + 30))
            ops.append(("write", a, "s0", rnd.randrange(1, 40000)))
            if i % 3 == 1:
                ops += [("begin", b, 10 * i + 1, 10 * i + 11), ("write", b, "s0", rnd.randrange(1, 9000)),
                        ("write", a, "s1", rnd.randrange(0, 5000))]
                ops.append(("commit", b) if i % 2 else ("abort", b))
                if i % 2:
                    live.append(b)
            ops.append(("commit", a) if i != 4 else ("abort", a))
            if i != 4:
                live.append(a)
            while len(live) > 3:
                ops.append(("delete", live.pop(0), 10 * i + 5))
            if i % 3 == 2:
                ops.append(("gc",))
            if i == 6:
                ops.append(("reopen",))
    return ops


def _data(gid: str, shard: str, n: int) -> bytes:
    return random.Random(f"{gid}/{shard}").randbytes(n)


@dataclass
class _Model:
    acked: dict[str, dict[str, bytes]] = field(default_factory=dict)
    writing: dict[str, dict[str, bytes]] = field(default_factory=dict)
    hints: dict[str, float] = field(default_factory=dict)           # committed: acknowledged reclaim step
    writing_hints: dict[str, float] = field(default_factory=dict)
    pending: tuple | None = None
    store: Store | None = None


def _run(store: Store, dev, ops: list[tuple], model: _Model) -> Store:
    writers = {}
    for op in ops:
        kind = op[0]
        if kind == "begin" or kind == "replace":
            _, gid, step, reclaim = op
            writers[gid] = store.begin_generation(gid, step, hint=Hint(reclaim_step=reclaim),
                                                  replace=kind == "replace")
            model.writing[gid] = {}
            model.writing_hints[gid] = reclaim
        elif kind == "write":
            _, gid, shard, n = op
            data = _data(gid, shard, n)
            writers[gid].write_shard(shard, [data[:n // 2], data[n // 2:]], size=n)
            model.writing[gid][shard] = data
        elif kind == "commit":
            gid = op[1]
            model.pending = ("commit", gid)
            writers.pop(gid).commit()
            model.acked[gid] = model.writing.pop(gid)
            model.hints[gid] = model.writing_hints.pop(gid)
        elif kind == "abort":
            writers.pop(op[1]).abort()
            model.writing.pop(op[1])
            model.writing_hints.pop(op[1])
        elif kind == "delete":
            model.pending = ("delete", op[1])
            store.delete(op[1], step=op[2])
            del model.acked[op[1]]
            del model.hints[op[1]]
        elif kind == "hint":
            _, gid, step, reclaim = op
            model.pending = ("hint", gid, reclaim)      # the old or the new, until acknowledged
            store.update_hint(gid, Hint(reclaim_step=reclaim), step=step)
            model.hints[gid] = reclaim
        elif kind == "gc":
            store.gc(force=True)
        elif kind == "reopen":
            store.close()
            store = model.store = Store.open(dev)
        model.pending = None
    return store


_LABELS = {Kind.COMMIT: "commit-record", Kind.DELETE: "delete-record", Kind.MOVE: "gc-move-record",
           Kind.SYNC: "sync-record", Kind.HINT: "hint-record", Kind.CLOSE: "zone-close-record"}


def _label(dev, offset: int, data, in_gc: bool) -> str:
    z = offset // dev.geometry.zone_size
    if isinstance(data, int) or z >= dev.meta_zones:
        return "gc-copy" if in_gc else "shard-data"
    head = bytes(memoryview(data)[:64])
    if head[:8] == MAGIC:
        return "rollover-snapshot"
    return _LABELS.get(kind_of(head[FRAME_HEADER:]), "journal-other")


class _LabelingDevice(FaultyDevice):
    """Records a label for every write (dry run only)."""

    def __init__(self, inner, meta_zones: int):
        super().__init__(inner)
        self.meta_zones = meta_zones
        self.labels: list[str] = []
        self.store: Store | None = None

    def write(self, offset, data):
        self.labels.append(_label(self, offset, data, bool(self.store and self.store.collector.running)))
        super().write(offset, data)


@dataclass
class CampaignReport:
    """Results of :func:`campaign`.

    Attributes:
        workload, seed: what ran.
        write_boundaries: writes the workload issues (cut points).
        points: crash states tried (over all cut points: one recovery and check each).
        classes: crash states per class (what the store was writing when the power went).
        states: crash states per kind: ``flushed`` (nothing was unflushed), ``all kept``,
            ``none kept``, ``record durable, data lost`` (every meta zone kept all its unflushed
            writes, a data zone lost some), ``data durable, record lost`` (the reverse), ``partial``
            (any other mix of prefixes).
        generations_recovered: committed generations found over all recoveries.
        bytes_verified: shard bytes read back and compared over all recoveries.
        failures: one line per failed point.
        point_keys: one key per point tried: ``(workload, script digest, second cut, boundary,
            state)``, the state as each unflushed zone's kept blocks.  The script digest (of the
            operations, not the seed) makes two seeds that script the same operations count once
            (:func:`distinct_points`).
    """

    workload: str
    seed: int
    write_boundaries: int = 0
    points: int = 0
    classes: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    generations_recovered: int = 0
    bytes_verified: int = 0
    failures: list[str] = field(default_factory=list)
    point_keys: list[tuple] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def state_kind(unflushed: dict[int, int], keep: dict[int, int], meta_zones: int) -> str:
    """Name a power-cut state (see :attr:`CampaignReport.states`)."""
    if not unflushed:
        return "flushed"
    lost = {z for z, n in unflushed.items() if keep.get(z, 0) < n}
    if not lost:
        return "all kept"
    if not keep:
        return "none kept"
    meta = {z for z in unflushed if z < meta_zones}
    data = set(unflushed) - meta
    if meta and data and not lost & meta:
        return "record durable, data lost"
    if meta and data and not lost & data:
        return "data durable, record lost"
    return "partial"


def _describe(unflushed: dict[int, int], keep: dict[int, int]) -> str:
    if not unflushed:
        return "nothing unflushed"
    return ", ".join(f"zone {z} kept {keep.get(z, 0)}/{n}" for z, n in sorted(unflushed.items())) + " blocks"


def campaign(name: str = "mixed", seed: int = 0, *, geometry: Geometry = GEOMETRY,
             points: list[int] | None = None,
             make_device: Callable[[Geometry], object] | None = None,
             second_cut: int | None = None, enumerate_up_to: int = ENUMERATE_UP_TO,
             samples: int = SAMPLES,
             progress: Callable[[int, int], None] | None = None) -> CampaignReport:
    """Run a power-cut campaign (see the module docstring).

    Args:
        name: workload name (:data:`WORKLOADS`).
        seed: workload seed (also seeds the sampling of crash states).
        geometry: device geometry (3 meta zones are used, 8 for ``spill``).
        points: write boundaries to cut at (default: every one).
        make_device: builds a fresh emulated device (default: a payload ``MemoryDevice``).  A
            ``MemoryDevice`` is cut once per boundary and copied per state; any other device reruns
            the workload for every state.
        second_cut: also cut the power again at this write after the reboot (during recovery's
            own writes, e.g. the mount-time rollover, or the first writes after it), reboot into a
            sampled state, then recover and check as usual (a double crash).
        enumerate_up_to, samples: crash states per cut (:func:`~retainz.zoned.faulty.power_cut_states`).
        progress: called with (boundaries done, boundaries total).
    """
    make = make_device or (lambda g: MemoryDevice(g))
    ops = workload(name, seed)
    digest = hashlib.sha256(repr(ops).encode()).hexdigest()[:16]
    rep = CampaignReport(workload=name, seed=seed)
    meta = META_ZONES.get(name, 3)
    dry = _LabelingDevice(make(geometry), meta)
    store = Store.format(dry, meta_zones=meta, policy=CAMPAIGN_POLICY)
    dry.store = store
    start = dry.writes
    dry.labels.clear()
    store = _run(store, dry, ops, _Model())
    store.close()
    labels = dry.labels
    dry.close()
    rep.write_boundaries = dry.writes - start
    todo = [k for k in (points or range(1, rep.write_boundaries + 1)) if 1 <= k <= rep.write_boundaries]
    for done, k in enumerate(todo, 1):
        label = labels[k - 1]
        rng = random.Random(f"{name}/{seed}/{k}")
        try:
            dev, model = _cut(make, geometry, meta, ops, k)
        except Exception as e:  # noqa: BLE001 - a failed point is reported, never hidden
            rep.failures.append(f"cut at write {k} ({label}): {type(e).__name__}: {e}")
            continue
        unflushed = dev.unflushed()
        states = power_cut_states(unflushed, enumerate_up_to=enumerate_up_to, samples=samples, rng=rng)
        snapshot = copy.deepcopy(dev.inner) if isinstance(dev.inner, MemoryDevice) else None
        for i, keep in enumerate(states):
            rep.points += 1
            rep.point_keys.append((name, digest, second_cut or 0, k,
                                   tuple(sorted((z, keep.get(z, 0)) for z in unflushed))))
            rep.classes[label] = rep.classes.get(label, 0) + 1
            kind = state_kind(unflushed, keep, meta)
            rep.states[kind] = rep.states.get(kind, 0) + 1
            try:
                if i:
                    if snapshot is not None:
                        dev = FaultyDevice(copy.deepcopy(snapshot))
                    else:
                        dev, model = _cut(make, geometry, meta, ops, k)
                _point(rep, dev, model, keep, second_cut, rng)
            except Exception as e:  # noqa: BLE001 - a failed point is reported, never hidden
                rep.failures.append(f"cut at write {k} ({label}), {kind}: {_describe(unflushed, keep)}: "
                                    f"{type(e).__name__}: {e}")
        if progress:
            progress(done, len(todo))
    return rep


def distinct_points(reports) -> int:
    """Distinct power-cut points over ``reports`` (:class:`CampaignReport`): distinct
    ``(workload, script, second cut, boundary, state)`` keys, so the same cut tried twice (the same
    script under two seeds, or two campaigns of one lane) counts once."""
    return len({key for rep in reports for key in rep.point_keys})


def campaign_series(name: str, min_points: int, *, first_seed: int = 1, max_seeds: int = 1000,
                    samples: int = 2 * SAMPLES, **kw) -> list[CampaignReport]:
    """Campaigns of workload ``name`` at seeds ``first_seed, first_seed + 1, ...`` until they have
    tried at least ``min_points`` distinct power-cut points (:func:`distinct_points`): the size knob
    of a lane (a lane's budget split over :data:`WORKLOADS` picks up a new workload by itself).

    Args:
        name: workload name (:data:`WORKLOADS`).
        min_points: distinct points to reach.
        first_seed, max_seeds: the seeds tried; a workload whose seeds stop adding points ends
            the series early (the caller sees fewer points than asked for).
        samples, kw: passed to :func:`campaign` (default: twice the default random states per cut).

    Returns:
        One report per seed run, in order.
    """
    reports: list[CampaignReport] = []
    seen: set[tuple] = set()
    for seed in range(first_seed, first_seed + max_seeds):
        rep = campaign(name, seed, samples=samples, **kw)
        reports.append(rep)
        before = len(seen)
        seen.update(rep.point_keys)
        if len(seen) >= min_points or len(seen) == before:
            break
    return reports


def lane_budget(total: int, workloads=WORKLOADS) -> int:
    """Each workload's share of a lane's ``total`` distinct points (rounded up)."""
    return math.ceil(total / len(workloads))


def _cut(make, geometry, meta: int, ops, k: int) -> tuple[FaultyDevice, _Model]:
    """Format a fresh device and run ``ops`` until the power goes right after write ``k`` (the
    write lands in the drive's cache; the next operation fails)."""
    dev = FaultyDevice(make(geometry))
    store = Store.format(dev, meta_zones=meta, policy=CAMPAIGN_POLICY)
    dev.cut_after_writes = dev.writes + k
    model = _Model()
    try:
        store = _run(store, dev, ops, model)
        store.close()
        raise AssertionError("the workload finished without reaching the cut")
    except PowerCutError:
        pass
    finally:
        try:
            (model.store or store).close()
        except PowerCutError:
            pass
    return dev, model


def _point(rep: CampaignReport, dev: FaultyDevice, model: _Model, keep: dict[int, int],
           second_cut: int | None, rng: random.Random) -> None:
    dev.reboot(keep)
    base = set(model.acked)
    must, may = set(base), set(base)
    expect = {gid: [data] for gid, data in model.acked.items()}       # the contents a generation may hold
    hints = {gid: {r} for gid, r in model.hints.items()}              # the reclaim steps it may carry
    if model.pending and model.pending[0] == "commit":
        gid = model.pending[1]
        may.add(gid)           # committed iff its record is durable; a replacement: the old or the new
        expect.setdefault(gid, []).append(model.writing.get(gid, {}))
        hints.setdefault(gid, set()).add(model.writing_hints.get(gid))
    elif model.pending and model.pending[0] == "delete":
        must.discard(model.pending[1])
    elif model.pending and model.pending[0] == "hint":
        hints[model.pending[1]].add(model.pending[2])
    if second_cut:   # a second power cut during recovery (or the first writes after it)
        dev.cut_after_writes = dev.writes + second_cut
        expect["during-recovery"] = [{"s": b"x" * 9000}]
        may.add("during-recovery")
        try:
            again = Store.open(dev)
            try:
                w = again.begin_generation("during-recovery", 10**6 - 1)
                w.write_shard("s", [b"x" * 9000])
                w.commit()
                must.add("during-recovery")
            finally:
                again.close()
        except PowerCutError:
            pass
        dev.reboot(rng.choice(power_cut_states(dev.unflushed(), rng=rng)))
    try:
        store = Store.open(dev)
    except BaseException:
        dev.close()
        raise
    try:
        got = {g.id for g in store.generations()}
        if not must <= got <= may:
            raise AssertionError(f"committed set {sorted(got)}, expected all of {sorted(must)} and "
                                 f"nothing outside {sorted(may)}")
        _verify(rep, store, got, expect, hints)
        w = store.begin_generation("post-crash", 10**6)
        w.write_shard("s", [b"after the crash" * 100])
        w.commit()
        expect["post-crash"] = [{"s": b"after the crash" * 100}]
        got.add("post-crash")
        store.close()
        store = Store.open(dev)
        if {g.id for g in store.generations()} != got:
            raise AssertionError("a clean reopen after recovery changed the committed set")
        _verify(rep, store, got, expect, hints, count=False)
    finally:
        store.close()
        dev.close()


def _verify(rep: CampaignReport, store: Store, got: set, expect: dict, hints: dict, count: bool = True) -> None:
    """Every generation in ``got`` holds one of its ``expect`` contents byte for byte and carries one
    of its ``hints`` reclaim steps (generations the model does not hint are not checked)."""
    for gid in got:
        gen = store.generation(gid)
        found = None
        for want in expect[gid]:
            if set(gen.shards) == set(want) and all(b"".join(store.read_shard(gid, sh)) == data
                                                   for sh, data in want.items()):
                found = want
                break
        if found is None:
            shapes = " or ".join(str(sorted(w)) for w in expect[gid])
            raise AssertionError(f"generation {gid}: shards {sorted(gen.shards)} with bytes matching none of "
                                 f"the acknowledged versions ({shapes}): bytes differ")
        if count:
            rep.bytes_verified += sum(len(d) for d in found.values())
        if gid in hints and gen.hint.reclaim_step not in hints[gid]:
            raise AssertionError(f"generation {gid}: reclaim step {gen.hint.reclaim_step}, expected one of "
                                 f"{sorted(hints[gid])}")
    if count:
        rep.generations_recovered += len(got)
    fsck = store.fsck()
    if not fsck.ok:
        raise AssertionError("fsck: " + "; ".join(fsck.problems[:3]))
    if store.table.key() != store.recompute_table().key():
        raise AssertionError("zone summaries differ from a recomputation")
