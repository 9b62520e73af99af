"""Crash recovery: power cut at every write boundary (every state the cut can leave: each zone keeps
a prefix of its unflushed writes, independently), durability order, interrupted deletions and GC
moves, FINISH recovery, double crashes."""

from __future__ import annotations

import re

import pytest

from retainz.errors import CorruptJournalError, PowerCutError
from retainz.hint import Hint
from retainz.store import Store
from retainz.testing.crashtest import GEOMETRY, WORKLOADS, campaign, workload
from retainz.zoned import FileDevice, MemoryDevice, ZoneCond, ZoneOp
from retainz.zoned.faulty import FaultyDevice

EXPECTED_CLASSES = {
    "basic": {"shard-data", "commit-record", "delete-record", "sync-record", "rollover-snapshot"},
    "gc": {"shard-data", "commit-record", "delete-record", "gc-copy", "gc-move-record", "rollover-snapshot",
           "sync-record"},
    "rollover": {"shard-data", "commit-record", "delete-record", "rollover-snapshot", "sync-record"},
    "spill": {"commit-record", "delete-record", "rollover-snapshot", "sync-record", "zone-close-record"},
    "mixed": {"shard-data", "commit-record", "delete-record", "gc-copy", "gc-move-record",
              "rollover-snapshot", "sync-record"},
    "shared": {"shard-data", "commit-record", "delete-record", "gc-copy", "gc-move-record",
               "rollover-snapshot", "sync-record"},
    "replace": {"shard-data", "commit-record", "delete-record", "gc-copy", "gc-move-record",
                "rollover-snapshot", "sync-record"},
    "hint": {"shard-data", "commit-record", "delete-record", "hint-record", "gc-move-record",
             "rollover-snapshot", "sync-record"},
}


@pytest.mark.parametrize("name", WORKLOADS)
def test_power_cut_at_every_write_boundary(name, crash_ledger):
    rep = campaign(name, seed=0)
    crash_ledger.append((f"{name} seed 0", [rep]))
    print(f"{name}: {rep.points} crash states at {rep.write_boundaries} write boundaries: {rep.states}")
    assert rep.failures == []
    assert rep.write_boundaries > 15
    # every boundary leaves at least its two extremes (all kept, none kept), most several more
    assert rep.points == sum(rep.classes.values()) == sum(rep.states.values()) > 2 * rep.write_boundaries
    assert rep.states["all kept"] == rep.states["none kept"] == rep.write_boundaries
    assert rep.states["partial"] > 0
    assert set(rep.classes) == EXPECTED_CLASSES[name]
    assert rep.generations_recovered > 0
    if name != "spill":
        assert rep.bytes_verified > 0


def test_campaign_states_include_records_ahead_of_data_and_data_ahead_of_records():
    """The basic workload's deletion record is appended while an aborted generation's data is still
    unflushed: the cut there leaves both reorderings, and the store survives both."""
    rep = campaign("basic", seed=0)
    assert rep.failures == []
    assert rep.states["record durable, data lost"] > 0 and rep.states["data durable, record lost"] > 0


@pytest.mark.parametrize("name", ["spill", "mixed"])
def test_a_second_power_cut_during_recovery(name, crash_ledger):
    """Cut at every boundary, then again at the first write after the reboot (the mount-time
    rollover after a torn tail, or the first commit): recover and check again.  This is the class
    that caught a torn record hidden by the rollover's finish of the old meta zone."""
    rep = campaign(name, seed=0, second_cut=1)
    crash_ledger.append((f"{name} seed 0, second cut 1", [rep]))
    print(f"{name} (second cut): {rep.points} crash states at {rep.write_boundaries} write boundaries")
    assert rep.failures == [] and rep.points > 80


@pytest.mark.slow
@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.parametrize("second_cut", [2, 3])
def test_second_power_cut_later_in_recovery(name, second_cut, crash_ledger):
    rep = campaign(name, seed=0, second_cut=second_cut)
    crash_ledger.append((f"{name} seed 0, second cut {second_cut}", [rep]))
    assert rep.failures == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_power_cut_campaign_other_seeds(seed, crash_ledger):
    rep = campaign("mixed", seed=seed)
    crash_ledger.append((f"mixed seed {seed}", [rep]))
    assert rep.failures == [] and rep.points > 200


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gc", "mixed"])
def test_power_cut_campaign_enumerating_more_states(name, crash_ledger):
    """The size knob: every state of a cut that leaves up to 512, 24 random ones otherwise (basic,
    rollover and spill cuts leave at most 16: the default lane already enumerates them all)."""
    rep = campaign(name, seed=0, enumerate_up_to=512, samples=24)
    crash_ledger.append((f"{name} seed 0, enumerated up to 512", [rep]))
    print(f"{name} (enumerated): {rep.points} crash states at {rep.write_boundaries} write boundaries")
    assert rep.failures == [] and rep.points > campaign(name, seed=0).points


@pytest.mark.slow
def test_power_cut_campaign_on_a_file_device(tmp_path, crash_ledger):
    path = tmp_path / "dev.img"
    rep = campaign("gc", seed=0, enumerate_up_to=2, samples=1,
                   make_device=lambda g: FileDevice.create(path, g, force=True))
    crash_ledger.append(("gc seed 0 on a file device", [rep]))
    assert rep.failures == [] and rep.points >= 2 * rep.write_boundaries


def test_campaign_detects_a_store_that_loses_commits(monkeypatch):
    """The campaign can fail: a store whose commit record is never flushed is caught."""
    from retainz.store import journal

    real = journal.Journal.append

    def lazy(self, payload, *, flush=True):
        real(self, payload, flush=not payload.startswith(b"c "))

    monkeypatch.setattr(journal.Journal, "append", lazy)
    rep = campaign("basic", seed=0)
    assert any("committed set" in f for f in rep.failures)


@pytest.mark.parametrize("name", ["basic", "gc", "rollover", "mixed"])
def test_campaign_detects_a_commit_that_does_not_flush_its_data_first(monkeypatch, name):
    """Without the data flush before the commit record, a cut between the record's write and its
    flush can persist the record and lose the data: the campaigns themselves catch it (the store
    refuses to open: committed data is missing below the device's write pointer)."""
    real = Store.commit_writer

    def commit_without_data_flush(self, w):
        dev, calls = self.device, []

        def flush():                     # skip the first flush (the data's); keep the record's
            calls.append(1)
            if len(calls) > 1:
                type(dev).flush(dev)

        dev.flush = flush
        try:
            return real(self, w)
        finally:
            del dev.flush

    monkeypatch.setattr(Store, "commit_writer", commit_without_data_flush)
    rep = campaign(name, seed=0)
    assert any(f.split(": ")[0].endswith("record durable, data lost") and "data lost" in f
               for f in rep.failures), rep.failures[:3]


def test_campaign_catches_a_generation_that_appears_without_being_confirmed(monkeypatch):
    """The checker's upper bound (nothing outside the confirmed set): a store whose abort commits the
    generation instead shows "x" after every later cut; each such point fails, naming the set."""
    commit = Store.commit_writer
    monkeypatch.setattr(Store, "abort_writer", lambda self, w: commit(self, w) and None)
    rep = campaign("basic", seed=0)
    wrong = [f for f in rep.failures if re.search(r"committed set \[[^]]*'x'\], expected all of .* and "
                                                  r"nothing outside \[[^]]*\]$", f) and "'x'" not in
             f.rsplit("nothing outside", 1)[1]]
    assert len(wrong) == len(rep.failures) > 10


def test_campaign_catches_shard_bytes_that_differ(monkeypatch):
    """The checker's byte comparison: a store that hands back one wrong byte (its checksums, fsck and
    zone summaries all fine) fails every point that reads the shard back."""
    from retainz.store.reader import Reader

    real = Reader.read_shard

    def off_by_one_bit(self, gen_id, name):
        chunks = list(real(self, gen_id, name))
        if chunks and chunks[-1]:
            chunks[-1] = chunks[-1][:-1] + bytes([chunks[-1][-1] ^ 1])
        return iter(chunks)

    monkeypatch.setattr(Reader, "read_shard", off_by_one_bit)
    rep = campaign("basic", seed=0)
    assert rep.failures and all(f.endswith("bytes differ") for f in rep.failures)
    assert len(rep.failures) == rep.points          # every recovery reads some shard back


class OpLog(FaultyDevice):
    """Records every device call, to check the durability order."""

    def __init__(self, inner):
        super().__init__(inner)
        self.ops: list[tuple] = []

    def write(self, offset, data):
        z = offset // self.geometry.zone_size
        kind = "meta" if z < 3 else "data"
        if kind == "meta":
            kind = bytes(memoryview(data)[8:10]).decode(errors="replace")
        self.ops.append(("write", z, kind))
        super().write(offset, data)

    def flush(self):
        self.ops.append(("flush",))
        super().flush()

    def zone_op(self, op, zone):
        self.ops.append((op.value, zone))
        super().zone_op(op, zone)


def _store_with_log():
    dev = OpLog(MemoryDevice(GEOMETRY))
    return Store.format(dev), dev


def test_commit_flushes_data_then_the_commit_record_before_returning():
    s, dev = _store_with_log()
    w = s.begin_generation("g", 1)
    w.write_shard("s", [b"x" * 70000])
    dev.ops.clear()
    w.commit()
    z = s.journal.chain[-1]               # the record's two copies (format 5), one write each, one flush
    assert dev.ops == [("flush",), ("write", z, "c "), ("write", z, "c "), ("flush",)]


def test_deletion_record_is_durable_before_any_reset():
    s, dev = _store_with_log()
    w = s.begin_generation("g", 1)
    w.write_shard("s", [b"x" * 70000])
    w.commit()
    dev.ops.clear()
    s.delete("g")
    kinds = [o[0] if o[0] != "write" else o[2] for o in dev.ops]
    assert kinds[:4] == ["d ", "d ", "flush", "reset"]      # both copies (format 5), then one flush
    assert kinds.count("reset") == 2


def test_gc_copies_flush_record_flush_then_reset():
    s, dev = _store_with_log()
    for i in range(3):
        w = s.begin_generation(f"g{i}", i)
        w.write_shard("s", [bytes([i]) * 30000])
        w.commit()
    s.delete("g1")
    if s.journal.room() < 8 * 4096:
        s.journal.roll()                  # room for the move record: no rollover between the steps
    dev.ops.clear()
    rep = s.gc(force=True)
    assert rep.victims
    kinds = [o[2] if o[0] == "write" else o[0] for o in dev.ops]
    first_victim = kinds.index("m ")
    assert set(kinds[:first_victim - 1]) == {"data"} and kinds[first_victim - 1] == "flush"
    assert kinds[first_victim + 1:first_victim + 4] == ["m ", "flush", "reset"]   # its copy 1 (format 5)


def _crash(dev, store, *, after: int = 1):
    """Arm a cut ``after`` writes from now."""
    dev.cut_after_writes = dev.writes + after


def _drop(store):
    with pytest.raises(PowerCutError):
        store.close()


def test_interrupted_deletion_resets_are_redone_at_mount():
    dev = FaultyDevice(MemoryDevice(GEOMETRY), torn_blocks=None, keep_unflushed=True)
    s = Store.format(dev)
    w = s.begin_generation("a", 1)
    w.write_shard("s", [b"a" * 100000])
    w.commit()
    zones = {e[0] for e in s.generation("a").shards["s"].extents}
    _crash(dev, s)                     # the deletion record lands; the flush after it fails
    with pytest.raises(PowerCutError):
        s.delete("a")
    _drop(s)
    dev.reboot()
    assert all(dev.zone(z).cond != ZoneCond.EMPTY for z in zones)   # resets never ran
    with Store.open(dev) as s2:
        assert s2.generations() == []
        assert sorted(s2.recovery.zones_reset) == sorted(zones)
        assert all(dev.zone(z).cond == ZoneCond.EMPTY for z in zones)
        assert s2.fsck().ok


def test_interrupted_gc_move_is_completed_deterministically():
    def setup(dev):
        s = Store.format(dev)
        for i in range(3):
            w = s.begin_generation(f"g{i}", i)
            w.write_shard("s", [bytes([65 + i]) * 30000])
            w.commit()
        s.delete("g1")
        return s

    probe = OpLog(MemoryDevice(GEOMETRY))          # a twin run counts the writes up to the record
    s = setup(probe)
    probe.ops.clear()
    s.gc(force=True)
    writes = [o for o in probe.ops if o[0] == "write"]
    upto = next(i for i, o in enumerate(writes) if o[2] == "m ") + 1
    s.close()

    dev = FaultyDevice(MemoryDevice(GEOMETRY), torn_blocks=None, keep_unflushed=True)
    s = setup(dev)
    victims = [z.index for z in s.table if z.cond == ZoneCond.FULL and z.dead]
    _crash(dev, s, after=upto)                      # the move record lands; its flush fails
    with pytest.raises(PowerCutError):
        s.gc(force=True)
    _drop(s)
    dev.reboot()
    assert all(dev.zone(v).cond != ZoneCond.EMPTY for v in victims)   # resets never ran
    with Store.open(dev) as s2:
        assert set(victims) <= set(s2.recovery.zones_reset)
        for i in (0, 2):
            assert b"".join(s2.read_shard(f"g{i}", "s")) == bytes([65 + i]) * 30000
            assert all(e[0] not in victims for e in s2.generation(f"g{i}").shards["s"].extents)
        assert s2.fsck().ok and s2.table.key() == s2.recompute_table().key()


def test_finish_recovery_keeps_writing_at_the_write_pointer_past_uncommitted_bytes():
    dev = FaultyDevice(MemoryDevice(GEOMETRY), torn_blocks=0, keep_unflushed=True)
    s = Store.format(dev)
    w = s.begin_generation("a", 1)
    w.write_shard("s", [b"a" * 10000])
    w.commit()
    z = s.generation("a").shards["s"].extents[0][0]
    w = s.begin_generation("lost", 2)
    w.write_shard("s", [b"b" * 8000])           # 2 blocks after a's 3, never committed
    _crash(dev, s)
    with pytest.raises(PowerCutError):
        w.write_shard("t", [b"c" * 100])
    _drop(s)
    dev.reboot()
    assert dev.zone(z).cond == ZoneCond.CLOSED       # the power cycle closed it
    with Store.open(dev) as s2:
        summ = s2.table[z]
        assert (summ.cond, summ.written, summ.live, summ.dead) == (ZoneCond.IMP_OPEN, 5 * 4096, 3 * 4096,
                                                                  2 * 4096)
        assert s2.recovery.dead_bytes_found == 2 * 4096
        w = s2.begin_generation("b", 3)
        info = w.write_shard("s", [b"d" * 100])
        w.commit()
        assert info.extents[0][:2] == (z, 5 * 4096)     # written at the device write pointer
        assert [g.id for g in s2.generations()] == ["a", "b"]


def test_zones_holding_only_uncommitted_data_are_reset():
    dev = FaultyDevice(MemoryDevice(GEOMETRY), torn_blocks=0, keep_unflushed=True)
    s = Store.format(dev)
    w = s.begin_generation("lost", 1)
    w.write_shard("s", [b"x" * 100000])
    zones = {e[0] for e in w.gen.shards["s"].extents}
    _crash(dev, s)
    with pytest.raises(PowerCutError):
        w.commit()                      # the flush before the commit record fails
    _drop(s)
    dev.reboot()
    with Store.open(dev) as s2:
        assert s2.generations() == [] and set(s2.recovery.zones_reset) == zones
        assert s2.table.written == 0 and s2.table.n_empty == len(s2.table)


def test_a_crash_during_recovery_is_recovered_again():
    dev = FaultyDevice(MemoryDevice(GEOMETRY), torn_blocks=1, keep_unflushed=True)
    # 4 meta zones: store format 5 keeps room for the next record's two copies beside the snapshot,
    # so the 2-block "torn" commit record no longer passes the admission of 3 meta zones of 12 blocks
    s = Store.format(dev, meta_zones=4)
    for op in workload("basic")[:8]:
        if op[0] == "begin":
            w = s.begin_generation(op[1], op[2], hint=Hint(reclaim_step=op[3]))
        elif op[0] == "write":
            w.write_shard(op[2], [b"z" * op[3]])
        elif op[0] == "commit":
            w.commit()
    w = s.begin_generation("torn", 99)
    for j in range(20):
        w.write_shard(f"{j}-" + "n" * 200, [b"q"])
    if s.journal.room() < 8 * 4096:
        s.journal.roll()                # room for the record: it is the commit's first write
    _crash(dev, s)
    with pytest.raises(PowerCutError):
        w.commit()                      # torn commit record: the mount will roll
    _drop(s)
    dev.reboot()
    _crash(dev, None)                   # cut the mount's rollover write too
    with pytest.raises(PowerCutError):
        Store.open(dev)
    dev.reboot()
    with Store.open(dev) as s2:
        assert [g.id for g in s2.generations()] == ["g0", "g1"]
        assert s2.fsck().ok


def test_committed_data_missing_on_the_device_is_an_error_not_silence():
    dev = MemoryDevice(GEOMETRY)
    with Store.format(dev) as s:
        w = s.begin_generation("a", 1)
        w.write_shard("s", [b"a" * 5000])
        w.commit()
        z = s.generation("a").shards["s"].extents[0][0]
    dev.zone_op(ZoneOp.RESET, z)
    with pytest.raises(CorruptJournalError, match=f"zone {z} is empty on the device"):
        Store.open(dev)


def test_campaign_detects_a_replacement_that_deletes_the_old_version_first(monkeypatch):
    """The replace workload's checker: a store that retires the old ``last`` when the replacement
    begins (not at its commit) loses both versions at a cut in between; those points fail."""
    real = Store.begin_generation

    def delete_first(self, gen_id, step, *, replace=False, **kw):
        if replace and gen_id in {g.id for g in self.generations()}:
            self.delete(gen_id, step=step)
        return real(self, gen_id, step, **kw)

    monkeypatch.setattr(Store, "begin_generation", delete_first)
    rep = campaign("replace", seed=0)
    assert any("committed set" in f and "'last'" in f.split("expected all of")[1] for f in rep.failures)


def test_campaign_detects_a_hint_update_that_is_not_journaled(monkeypatch):
    """The hint workload's checker: an update kept in memory only is lost by every later cut."""
    def in_memory(self, gen_id, hint, *, step=None):
        self.generation(gen_id).hint = hint

    monkeypatch.setattr(Store, "update_hint", in_memory)
    rep = campaign("hint", seed=0)
    assert rep.failures and all("reclaim step" in f and "expected one of" in f for f in rep.failures)


def test_finishes_and_their_unused_capacity_are_counted_and_survive_a_reopen():
    """``dedicated`` gives each generation its own zone and finishes the oldest open one when the
    active-zone budget (4 - the journal's 1) is spent: each finish is counted and charged the
    zone's remaining capacity, and the journaled counters come back at the next open."""
    dev = MemoryDevice(GEOMETRY)
    cap = GEOMETRY.zone_capacity
    with Store.format(dev, policy="dedicated") as s:
        budget = s.zones.max_active
        for i in range(budget + 2):
            w = s.begin_generation(f"g{i}", i)
            w.write_shard("s", [bytes([65 + i]) * 20000])          # 5 blocks of a zone
            w.commit()
        finished = sorted(z.index for z in s.table if z.cond == ZoneCond.FULL)
        assert len(finished) == 2 and s.metrics.finishes == 2
        assert s.metrics.unused_capacity_bytes == 2 * (cap - 5 * 4096) == s.table.unused
        assert s.table[finished[0]].opened_step == 0                # g0's step, in a fresh store
        steps = s.metrics.unused_capacity_byte_steps
        now = s.zones.now
        s.advance(now + 10)
        s.advance(now + 10)                                           # not later: nothing
        s.advance(now + 15)                                           # lost capacity x steps held
        assert s.metrics.unused_capacity_byte_steps == steps + 15 * s.table.unused
        before = s.metrics.to_dict()
    with Store.open(dev) as s2:
        assert s2.metrics.finishes == 2 and s2.metrics.unused_capacity_bytes == 2 * (cap - 5 * 4096)
        assert sorted(z.index for z in s2.table if z.cond == ZoneCond.FULL) == finished
        assert s2.table.unused == 2 * (cap - 5 * 4096)
        assert s2.metrics.to_dict() == before                        # every counter, resumed


@pytest.mark.parametrize("reopen", [False, True])
def test_a_replayed_replacement_leaves_the_old_zone_to_the_generations_still_in_it(reopen):
    """x shares zone A with y; x is replaced by a version in zone B.  A hint update of y, now alone in
    A, sets A's reclaim step to y's (a shared zone keeps the latest); the same after a reopen that
    replays the replacing commit record."""
    dev = MemoryDevice(GEOMETRY)

    def put(s, gid, step, reclaim, n, replace=False):
        w = s.begin_generation(gid, step, hint=Hint(reclaim_step=reclaim), replace=replace)
        w.write_shard("s", [bytes([step]) * n])
        return w.commit()

    s = Store.format(dev, policy="greedy")
    put(s, "x", 1, 100, 8192)
    put(s, "y", 2, 100, 40960)                     # fills zone A with x
    put(s, "x", 3, 500, 8192, replace=True)
    a, b = s.generation("y").shards["s"].extents[0][0], s.generation("x").shards["s"].extents[0][0]
    assert a != b
    if reopen:
        s.close()
        s = Store.open(dev)
        assert s.recovery.records > 3              # the replacing commit is replayed, not snapshotted
    s.update_hint("y", Hint(reclaim_step=50))
    assert (s.table[a].reclaim_step, s.table[b].reclaim_step) == (50, 500)
    assert s.table.key() == s.recompute_table().key()
    s.close()


def test_interrupted_replacement_resets_are_redone_at_mount():
    """The replacing commit record lands, the power goes before the old version's zones are reset:
    the mount resets them (the record names them) and charges no live data to them."""
    dev = FaultyDevice(MemoryDevice(GEOMETRY), torn_blocks=None, keep_unflushed=True)
    s = Store.format(dev)
    w = s.begin_generation("a", 1)
    w.write_shard("s", [b"a" * (2 * GEOMETRY.zone_capacity)])     # two whole zones
    w.commit()
    old = sorted({e[0] for e in s.generation("a").shards["s"].extents})
    w = s.begin_generation("a", 2, replace=True)
    w.write_shard("s", [b"b" * 5000])
    new = w.gen.shards["s"].extents[0][0]
    assert new not in old
    _crash(dev, s)                     # the commit record lands; the flush after it fails
    with pytest.raises(PowerCutError):
        w.commit()
    _drop(s)
    dev.reboot()
    assert all(dev.zone(z).cond != ZoneCond.EMPTY for z in old)     # resets never ran
    with Store.open(dev) as s2:
        assert [(g.id, g.step) for g in s2.generations()] == [("a", 2)]
        assert b"".join(s2.read_shard("a", "s")) == b"b" * 5000
        assert s2.recovery.zones_reset == old and len(old) == 2
        assert all(dev.zone(z).cond == ZoneCond.EMPTY and s2.table[z].written == 0 for z in old)
        assert s2.fsck().ok and s2.table.key() == s2.recompute_table().key()


@pytest.mark.parametrize("readonly", [False, True])
def test_a_write_pointer_below_any_committed_extent_end_is_data_lost(readonly):
    """Two writers share a zone: b's shard lands first (blocks 0-1), a's after it (blocks 2-4), a
    commits first.  A device whose write pointer is back at block 4 lost the end of a's extent,
    the highest one though not the last in commit order: the mount refuses, naming both ends; an
    empty zone is refused likewise."""
    dev = MemoryDevice(GEOMETRY)
    with Store.format(dev, policy="greedy") as s:    # the one log: both writers in one zone
        wa, wb = s.begin_generation("a", 1), s.begin_generation("b", 1)
        wb.write_shard("s", [b"b" * 5000])
        wa.write_shard("s", [b"a" * 10000])
        wa.commit()
        wb.commit()
        z = s.generation("a").shards["s"].extents[0][0]
        assert [s.generation(g).shards["s"].extents[0][:2] for g in "ab"] == [(z, 8192), (z, 0)]
    dev.zone_op(ZoneOp.RESET, z)
    dev.write(z * GEOMETRY.zone_size, b"\0" * 16384)
    want = (f"zone {z}: the device write pointer (16384 bytes in) is below the end of a committed extent "
            f"(20480): data lost")
    with pytest.raises(CorruptJournalError, match=f"^{re.escape(want)}$"):
        Store.open(dev, readonly=readonly)
    dev.zone_op(ZoneOp.RESET, z)
    want = f"zone {z} is empty on the device but the journal has 20480 bytes of committed data in it: data lost"
    with pytest.raises(CorruptJournalError, match=f"^{re.escape(want)}$"):
        Store.open(dev, readonly=readonly)


def _dead(key: tuple) -> tuple:
    """A zone summary key with its live bytes counted dead."""
    idx, cap, cond, written, live, dead, *rest = key
    return (idx, cap, cond, written, 0, dead + live, *rest)


@pytest.mark.parametrize("finished", [False, True])
def test_zones_holding_only_uncommitted_data_after_a_crash_readonly_and_read_write(finished):
    """``a`` (step 1) is never committed; the commit records after it journal its zone's attributes
    (``dedicated`` finishes that zone when a third generation opens one); ``c`` (step 6) writes a
    zone no record ever names.  A read-only open shows a's zone as the store had it, all dead, and
    c's zone from the device alone (written to its write pointer, last written at the latest step
    the journal knows); a read-write open resets both, charging a part-empty zone's unused capacity
    from its journaled last write to the journal's time."""
    dev = FaultyDevice(MemoryDevice(GEOMETRY), torn_blocks=None, keep_unflushed=True)
    s = Store.format(dev, policy="dedicated")
    wa = s.begin_generation("a", 1, hint=Hint(reclaim_step=100))
    wa.write_shard("s", [b"a" * 8192])
    za = wa.gen.shards["s"].extents[0][0]
    for i in range(3 if finished else 1):
        w = s.begin_generation(f"b{i}", 2 + i)
        w.write_shard("s", [b"b" * 8192])
        w.commit()
    now = s.zones.now
    assert s.table[za].cond == (ZoneCond.FULL if finished else ZoneCond.IMP_OPEN)
    had = s.table[za].key()
    assert had[3:] == (8192, 8192, 0, 100, 0, 1, 1, 1)
    wc = s.begin_generation("c", 6)
    wc.write_shard("s", [b"c" * 4096])
    zc = wc.gen.shards["s"].extents[0][0]
    dev.cut_now()
    _drop(s)
    dev.reboot()
    cap = GEOMETRY.zone_capacity
    with Store.open(dev, readonly=True) as r:
        assert r.zones.now == now
        assert r.table[za].key() == _dead(had)
        assert r.table[zc].key() == (zc, cap, ZoneCond.IMP_OPEN, 4096, 0, 4096, None, 0, 0, 0, now)
        assert r.recovery.repairs == [f"reset data zone {za} (8192 bytes written, no committed data)",
                                      f"reset data zone {zc} (4096 bytes written, no committed data)"]
        assert r.recovery.zones_reset == []
        # the metrics as last journaled (a snapshot or sync record: with format 5's two copies a
        # rollover follows a's finish and journals its charge when it is finished)
        base = (r.metrics.unused_capacity_bytes, r.metrics.unused_capacity_byte_steps)
        assert base == ((cap - 8192, 0) if finished else (0, 0))
    with Store.open(dev) as r:
        assert r.recovery.zones_reset == [za, zc] and r.recovery.repairs == []
        assert r.table[za].written == r.table[zc].written == 0
        m = r.metrics
        assert m.resets == 2
        unused_a = 0 if finished else cap - 8192              # a finished zone was charged at its finish
        assert m.unused_capacity_bytes == base[0] + unused_a + cap - 4096
        assert m.unused_capacity_byte_steps == base[1] + unused_a * (now - 1)
        assert r.table.key() == r.recompute_table().key()


def test_bytes_past_the_committed_data_are_dead_whether_the_zone_is_open_or_full():
    """What a crash leaves after the last record, written straight to the device after a clean
    close: 1 and 2 blocks past b's and c's data (their zones stay open), and the rest of d's zone
    (full, its finish never journaled: written to capacity).  a's zone was finished and journaled so
    (written = its finish point, nothing dead).  Each zone is kept with those bytes dead, and the
    report sums them."""
    dev = MemoryDevice(GEOMETRY)
    cap, bs = GEOMETRY.zone_capacity, GEOMETRY.block_size
    with Store.format(dev, policy="dedicated") as s:
        for i, g in enumerate("abcd"):
            w = s.begin_generation(g, i)
            w.write_shard("s", [g.encode() * 8192])
            w.commit()
        zone = {g: s.generation(g).shards["s"].extents[0][0] for g in "abcd"}
        assert s.table[zone["a"]].cond == ZoneCond.FULL
    for g, n in (("b", bs), ("c", 2 * bs), ("d", cap - 8192)):
        dev.write(dev.zone(zone[g]).wp, b"\xee" * n)
    assert dev.zone(zone["d"]).cond == ZoneCond.FULL
    with Store.open(dev) as s:
        got = {g: (s.table[z].cond, s.table[z].written, s.table[z].live, s.table[z].dead) for g, z in zone.items()}
        assert got == {"a": (ZoneCond.FULL, 8192, 8192, 0), "b": (ZoneCond.IMP_OPEN, 8192 + bs, 8192, bs),
                       "c": (ZoneCond.IMP_OPEN, 8192 + 2 * bs, 8192, 2 * bs),
                       "d": (ZoneCond.FULL, cap, 8192, cap - 8192)}
        assert s.recovery.dead_bytes_found == 3 * bs + cap - 8192 == s.table.dead
        assert s.recovery.zones_reset == []
        assert all(b"".join(s.read_shard(g, "s")) == g.encode() * 8192 for g in "abcd")
        assert s.table.key() == s.recompute_table().key()
        assert s.zones.now == 3                      # the journal's latest step (d's)
        # the last write step: the journaled one where the device holds nothing more, else the
        # latest step the journal knows
        assert {g: s.table[z].last_write_step for g, z in zone.items()} == {"a": 0, "b": 3, "c": 3, "d": 3}
        table = s.table.key()
    with Store.open(dev) as s:                       # the close journaled what the open found
        assert s.recovery.dead_bytes_found == 0 and s.table.key() == table


def test_a_device_without_an_active_zone_limit_leaves_data_zones_unlimited():
    """``max_active=0`` (no limit): the data zones get no budget either, so ``dedicated`` opens a
    zone per generation and never finishes one; a limit of 4 leaves data 3 (the journal keeps one)."""
    from retainz.zoned import Geometry

    g = Geometry(nr_zones=12, zone_size=64 * 1024, zone_capacity=48 * 1024, block_size=4096, max_open=0,
                 max_active=0)
    with Store.format(MemoryDevice(g), policy="dedicated") as s:
        assert (s.zones.max_active, s.table.max_active, s.table.reserved_active) == (0, 0, 0)
        for i in range(6):
            w = s.begin_generation(f"g{i}", i)
            w.write_shard("s", [b"x" * 8192])
            w.commit()
        assert len(s.table.open) == 6 and s.metrics.finishes == 0
    with Store.format(MemoryDevice(GEOMETRY), policy="dedicated") as s:
        assert (s.zones.max_active, s.table.max_active, s.table.reserved_active) == (3, 3, 1)
