"""An I/O error on any device operation leaves the open store consistent: after each injected fault
(every operation class, at every one of its first calls in a workload of commits, aborts, deletions
and GC) the failed call raises or is absorbed, fsck is clean, the cached zone summaries equal a
recomputation, the store keeps working once the device does, and a reopen shows every acknowledged
generation byte-exact."""

from __future__ import annotations

import random

import pytest

from retainz.errors import InjectedIOError, ZonedDeviceError
from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice, ZoneCond
from retainz.zoned.faulty import FaultyDevice

KiB = 1024
GEOM = Geometry(nr_zones=12, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)
CALLS = 40          # a fault at each of an operation's first CALLS calls
#: The device operations the store issues (it never opens, closes or appends explicitly).
OPS = ("write", "read", "flush", "finish", "reset", "report")


def data(i: int) -> bytes:
    return random.Random(i).randbytes(9000 + 997 * i)


def workload(s: Store) -> tuple[dict[str, bytes], set[str], list[str]]:
    """Commits, reads, deletions and forced GC; a call that raises is noted and the workload goes on.
    Returns (acknowledged generations, generations whose deletion raised, errors)."""
    acked: dict[str, bytes] = {}
    unsure: set[str] = set()
    errors: list[str] = []
    live: list[str] = []
    for i in range(14):
        gid = f"g{i}"
        w = None
        try:
            w = s.begin_generation(gid, 10 * i, hint=Hint(reclaim_step=10 * i + 30))
            w.write_shard("a", [data(i)[:5000], data(i)[5000:]])
            w.commit()
            acked[gid] = data(i)
            live.append(gid)
        except ZonedDeviceError as e:
            errors.append(f"commit {gid}: {e}")
            if w is not None and w.state.value == "writing":
                w.abort()
            unsure.add(gid)            # a failed flush of the commit record: durable or not
        while len(live) > 3:
            g = live.pop(0)
            try:
                s.delete(g, step=10 * i + 5)
                del acked[g]
            except ZonedDeviceError as e:
                errors.append(f"delete {g}: {e}")
                unsure.add(g)
                del acked[g]
        if live:
            # a read of what is live (GC's copies read too, but whether GC has live bytes to copy
            # depends on the policy's placement)
            try:
                assert b"".join(s.read_shard(live[0], "a")) == acked[live[0]]
            except ZonedDeviceError as e:
                errors.append(f"read {live[0]}: {e}")
        if i % 3 == 2:
            try:
                s.gc(force=True)
            except ZonedDeviceError as e:
                errors.append(f"gc: {e}")
    return acked, unsure, errors


def check(s: Store) -> None:
    rep = s.fsck()
    assert rep.ok, rep.problems[:3]
    assert s.table.key() == s.recompute_table().key()


@pytest.mark.parametrize("op", OPS)
def test_one_fault_on_any_operation_leaves_the_open_store_consistent(op):
    fired = 0
    for policy, after in [(p, a) for p in ("retainz", "dedicated") for a in range(CALLS)]:
        dev = FaultyDevice(MemoryDevice(GEOM))
        s = Store.format(dev, policy=policy)   # dedicated finishes zones; retainz shares them
        fault = dev.fail(op, after=after)
        acked, unsure, _ = workload(s)
        fired += fault.seen > after
        dev.faults.clear()
        check(s)
        w = s.begin_generation("after", 10_000)                # the store still works
        w.write_shard("a", [b"z" * 7000])
        w.commit()
        acked["after"] = b"z" * 7000
        check(s)
        s.close()
        with Store.open(dev) as back:
            got = {g.id for g in back.generations()}
            assert set(acked) <= got <= set(acked) | unsure, (op, policy, after, sorted(got), sorted(acked))
            for gid, want in acked.items():
                assert b"".join(back.read_shard(gid, "a")) == want
            check(back)
    assert fired > 0, f"no {op} fault fired: the workload does not exercise it"


def test_a_reset_failing_after_a_journaled_deletion_leaves_dead_bytes_not_live_ones():
    """The reported case: the deletion is durable, its reset fails; the zone keeps its bytes as dead
    (counted, reconciled) and a later GC or mount resets it."""
    dev = FaultyDevice(MemoryDevice(GEOM))
    with Store.format(dev) as s:
        w = s.begin_generation("g", 1)
        w.write_shard("a", [b"x" * (48 * KiB)])              # one whole zone
        w.commit()
        z = s.generation("g").shards["a"].extents[0][0]
        dev.fail("reset", count=2)                           # the batch, then the zone's own retry
        s.delete("g", step=2)
        assert s.generations() == [] and s.table[z].live == 0 and s.table[z].dead == 48 * KiB
        assert s.zones.failed_resets == 1
        check(s)
        s.gc(force=True)
        assert s.table[z].written == 0
        check(s)


class DoneThenFails(FaultyDevice):
    """A device whose armed faults fire after the drive carried the operation out (a command that
    completed but reported an error, e.g. a timeout): the zone's state has changed all the same."""

    def zone_op(self, op, zone):
        try:
            super().zone_op(op, zone)
        except InjectedIOError:
            self.inner.zone_op(op, zone)
            raise

    def write(self, offset, data):
        try:
            super().write(offset, data)
        except InjectedIOError:
            self.inner.write(offset, data)
            raise


def test_a_reset_the_device_carried_out_before_failing_leaves_the_zone_empty_in_the_table(caplog):
    """An aborted generation's zone is reset; the device does it but reports an error: the failure is
    counted and logged, and the zone table follows the device (empty), not the failed call."""
    dev = DoneThenFails(MemoryDevice(GEOM))
    with Store.format(dev) as s:
        zones = []
        for i in range(2):
            w = s.begin_generation(f"aborted{i}", i)
            w.write_shard("a", [data(i)])                    # 9-10 KiB: one zone, part-filled
            zones.append(w.gen.shards["a"].extents[0][0])
            dev.fail("reset", zone=zones[-1])
            with caplog.at_level("WARNING", logger="retainz.store.zonebook"):
                w.abort()
        assert s.zones.failed_resets == 2
        assert [r.getMessage() for r in caplog.records if r.name == "retainz.store.zonebook"] == [
            f"zone {z}: reset failed (injected I/O error on reset (zone {z})); it keeps its dead bytes "
            "until a later reset" for z in zones]
        for z in zones:
            assert dev.zone(z).cond == ZoneCond.EMPTY
            assert (s.table[z].cond, s.table[z].written, s.table[z].dead) == (ZoneCond.EMPTY, 0, 0)
        assert s.table.written == s.table.dead == 0
        check(s)
        w = s.begin_generation("next", 5)                    # the next record journals the zones
        w.write_shard("a", [data(5)])
        w.commit()
        check(s)
    with Store.open(dev) as back:
        assert back.recovery.zones_reset == [] and back.table.written == s.table.written
        assert b"".join(back.read_shard("next", "a")) == data(5)
        check(back)


def summary(s: Store, z: int) -> tuple:
    t = s.table[z]
    return t.cond, t.written, t.live, t.dead, t.lifetime, t.opened_step, t.last_write_step


def test_a_write_refused_before_any_byte_landed_leaves_the_zone_as_it_was():
    dev = FaultyDevice(MemoryDevice(GEOM))
    with Store.format(dev) as s:
        empty = s.table.n_empty
        w = s.begin_generation("g", 3)
        dev.fail("write")
        with pytest.raises(ZonedDeviceError, match=r"^injected I/O error on write \(zone \d+\)$"):
            w.write_shard("a", [data(0)])
        assert s.table.n_empty == empty and not s.table.open and s.table.written == 0
        w.write_shard("a", [b"a" * 5000])                          # 2 blocks
        w.commit()
        z = s.generation("g").shards["a"].extents[0][0]
        before = summary(s, z)
        assert before == (ZoneCond.IMP_OPEN, 8192, 8192, 0, 0, 3, 3)
        w = s.begin_generation("h", 7)
        dev.fail("write")
        with pytest.raises(ZonedDeviceError, match=rf"^injected I/O error on write \(zone {z}\)$"):
            w.write_shard("a", [data(1)])
        assert summary(s, z) == before                             # not even its last write step
        w.abort()
        check(s)


def test_a_write_the_device_carried_out_before_failing_counts_its_bytes_dead():
    """The bytes landed (the device's write pointer moved) but the write reported an error: the zone
    table counts them written and dead, at the write's step (a zone they open has no lifetime), and
    the zone goes on from the device's write pointer; a reopen agrees."""
    dev = DoneThenFails(MemoryDevice(GEOM))
    with Store.format(dev) as s:
        w = s.begin_generation("g0", 3)
        dev.fail("write")
        with pytest.raises(ZonedDeviceError):
            w.write_shard("a", [b"a" * 5000])                      # 2 blocks land, then the error
        z = next(z.index for z in s.table if z.written)
        assert summary(s, z) == (ZoneCond.IMP_OPEN, 8192, 0, 8192, 0, 3, 3)
        assert s.table[z].open_seq == 1 and list(s.table.open) == [z]
        w.write_shard("a", [b"a" * 5000])
        assert w.gen.shards["a"].extents[0][:2] == (z, 8192)
        w.commit()
        assert summary(s, z) == (ZoneCond.IMP_OPEN, 16384, 8192, 8192, 0, 3, 3)
        w = s.begin_generation("g1", 7)
        dev.fail("write")
        with pytest.raises(ZonedDeviceError):
            w.write_shard("a", [b"b" * 10000])                     # 3 blocks land, then the error
        assert dev.zone(z).wp - dev.zone(z).start == 28672
        assert summary(s, z) == (ZoneCond.IMP_OPEN, 28672, 8192, 20480, 0, 3, 7)
        assert s.table.dead == 20480 and s.table.live == 8192
        check(s)
        w.write_shard("a", [b"c" * 4096])                          # the store goes on after them
        assert w.gen.shards["a"].extents[0][:2] == (z, 28672)
        w.commit()
        check(s)
    with Store.open(dev) as back:
        assert summary(back, z)[:4] == (ZoneCond.IMP_OPEN, 32768, 12288, 20480)
        assert b"".join(back.read_shard("g1", "a")) == b"c" * 4096
        check(back)


def test_a_finish_the_device_carried_out_before_failing_leaves_the_zone_full():
    """``dedicated`` finishes its oldest zone to open a new one; the device finishes it and reports
    an error: the zone is full in the table (its rest counted written and dead, as recovery counts a
    full zone whose finish was never journaled), no finish is counted, and the generation fails."""
    dev = DoneThenFails(MemoryDevice(GEOM))
    with Store.format(dev, policy="dedicated") as s:
        for i in range(s.zones.max_active):
            w = s.begin_generation(f"g{i}", i)
            w.write_shard("a", [b"x" * 8192])
            w.commit()
        oldest = s.generation("g0").shards["a"].extents[0][0]
        dev.fail("finish")
        w = s.begin_generation("late", 9)
        with pytest.raises(ZonedDeviceError, match=rf"^injected I/O error on finish \(zone {oldest}\)$"):
            w.write_shard("a", [b"y" * 8192])
        assert dev.zone(oldest).cond == ZoneCond.FULL
        cap = GEOM.zone_capacity
        assert summary(s, oldest)[:4] == (ZoneCond.FULL, cap, 8192, cap - 8192)
        assert s.metrics.finishes == 0 and s.metrics.unused_capacity_bytes == 0 == s.table.unused
        w.abort()
        check(s)
    with Store.open(dev) as back:
        assert summary(back, oldest)[:4] == (ZoneCond.FULL, cap, 8192, cap - 8192)
        check(back)


def test_a_report_failing_while_reconciling_is_logged_and_the_table_kept(caplog):
    dev = FaultyDevice(MemoryDevice(GEOM))
    with Store.format(dev) as s:
        w = s.begin_generation("g", 1)
        w.write_shard("a", [b"a" * 5000])
        z = w.gen.shards["a"].extents[0][0]
        before = summary(s, z)
        dev.fail("write")
        dev.fail("report")
        with caplog.at_level("WARNING", logger="retainz.store.zonebook"):
            with pytest.raises(ZonedDeviceError, match=rf"^injected I/O error on write \(zone {z}\)$"):
                w.write_shard("b", [b"b" * 5000])
        assert [r.getMessage() for r in caplog.records if r.name == "retainz.store.zonebook"] == [
            f"zone {z}: report failed while reconciling (injected I/O error on report)"]
        assert summary(s, z) == before
        w.commit()
        check(s)
