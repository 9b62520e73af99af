"""The write path (``store/writer.py``) as a caller sees it: counted shards (payload-less devices)
fill zones at their write pointers and give every byte back when aborted; every placement decision
is counted with its CPU time, also the one retried after a GC pass; a counted shard's refusals say
what is wrong."""

from __future__ import annotations

import re
from time import thread_time

import pytest

from retainz.errors import NoSpaceError, ShardSizeError
from retainz.hint import Hint
from retainz.placement.base import Decision
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


def misbehave(s: Store, decide) -> None:
    """Make the store's policy answer ``decide(request, honest decision)`` instead."""
    alloc = s.write_path.allocator
    place = alloc.place
    alloc.place = lambda req: decide(req, place(req))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_decision_that_breaks_the_contract_is_refused_and_nothing_is_written(policy):
    """The write path checks every decision (finish only open data zones; write only into a data
    zone with room; open a zone only within the active-zone budget) before executing any of it."""
    cases = {
        "finish an empty zone": (lambda s, d: Decision(d.zone, finish=(empty(s),)),
                                 r"asked to finish zone {e}, which is not an open data zone"),
        "a full zone": (lambda s, d: Decision(full(s)), r"chose zone {f}, which is not a data zone with room"),
        "a meta zone": (lambda s, d: Decision(0), r"chose zone 0, which is not a data zone with room"),
        "past the last zone": (lambda s, d: Decision(GEOM.nr_zones), rf"chose zone {GEOM.nr_zones}, which is not "),
        "beyond the budget": (lambda s, d: Decision(empty(s)), r"opened zone {e} beyond the active-zone budget {b}$"),
    }
    for what, (bad, message) in cases.items():
        with Store.format(MemoryDevice(GEOM), policy=policy) as s:
            w = s.begin_generation("full", 1, hint=Hint(reclaim_step=5))
            w.write_shard("s", [b"f" * CAP])                # one full zone
            w.commit()
            budget = s.write_path.zones.max_active            # the data zones' share of max_active
            assert 0 < budget < GEOM.max_active
            if what == "beyond the budget":                 # exactly every active zone in use
                for _ in range(budget - len(s.table.open)):
                    s.write_path.zones.table.on_write(empty(s), 4096, reclaim_step=None, lifetime=0, step=1)
            e_zone, f_zone = empty(s), full(s)
            key, decisions = s.table.key(), s.metrics.decisions
            misbehave(s, lambda req, d, bad=bad, s=s: bad(s, d))
            w = s.begin_generation("g", 2)
            with pytest.raises(ValueError) as err:
                w.write_shard("s", [b"x" * 5000])
            w.abort()
            assert str(err.value).startswith(f"allocator {s.allocator.name} "), what
            assert re.search(message.format(e=e_zone, f=f_zone, b=budget), str(err.value)), (what, str(err.value))
            assert s.metrics.decisions > decisions
            if what == "beyond the budget":
                assert len(s.table.open) == budget
            else:
                assert s.table.key() == key                 # nothing finished, nothing written


def empty(s: Store) -> int:
    return next(z.index for z in s.table if z.cond is ZoneCond.EMPTY)


def full(s: Store) -> int:
    return next(z.index for z in s.table if z.cond is ZoneCond.FULL)


def test_a_write_no_zone_can_take_names_the_bytes_and_the_free_space():
    """ZenFS (no admission) fills the device; the refusal names the request, the free bytes and
    whether a GC pass freed anything first."""
    with Store.format(MemoryDevice(GEOM), policy="zenfs") as s:
        with pytest.raises(NoSpaceError) as e:
            for i in range(100):
                w = s.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=1000 + i))
                w.write_shard("s", [b"x" * 40 * KiB])
                w.commit()
        err = e.value
        w.abort()
        assert err.cause == "allocation"                   # no dead bytes: nothing for GC to free
        m = re.fullmatch(r"no zone can take (\d+) bytes of generation 'g\d+' \((\d+) bytes free in zones\)", str(err))
        assert m and err.needed == int(m[1]) > 0 and err.available == int(m[2])
        assert err.available == s.write_path.zones.free()
    with Store.format(MemoryDevice(GEOM), policy="zenfs") as s:
        passes = []
        collect = s.write_path.collector.collect
        s.write_path.collector.collect = lambda **kw: passes.append(collect(**kw)) or passes[-1]
        with pytest.raises(NoSpaceError) as e:
            for i in range(200):
                w = s.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=1000 + i))
                w.write_shard("s", [b"x" * 40 * KiB])
                w.commit()
                if i % 4 == 1:
                    s.delete(f"g{i - 1}", step=i)          # dead bytes GC can free, never enough
        w.abort()
        rep = passes[-1]                                # the forced pass the refused write ran
        assert e.value.cause == ("gc" if rep.zones_reset or rep.bytes_copied else "allocation")
        assert e.value.needed > 0 and e.value.available == s.write_path.zones.free()


@pytest.mark.parametrize("fail", [False, True])
def test_a_pushed_shard_used_as_a_context_manager_closes_or_aborts(fail):
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 1)
        try:
            with w.open_shard("s") as sh:
                sh.write(b"abc" * 1000)
                if fail:
                    raise RuntimeError("caller failed")
        except RuntimeError:
            pass
        if fail:
            assert "s" not in w.gen.shards and s.table.live == 0
            w.write_shard("s", [b"again"])              # the name is free again
        w.commit()
        assert b"".join(s.read_shard("g", "s")) == (b"again" if fail else b"abc" * 1000)
        h = s.begin_generation("h", 2)
        with h.open_shard("t") as sh:
            sh.write(b"x")
            sh.close()                                  # closed inside: the exit does nothing more
        assert h.commit().shards["t"].size == 1



MiB = 1 << 20
BIG = Geometry(nr_zones=32, zone_size=4 * MiB, zone_capacity=4 * MiB, block_size=4096, max_open=8, max_active=8)


def test_decision_cpu_time_is_the_time_spent_in_each_place_call(monkeypatch):
    """With a clock that advances one second per reading, every decision (also the one retried
    after a GC pass) adds exactly one second."""
    import retainz.store.writer as writer

    ticks = iter(range(10**9))
    monkeypatch.setattr(writer, "thread_time", lambda: float(next(ticks)))
    with Store.format(MemoryDevice(GEOM), policy="zenfs") as s:
        calls = counting_places(s)
        answers = []
        place = s.write_path.allocator.place
        s.write_path.allocator.place = lambda req: answers.append(place(req)) or answers[-1]
        retried = []
        decide = s.write_path._decide
        s.write_path._decide = lambda req: retried.append(req) or decide(req)
        for i in range(200):
            w = s.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=1000 + i))
            try:
                w.write_shard("s", [bytes([i % 256]) * 40 * KiB])
                w.commit()
            except NoSpaceError:
                w.abort()
                break
            if i % 3:
                s.delete(f"g{i}", step=i)
            assert s.metrics.decision_cpu_seconds == s.metrics.decisions == len(calls)
        assert retried
        assert s.metrics.decision_cpu_seconds == s.metrics.decisions == len(calls)
        # a GC pass and a second decision follow only a user write's decision that found no zone
        assert len(retried) <= sum(1 for req, d in zip(calls, answers, strict=True) if d.zone is None and not req.gc)


def test_zenfs_asks_once_per_zone_a_pushed_shard_spans_not_once_per_buffer():
    """ZenFS allocates a file a new zone only on its first write and when its zone is full
    (``ZoneFile::AllocateNewZone``, fs/io_zenfs.cc): a 3 MiB shard pushed in 1 MiB buffers into a
    4 MiB zone costs one decision; a user shard's later buffers keep its zone."""
    with Store.format(MemoryDevice(BIG), policy="zenfs") as s:
        calls = counting_places(s)
        w = s.begin_generation("g", 1, hint=Hint(reclaim_step=10))
        with w.open_shard("s") as sh:
            for _ in range(12):
                sh.write(b"z" * (MiB // 4))
        info = w.gen.shards["s"]
        assert len({e[0] for e in info.extents}) == 1 and len(info.extents) == 3
        assert len(calls) == 1
        w.commit()


def test_a_pushed_shard_over_several_buffers_counts_all_its_bytes():
    with Store.format(MemoryDevice(BIG)) as s:
        w = s.begin_generation("g", 1)
        with w.open_shard("s") as sh:
            for _ in range(10):
                sh.write(b"q" * (MiB // 4 + 1))
        w.commit()
        size = 10 * (MiB // 4 + 1)
        assert s.metrics.host_bytes == -(-size // 4096) * 4096
        assert s.generation("g").shards["s"].size == size


def test_a_shard_that_fails_its_size_check_inside_a_with_block_is_dropped_once():
    """``close`` aborts a pushed shard short of its size; leaving the ``with`` block must not drop
    its bytes a second time."""
    with Store.format(MemoryDevice(BIG)) as s:
        keep = s.begin_generation("keep", 1)
        keep.write_shard("k", [b"k" * 5000])
        keep.commit()
        live = s.table.live
        w = s.begin_generation("g", 2)
        with pytest.raises(ShardSizeError):
            with w.open_shard("s", size=2 * MiB + 1) as sh:
                sh.write(b"x" * 2 * MiB)                  # two extents on the device
        assert s.table.live == live and "s" not in w.gen.shards
        assert s.table.key() == s.recompute_table().key()
        w.abort()
        assert s.table.live == live and s.fsck().ok and s.table.key() == s.recompute_table().key()


def test_aborting_a_generation_drops_its_open_shards():
    with Store.format(MemoryDevice(BIG)) as s:
        w = s.begin_generation("g", 1)
        sh = w.open_shard("s")
        sh.write(b"x" * (MiB + 5))                        # one extent written, the rest buffered
        assert s.table.live > 0
        w.abort()
        assert s.table.live == 0 and s.table.key() == s.recompute_table().key()
        assert all(z.cond is ZoneCond.EMPTY for z in s.table)


def test_pushed_chunks_are_cut_into_extents_of_at_most_the_write_buffer():
    """Chunks of any size are buffered and written in extents of at most 1 MiB (one device write, one
    crc32c each), however they straddle the buffer."""
    data = bytes(range(256)) * (7 * MiB // 256)
    with Store.format(MemoryDevice(BIG)) as s:
        w = s.begin_generation("g", 1)
        with w.open_shard("s") as sh:
            for i in range(0, len(data), 3 * MiB // 4):       # 0.75 MiB chunks
                sh.write(data[i:i + 3 * MiB // 4])
        w.commit()
        ext = s.generation("g").shards["s"].extents
        assert [e[2] for e in ext] == [MiB] * 7
        assert b"".join(s.read_shard("g", "s")) == data


def test_a_pushed_shard_uses_up_its_generations_admission_reserve():
    with Store.format(MemoryDevice(BIG)) as s:
        free = s.df().admissible
        w = s.begin_generation("g", 1, declared_size=3 * MiB)
        with w.open_shard("s") as sh:
            sh.write(b"a" * (MiB + 100))                  # one extent placed, 100 bytes buffered
            assert w.reserve == 2 * MiB and s.df().admissible == free - 3 * MiB
            sh.write(b"b" * MiB)
            assert w.reserve == MiB and s.df().admissible == free - 3 * MiB
        assert w.reserve == MiB - 4096                    # the tail took one block
        w.commit()


def test_a_shard_refuses_bytes_after_close_and_beyond_its_size_with_the_reason():
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 1)
        sh = w.open_shard("s", size=10)
        with pytest.raises(ShardSizeError) as e:
            sh.write(b"x" * 11)
        assert str(e.value) == "shard 's': more than the 10 bytes given as its size"
        t = w.open_shard("t")
        t.write(b"y")
        t.close()
        with pytest.raises(ValueError) as e:
            t.write(b"z")
        assert str(e.value) == "shard 't' of generation 'g' is closed"
        assert w.commit().shards["t"].size == 1 and "s" not in s.generation("g").shards


@pytest.mark.parametrize("policy", ["greedy", "retainz"])
def test_a_failed_device_write_of_a_counted_shard_leaves_the_store_consistent(policy):
    """An I/O error at each of a payload-less workload's writes: the shard fails, its zone is
    reconciled with the device, and fsck and a recomputed zone table agree; the store keeps working."""
    from retainz.errors import ZonedDeviceError
    from retainz.zoned.faulty import FaultyDevice

    fired = 0
    for after in range(12):
        dev = FaultyDevice(MemoryDevice(GEOM, payload=False))
        with Store.format(dev, policy=policy) as s:
            fault = dev.fail("write", after=after)
            for i in range(4):
                w = s.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=50 + i))
                try:
                    w.write_counted_shard("a", 30 * KiB + 7)
                    w.write_counted_shard("b", 70 * KiB)
                    w.commit()
                except ZonedDeviceError:
                    w.abort()
            fired += fault.seen > after
            dev.faults.clear()
            assert s.fsck().ok and s.table.key() == s.recompute_table().key(), after
            w = s.begin_generation("after", 100)
            w.write_counted_shard("a", 5000)
            w.commit()
            assert s.table.key() == s.recompute_table().key()
    assert fired >= 6


# -- what the shard and generation writers refuse, and when their bytes reach the device ------------
def test_a_whole_write_buffer_is_written_at_once_not_held_until_close():
    """Bytes that fill the write buffer go to the device with the ``write`` call that completes it
    (ZenFS flushes a full 1 MiB buffer the same way); only a partial buffer waits for more bytes."""
    with Store.format(MemoryDevice(BIG)) as s:
        w = s.begin_generation("g", 1)
        sh = w.open_shard("s")
        sh.write(b"a" * MiB)
        assert s.table.live == MiB and len(sh.extents) == 1
        sh.write(b"b" * (MiB - 4096))
        assert s.table.live == MiB                      # held: the buffer is not full
        sh.write(b"c" * 4096)
        assert s.table.live == 2 * MiB and [e[2] for e in sh.extents] == [MiB, MiB]
        sh.close()
        w.commit()
        assert b"".join(s.read_shard("g", "s")) == b"a" * MiB + b"b" * (MiB - 4096) + b"c" * 4096


def test_a_shard_that_failed_is_closed_to_further_bytes():
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 1)
        sh = w.open_shard("s", size=10)
        with pytest.raises(ShardSizeError):
            sh.write(b"x" * 11)
        for call in (lambda: sh.write(b"x"), sh.close):
            with pytest.raises(ValueError, match=r"^shard 's' of generation 'g' is closed$"):
                call()
        assert w.open_shards == [] and s.table.live == 0
        short = w.open_shard("short", size=10)
        short.write(b"y" * 5)
        with pytest.raises(ShardSizeError, match=r"^shard 'short': 5 bytes, not the 10 given as its size$"):
            short.close()
        with pytest.raises(ValueError, match=r"^shard 'short' of generation 'g' is closed$"):
            short.write(b"y" * 5)
        assert w.commit().shards == {} and s.table.live == 0


def test_the_declared_size_counts_closed_open_and_counted_shards_together():
    """A generation declared at ``N`` bytes refuses the shard byte that takes the sum of its closed
    shards, its other open shards and this one past ``N``, naming the shard and both sums."""
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 1, declared_size=4000)
        w.write_shard("a", [b"a" * 1000])
        w.write_shard("b", [b"b" * 1000])
        c = w.open_shard("c")
        d = w.open_shard("d")                            # two shards open at once, other names
        c.write(b"c" * 700)
        with pytest.raises(ShardSizeError, match=r"^generation 'g': shard 'd' brings it to 4001 bytes, "
                                                 r"more than the 4000 declared$"):
            d.write(b"d" * 1301)
        c.write(b"c" * 300)
        c.close()
        assert w.open_shards == [] and set(w.gen.shards) == {"a", "b", "c"}
        with pytest.raises(ShardSizeError, match=r"brings it to 4001 bytes"):
            w.write_shard("e", [b"e" * 1001])
        w.write_shard("e", [b"e" * 1000])
        assert sum(i.size for i in w.commit().shards.values()) == 4000
    with Store.format(MemoryDevice(GEOM, payload=False)) as s:
        w = s.begin_generation("g", 1, declared_size=4000)
        w.write_counted_shard("a", 3000)
        with pytest.raises(ShardSizeError, match=r"^generation 'g': shard 'b' brings it to 4001 bytes"):
            w.write_counted_shard("b", 1001)
        w.write_counted_shard("b", 1000)
        w.commit()


def test_shard_names_sizes_and_calls_out_of_order_are_refused_with_the_reason():
    from retainz.errors import InvalidIdError

    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 1)
        with pytest.raises(InvalidIdError, match=r"^shard name 'a/b' contains"):
            w.open_shard("a/b")
        with pytest.raises(InvalidIdError, match=r"^shard name is empty"):
            w.write_shard(" ", [b"x"])
        with pytest.raises(ValueError, match=r"^shard 's': size must be a non-negative int, not -1$"):
            w.open_shard("s", size=-1)
        with pytest.raises(ValueError, match=r"^shard 's': no chunks given \(a counted shard on a payload-less "
                                             r"device is write_counted_shard\)$"):
            w.write_shard("s", None)
        a = w.open_shard("a")
        with pytest.raises(ValueError, match=r"^generation 'g' already has a shard 'a'$"):
            w.open_shard("a")
        b = w.open_shard("b")
        a.write(b"1")
        with pytest.raises(ValueError, match=r"^generation 'g': shard 'a' is still open; close or abort it "
                                             r"before the commit$"):
            w.commit()
        a.close()
        with pytest.raises(ValueError, match=r"^generation 'g': shard 'b' is still open"):
            w.commit()
        b.abort()
        w.commit()
        with pytest.raises(ValueError, match=r"^generation 'g' is committed, not writing$"):
            w.open_shard("c")
        h = s.begin_generation("h", 2)                    # names are per generation
        h.write_shard("a", [b"2"])
        assert h.commit().shards["a"].size == 1


def test_peak_occupancy_counts_dead_bytes_not_yet_reclaimed():
    """Occupancy is live + dead bytes (a deleted generation's bytes in a zone a live one shares
    still occupy the device until a reset)."""
    with Store.format(MemoryDevice(GEOM), policy="greedy") as s:
        for i in range(3):
            w = s.begin_generation(f"g{i}", i)
            w.write_shard("s", [b"x" * 20 * KiB])          # greedy packs: zones are shared
            w.commit()
        s.delete("g0", step=5)
        s.delete("g1", step=5)
        dead = s.table.dead
        assert dead > 0
        w = s.begin_generation("g3", 6)
        w.write_shard("s", [b"y" * 40 * KiB])
        w.commit()
        assert s.metrics.peak_occupancy == s.table.live + s.table.dead > s.table.live


def test_a_decision_that_finishes_a_zone_and_names_another_runs_no_gc():
    """A decision may finish zones and still name a zone (ZenFS finishes a zone below its finish
    threshold, then opens another): it is executed as given; only a decision without a zone makes
    the write path run a GC pass, even with dead bytes on the device."""
    with Store.format(MemoryDevice(GEOM), policy="greedy") as s:
        for i in range(3):
            w = s.begin_generation(f"g{i}", i)
            w.write_shard("s", [b"x" * 20 * KiB])          # greedy packs: g1 shares both of its zones
            w.commit()
        s.delete("g0", step=3)
        assert s.table.dead and len(s.table.open) == 1
        passes = []
        collect = s.write_path.collector.collect
        s.write_path.collector.collect = lambda **kw: passes.append(collect(**kw)) or passes[-1]
        (opened,) = s.table.open
        target = empty(s)
        misbehave(s, lambda req, d: Decision(target, finish=tuple(s.table.open)) if not req.gc else d)
        calls = counting_places(s)
        w = s.begin_generation("g3", 4)
        w.write_shard("s", [b"y" * 4096])
        w.commit()
        assert passes == [] and len(calls) == 1
        assert s.table[opened].cond is ZoneCond.FULL and s.generation("g3").shards["s"].extents[0][0] == target


def test_an_aborted_generations_zones_are_reset_one_by_one_and_counted():
    """Zones an abort leaves with no live data are reset (``ZoneBook.reset``, not a journaled batch):
    each reset is counted once, and a zone reset while part-empty is charged its unwritten capacity,
    in bytes and in bytes x the steps since its last write; a full zone was charged nothing."""
    with Store.format(MemoryDevice(GEOM)) as s:
        m = s.metrics
        w = s.begin_generation("g", 1)
        w.write_shard("s", [b"x" * (CAP + 5000)])         # one full zone, one with 8 KiB written
        s.advance(11)
        assert (m.resets, m.unused_capacity_bytes, m.unused_capacity_byte_steps) == (0, 0, 0)
        w.abort()
        assert m.resets == 2 and all(z.cond is ZoneCond.EMPTY for z in s.table)
        assert m.unused_capacity_bytes == CAP - 8192
        assert m.unused_capacity_byte_steps == (CAP - 8192) * (11 - 1)
        assert s.table.key() == s.recompute_table().key()
        w = s.begin_generation("h", 12)
        w.write_shard("s", [b"y" * 100])
        w.abort()
        assert m.resets == 3 and m.unused_capacity_bytes == (CAP - 8192) + (CAP - 4096)
        w = s.begin_generation("f", 13)                   # a zone finished before the abort was charged then
        w.write_shard("s", [b"z" * 100])
        (z,) = s.table.open
        s.write_path.zones.finish(z)
        assert m.unused_capacity_bytes == (CAP - 8192) + 2 * (CAP - 4096)
        w.abort()
        assert m.resets == 4 and m.unused_capacity_bytes == (CAP - 8192) + 2 * (CAP - 4096)
        assert s.table.key() == s.recompute_table().key()


def test_a_duplicate_shard_name_is_its_own_error_also_through_a_node_service_reply():
    """A shard name the generation already has (closed or open) is ShardExistsError (still a
    ValueError), refused before a byte is placed, and a node service's reply raises it again as itself:
    the namespace's carry-over into a joined re-save tells "another rank wrote it" from other refusals."""
    from retainz.errors import ShardExistsError
    from retainz.node.protocol import error_reply, raise_reply

    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("g", 1)
        w.write_shard("a", [b"1" * 5000])
        used = s.df().used
        with pytest.raises(ShardExistsError, match=r"^generation 'g' already has a shard 'a'$") as e:
            w.write_shard("a", [b"2" * 5000])
        assert isinstance(e.value, ValueError) and s.df().used == used
        with pytest.raises(ShardExistsError, match="already has a shard 'a'"):
            raise_reply(error_reply(e.value))
        w.commit()
        assert b"".join(s.read_shard("g", "a")) == b"1" * 5000


def test_the_table_knows_which_groups_are_in_flight_and_which_open_zones_they_fill():
    """Issue 40: two saves overlapping in time, each shard written in units (``ShardWriter.count``):
    the zone table records each group's open zones while it can still write, and forgets the group
    once every declared byte is written (before its commit), or at its abort."""
    with Store.format(MemoryDevice(GEOM, payload=False)) as s:
        t = s.table
        a = s.begin_generation("a", 10, hint=Hint(reclaim_step=100), declared_size=2 * CAP)
        b = s.begin_generation("b", 10, hint=Hint(reclaim_step=300), declared_size=CAP)
        assert t.writing == {"a": set(), "b": set()} and t.filling == {}
        sa, sb = a.open_shard("x", size=2 * CAP), b.open_shard("y", size=CAP)
        sa.count(8 * KiB)
        sb.count(8 * KiB)
        za, zb = sa.extents[-1][0], sb.extents[-1][0]
        assert za != zb                                   # b does not follow a into its zone
        assert t.filling == {za: {"a"}, zb: {"b"}} and t.filled_by_others(za, "b")
        assert not t.filled_by_others(za, "a")
        sb.count(CAP - 8 * KiB)                           # b's last byte: its zone is full
        sb.close()
        assert "b" not in t.writing and zb not in t.filling
        b.commit()
        sa.count(CAP)
        assert t.filling == {sa.extents[-1][0]: {"a"}}
        with pytest.raises(ValueError, match="counted; it takes no bytes through write"):
            sa.write(b"x")
        a.abort()
        assert t.writing == {} and t.filling == {}


def test_counted_units_refused_on_a_payload_device_and_after_the_tail():
    with Store.format(MemoryDevice(GEOM)) as s:
        w = s.begin_generation("a", 1)
        with pytest.raises(ValueError, match="need a payload-less device"):
            w.open_shard("x").count(4096)
    with Store.format(MemoryDevice(GEOM, payload=False)) as s:
        w = s.begin_generation("a", 1)
        sh = w.open_shard("x")
        sh.count(100)
        with pytest.raises(ValueError, match="its tail was counted"):
            sh.count(4096)
