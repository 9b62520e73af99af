"""The store on every kind of zoned device, real Linux zoned block devices included.

Parametrized like the conformance suite: a ``MemoryDevice`` and a ``FileDevice`` by default, plus every
device named in ``RETAINZ_TEST_ZBD`` (the QEMU guest lane runs this file against ``/dev/nvme0n1``, QEMU's
NVMe ZNS, and ``/dev/nullb0``, null_blk zoned).  The workload is written against the device's own
geometry (sizes are fractions of the zone capacity, so every test crosses zone boundaries and shares
zones between generations whatever the zone size) and keeps data small (a few zone capacities).

Crashes here are **process crashes**: the store's process dies, the device keeps every write the
kernel completed (an ``O_DIRECT`` write that returned is on the device), and the next process opens
the device again.  Two ways:

* in-process: the device is wrapped in a :class:`~retainz.zoned.faulty.FaultyDevice` used only as a
  switch that stops all I/O at a write boundary (optionally landing only the first blocks of the
  cutting write: a torn write).  Dropping the store is then ``close()`` through the dead device: it
  writes nothing (every device call raises :class:`PowerCutError`) and its ``finally`` releases the
  in-process open-store lock (``Store.open`` refuses a second open of the same device path in one
  process).  The device is then reopened through a **new handle** (a new ``LinuxZonedDevice`` /
  ``FileDevice``; the ``MemoryDevice`` is its own medium), so nothing of the old process's state
  (write-pointer cache, open-zone bookkeeping) survives;
* out-of-process: a child process writes a generation and is killed with ``SIGKILL`` in the middle of
  it, or right after its commit record was written and before the flush that acknowledges it.

What cannot be injected on a real device is a **power cut that drops unflushed writes** (or tears a
write the device acknowledged): the kernel and the drive complete what they complete, and nothing
here can un-write it.  The FaultyDevice campaigns (tests/store/test_store_recovery.py,
``retainz.testing.crashtest``) cover those on emulated devices, every write boundary crossed with the
states a cut can leave (each zone keeping any prefix of its unflushed writes).  A ``FileDevice`` records its write pointers at ``flush``, so a killed process
loses its unflushed writes there, like such a power cut; the out-of-process tests expect exactly that
of it.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys

import crc32c
import pytest

from retainz.errors import ForeignDeviceError, PowerCutError, StoreLockedError
from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, ZoneCond
from retainz.zoned.faulty import FaultyDevice
from tests.conftest import DEVICE_KINDS, make_device

#: The emulated devices' geometry: like the guest's devices (16 zones, capacity < size, 3 open / 4
#: active), only smaller.  Real devices bring their own.
GEOMETRY = Geometry(nr_zones=16, zone_size=64 * 1024, zone_capacity=48 * 1024, block_size=4096,
                    max_open=3, max_active=4)
REAL = [k for k in DEVICE_KINDS if k.startswith("linux:")]
#: ``-high``: the same geometry with 3 GiB zones, so the data zones lie past 2^31 and 2^32 bytes.
KINDS = ["memory", "file", "memory-high", "file-high"] + REAL
#: Devices whose contents outlive the process (for the out-of-process crash).
PERSISTENT = ["file", "file-high"] + REAL


class Rig:
    """One device under test: a fresh (all-empty) device, and reopening the same medium."""

    def __init__(self, kind: str, tmp_path):
        self.kind = kind
        self.tmp_path = tmp_path
        self.dev = make_device(kind, tmp_path, GEOMETRY)  # a real device is reset zone by zone
        self.stores: list[Store] = []

    def format(self, dev=None, **kw) -> Store:
        """``Store.format``, remembered so a failing test cannot leave the store open: the
        in-process lock is per device path, and a real device's path is the same in every test."""
        self.stores.append(Store.format(dev or self.dev, **kw))
        return self.stores[-1]

    def open(self, dev=None) -> Store:
        self.stores.append(Store.open(dev or self.dev))
        return self.stores[-1]

    def teardown(self) -> None:
        for s in self.stores:
            try:
                s.close()
            except Exception:  # noqa: BLE001 - a crashed store's close fails; it is released anyway
                pass
        self.release()

    @property
    def g(self) -> Geometry:
        return self.dev.geometry

    def release(self) -> None:
        """Close the device handle (another process may open the device now)."""
        if not self.kind.startswith("memory"):
            self.dev.close()

    def attach(self):
        """A new handle on the same medium: what the next process opens."""
        if self.kind.startswith("file"):
            self.dev = FileDevice(self.tmp_path / "dev.img")
        elif self.kind.startswith("linux:"):
            from retainz.zoned.linux import LinuxZonedDevice

            self.dev = LinuxZonedDevice(self.kind[6:])
        return self.dev

    def reopen(self):
        self.release()
        return self.attach()

    def crash(self, switch: FaultyDevice, store: Store):
        """The store's process dies now: no further I/O reaches the device; the store is dropped
        without writing anything; the device is opened again through a new handle."""
        switch.cut_now()
        with pytest.raises(PowerCutError):
            store.close()            # every device call fails: nothing written, the lock released
        with pytest.raises(ValueError, match="closed"):
            store.begin_generation("after-crash", 0)   # the dropped store is unusable
        return self.reopen()


@pytest.fixture(params=KINDS)
def rig(request, tmp_path):
    r = Rig(request.param, tmp_path)
    yield r
    r.teardown()


def payload(gid: str, shard: str, n: int) -> bytes:
    return random.Random(f"{gid}/{shard}/{n}").randbytes(n)


def chunks(data: bytes):
    """The shard in uneven pieces (the store buffers and cuts them into extents itself)."""
    cuts = sorted({0, len(data) // 3, len(data) // 3 + 1, len(data) // 2, len(data)})
    return [data[a:b] for a, b in zip(cuts, cuts[1:], strict=False)] or [b""]


def shards_for(g: Geometry, gid: str, sizes: dict[str, float | int]) -> dict[str, bytes]:
    """Shards sized from the zone capacity: a float is a fraction of it (plus an odd tail, so
    lengths are not block multiples), an int is a byte count."""
    cap = g.zone_capacity
    out = {}
    for name, size in sizes.items():
        n = int(cap * size) + 1237 if isinstance(size, float) else size
        out[name] = payload(gid, name, n)
    return out


def write_gen(store: Store, gid: str, step: int, shards: dict[str, bytes], *, commit: bool = True,
              more: int = 0):
    """Admit (declaring the shards' bytes plus ``more`` to be written later), write, commit."""
    total = sum(len(d) for d in shards.values()) + more
    w = store.begin_generation(gid, step, hint=Hint(reclaim_step=step + 100), declared_size=total)
    for name, data in shards.items():
        info = w.write_shard(name, chunks(data))
        assert (info.name, info.size) == (name, len(data))
        assert info.crc == crc32c.crc32c(data)
        assert sum(e[2] for e in info.extents) == len(data)
    if commit:
        gen = w.commit()
        assert gen.id == gid and gen.step == step and set(gen.shards) == set(shards)
    return w


def zones_of(store: Store, gid: str) -> dict[int, int]:
    """zone -> data bytes of generation ``gid`` there."""
    out: dict[int, int] = {}
    for s in store.generation(gid).shards.values():
        for z, _off, length, _crc in s.extents:
            out[z] = out.get(z, 0) + length
    return out


def check(store: Store, expect: dict[str, dict[str, bytes]]) -> None:
    """The committed set is exactly ``expect``; every byte reads back and verifies; fsck is clean
    and verified every byte; the zone summaries equal a recomputation; the device agrees."""
    assert sorted(g.id for g in store.generations()) == sorted(expect)
    total = 0
    for gid, shards in expect.items():
        gen = store.generation(gid)
        assert set(gen.shards) == set(shards)
        for name, data in shards.items():
            info = gen.shards[name]
            assert (info.size, info.crc) == (len(data), crc32c.crc32c(data))
            assert b"".join(store.read_shard(gid, name)) == data
            total += len(data)
    rep = store.fsck()
    assert rep.ok, rep.problems
    assert (rep.generations, rep.bytes_verified, rep.unverifiable_bytes) == (len(expect), total, 0)
    assert rep.shards == sum(len(s) for s in expect.values())
    assert store.table.key() == store.recompute_table().key()
    bs = store.device.geometry.block_size
    live = sum(-(-len(d) // bs) * bs for s in expect.values() for d in s.values())
    assert store.table.live == live
    for z in store.table:   # the device's report agrees with the store's summaries
        dz = store.device.zone(z.index)
        assert (dz.cond == ZoneCond.EMPTY) == (z.cond == ZoneCond.EMPTY), (z, dz)
        if z.cond != ZoneCond.FULL:
            assert dz.wp - dz.start == z.written


# -- format -----------------------------------------------------------------------------------------

def test_format_refuses_a_non_empty_device_unless_forced(rig):
    dev = rig.dev
    g = rig.g
    last = g.nr_zones - 1
    dev.write(dev.zone(last).start, payload("foreign", "x", g.block_size))
    before = [(z.cond, z.wp) for z in dev.report_zones()]
    with pytest.raises(ForeignDeviceError, match="does not recognise"):
        Store.format(dev)
    assert [(z.cond, z.wp) for z in dev.report_zones()] == before   # nothing written
    with rig.format(dev, force=True) as s:
        assert s.generations() == [] and dev.zone(last).cond == ZoneCond.EMPTY
        assert s.df().data_zones == g.nr_zones - s.meta_zones
        write_gen(s, "g0", 1, shards_for(g, "g0", {"a": 0.25}))
    with pytest.raises(ForeignDeviceError, match="already holds a RetainZ store"):
        Store.format(dev)
    with rig.open(rig.reopen()) as s:
        assert [x.id for x in s.generations()] == ["g0"]
        with pytest.raises(StoreLockedError):
            Store.open(s.device)
    with rig.format(force=True) as s:
        assert s.generations() == []
        check(s, {})


# -- write, read, delete, GC, reopen ------------------------------------------------------------------

def test_generations_round_trip_delete_gc_and_reopen(rig):
    """Several generations of real payload; deletion resets the zones a generation held alone; GC
    moves the live extents out of zones shared with deleted ones; a clean reopen replays the journal
    to the same committed set; every step is checked against the device."""
    g = rig.g
    expect: dict[str, dict[str, bytes]] = {}
    s = rig.format()
    # "big" fills zones of its own; the small ones (2/3 of a zone each) share zones pairwise
    expect["big"] = shards_for(g, "big", {"model": 2.0, "optim": 0.5, "empty": 0})
    write_gen(s, "big", 10, expect["big"])
    check(s, expect)
    for i in range(5):
        gid = f"s{i}"
        expect[gid] = shards_for(g, gid, {"model": 0.66, "extra": 4096 * (i + 1) + i})
        write_gen(s, gid, 20 + i, expect[gid])
        check(s, expect)
    shared = {z: [gid for gid in expect if z in zones_of(s, gid)] for z in zones_of(s, "s1")}
    assert any(len(v) > 1 for v in shared.values()), shared   # the workload mixes generations in zones

    # delete: the zones "big" held alone are reset (device and summaries), the rest keep dead bytes
    big = zones_of(s, "big")
    alone = sorted(z for z in big if all(z not in zones_of(s, o) for o in expect if o != "big"))
    assert alone, big
    resets = s.metrics.resets
    s.delete("big", step=40)
    del expect["big"]
    assert s.metrics.resets - resets == len(alone)
    for z in alone:
        assert s.device.zone(z).cond == ZoneCond.EMPTY and s.table[z].cond == ZoneCond.EMPTY
    check(s, expect)

    # GC: delete every other small generation; full zones now mix live and dead bytes
    for gid in ("s1", "s3"):
        s.delete(gid, step=41)
        del expect[gid]
    victims = sorted(z.index for z in s.table if z.cond == ZoneCond.FULL and z.dead)
    mixed = [v for v in victims if s.table[v].live]
    assert mixed, [(z.index, z.cond, z.live, z.dead) for z in s.table]
    live_before = {v: s.table[v].live for v in victims}
    dead_elsewhere = s.table.dead - sum(s.table[v].dead for v in victims)
    rep = s.gc(force=True)
    assert sorted(rep.victims) == victims and rep.errors == [] and rep.skipped == []
    assert rep.zones_reset == len(victims) and rep.extents_moved >= len(mixed)
    assert rep.bytes_copied == sum(live_before.values()) == s.metrics.gc_bytes > 0
    for v in victims:
        assert s.device.zone(v).cond == ZoneCond.EMPTY
    check(s, expect)
    assert s.table.dead == dead_elsewhere    # the victims' dead bytes are gone, nothing else changed

    expect["after-gc"] = shards_for(g, "after-gc", {"model": 1.2})
    write_gen(s, "after-gc", 50, expect["after-gc"])
    metrics = s.metrics.to_dict()
    s.close()

    s = rig.open(rig.reopen())   # journal replay on a new handle
    try:
        assert s.recovery.zones_reset == [] and s.recovery.torn_bytes == 0
        assert s.recovery.dead_bytes_found == 0 and s.recovery.records > 0
        check(s, expect)
        assert [(x.id, x.step) for x in s.generations()] == [("s0", 20), ("s2", 22), ("s4", 24),
                                                             ("after-gc", 50)]
        for k in ("host_bytes", "gc_bytes", "resets", "generations_committed", "generations_deleted"):
            assert s.metrics.to_dict()[k] == metrics[k], k
    finally:
        s.close()


# -- process crashes (in-process: a switch that stops all I/O) ------------------------------------------

def _committed_base(rig, **kw) -> tuple[FaultyDevice, Store, dict]:
    """g0 and g1 committed (g1 ends part-way into a zone, so the next generation shares it);
    ``kw``: ``Store.format``'s."""
    switch = FaultyDevice(rig.dev)   # forwards everything until cut
    s = rig.format(switch, **kw)
    expect = {"g0": shards_for(rig.g, "g0", {"model": 1.3}),
              "g1": shards_for(rig.g, "g1", {"model": 0.4, "meta": 300})}
    for i, gid in enumerate(expect):
        write_gen(s, gid, 10 * (i + 1), expect[gid])
    return switch, s, expect


def _after_recovery(rig, expect: dict, uncommitted_zones: set[int]) -> None:
    """Open the store on the new handle: the committed set is exact, space the crashed generation
    held alone was reset, its bytes in shared zones are dead; the store takes a new generation, GC
    reclaims, and a clean reopen keeps it all."""
    s = rig.open()
    try:
        check(s, expect)
        committed = set()
        for gid in expect:
            committed |= set(zones_of(s, gid))
        for z in {z for z in uncommitted_zones if z >= s.meta_zones} - committed:
            assert rig.dev.zone(z).cond == ZoneCond.EMPTY, z           # reset at mount
            assert z in s.recovery.zones_reset
        for z in s.table:                                               # no zone holds only garbage
            assert z.cond == ZoneCond.EMPTY or z.index in committed, (z.index, z.cond, z.written)
        assert s.table.dead == s.recovery.dead_bytes_found
        assert s.table.written == s.table.live + s.table.dead
        expect["post"] = shards_for(rig.g, "post", {"model": 0.9})
        write_gen(s, "post", 100, expect["post"])
        s.delete("g0", step=101)
        del expect["g0"]
        s.gc(force=True)
        check(s, expect)
    finally:
        s.close()
    with rig.open(rig.reopen()) as s:
        assert s.recovery.zones_reset == [] and s.recovery.torn_bytes == 0
        check(s, expect)


def _zones_written_since(dev, before) -> set[int]:
    return {z.index for z, b in zip(dev.report_zones(), before, strict=True) if z.wp != b.wp}


@pytest.mark.parametrize("point", ["between-shards", "mid-shard", "torn-shard"])
def test_process_crash_while_writing_a_generation(rig, point):
    """The process dies while generation g2 is being written: after shard "a" and before "b"
    (between-shards), after the first of b's writes landed whole (mid-shard), or with only the first
    block of that write on the device (torn-shard: a write cut short, as a killed process with a
    large write in flight leaves it).  After reopen: exactly g0 and g1; g2's zones are reset or its
    bytes dead; every committed byte verifies."""
    switch, s, expect = _committed_base(rig)
    before = rig.dev.report_zones()
    b = payload("g2", "b", 2 * rig.g.zone_capacity + 999)   # at least two device writes
    w = write_gen(s, "g2", 30, shards_for(rig.g, "g2", {"a": 1.1}), commit=False, more=len(b))
    if point == "between-shards":
        pass
    else:
        switch.cut_after_writes = switch.writes + 1
        switch.torn_blocks = None if point == "mid-shard" else 1
        with pytest.raises(PowerCutError) as ei:
            w.write_shard("b", chunks(b))
        if point == "torn-shard":
            bs = rig.g.block_size
            landed = re.search(r"(\d+) of (\d+) bytes landed", str(ei.value))
            assert landed and int(landed[1]) == bs < int(landed[2])
    touched = _zones_written_since(rig.dev, before)
    assert touched
    rig.crash(switch, s)
    _after_recovery(rig, expect, touched)


@pytest.mark.parametrize("point", ["record-not-written", "record-torn", "copy-0-written", "record-written"])
def test_process_crash_during_a_commit(rig, point):
    """The process dies in g2's commit: before its commit record reached the device, with only the
    record's first block written (a two-block record: many long shard names), after the record's
    first copy was written (format 5 writes two, one write each) but not its second, or after both
    were written but before the flush that acknowledges the commit.  A generation is committed
    iff its commit record (a copy of it) is on the device: absent, absent, present, present."""
    # 4 meta zones: store format 5 keeps room for the next record's two copies beside the snapshot,
    # so a 2-block commit record no longer passes the journal admission of 3 meta zones of 12 blocks
    switch, s, expect = _committed_base(rig, meta_zones=4)
    bs = rig.g.block_size
    if s.journal.room() < 16 * bs:
        s.journal.roll()      # room for the record, so that it is the commit's first write (no rollover first)
    before = rig.dev.report_zones()
    names = {f"{i:02d}-" + "n" * 200: 1000 + 37 * i for i in range(24)} if point == "record-torn" else {}
    g2 = shards_for(rig.g, "g2", {"a": 0.7, **names})
    w = write_gen(s, "g2", 30, g2, commit=False)
    # the commit record's copy 0 is the commit's first write, its copy 1 the second
    switch.cut_after_writes = switch.writes + (2 if point == "record-written" else 1)
    switch.torn_blocks = {"record-not-written": 0, "record-torn": 1, "copy-0-written": None,
                          "record-written": None}[point]
    with pytest.raises(PowerCutError) as ei:
        w.commit()
    if point == "record-torn":
        landed = re.search(r"(\d+) of (\d+) bytes landed", str(ei.value))
        assert landed and int(landed[1]) == bs < int(landed[2])
    elif point == "copy-0-written":
        assert "write not executed" in str(ei.value)       # copy 0 landed; copy 1's write did not run
    elif point == "record-written":
        assert "flush" in str(ei.value)                   # the record landed; its flush did not run
    touched = _zones_written_since(rig.dev, before)
    rig.crash(switch, s)
    if point in ("copy-0-written", "record-written"):
        expect["g2"] = g2
    _after_recovery(rig, expect, touched)


# -- process crashes (out-of-process: SIGKILL) -----------------------------------------------------------

_CHILD = r"""
import os, random, signal, sys
from retainz.hint import Hint
from retainz.store import Store

kind, path, point, cap = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if kind == "file":
    from retainz.zoned import FileDevice
    dev = FileDevice(path)
else:
    from retainz.zoned.linux import LinuxZonedDevice
    dev = LinuxZonedDevice(path)
store = Store.open(dev)
def payload(gid, shard, n):
    return random.Random(f"{gid}/{shard}/{n}").randbytes(n)
def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
w = store.begin_generation("g2", 30, hint=Hint(reclaim_step=130))
w.write_shard("a", [payload("g2", "a", cap + 1237)])
print("shard a written", flush=True)
if point == "mid-generation":
    def b():
        yield payload("g2", "b", cap // 2)
        die()
    w.write_shard("b", b())
else:
    real_write = dev.write
    def write(offset, data):
        real_write(offset, data)
        print("commit record written", flush=True)
        die()                       # before the flush that would acknowledge the commit
    dev.write = write
    w.commit()
print("not killed", flush=True)
"""


@pytest.fixture(params=PERSISTENT)
def persistent_rig(request, tmp_path):
    r = Rig(request.param, tmp_path)
    yield r
    r.teardown()


@pytest.mark.parametrize("point", ["mid-generation", "mid-commit"])
def test_killed_process_leaves_the_committed_set_exact(persistent_rig, point):
    """A child process opens the store, writes g2 and is killed with SIGKILL: while streaming its
    second shard (mid-generation), or right after its commit record was written and before the
    flush (mid-commit).  The killed process never closes anything.  A real device keeps the record
    (the write completed in the kernel): g2 is committed.  A FileDevice records write pointers at
    flush only, so the record is lost with the process: g2 is absent (see the module docstring)."""
    rig = persistent_rig
    switch, s, expect = _committed_base(rig)
    s.close()
    before = rig.dev.report_zones()
    file = rig.kind.startswith("file")
    path = rig.tmp_path / "dev.img" if file else rig.kind[6:]
    rig.release()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.run([sys.executable, "-c", _CHILD, "file" if file else "linux",
                            str(path), point, str(rig.g.zone_capacity)], capture_output=True, text=True,
                           timeout=120, cwd=root)
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stdout, child.stderr)
    assert "shard a written" in child.stdout and "not killed" not in child.stdout
    if point == "mid-commit":
        assert "commit record written" in child.stdout
    rig.attach()
    touched = _zones_written_since(rig.dev, before)
    assert touched or file
    if point == "mid-commit" and not file:
        expect["g2"] = {"a": payload("g2", "a", rig.g.zone_capacity + 1237)}
    _after_recovery(rig, expect, touched)
