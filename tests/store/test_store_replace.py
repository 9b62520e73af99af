"""Replace-on-commit: a generation written with ``replace=True`` over a committed one of the same id
leaves the old one visible and intact until the new one's commit record is durable; one record
retires the old and commits the new, so a power cut at any write boundary, in any state the cut can
leave, leaves exactly one of the two, byte-exact."""

from __future__ import annotations

import copy
import random

import pytest

from retainz.errors import GenerationExistsError, PowerCutError
from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice
from retainz.zoned.faulty import FaultyDevice, power_cut_states

KiB = 1024
GEOM = Geometry(nr_zones=12, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=3,
                max_active=4)
OLD = {"model": random.Random(1).randbytes(30 * KiB), "optim": random.Random(2).randbytes(9000)}
NEW = {"model": random.Random(3).randbytes(41 * KiB), "extra": random.Random(4).randbytes(100)}


def contents(s: Store, gid: str) -> dict[str, bytes]:
    return {name: b"".join(s.read_shard(gid, name)) for name in s.generation(gid).shards}


def write(s: Store, gid: str, step: int, shards: dict, **kw) -> None:
    w = s.begin_generation(gid, step, hint=Hint(reclaim_step=step + 100), **kw)
    for name, data in shards.items():
        w.write_shard(name, [data[:1000], data[1000:]])
    w.commit()


def test_the_old_version_is_readable_until_the_commit_and_then_only_the_new():
    with Store.format(MemoryDevice(GEOM)) as s:
        write(s, "last", 10, OLD)
        with pytest.raises(GenerationExistsError, match="replace=True"):
            s.begin_generation("last", 20)
        w = s.begin_generation("last", 20, replace=True)
        with pytest.raises(GenerationExistsError, match="being written"):
            s.begin_generation("last", 20, replace=True)
        w.write_shard("model", [NEW["model"]])
        assert contents(s, "last") == OLD and s.generation("last").step == 10
        w.write_shard("extra", [NEW["extra"]])
        w.commit()
        assert contents(s, "last") == NEW and s.generation("last").step == 20
        assert s.metrics.generations_deleted == 1 and s.fsck().ok
        assert s.table.key() == s.recompute_table().key()
    # the record replays to the same state
    dev = s.device
    with Store.open(dev) as s2:
        assert contents(s2, "last") == NEW and len(s2.generations()) == 1 and s2.fsck().ok


def test_an_aborted_replacement_leaves_the_old_version():
    with Store.format(MemoryDevice(GEOM)) as s:
        write(s, "last", 10, OLD)
        w = s.begin_generation("last", 20, replace=True)
        w.write_shard("model", [NEW["model"]])
        w.abort()
        assert contents(s, "last") == OLD and s.fsck().ok


def test_the_old_version_deleted_meanwhile_makes_a_plain_commit():
    with Store.format(MemoryDevice(GEOM)) as s:
        write(s, "last", 10, OLD)
        w = s.begin_generation("last", 20, replace=True)
        s.delete("last", step=15)
        w.write_shard("model", [NEW["model"]])
        w.commit()
        assert contents(s, "last") == {"model": NEW["model"]} and s.metrics.generations_deleted == 1


def _replace_run(dev, cut_after: int | None):
    """Format, commit the old version (flushed), then replace it; the power goes ``cut_after``
    writes into the replacement.  Returns whether the replacement's commit returned."""
    s = Store.format(dev)
    write(s, "last", 10, OLD)
    write(s, "other", 11, {"o": b"o" * 5000})
    if cut_after is not None:
        dev.cut_after_writes = dev.writes + cut_after
    try:
        write(s, "last", 20, NEW, replace=True)
        s.close()
        return True
    except PowerCutError:
        return False


def test_a_power_cut_at_every_write_of_a_replacement_leaves_exactly_one_version():
    dry = FaultyDevice(MemoryDevice(GEOM))
    s = Store.format(dry)
    write(s, "last", 10, OLD)
    write(s, "other", 11, {"o": b"o" * 5000})
    start = dry.writes
    write(s, "last", 20, NEW, replace=True)
    boundaries = dry.writes - start
    # two shards' extents, a rollover (its snapshot: one write) and the commit record's two copies
    # (format 5: a write each; the two copies fill the old chain zone, so the roll comes first)
    assert boundaries == 5
    outcomes = {"old": 0, "new": 0}
    points = 0
    for k in range(1, boundaries + 1):
        dev = FaultyDevice(MemoryDevice(GEOM))
        acked = _replace_run(dev, k)
        assert not acked
        for keep in power_cut_states(dev.unflushed(), enumerate_up_to=16, samples=4, rng=random.Random(k)):
            d = FaultyDevice(copy.deepcopy(dev.inner))
            d.reboot(keep)
            with Store.open(d) as back:
                got = contents(back, "last")
                assert got in (OLD, NEW), f"cut at write {k}: neither version"
                assert contents(back, "other") == {"o": b"o" * 5000}
                assert back.fsck().ok and back.table.key() == back.recompute_table().key()
                outcomes["old" if got == OLD else "new"] += 1
            points += 1
    assert outcomes["old"] and outcomes["new"] and points > boundaries


def test_the_commit_record_retires_the_old_version_and_names_its_zones_for_a_replay_after_a_crash():
    """No sync record (power cut right after the commit): the replay of the replacing commit record
    alone retires the old version, resets the zones it held alone, and repairs nothing."""
    dev = FaultyDevice(MemoryDevice(GEOM))
    s = Store.format(dev)
    write(s, "last", 10, {"model": random.Random(5).randbytes(48 * KiB)})      # one zone of its own
    old_zones = {e[0] for sh in s.generation("last").shards.values() for e in sh.extents}
    w = s.begin_generation("last", 20, hint=Hint(reclaim_step=120), replace=True)
    for name, data in NEW.items():
        w.write_shard(name, [data])
    w.commit()
    assert len(old_zones) == 1 and all(s.table[z].written == 0 for z in old_zones)    # reset at the commit
    key = s.table.key()
    dev.cut_now()
    with pytest.raises(PowerCutError):
        s.close()
    dev.reboot()
    with Store.open(dev) as back:
        assert back.recovery.repairs == [] and back.table.key() == key and back.fsck().ok
        assert contents(back, "last") == NEW and back.generation("last").step == 20
        assert len(back.generations()) == 1 and not any(z in back.catalog.zone_gens for z in old_zones)
        # the freed zone is reused by a generation alone in it: a new hint sets its reclaim step
        w = back.begin_generation("x", 30, hint=Hint(reclaim_step=500))
        w.write_shard("model", [bytes(48 * KiB)])
        w.commit()
        assert {e[0] for e in back.generation("x").shards["model"].extents} == old_zones
        back.update_hint("x", Hint(reclaim_step=50))
        assert [back.table[z].reclaim_step for z in old_zones] == [50]
