"""The previous journal chain as the second copy of the current snapshot (store format 5;
docs/format.md, "Which copy is used"; :mod:`retainz.store.journal`, "Previous chain").

A snapshot's generation and zone batches (``sg``, ``sz``) are written once; the chain the rollover
replaced is kept until the next rollover, and a mount that finds a batch damaged replays that chain
(its snapshot and appended records, up to the ``q`` the current snapshot head carries) in its place,
then the current chain's appended records.  Format 4 lost the batch's generations (named by count).
"""

from __future__ import annotations

import pytest

from retainz.errors import CorruptJournalError
from retainz.store import Store
from retainz.store.records import Kind, kind_of, unframe
from retainz.zoned import Geometry, MemoryDevice

KiB = 1024
BS = 4096
GEOM = Geometry(nr_zones=24, zone_size=128 * KiB, zone_capacity=96 * KiB, block_size=BS, max_open=4,
                max_active=6)


def _put(s: Store, gid: str, step: int) -> None:
    w = s.begin_generation(gid, step)
    w.write_shard("a", [bytes([step]) * 6000])
    w.commit()


def _build() -> MemoryDevice:
    """g0..g5 committed, a rollover (its snapshot holds them), then g1 deleted and g6 committed in
    the new chain; closed cleanly."""
    dev = MemoryDevice(GEOM)
    with Store.format(dev) as s:
        for i in range(6):
            _put(s, f"g{i}", i)
        s.journal.roll()
        s.delete("g1", step=7)
        _put(s, "g6", 8)
        assert s.metrics.rollovers == 1
    return dev


def _frames(dev: MemoryDevice, zone: int) -> list[tuple[int, Kind | None]]:
    """``(byte in the zone, kind)`` of every frame of a chain zone (both copies of a record)."""
    z = dev.zone(zone)
    written = z.capacity if z.cond.name == "FULL" else z.wp - z.start
    buf = dev.read(z.start, written)
    out, pos = [], 2 * BS
    while pos + 8 <= written:
        n, total, ok = unframe(buf, pos, written, BS)
        if not total:
            break
        out.append((pos, kind_of(bytes(buf[pos + 8:pos + 8 + min(n, 16)]))))
        pos += total
    return out


def _chains(dev: MemoryDevice) -> tuple[list[int], list[int]]:
    with Store.open(dev, readonly=True) as s:
        return s.journal.chain, s.journal.previous


def _zero(dev: MemoryDevice, zone: int, off: int) -> None:
    dev._data[zone][off:off + BS] = bytes(BS)


LIVE = ["g0", "g2", "g3", "g4", "g5", "g6"]
STEP = {"g0": 0, "g2": 2, "g3": 3, "g4": 4, "g5": 5, "g6": 8}


@pytest.mark.parametrize("kind", [Kind.GENS, Kind.ZONES])
def test_a_lost_snapshot_batch_is_replayed_from_the_previous_chain(kind):
    """The current chain's only ``sg`` (``sz``) block zeroed: both opens keep every generation, g1
    stays deleted (its deletion follows the snapshot), the note names the previous chain, and a
    repair rewrites both chains (fsck then finds nothing to note)."""
    dev = _build()
    (z,), (p,) = _chains(dev)
    batch = [off for off, k in _frames(dev, z) if k is kind]
    assert len(batch) == 1
    _zero(dev, z, batch[0])
    for readonly in (True, False):
        with Store.open(dev, readonly=readonly) as s:
            assert [g.id for g in s.generations()] == LIVE
            assert [b"".join(s.read_shard(g, "a"))[:1] for g in LIVE] == [bytes([STEP[g]]) for g in LIVE]
            assert [n for n in s.recovery.copies if f"the previous journal chain (sequence 1, meta zones [{p}])"
                    in n and n.startswith(f"meta zone {z}: ")], s.recovery.copies
            assert s.fsck().ok
    with Store.open(dev, repair=True) as s:
        assert [g.id for g in s.generations()] == LIVE and s.recovery.dropped == []
    with Store.open(dev, readonly=True) as s:
        assert [g.id for g in s.generations()] == LIVE and s.fsck().notes == []


def test_a_damaged_previous_chain_is_named_by_fsck_and_costs_nothing():
    """Both copies of a commit record of the previous chain zeroed: the mount does not need it;
    fsck names it."""
    dev = _build()
    (z,), (p,) = _chains(dev)
    for off in [off for off, k in _frames(dev, p) if k is Kind.COMMIT][:2]:
        _zero(dev, p, off)
    with Store.open(dev, readonly=True) as s:
        assert [g.id for g in s.generations()] == LIVE and s.recovery.copies == []
        assert [n for n in s.fsck().notes if n.startswith(f"meta zone {p}: ") and "previous journal chain" in n]


def test_a_damaged_current_chain_is_never_passed_over_for_the_previous_one():
    """Both copies of the deletion record after the snapshot zeroed (two faults): the previous chain
    is complete, but falling back to it would lose the chain's records (g1's deletion, g6): the
    open refuses, naming the record, and a repair keeps g1 out of every listing."""
    dev = _build()
    (z,), _ = _chains(dev)
    for off in [off for off, k in _frames(dev, z) if k is Kind.DELETE]:
        _zero(dev, z, off)
    for readonly in (True, False):
        with pytest.raises(CorruptJournalError, match=f"^meta zone {z}: a zeroed block at byte "):
            Store.open(dev, readonly=readonly)
    with Store.open(dev, repair=True):
        pass
    with Store.open(dev, readonly=True) as s:
        assert "g1" not in [g.id for g in s.generations()] and "g6" in [g.id for g in s.generations()]


def test_a_snapshot_batch_lost_with_its_previous_chain_damaged_too_is_salvaged_naming_the_loss():
    """Two faults: the current chain's ``sg`` block and a block of the previous chain: the previous
    chain cannot stand for the snapshot; the open refuses, and the repair names what it lost."""
    dev = _build()
    (z,), (p,) = _chains(dev)
    _zero(dev, z, next(off for off, k in _frames(dev, z) if k is Kind.GENS))
    for off in [off for off, k in _frames(dev, p) if k is Kind.COMMIT][:2]:    # g0's commit, both copies
        _zero(dev, p, off)
    with pytest.raises(CorruptJournalError):
        Store.open(dev, readonly=True)
    with Store.open(dev, repair=True) as s:
        dropped = s.recovery.dropped
    assert dropped and all(d["id"] is None and d["count"] for d in dropped)
    with Store.open(dev, readonly=True) as s:
        assert [g.id for g in s.generations()] == ["g6"]
