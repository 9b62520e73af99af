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
from retainz.testing import FaultyDevice
from retainz.zoned import Geometry, MemoryDevice, ZoneCond

KiB = 1024
GEOM = Geometry(nr_zones=12, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)
CALLS = 40          # a fault at each of an operation's first CALLS calls
#: The device operations the store issues (it never opens, closes or appends explicitly).
OPS = ("write", "read", "flush", "finish", "reset", "report")


def data(i: int) -> bytes:
    return random.Random(i).randbytes(9000 + 997 * i)


def workload(s: Store) -> tuple[dict[str, bytes], set[str], list[str]]:
    """Commits, deletions and forced GC; a call that raises is noted and the workload goes on.
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
