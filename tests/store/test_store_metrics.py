"""Store metrics with exact values on tiny scripted workloads: unused capacity of finished zones and
of zones reset while part-empty."""

from __future__ import annotations

from dataclasses import dataclass

from retainz.errors import PowerCutError
from retainz.placement import Decision
from retainz.placement.greedy import Greedy
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice, ZoneCond
from retainz.zoned.faulty import FaultyDevice

KiB = 1024
GEOM = Geometry(nr_zones=16, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=6,
                max_active=6)


@dataclass
class Scripted(Greedy):
    """Greedy; a generation whose id starts with ``f`` finishes every open zone and opens one."""

    name = "test-scripted"

    def place(self, req):
        t = self.table
        if req.generation.startswith("f") and t.open:
            return Decision(t.first_empty(), finish=tuple(t.open))
        return super().place(req)


def put(s, gid, step, n):
    w = s.begin_generation(gid, step)
    w.write_counted_shard("s", n)
    w.commit()


def use(s):
    a = Scripted()
    s.use_allocator(a)


def test_unused_capacity_counts_finished_and_part_empty_zones_exactly():
    dev = MemoryDevice(GEOM, payload=False)
    s = Store.format(dev)
    use(s)
    m = s.metrics
    put(s, "g1", 10, 20 * KiB)              # zone 3 opened at step 10: 20 of 48 KiB
    put(s, "f2", 20, 8 * KiB)               # finishes zone 3 (28 KiB unused from step 20), zone 4
    assert s.table[3].cond == ZoneCond.FULL and s.table[4].last_write_step == 20
    assert (m.unused_capacity_bytes, m.unused_capacity_byte_steps) == (28 * KiB, 0)
    s.delete("g1", step=50)                 # zone 3 (finished) reset: 28 KiB x 30 steps
    assert s.table[3].cond == ZoneCond.EMPTY
    assert (m.unused_capacity_bytes, m.unused_capacity_byte_steps) == (28 * KiB, 28 * KiB * 30)
    s.delete("f2", step=60)                 # zone 4 reset part-empty: 40 KiB x (60 - 20)
    assert (m.unused_capacity_bytes, m.unused_capacity_byte_steps) == (
        68 * KiB, 28 * KiB * 30 + 40 * KiB * 40)
    put(s, "g3", 70, 8 * KiB)               # zone 3 again
    put(s, "g4", 80, 8 * KiB)               # its last write is now at step 80
    assert s.table[3].last_write_step == 80 and s.table[3].opened_step == 70
    s.close()
    s = Store.open(dev)                     # the last write step is journaled
    use(s)
    m = s.metrics
    assert s.table[3].last_write_step == 80 and s.table.key() == s.recompute_table().key()
    s.delete("g3", step=90)                 # live data left: no reset
    assert m.unused_capacity_bytes == 68 * KiB
    s.delete("g4", step=100)                # reset part-empty: 32 KiB x (100 - 80)
    assert s.table[3].cond == ZoneCond.EMPTY
    assert (m.unused_capacity_bytes, m.unused_capacity_byte_steps) == (
        100 * KiB, 28 * KiB * 30 + 40 * KiB * 40 + 32 * KiB * 20)
    assert m.resets == 3 and m.finishes == 1
    s.close()


def test_a_full_zone_reset_has_no_unused_capacity():
    with Store.format(MemoryDevice(GEOM, payload=False)) as s:
        put(s, "g", 5, 48 * KiB)            # exactly one zone, full by writes
        s.delete("g", step=100)
        assert s.metrics.resets == 1
        assert (s.metrics.unused_capacity_bytes, s.metrics.unused_capacity_byte_steps) == (0, 0)


def crash(s, dev):
    dev.cut_now()
    try:
        s.close()
    except PowerCutError:
        pass
    dev.reboot()
    return Store.open(dev)


def test_a_zone_reset_at_recovery_is_charged_from_its_journaled_last_write():
    dev = FaultyDevice(MemoryDevice(GEOM, payload=False))
    s = Store.format(dev)
    put(s, "a", 10, 8 * KiB)                 # zone 3: 8 KiB
    w = s.begin_generation("b", 30)
    w.write_counted_shard("s", 8 * KiB)         # uncommitted: zone 3 at 16 KiB, last write step 30
    s.delete("a", step=50)                   # zone 3 keeps b's bytes; the record journals it
    s = crash(s, dev)                        # metrics resume from the format's snapshot (0)
    assert s.recovery.zones_reset == [3]
    assert (s.metrics.unused_capacity_bytes, s.metrics.unused_capacity_byte_steps) == (
        32 * KiB, 32 * KiB * (50 - 30))
    s.close()


def test_a_zone_reset_at_recovery_written_after_the_last_record_is_charged_no_steps():
    dev = FaultyDevice(MemoryDevice(GEOM, payload=False))
    s = Store.format(dev)
    put(s, "a", 10, 8 * KiB)                 # zone 3: 8 KiB (journaled now = 10)
    w = s.begin_generation("b", 30)
    w.write_counted_shard("s", 48 * KiB)        # zone 3 full, zone 4 at 8 KiB: never journaled
    dev.flush()
    s = crash(s, dev)
    assert s.recovery.zones_reset == [4] and s.table[3].cond == ZoneCond.FULL
    assert (s.metrics.unused_capacity_bytes, s.metrics.unused_capacity_byte_steps) == (40 * KiB, 0)
    s.close()
