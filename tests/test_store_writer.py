"""The write path (``store/writer.py``) as a caller sees it: counted shards (payload-less devices)
fill zones at their write pointers and give every byte back when aborted; every placement decision
is counted with its CPU time, also the one retried after a GC pass; a counted shard's refusals say
what is wrong."""

from __future__ import annotations

from time import thread_time

import pytest

from retainz.errors import NoSpaceError
from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice, ZoneCond

KiB = 1024
CAP = 48 * KiB
GEOM = Geometry(nr_zones=40, zone_size=64 * KiB, zone_capacity=CAP, block_size=4096, max_open=14, max_active=14)
POLICIES = ["greedy", "retainz", "zenfs"]


def counting_places(s: Store) -> list:
    """Wrap the store's policy so every ``place`` call is recorded (the requests)."""
    calls: list = []
    alloc = s.write_path.allocator
    place = alloc.place

    def counted(req):
        calls.append(req)
        return place(req)

    alloc.place = counted
    return calls


def zone_written(s: Store) -> dict[int, int]:
    return {z.index: z.written for z in s.table if z.written}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_counted_shard_fills_zones_at_their_write_pointers_and_an_abort_gives_every_byte_back(policy):
    with Store.format(MemoryDevice(GEOM, payload=False), policy=policy) as s:
        w0 = s.begin_generation("first", 1, hint=Hint(reclaim_step=500))
        w0.write_counted_shard("a", 10 * KiB + 5)        # a partly used zone before the next shard
        w0.commit()
        before = zone_written(s)
        live = s.table.live
        calls = counting_places(s)
        w = s.begin_generation("g", 2, hint=Hint(reclaim_step=50))
        size = 2 * CAP + 7000 + 3                          # spans at least three zones
        info = w.write_counted_shard("b", size)
        ext = info.extents
        assert info.crc is None and all(e[3] is None for e in ext)
        assert sum(e[2] for e in ext) == size
        for z, off, length, _ in ext[:-1]:                 # every extent but the last fills its zone
            assert off == before.get(z, 0) and off + length == CAP
        z, off, length, _ = ext[-1]
        assert off == before.get(z, 0) and length == size - sum(e[2] for e in ext[:-1])
        padded = -(-size // 4096) * 4096
        after = zone_written(s)
        grown = {z: after[z] - before.get(z, 0) for z in after if after[z] != before.get(z, 0)}
        assert grown == {e[0]: min(CAP - e[1], padded - sum(x[2] for x in ext[:i]))
                         for i, e in enumerate(ext)}
        assert sum(grown.values()) == padded and s.table.live == live + padded
        assert all(s.table[e[0]].reclaim_step == 50 for e in ext[1:])   # zones it opened take its step
        assert len(calls) == len(ext) and s.metrics.decisions >= len(ext)
        dead = s.table.dead
        w.abort()                                          # its zones alone are reset, shared ones keep dead bytes
        assert s.table.live == live and s.table.dead == dead + sum(grown[z] for z in grown if z in before)
        assert zone_written(s) == {z: after[z] for z in after if z in before}
        assert all(s.table[e[0]].cond is ZoneCond.EMPTY for e in ext if e[0] not in before)
        assert s.fsck().ok and s.table.key() == s.recompute_table().key()


@pytest.mark.parametrize("policy", POLICIES)
def test_every_placement_decision_is_counted_with_its_cpu_time_also_after_a_gc_pass(policy):
    start = thread_time()
    with Store.format(MemoryDevice(GEOM), policy=policy, gc_reserve_zones=1) as s:
        calls = counting_places(s)
        for i in range(6):
            w = s.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=100 + i))
            w.write_shard("s", [bytes([i]) * 40 * KiB])
            w.commit()
        for i in range(0, 6, 2):
            s.delete(f"g{i}", step=10)
        cpu = s.metrics.decision_cpu_seconds
        assert 0 <= cpu <= thread_time() - start
        retried = []
        decide = s.write_path._decide
        s.write_path._decide = lambda req: retried.append(req) or decide(req)
        for i in range(6, 200):                      # until the store is full
            w = s.begin_generation(f"g{i}", 10 + i, hint=Hint(reclaim_step=1000 + i))
            try:
                w.write_shard("s", [bytes([i]) * 40 * KiB])
                w.commit()
            except NoSpaceError:
                w.abort()
                break
            if i % 3:
                s.delete(f"g{i}", step=10 + i)
        # ZenFS has no admission: a write that finds no zone runs a GC pass and asks once more
        assert bool(retried) == (policy == "zenfs")
        assert s.metrics.decisions == len(calls) > 6
        assert cpu <= s.metrics.decision_cpu_seconds <= thread_time() - start


def test_a_counted_shard_is_refused_with_the_reason():
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 1)
        with pytest.raises(ValueError, match=r"^shard 's': a counted shard \(size without bytes\) needs a "
                                             r"payload-less device; this device keeps payload$"):
            w.write_counted_shard("s", 100)
    with Store.format(MemoryDevice(GEOM, payload=False)) as s:
        w = s.begin_generation("g", 1)
        with pytest.raises(ValueError, match=r"^shard 's': a counted shard needs its size$"):
            w.write_counted_shard("s", None)
        for bad in (-1, 2.5):
            with pytest.raises(ValueError, match=r"^shard 's': size must be a non-negative int, not "):
                w.write_counted_shard("s", bad)
        w.write_counted_shard("s", 0)
        assert w.commit().shards["s"].size == 0


@pytest.mark.parametrize("policy", ["greedy", "retainz"])
def test_counted_shards_use_up_their_generations_admission_reserve(policy):
    """A declared generation reserves its size at admission; the counted shards it writes turn the
    reserve into written bytes, so what others can be admitted does not change until it is used."""
    with Store.format(MemoryDevice(GEOM, payload=False), policy=policy) as s:
        free = s.df().admissible
        w = s.begin_generation("g", 1, declared_size=100 * KiB, hint=Hint(reclaim_step=9))
        assert w.reserve == 100 * KiB and s.df().admissible == free - 100 * KiB
        w.write_counted_shard("a", 30 * KiB)            # 32 KiB on the device (block-rounded)
        assert w.reserve == 68 * KiB and s.df().admissible == free - 100 * KiB
        w.write_counted_shard("b", 10 * KiB - 1)        # 12 KiB
        assert w.reserve == 56 * KiB and s.df().admissible == free - 100 * KiB
        w.write_counted_shard("c", 56 * KiB)
        assert w.reserve == 0
        w.commit()
