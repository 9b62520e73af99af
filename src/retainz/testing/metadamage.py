"""Metadata damage campaigns: the fault model a store must survive (issue 41 item 5;
docs/testing.md, "Metadata damage").

A store is built by a real workload (several jobs committing checkpoints, deletions, a replaced
``last`` generation, hint updates, forced GC passes that move extents) and closed cleanly.  Then, one
fault at a time on a fresh copy of its device:

* **block**: every 4 KiB block written in a meta zone (superblock copies, spares, every journal
  record) is destroyed (reads back as zeros: a lost write, a remapped sector);
* **byte**: one byte is flipped at every metadata offset: each superblock copy's fields and each
  journal record's header and payload (the zero padding after a record is not covered by its
  checksum and holds nothing);
* **pair**: every run of two adjacent written blocks is destroyed (an 8 KiB loss: two faults, both
  copies of a superblock, of an appended record, of a snapshot's head or end).  Records may be lost
  here, but the oracle is the same: nothing deleted comes back and every loss is named.
* **tail**: every run from a block of appended records (after the snapshot's end) to the zone's
  last written block is destroyed (the journal's lost tail of any length: the blocks a drive's write cache lost, a bad region at a zone's
  end).  Up to store format 5 a Full zone's zeroed tail read as padding, so deletions at the end of
  the journal were lost silently (issue 41 trial); format 6's close record makes it damage.

After each fault the store is opened read-only; if the open refuses, it is repaired
(``Store.open(repair=True)``, what ``retainz fsck --repair`` runs) and reopened read-only.  The
oracle, with *live* the generations committed and not deleted (each with the content of its latest
version) and *deleted* every retired generation or replaced version:

* recovered ⊆ live, each with its latest content: nothing deleted, nothing replaced comes back
  (``resurrected`` counts violations and must be 0);
* live ⊆ recovered ∪ named: every live generation not recovered is named by the repair, by id (lost,
  or kept as unknown) or, when the only record naming it was lost, counted by commit sequence or
  snapshot count (``named_anonymous``); anything else is ``unnamed`` and must be 0;
* the repaired store opens read-only again, and ``fsck`` finds no problem in what it lists.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from retainz.errors import CorruptDeviceError, CorruptJournalError, StoreError
from retainz.hint import Hint
from retainz.store import Store
from retainz.store.format import SUPERBLOCK_BYTES
from retainz.store.records import FRAME_HEADER, unframe
from retainz.zoned.faulty import FaultyDevice
from retainz.zoned.file import FileDevice
from retainz.zoned.memory import MemoryDevice
from retainz.zoned.model import Geometry, ZoneCond

__all__ = ["DamageCounts", "build_store", "damage_sites", "run_campaign", "run_device_blocks", "run_torn", "WORKLOADS",
           "BLOCK", "TEAR_LANDED"]

#: The unit a drive loses (bytes).
BLOCK = 4096
#: The campaign's device: 24 zones of 128 KiB (96 KiB writable), 4 KiB blocks.
GEOMETRY = Geometry(nr_zones=24, zone_size=128 * 1024, zone_capacity=96 * 1024, block_size=BLOCK,
                    max_open=4, max_active=6)


def _content(gid: str, version: int, n: int) -> bytes:
    seed = hashlib.blake2b(f"{gid}/{version}".encode(), digest_size=8).digest()
    return (seed * (n // 8 + 1))[:n]


@dataclass
class Truth:
    """What the workload left: ``live`` ``{id: sha of its latest content}`` and ``deleted`` ids
    (retired, or a replaced version's content under ``replaced``).  ``pending``: the operation in
    flight, ``("put", id, sha)`` or ``("delete", id)`` (what a power cut may or may not keep),
    else ``None``."""

    live: dict[str, str] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    replaced: dict[str, set[str]] = field(default_factory=dict)
    pending: tuple | None = None

    def must(self) -> dict[str, set[str]]:
        """Every generation that must be recovered, with the contents it may have: the live ones,
        less one whose deletion was in flight; one whose replacement was in flight may have either."""
        out = {gid: {sha} for gid, sha in self.live.items()}
        p = self.pending
        if p and p[0] == "delete":
            out.pop(p[1], None)
        elif p and p[1] in out:
            out[p[1]].add(p[2])
        return out

    def may(self) -> dict[str, set[str]]:
        """Every generation that may be recovered (the must-survive ones, and a put in flight)."""
        out = {gid: {sha} for gid, sha in self.live.items()}
        p = self.pending
        if p and p[0] == "put":
            out.setdefault(p[1], set()).add(p[2])
        return out


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _put(store: Store, truth: Truth, gid: str, step: int, n: int, version: int = 0, *,
         replace: bool = False, hint: Hint | None = None) -> None:
    data = _content(gid, version, n)
    truth.pending = ("put", gid, _sha(data))
    w = store.begin_generation(gid, step, hint=hint or Hint(), replace=replace)
    w.write_shard("model.pt", [data[i:i + 20000] for i in range(0, len(data), 20000)])
    w.commit()
    truth.pending = None
    if replace and gid in truth.live:
        truth.replaced.setdefault(gid, set()).add(truth.live[gid])
    truth.live[gid] = _sha(data)
    truth.deleted.discard(gid)


def _delete(store: Store, truth: Truth, gid: str, step: int) -> None:
    truth.pending = ("delete", gid)
    store.delete(gid, step=step)
    truth.pending = None
    truth.live.pop(gid)
    truth.deleted.add(gid)


def _jobs(store: Store, truth: Truth, rng: random.Random) -> None:
    """Two jobs saving every step, each keeping its last 3 (deletes), a replaced ``last``, a hint
    update, and forced GC passes (GC moves extents of live generations)."""
    kept: dict[str, list[str]] = {"a": [], "b": []}
    for step in range(1, 13):
        for job in ("a", "b"):
            gid = f"{job}-step-{step}"
            _put(store, truth, gid, step, rng.randrange(6000, 30000), hint=Hint(reclaim_step=step + 3))
            kept[job].append(gid)
            if len(kept[job]) > 3:
                _delete(store, truth, kept[job].pop(0), step)
        _put(store, truth, "last", step, 9000, version=step, replace="last" in truth.live)
        if step == 6:
            store.update_hint("a-step-6", Hint(reclaim_step=40), step=step)
        if step % 4 == 0:
            store.gc(force=True)


def _churn(store: Store, truth: Truth, rng: random.Random) -> None:
    """Many small generations committed and deleted out of order, with a GC pass at the end."""
    ids = []
    for step in range(1, 25):
        gid = f"g{step:03d}"
        _put(store, truth, gid, step, rng.randrange(1000, 9000))
        ids.append(gid)
        if step % 3 == 0:
            victim = ids.pop(rng.randrange(len(ids)))
            _delete(store, truth, victim, step)
    store.gc(force=True)


WORKLOADS = {"jobs": _jobs, "churn": _churn}


def build_store(workload: str, seed: int = 41) -> tuple[MemoryDevice, Truth]:
    """Run ``workload`` on a fresh :data:`GEOMETRY` memory device; returns the device (the store
    closed cleanly) and what it must hold."""
    dev = MemoryDevice(GEOMETRY)
    truth = Truth()
    with Store.format(dev) as store:
        WORKLOADS[workload](store, truth, random.Random(seed))
    return dev, truth


def _meta_written(dev: MemoryDevice) -> Iterator[tuple[int, int]]:
    """``(zone, written bytes)`` of every non-empty meta zone."""
    with Store.open(dev, readonly=True) as s:
        meta = s.meta_zones
    for z in dev.report_zones(0, meta):
        if z.cond != ZoneCond.EMPTY:
            yield z.index, (z.capacity if z.cond == ZoneCond.FULL else z.wp - z.start)


def damage_sites(dev: MemoryDevice, kind: str) -> list[tuple[int, int]]:
    """``(zone, byte in the zone)`` of every fault of ``kind``: ``"block"`` and ``"noise"``, each
    written 4 KiB block of a meta zone that holds data (``"pair"``: each such block that is not the
    zone's last written one, the first of the two; ``"tail"``: each such block after the zone's
    snapshot end, the first of the run lost up to the zone's end); ``"byte"``, each superblock field byte and
    each byte of a journal record's header and payload."""
    g = dev.geometry
    out = []
    for z, written in _meta_written(dev):
        buf = dev.read(z * g.zone_size, written)
        appended = _appended_from(buf, written, g.block_size)
        for off in range(0, written, BLOCK):
            blk = buf[off:off + BLOCK]
            if kind in ("block", "noise", "pair", "tail"):
                if any(blk) and (kind != "pair" or off + BLOCK < written) and (kind != "tail" or off >= appended):
                    out.append((z, off))
                continue
            if blk[:8] == b"RETAINZS":
                out += [(z, off + i) for i in range(SUPERBLOCK_BYTES)]
                continue
            n, total, ok = unframe(buf, off, written, g.block_size) if off + FRAME_HEADER <= written else (0, 0, 0)
            if ok and total:
                out += [(z, off + i) for i in range(FRAME_HEADER + n)]
    return out


def _appended_from(buf, written: int, bs: int) -> int:
    """Where a meta zone's appended records start: after its snapshot's end record (both copies),
    or the zone's end when it holds no snapshot end (a spare, a snapshot's earlier part)."""
    pos, start = 2 * BLOCK, written
    while pos + FRAME_HEADER <= written:
        n, total, ok = unframe(buf, pos, written, bs)
        if not total or not ok:
            break
        if bytes(buf[pos + FRAME_HEADER:pos + FRAME_HEADER + 5]) == b"send ":
            start = pos + total
        pos += total
    return start


def _damaged(dev: MemoryDevice, kind: str, zone: int, off: int) -> MemoryDevice:
    d = copy.deepcopy(dev)
    buf = d._data[zone]
    n = len(buf[off:off + BLOCK])
    if kind == "block":
        buf[off:off + BLOCK] = bytes(n)
    elif kind == "pair":      # two adjacent blocks lost: two faults at once
        n = len(buf[off:off + 2 * BLOCK])
        buf[off:off + 2 * BLOCK] = bytes(n)
    elif kind == "tail":      # every block from here to the zone's end lost (a lost tail)
        buf[off:] = bytes(len(buf) - off)
    elif kind == "noise":     # a block read back as garbage (a misdirected write, a bad sector's contents)
        buf[off:off + BLOCK] = random.Random(f"{zone}/{off}").randbytes(n)
    else:
        buf[off] ^= 0xFF
    return d


@dataclass
class DamageCounts:
    """A campaign's outcome for one fault kind (the issue's counts)."""

    kind: str
    sites: int = 0
    opened_intact: int = 0         #: read-only open with every must-survive generation, unchanged
    repaired: int = 0              #: the open refused; fsck --repair salvaged, and the result reopens
    named_lost: int = 0            #: must-survive generations a repair named by id as lost
    named_unknown: int = 0         #: must-survive generations a repair kept as unknown (named by id)
    named_anonymous: int = 0       #: generations named by commit sequence or snapshot count only
    resurrected: int = 0           #: a deleted generation or replaced version listed (must be 0)
    unnamed: int = 0               #: a must-survive generation gone without a name (must be 0)
    failures: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        """Must-survive generations not recovered, named or not (0: no fault lost a commit)."""
        return self.named_lost + self.named_unknown + self.named_anonymous + self.unnamed

    def to_dict(self) -> dict:
        d = asdict(self)
        d["failures"] = d["failures"][:10]
        d["lost"] = self.lost
        return d


def _check(store: Store, truth: Truth, c: DamageCounts, where: str) -> set[str]:
    """Apply the oracle to an open store; returns the ids it recovered intact (each in the
    may-survive set with a content it may have; anything else is counted as resurrected)."""
    may = truth.may()
    got = set()
    for g in store.generations():
        data = b"".join(store.read_shard(g.id, "model.pt"))
        sha = _sha(data)
        if sha not in may.get(g.id, ()):
            c.resurrected += 1
            c.failures.append(f"{where}: {g.id!r} listed"
                              + (" (deleted)" if g.id in truth.deleted else " (an old version)"))
        else:
            got.add(g.id)
    return got


def _one(dev: MemoryDevice, truth: Truth, kind: str, zone: int, off: int, c: DamageCounts) -> None:
    _judge(_damaged(dev, kind, zone, off), truth, f"{kind} at meta zone {zone} byte {off}", c)


def _judge(d: MemoryDevice, truth: Truth, where: str, c: DamageCounts) -> None:
    """Open the faulted device ``d`` read-only, or repair it when that refuses, and apply the
    oracle: must-survive ⊆ recovered ⊆ may-survive, and every must-survive generation not
    recovered named by the repair (module docstring)."""
    must = set(truth.must())
    try:
        with Store.open(d, readonly=True) as s:
            got = _check(s, truth, c, where)
    except (CorruptJournalError, StoreError, ValueError, KeyError) as e:
        refused = str(e)
    else:
        if got >= must:
            c.opened_intact += 1
            return
        c.unnamed += len(must - got)
        c.failures.append(f"{where}: opened read-only without {sorted(must - got)[:4]}, none named")
        return
    try:
        with Store.open(d, repair=True) as s:
            dropped = list(s.recovery.dropped)
        with Store.open(d, readonly=True) as s:
            got = _check(s, truth, c, where + " (repaired)")
            unknown = {g.id for g in s.unknown()}
            rep = s.fsck()
    except Exception as e:  # noqa: BLE001 - every failure is counted and named
        c.failures.append(f"{where}: refused ({refused[:120]}) and the repair failed: {type(e).__name__}: {e}"[:400])
        c.unnamed += len(must)
        return
    c.repaired += 1
    if rep.problems:
        c.failures.append(f"{where}: repaired store has problems: {rep.problems[:2]}")
    by_id = {d["id"] for d in dropped if d["id"] is not None and not d.get("unknown")}
    anonymous = sum(d.get("count", 0) for d in dropped if d["id"] is None)
    missing = must - got
    c.named_unknown += len(missing & unknown)
    c.named_lost += len((missing - unknown) & by_id)
    rest = missing - unknown - by_id
    c.named_anonymous += min(len(rest), anonymous)
    if len(rest) > anonymous:
        c.unnamed += len(rest) - anonymous
        c.failures.append(f"{where}: repaired without {sorted(rest)[:4]} and named {anonymous} anonymously")


def run_campaign(workload: str, kind: str, *, sample: int | None = None, seed: int = 41) -> DamageCounts:
    """Every fault of ``kind`` (``"block"``: zeroed, ``"noise"``: random bytes, ``"byte"``: one
    flipped, ``"pair"``: two adjacent blocks zeroed, ``"tail"``: a zone's blocks zeroed from one to its end) on the store ``workload`` builds, or a ``sample`` of them (seeded), each checked by
    the oracle (module docstring)."""
    dev, truth = build_store(workload, seed)
    sites = damage_sites(dev, kind)
    if sample is not None and sample < len(sites):
        sites = sorted(random.Random(seed).sample(sites, sample))
    c = DamageCounts(kind=kind, sites=len(sites))
    for z, off in sites:
        _one(dev, truth, kind, z, off, c)
    return c


#: How much of the write a power cut interrupts lands (:class:`~retainz.zoned.faulty.FaultyDevice`
#: ``torn_blocks``): nothing, its first block, or all of it (the next operation fails).
TEAR_LANDED = (0, 1, None)


def _writes(workload: str, seed: int) -> tuple[int, int]:
    """``(writes of the format, writes after the workload and a clean close)``."""
    fd = FaultyDevice(MemoryDevice(GEOMETRY))
    store = Store.format(fd)
    first = fd.writes
    WORKLOADS[workload](store, Truth(), random.Random(seed))
    store.close()
    return first, fd.writes


def run_torn(workload: str, *, sample: int | None = None, seed: int = 41) -> DamageCounts:
    """Power cuts during ``workload``: at each of its writes after the format (or its last
    ``sample`` writes: the last commits, deletions and the closing sync record, each record's two
    copies a write apiece), the write lands torn (:data:`TEAR_LANDED`), and everything the drive
    completed before it persists.  The rebooted device is judged as :func:`run_campaign` does,
    with the operation in flight allowed either way (:meth:`Truth.must`, :meth:`Truth.may`)."""
    first, total = _writes(workload, seed)
    cuts = list(range(first + 1, total + 1))
    if sample is not None:
        cuts = cuts[-sample:]
    c = DamageCounts(kind="torn")
    for cut in cuts:
        for landed in TEAR_LANDED:
            fd = FaultyDevice(MemoryDevice(GEOMETRY))
            store = Store.format(fd)
            fd.cut_after_writes, fd.torn_blocks = cut, landed
            truth = Truth()
            where = f"power cut at write {cut} ({'all' if landed is None else landed} block(s) of it landed)"
            try:
                WORKLOADS[workload](store, truth, random.Random(seed))
                store.close()
            except Exception as e:  # noqa: BLE001 - the cut surfaces as whatever the store raises
                if not fd.dead:
                    c.failures.append(f"{where}: {type(e).__name__} before the cut: {e}"[:300])
                    continue
            c.sites += 1
            _judge(fd.reboot(), truth, where, c)
    return c


def run_device_blocks(workload: str, directory: str, seed: int = 41) -> DamageCounts:
    """The device file's own metadata blocks, each destroyed in turn on a FileDevice built by
    ``workload`` in ``directory``: the label block, every 4 KiB block of the four zone-state slot
    copies, and the label copy at the end of the file.  A refused open is repaired as
    ``retainz fsck --repair`` does (the device's copies first, the zone state rebuilt from the
    journal when every slot copy is lost, then the salvaging store open); the oracle as
    :func:`run_campaign`."""
    pristine = os.path.join(directory, "pristine.img")
    dev = FileDevice.create(pristine, GEOMETRY)
    truth = Truth()
    with Store.format(dev) as store:
        WORKLOADS[workload](store, truth, random.Random(seed))
    slot, data = dev._slot_size, dev._data_offset
    dev.close()
    size = os.path.getsize(pristine)
    sites = [0, *range(BLOCK, data, BLOCK), size - BLOCK]
    assert data == BLOCK + 4 * slot
    c = DamageCounts(kind="device block", sites=len(sites))
    path = os.path.join(directory, "damaged.img")
    for off in sites:
        shutil.copyfile(pristine, path)
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(bytes(BLOCK))
        where = f"device block at byte {off}"
        try:
            d = FileDevice(path, readonly=True)
            try:
                with Store.open(d, readonly=True) as s:
                    got = _check(s, truth, c, where)
            finally:
                d.close()
        except (CorruptDeviceError, CorruptJournalError, StoreError):
            pass
        else:
            if got == set(truth.live):
                c.opened_intact += 1
                continue
        try:
            try:
                d = FileDevice(path)
            except CorruptDeviceError:
                d = FileDevice(path, lost_state=True)
            try:
                d.repair_metadata()
                with Store.open(d, repair=True) as s:
                    dropped = list(s.recovery.dropped)
            finally:
                d.close()
            d = FileDevice(path, readonly=True)
            try:
                with Store.open(d, readonly=True) as s:
                    got = _check(s, truth, c, where + " (repaired)")
            finally:
                d.close()
        except Exception as e:  # noqa: BLE001 - every failure is counted and named
            c.failures.append(f"{where}: the repair failed: {type(e).__name__}: {e}"[:400])
            c.unnamed += len(truth.live)
            continue
        c.repaired += 1
        missing = set(truth.live) - got
        named = {x["id"] for x in dropped if x["id"] is not None}
        c.named_lost += len(missing & named)
        if missing - named:
            c.unnamed += len(missing - named)
            c.failures.append(f"{where}: repaired without {sorted(missing - named)[:4]}, none named")
    return c
