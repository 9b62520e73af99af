"""Read-only open: a crashed store is served (generations, read_shard, fsck, df) without a single
write to the device; fsck lists what a read-write open then repairs."""

from __future__ import annotations

import hashlib
import random

import pytest

from retainz.cli import main as cli_main
from retainz.errors import PowerCutError, ReadOnlyStoreError
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice
from retainz.zoned.faulty import FaultyDevice

KiB = 1024
GEOM = Geometry(nr_zones=12, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=4,
                max_active=5)
G1 = random.Random(1).randbytes(40 * KiB)


def crash(base) -> FaultyDevice:
    """g1 committed; g2 (20 long-named 4 KiB shards: zone 4's tail, zones 5 and 6 (zones 0-3 meta)) cut while its
    two-block commit record is written (one block of its first copy lands: a torn tail)."""
    dev = FaultyDevice(base)
    # 4 meta zones: store format 5 keeps room for the next record's two copies beside the snapshot,
    # so g2's 2-block commit record no longer passes the journal admission of 3 meta zones of 12 blocks
    s = Store.format(dev, meta_zones=4)
    w = s.begin_generation("g1", 1)
    w.write_shard("model", [G1])
    w.commit()
    w = s.begin_generation("g2", 2)
    for j in range(20):
        w.write_shard(f"{j:02d}-" + "n" * 200, [bytes([j]) * 4096])
    if s.journal.room() < 8 * 4096:
        s.journal.roll()     # room for the record (two copies: format 5), so it is the commit's first write
    dev.cut_after_writes, dev.torn_blocks = dev.writes + 1, 1
    with pytest.raises(PowerCutError):
        w.commit()
    try:
        s.close()
    except PowerCutError:
        pass
    dev.reboot()
    return dev


def device_state(dev) -> tuple:
    zones = dev.report_zones()
    data = hashlib.sha256()
    for z in zones:
        n = z.capacity if z.cond.name == "FULL" else z.wp - z.start
        if n:
            data.update(dev.read(z.start, n))
    return [(z.index, z.cond, z.wp) for z in zones], data.hexdigest()


def use_readonly(dev) -> list[str]:
    with Store.open(dev, readonly=True) as s:
        assert [g.id for g in s.generations()] == ["g1"]
        assert b"".join(s.read_shard("g1", "model")) == G1
        rep = s.fsck()
        assert rep.ok and rep.repairs == s.recovery.repairs
        assert s.df().generations == 1
        for op in (lambda: s.begin_generation("x", 9), lambda: s.delete("g1"), lambda: s.gc(force=True)):
            with pytest.raises(ReadOnlyStoreError):
                op()
        return rep.repairs


def test_readonly_open_of_a_crashed_memory_store_writes_nothing():
    dev = crash(MemoryDevice(GEOM))
    before = device_state(dev)
    writes = dev.writes
    repairs = use_readonly(dev)
    assert device_state(dev) == before and dev.writes == writes
    assert repairs == ["reset data zone 5 (49152 bytes written, no committed data)",
                       "reset data zone 6 (24576 bytes written, no committed data)",
                       "roll the journal over to a fresh chain (drop a torn tail of 4096 bytes)"]
    with Store.open(dev) as s:                      # read-write: the repairs happen
        assert s.recovery.zones_reset == [5, 6] and s.recovery.rolled and s.recovery.repairs == []
        assert s.fsck().ok and [g.id for g in s.generations()] == ["g1"]


def test_readonly_open_of_a_crashed_file_store_leaves_the_file_unchanged(tmp_path, capsys):
    path = tmp_path / "dev.img"
    crash(FileDevice.create(path, GEOM)).close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with FileDevice(path, readonly=True) as dev:
        before = device_state(dev)
        repairs = use_readonly(dev)
        assert device_state(dev) == before
    assert len(repairs) == 3
    for cmd in (["ls", str(path)], ["df", str(path)], ["get", str(path), "g1", "-o", str(tmp_path / "o")]):
        assert cli_main(cmd) == 0
    assert (tmp_path / "o" / "model").read_bytes() == G1
    assert cli_main(["fsck", str(path)]) == 0
    out = capsys.readouterr().out
    assert "a read-write open would: reset data zone 5" in out and "clean" in out
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    with FileDevice(path) as dev, Store.open(dev) as s:
        assert s.recovery.zones_reset == [5, 6] and s.fsck().ok
    assert hashlib.sha256(path.read_bytes()).hexdigest() != digest


def test_a_readonly_store_refuses_every_change_with_one_line_and_its_close_writes_nothing():
    dev = MemoryDevice(GEOM)
    with Store.format(dev) as s:
        w = s.begin_generation("g1", 1)
        w.write_shard("model", [G1])
        w.commit()
    before = device_state(dev)
    s = Store.open(dev, readonly=True)
    assert s.readonly
    for op in (lambda: s.begin_generation("x", 9), lambda: s.delete("g1"), lambda: s.gc(),
               lambda: s.update_hint("g1", s.generation("g1").hint)):
        with pytest.raises(ReadOnlyStoreError, match=r"^memory: the store was opened read-only$"):
            op()
    s.close()
    assert device_state(dev) == before
    with Store.open(dev) as s:                 # read-write (the default) journals a sync record at close
        assert not s.readonly
    assert device_state(dev) != before
