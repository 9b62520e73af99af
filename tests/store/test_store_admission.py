"""Admission on every write path: a generation begun without a declared size (fsspec, the mount, DCP
without a plan) reserves as its bytes arrive and is refused before it would write into the GC
reserve; ``df`` shows what can be admitted and the reserve separately."""

from __future__ import annotations

import pytest

from retainz.cli import main
from retainz.errors import InjectedIOError, NoSpaceError
from retainz.hint import Hint
from retainz.placement import make_allocator
from retainz.placement.greedy import Greedy
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice
from retainz.zoned.faulty import FaultyDevice

KiB = 1024
GEOM = Geometry(nr_zones=12, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=6,
                max_active=6)
ZENFS_GEOM = Geometry(nr_zones=40, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=14,
                      max_active=14)


def fill_undeclared(s: Store, push: bool) -> NoSpaceError:
    """Write generations of 30 KiB without declaring a size until the store refuses one."""
    i = 0
    while True:
        w = s.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=10_000))
        try:
            if push:
                sh = w.open_shard("a")
                for _ in range(6):
                    sh.write(b"x" * (5 * KiB))
                sh.close()
            else:
                w.write_shard("a", [b"x" * (30 * KiB)])
            w.commit()
        except NoSpaceError as e:
            w.abort()
            return e
        i += 1


@pytest.mark.parametrize("push", [False, True])
def test_an_undeclared_generation_is_refused_at_admission_before_the_gc_reserve(push):
    with Store.format(MemoryDevice(GEOM), gc_reserve_zones=2) as s:
        e = fill_undeclared(s, push)
        assert e.cause == "admission"
        assert s.table.n_empty >= s.admission_reserve_zones == 2      # the reserve was never written
        assert s.fsck().ok and s.table.key() == s.recompute_table().key()
        df = s.df()
        assert df.admissible < 30 * KiB and df.gc_reserve == 2 * GEOM.zone_capacity
        assert df.free >= df.gc_reserve + df.admissible


def test_a_declared_generation_is_admitted_whole_at_its_start_as_before():
    with Store.format(MemoryDevice(GEOM), gc_reserve_zones=2) as s:
        with pytest.raises(NoSpaceError) as e:
            s.begin_generation("big", 1, declared_size=8 * 48 * KiB)
        assert e.value.cause == "admission"


def test_zenfs_has_no_admission_on_any_path():
    with Store.format(MemoryDevice(ZENFS_GEOM), policy="zenfs") as s:
        e = fill_undeclared(s, push=True)
        assert e.cause in ("allocation", "gc") and s.df().gc_reserve == 0


def test_df_prints_admissible_bytes_and_the_reserve(tmp_path, capsys):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEOM)
    with Store.format(dev) as s:
        fill_undeclared(s, push=False)
    dev.close()
    assert main(["df", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Admissible: 0.0" in out and "GC reserve of 0.09 MiB" in out
    assert main(["df", str(path), "--json"]) == 0
    import json
    rep = json.loads(capsys.readouterr().out)
    assert rep["gc_reserve"] == 2 * GEOM.zone_capacity and rep["admissible"] < 30 * KiB


def test_df_admits_nothing_when_free_space_is_below_the_reserve():
    """A store filled by ZenFS (no admission control) and reopened under a policy that keeps a GC
    reserve has less free than the reserve: ``df`` says 0 bytes can be admitted (never a negative
    figure), and a declared generation is refused with the same 0."""
    dev = MemoryDevice(ZENFS_GEOM)
    with Store.format(dev, policy="zenfs", gc_reserve_zones=8) as s:
        fill_undeclared(s, push=False)
    with Store.open(dev, policy="greedy") as s:
        df = s.df()
        assert df.free < df.gc_reserve == 8 * GEOM.zone_capacity
        assert df.admissible == 0
        with pytest.raises(NoSpaceError, match=r"^generation 'x' needs 4096 bytes; 0 can be reserved ") as e:
            s.begin_generation("x", 10_000, declared_size=1)
        assert (e.value.needed, e.value.available) == (4096, 0)


class GreedyWithoutAdmission(Greedy):
    """Greedy placement admitting every generation (a scripted policy given by ``use_allocator``)."""

    admission_control = False


def test_df_shows_no_gc_reserve_for_a_policy_without_admission_control():
    with Store.format(MemoryDevice(GEOM), gc_reserve_zones=2) as s:
        assert s.df().gc_reserve == 2 * GEOM.zone_capacity
        s.use_allocator(GreedyWithoutAdmission())
        assert s.admission_reserve_zones == 2 and s.df().gc_reserve == 0


def test_an_admission_refusal_names_every_figure_and_exactly_what_can_be_reserved_is_admitted():
    cap = GEOM.zone_capacity
    with Store.format(MemoryDevice(GEOM), gc_reserve_zones=2) as s:
        other = s.begin_generation("other", 1, declared_size=5000)          # reserves 2 blocks
        assert other.reserve == 8192
        free = s.df().free
        avail = free - 8192 - 2 * cap
        assert s.df().admissible == avail > 0
        with pytest.raises(NoSpaceError, match=rf"^generation 'big' needs {avail + 4096} bytes; {avail} can be "
                                               rf"reserved \({free} free, 8192 reserved by other writers, 2 zones "
                                               r"kept for GC\)$") as e:
            s.begin_generation("big", 2, declared_size=avail + 1)
        assert (e.value.needed, e.value.available, e.value.cause) == (avail + 4096, avail, "admission")
        assert e.value.state == s.stop_state() and e.value.state
        fits = s.begin_generation("fits", 2, declared_size=avail)           # exactly what can be reserved
        assert fits.reserve == avail and s.df().admissible == 0
        u = s.begin_generation("u", 3)                                       # undeclared: nothing reserved yet
        assert u.reserve == 0 and s.df().admissible == 0
        with pytest.raises(NoSpaceError, match=rf"^generation 'u' needs 4096 more bytes; 0 can be reserved "
                                               rf"\({free} free, {8192 + avail} reserved by other writers, 2 "
                                               r"zones kept for GC\)$") as e:
            u.write_shard("a", [b"u" * 100])
        assert (e.value.needed, e.value.available, e.value.cause) == (4096, 0, "admission")
        fits.abort()
        u.write_shard("a", [b"u" * 100])
        assert u.reserve == 0 and s.df().admissible == avail - 4096


def test_admission_collects_only_when_the_free_space_is_short():
    """Dead bytes alone start no GC at admission: only a size that does not fit what can be reserved
    does (a forced pass), and one that fits exactly is admitted without one."""
    with Store.format(MemoryDevice(GEOM), gc_reserve_zones=2) as s:
        for i in range(4):                                      # two full zones, half of each dead
            w = s.begin_generation(f"g{i}", i, declared_size=24 * KiB)
            w.write_shard("a", [bytes([i]) * (24 * KiB)])
            w.commit()
        s.delete("g0")
        s.delete("g2")
        dead, resets = s.table.dead, s.metrics.resets
        assert dead == 48 * KiB
        avail = s.df().admissible
        s.begin_generation("small", 5, declared_size=4096).abort()
        s.begin_generation("exact", 5, declared_size=avail).abort()
        assert (s.table.dead, s.metrics.resets, s.metrics.gc_bytes) == (dead, resets, 0)
        w = s.begin_generation("more", 5, declared_size=avail + 1)   # a forced pass frees both zones
        assert (s.table.dead, s.metrics.resets, s.metrics.gc_bytes) == (0, resets + 2, 48 * KiB)
        assert w.reserve == avail + 4096
        w.abort()


def test_a_policy_without_admission_control_reserves_nothing_even_past_the_free_space():
    with Store.format(MemoryDevice(ZENFS_GEOM), policy="zenfs") as s:
        free = s.df().free
        w = s.begin_generation("big", 1, declared_size=free + 4096)
        assert w.reserve == 0 and s.df().admissible == free and s.df().gc_reserve == 0
        w.write_shard("a", [b"z" * 8192])
        w.commit()


def test_a_failed_write_keeps_its_reservation_until_the_generation_ends():
    with Store.format(FaultyDevice(MemoryDevice(GEOM)), gc_reserve_zones=2) as s:
        dev = s.device
        admissible = s.df().admissible
        w = s.begin_generation("u", 1)
        dev.fail("write")
        with pytest.raises(InjectedIOError):
            w.write_shard("a", [b"a" * 8192])
        assert w.reserve == 8192
        dev.fail("write")
        with pytest.raises(InjectedIOError):
            w.write_shard("b", [b"b" * 12288])
        assert w.reserve == 12288
        w.write_shard("c", [b"c" * 4096])
        assert w.reserve == 8192
        w.commit()
        assert s.df().admissible == s.df().free - 2 * GEOM.zone_capacity < admissible


def test_a_new_generation_starts_an_unforced_gc_pass_when_fewer_zones_than_the_reserve_are_empty():
    """Without admission the data can use the reserve; the next ``begin_generation`` then runs one
    GC pass by the policy's unforced rule (the base rule: the zones with most dead bytes until the
    reserve is back), not a forced one that would compact every zone."""
    with Store.format(MemoryDevice(GEOM), gc_reserve_zones=2) as s:
        s.use_allocator(GreedyWithoutAdmission())
        data_zones = len(s.table.zones)
        for i in range(2 * (data_zones - 1)):               # two generations a zone, one zone left empty
            w = s.begin_generation(f"g{i}", i)
            w.write_shard("a", [bytes([i]) * (24 * KiB)])
            w.commit()
        for i in range(0, 2 * (data_zones - 1), 2):
            s.delete(f"g{i}")
        assert (s.table.n_empty, s.table.dead, s.metrics.gc_bytes) == (1, (data_zones - 1) * 24 * KiB, 0)
        s.begin_generation("next", 100).abort()
        assert s.metrics.gc_bytes == 24 * KiB                # one victim's live half copied
        assert (s.table.n_empty, s.table.dead) == (1, (data_zones - 2) * 24 * KiB)
        s.begin_generation("again", 101).abort()             # one zone empty is still short of 2
        assert s.metrics.gc_bytes == 48 * KiB and s.table.n_empty == 2
        s.begin_generation("enough", 102).abort()            # the reserve is back: no pass
        assert s.metrics.gc_bytes == 48 * KiB and s.fsck().ok


def test_a_new_generation_starts_no_gc_pass_while_the_reserve_is_empty_whatever_the_policy_would_collect():
    """``begin_generation``'s GC trigger is the store's reserve (fewer than ``gc_reserve_zones``
    empty zones, and dead bytes), for every policy: ZenFS's rule ignores the reserve and would
    collect here (11 % free, every full zone 92 % garbage), yet a new generation leaves it alone
    while the one reserve zone is empty; an explicit ``gc()`` collects."""
    with Store.format(MemoryDevice(GEOM), gc_reserve_zones=1) as s:
        full = len(s.table.zones) - 2
        for i in range(full):                               # a zone each: 4 KiB live, 44 KiB dead
            for name, size in (("a", 4), ("b", 44)):
                w = s.begin_generation(f"{name}{i}", i)
                w.write_shard("s.sst", [bytes([i]) * (size * KiB)])
                w.commit()
        w = s.begin_generation("open", 50)
        w.write_shard("s.sst", [b"o" * (24 * KiB)])
        w.commit()
        for i in range(full):
            s.delete(f"b{i}")
        s.use_allocator(make_allocator("zenfs"))
        assert s.table.n_empty == 1 and s.allocator.gc_victims(1) == sorted(s.table.zones)[:full]
        dead = s.table.dead
        s.begin_generation("x", 100).abort()
        assert (s.table.dead, s.metrics.gc_bytes, s.table.n_empty) == (dead, 0, 1)
        rep = s.gc()
        assert rep.bytes_copied == 6 * 4096 and s.table.n_empty == 7


def test_bytes_already_reserved_are_written_without_a_new_admission():
    """A write covered by the writer's own reservation (left by a failed write) needs no admission,
    even when the space others took since leaves nothing more to reserve."""
    with Store.format(FaultyDevice(MemoryDevice(GEOM)), gc_reserve_zones=2) as s:
        w = s.begin_generation("u", 1)
        s.device.fail("write")
        with pytest.raises(InjectedIOError):
            w.write_shard("a", [b"a" * 8192])
        assert w.reserve == 8192
        s.use_allocator(GreedyWithoutAdmission())            # others write into the reserve
        x = s.begin_generation("x", 2)
        x.write_shard("a", [bytes(s.df().free - 2 * GEOM.zone_capacity)])
        x.commit()
        s.use_allocator(Greedy())
        df = s.df()
        assert df.admissible == 0 and df.free < df.gc_reserve + w.reserve      # less than nothing left
        w.write_shard("b", [b"b" * 8192])                     # within its reservation: admitted
        w.commit()
        assert b"".join(s.read_shard("u", "b")) == b"b" * 8192


def half_dead_store(policy: str) -> Store:
    """16 data zones of 48 KiB, 15 of them full, each holding one live and one dead 24 KiB
    generation; 1 empty zone, the GC reserve 1 zone.  One forced GC pass can copy only into the
    one empty zone (two victims' live halves), since its victims are reset when it ends."""
    geom = Geometry(nr_zones=19, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=14,
                    max_active=14)
    s = Store.format(MemoryDevice(geom), policy=policy, gc_reserve_zones=1)
    for i in range(30):
        w = s.begin_generation(f"g{i}", i, declared_size=24 * KiB)
        w.write_shard("s", [b"x" * (24 * KiB)])
        w.commit()
    for i in range(0, 30, 2):
        s.delete(f"g{i}")
    assert s.table.n_empty == 1 and s.table.dead == 15 * 24 * KiB
    return s


@pytest.mark.parametrize("policy", ["greedy", "retainz", "retainz-nohint", "oracle"])
def test_admission_repeats_forced_gc_passes_while_each_frees_space(policy):
    # The fleet map's loss cell (docs/results.md, "Fleets"): one forced pass left 15 empty zones
    # where a 13-zone save needed 17, and the next pass would have made room.  f2fs's foreground
    # GC repeats until enough sections are free; admission now does the same.
    with half_dead_store(policy) as s:
        w = s.begin_generation("big", 40, declared_size=3 * 48 * KiB)   # 3 zones; 0 admittable
        assert s.table.n_empty >= 4                                      # 3 for it + the reserve
        assert s.metrics.gc_bytes == 6 * 24 * KiB                        # 6 live halves: 2 passes
        w.write_shard("s", [b"y" * (3 * 48 * KiB)])
        w.commit()
        assert s.fsck().ok and s.table.key() == s.recompute_table().key()
        assert all(b"".join(s.read_shard(f"g{i}", "s")) == b"x" * (24 * KiB) for i in range(1, 30, 2))


def test_admission_refuses_once_gc_frees_nothing_more_and_the_refusal_is_honest():
    with half_dead_store("greedy") as s:
        with pytest.raises(NoSpaceError) as e:   # 9 zones: more than all the dead bytes could free
            s.begin_generation("huge", 40, declared_size=9 * 48 * KiB)
        assert e.value.cause == "admission"
        assert s.table.dead == 0                 # GC went on until nothing dead was left
        st = e.value.state
        assert st["dead_bytes"] == 0 and st["empty_zones"] == s.table.n_empty == 8
        # all 16 zones' capacity less the 15 live halves, less the 1-zone reserve
        assert e.value.available == 16 * 48 * KiB - 15 * 24 * KiB - 48 * KiB
        assert s.fsck().ok


def finished_tails_store(policy: str) -> Store:
    """13 data zones of 48 KiB, 2 of them active for data, the GC reserve 1 zone.  One permanent
    24 KiB generation holds an open zone; then 72 KiB saves, each with a reclaim step three times
    farther out than the one before: each fills a zone and leaves a 24 KiB tail in a zone of its
    own, and the next one, with the active budget spent, finishes that tail zone (orphaned: its
    data dies first, so finishing it costs nothing under RetainZ's rule) rather than join it.
    After 6 saves: 5 finished tail zones, each 24 KiB live and 24 KiB of unused capacity, no dead
    byte, no empty zone: the fleet map's RetainZ stop in small (docs/fleet.md)."""
    geom = Geometry(nr_zones=16, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                    max_active=3)
    s = Store.format(MemoryDevice(geom), policy=policy, gc_reserve_zones=1)
    w = s.begin_generation("g0", 0, hint=Hint(reclaim_step=float("inf")), declared_size=24 * KiB)
    w.write_shard("s", [b"x" * (24 * KiB)])
    w.commit()
    for i in range(1, 7):
        w = s.begin_generation(f"g{i}", 10 * i, hint=Hint(reclaim_step=10 * i + 100 * 3 ** i),
                               declared_size=72 * KiB)
        w.write_shard("s", [b"x" * (72 * KiB)])
        w.commit()
    t = s.table
    assert (s.metrics.finishes, t.unused, t.dead, t.n_empty) == (5, 5 * 24 * KiB, 0, 0)
    return s


@pytest.mark.parametrize("policy", ["retainz", "oracle"])
def test_admission_collects_capacity_lost_to_finishes_when_nothing_is_dead(policy):
    # The fleet map's one RetainZ stop (concurrency 4, churn 16, zn540/small-models, pressure 0.97,
    # seed 1): refused at admission with 0 dead bytes while 20 finished zones held 11 GB of unused
    # capacity, because forced GC ran only when something was dead.  A reset returns a finished
    # zone's unwritten capacity as it returns dead bytes (ZoneTable.reclaimable), and RetainZ's
    # victim rule names such zones: admission now collects them before it refuses.
    with finished_tails_store(policy) as s:
        assert s.zones.free() - s.admission_reserve_zones * 48 * KiB == 0     # nothing admittable
        w = s.begin_generation("g7", 70, hint=Hint(reclaim_step=10**6), declared_size=72 * KiB)
        assert s.metrics.gc_bytes == 5 * 24 * KiB                 # the 5 tails moved together
        assert s.table.unused == 0 and s.table.dead == 0
        w.write_shard("s", [b"y" * (72 * KiB)])
        w.commit()
        assert s.fsck().ok and s.table.key() == s.recompute_table().key()
        assert b"".join(s.read_shard("g0", "s")) == b"x" * (24 * KiB)
        assert all(b"".join(s.read_shard(f"g{i}", "s")) == b"x" * (72 * KiB) for i in range(1, 7))


def test_admission_refuses_once_nothing_is_reclaimable_and_the_refusal_is_honest():
    with finished_tails_store("retainz") as s:
        with pytest.raises(NoSpaceError) as e:   # 4 zones: more than the 5 finished tails could free
            s.begin_generation("huge", 70, declared_size=4 * 48 * KiB)
        assert e.value.cause == "admission"
        assert s.table.reclaimable == 0          # GC went on until no dead byte and no unused capacity
        st = e.value.state
        assert st["dead_bytes"] == 0 and st["live_bytes"] == 24 * KiB + 6 * 72 * KiB
        # all 13 zones' capacity less the live bytes, less the 1-zone reserve
        assert e.value.available == 13 * 48 * KiB - (24 + 6 * 72) * KiB - 48 * KiB
        assert s.fsck().ok
