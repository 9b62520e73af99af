"""Fault injection: FaultyDevice itself must cut, tear, fail and corrupt exactly as configured."""

from __future__ import annotations

import pytest

from retainz import errors
from retainz.zoned import FileDevice, MemoryDevice, ZoneCond
from retainz.zoned.faulty import FaultyDevice, power_cut_states
from tests.conftest import SMALL

BS = SMALL.block_size


def blk(seed: int, n: int = 1) -> bytes:
    return bytes([seed % 256]) * (n * BS)


def inner(kind, tmp_path):
    return MemoryDevice(SMALL) if kind == "memory" else FileDevice.create(tmp_path / "d.img", SMALL)


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_power_cut_after_nth_write_loses_later_writes(kind, tmp_path):
    dev = FaultyDevice(inner(kind, tmp_path), cut_after_writes=3)
    dev.write(0, blk(1))
    dev.write(BS, blk(2))
    dev.write(2 * BS, blk(3))  # the 3rd lands whole and returns
    assert dev.writes == 3
    with pytest.raises(errors.PowerCutError):
        dev.write(3 * BS, blk(4))
    for call in (dev.flush, lambda: dev.read(0, BS), lambda: dev.reset_zone(0), dev.report_zones):
        with pytest.raises(errors.PowerCutError):
            call()
    dev.reboot()
    assert dev.read(0, 4 * BS) == blk(1) + blk(2) + blk(3) + bytes(BS)
    assert dev.zone(0).cond == ZoneCond.CLOSED
    dev.write(3 * BS, blk(5))  # alive again, at the surviving write pointer
    dev.close()


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_power_cut_dropping_unflushed_keeps_only_flushed(kind, tmp_path):
    dev = FaultyDevice(inner(kind, tmp_path), cut_after_writes=3, keep_unflushed=False)
    dev.write(0, blk(1))
    dev.flush()
    dev.write(BS, blk(2))
    dev.write(SMALL.zone_size, blk(3))
    dev.reboot()
    assert dev.read(0, 2 * BS) == blk(1) + bytes(BS)
    assert dev.zone(1).cond == ZoneCond.EMPTY
    dev.close()


@pytest.mark.parametrize("torn", [0, 1, 2, 3, 7])
def test_torn_write_lands_exactly_its_first_blocks(torn):
    dev = FaultyDevice(MemoryDevice(SMALL), cut_after_writes=2, torn_blocks=torn)
    dev.write(0, blk(1))
    with pytest.raises(errors.PowerCutError, match="landed"):
        dev.write(BS, blk(2, 3))
    dev.reboot()
    landed = min(torn, 3)
    assert dev.zone(0).wp == (1 + landed) * BS
    assert dev.read(0, 4 * BS) == blk(1) + blk(2, landed) + bytes((3 - landed) * BS)


def test_torn_append_and_counted_writes():
    dev = FaultyDevice(MemoryDevice(SMALL, payload=False), cut_after_writes=1, torn_blocks=1)
    with pytest.raises(errors.PowerCutError):
        dev.append(2, 4 * BS)
    dev.reboot()
    assert dev.zone(2).wp == dev.zone(2).start + BS


def test_injected_io_errors_by_op_count_and_zone():
    dev = FaultyDevice(MemoryDevice(SMALL))
    dev.fail("write", after=1, count=1)
    dev.write(0, blk(1))
    with pytest.raises(errors.InjectedIOError):
        dev.write(BS, blk(2))
    dev.write(BS, blk(2))  # only one failure
    dev.fail("reset", zone=3, count=-1)
    dev.reset_zone(2)
    for _ in range(3):
        with pytest.raises(errors.InjectedIOError, match="zone 3"):
            dev.reset_zone(3)
    dev.fail("read")
    with pytest.raises(errors.InjectedIOError):
        dev.read(0, BS)
    assert dev.read(0, BS) == blk(1)
    with pytest.raises(ValueError, match="unknown operation"):
        dev.fail("teleport")


def test_read_corruption_flips_only_covering_reads():
    mem = MemoryDevice(SMALL)
    dev = FaultyDevice(mem)
    dev.write(0, blk(0xAA, 2))
    dev.corrupt(BS + 5, 0x01)
    got = dev.read(0, 2 * BS)
    assert got[BS + 5] == 0xAB and got[:BS + 5] == blk(0xAA, 2)[:BS + 5] and got[BS + 6:] == blk(0xAA, 2)[BS + 6:]
    assert dev.read(0, BS) == blk(0xAA)  # does not cover the byte
    assert mem.read(0, 2 * BS) == blk(0xAA, 2)  # the media is unchanged
    with pytest.raises(ValueError):
        dev.corrupt(0, 0)


def test_faulty_device_without_faults_is_transparent():
    dev = FaultyDevice(MemoryDevice(SMALL))
    assert dev.geometry == SMALL and dev.info.kind == "faulty(memory)"
    assert dev.append(1, blk(3)) == SMALL.zone_size
    dev.finish_zone(1)
    assert dev.zone(1).cond == ZoneCond.FULL


# -- what a power cut leaves: each zone a prefix of its unflushed writes, zones independent -------------

ZS = SMALL.zone_size


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_unflushed_lists_blocks_per_zone_since_the_last_flush_or_zone_operation(kind, tmp_path):
    dev = FaultyDevice(inner(kind, tmp_path))
    dev.write(0, blk(1))
    dev.flush()
    dev.write(BS, blk(2, 2))
    dev.write(ZS, blk(3, 3))
    dev.write(2 * ZS, blk(4))
    dev.finish_zone(2)                     # a finish is durable on completion, with its writes
    assert dev.unflushed() == {0: 2, 1: 3}
    dev.flush()
    assert dev.unflushed() == {}
    dev.close()


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_reboot_keeps_exactly_the_chosen_prefix_of_each_zone(kind, tmp_path):
    dev = FaultyDevice(inner(kind, tmp_path))
    dev.write(0, blk(1))
    dev.flush()
    dev.write(BS, blk(2) + blk(3))         # zone 0: 2 unflushed blocks
    dev.write(ZS, blk(4) + blk(5) + blk(6))  # zone 1: 3
    dev.write(2 * ZS, blk(7))              # zone 2: 1
    dev.cut_now()
    dev.reboot({0: 0, 1: 2})               # zone 0 loses its writes, zone 1 keeps 2 of 3, zone 2 none
    assert [dev.zone(z).wp - z * ZS for z in range(3)] == [BS, 2 * BS, 0]
    assert [dev.zone(z).cond for z in range(3)] == [ZoneCond.CLOSED, ZoneCond.CLOSED, ZoneCond.EMPTY]
    assert dev.read(0, 2 * BS) == blk(1) + bytes(BS)
    assert dev.read(ZS, 3 * BS) == blk(4) + blk(5) + bytes(BS)
    assert dev.unflushed() == {}
    dev.write(2 * BS + ZS, blk(8))         # writable at the surviving write pointer
    dev.close()


def test_reboot_can_leave_a_later_zone_durable_and_an_earlier_one_lost():
    """The reordering a write cache allows: the second write (another zone) persists, the first not."""
    dev = FaultyDevice(MemoryDevice(SMALL))
    dev.write(ZS, blk(1, 2))               # "data"
    dev.write(0, blk(2))                   # "commit record", written after it
    dev.cut_now()
    dev.reboot({0: 1})
    assert dev.read(0, BS) == blk(2) and dev.zone(1).cond == ZoneCond.EMPTY


def test_power_cut_states_enumerates_every_prefix_combination_when_few():
    states = power_cut_states({3: 2, 7: 1}, enumerate_up_to=6)
    keys = [(s.get(3, 0), s.get(7, 0)) for s in states]
    assert sorted(keys) == [(a, b) for a in range(3) for b in range(2)]
    assert keys[0] == (2, 1) and keys[-1] == (0, 0)           # the extremes: all kept ... none kept
    assert all(0 not in s.values() for s in states)          # zones that keep nothing are left out
    assert power_cut_states({}) == [{}]


def test_power_cut_states_samples_each_zone_alone_kept_and_alone_lost():
    import random

    unflushed = {0: 1, 4: 5, 5: 3, 6: 2}
    states = power_cut_states(unflushed, enumerate_up_to=6, samples=5, rng=random.Random(1))
    assert states[0] == unflushed and states[1] == {}
    for z, n in unflushed.items():
        assert {z: n} in states                                      # only z persisted
        assert {y: m for y, m in unflushed.items() if y != z} in states  # only z lost
    keys = [tuple(s.get(z, 0) for z in unflushed) for s in states]
    assert len(set(keys)) == len(keys) <= 2 + 2 * 4 + 5
    assert all(0 <= s.get(z, 0) <= n for s in states for z, n in unflushed.items())
    assert states == power_cut_states(unflushed, enumerate_up_to=6, samples=5, rng=random.Random(1))
