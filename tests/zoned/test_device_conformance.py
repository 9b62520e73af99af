"""The zoned device conformance suite: every device kind must pass it.

Each test names the NVMe ZNS rule it checks (NVMe ZNS Command Set 1.1, section 2.1.1 zone state
machine; section 3.4 status values) and is written against the device's own geometry, so the same
tests run against a real /dev/nvmeXnY in the QEMU guest lane.
"""

from __future__ import annotations

import pytest

from retainz.errors import (
    InvalidZoneTransitionError,
    MisalignedIOError,
    OutOfRangeError,
    TooManyActiveZonesError,
    TooManyOpenZonesError,
    ZoneBoundaryError,
    ZoneFullError,
    ZoneInvalidWriteError,
)
from retainz.zoned import ZoneCond

E, IO, EO, C, F = ZoneCond.EMPTY, ZoneCond.IMP_OPEN, ZoneCond.EXP_OPEN, ZoneCond.CLOSED, ZoneCond.FULL


def blocks(dev, n: int, seed: int = 1) -> bytes:
    """n blocks of a recognisable pattern."""
    bs = dev.geometry.block_size
    return bytes(((seed * 131 + i * 7) % 251) for i in range(n * bs))


def conds(dev) -> list[ZoneCond]:
    return [z.cond for z in dev.report_zones()]


# -- report ---------------------------------------------------------------------------------------

def test_initial_report_every_zone_empty_with_capacity_below_size(any_device):
    dev = any_device
    g = dev.geometry
    zones = dev.report_zones()
    assert len(zones) == g.nr_zones
    for i, z in enumerate(zones):
        assert (z.index, z.start, z.size, z.capacity, z.wp, z.cond) == (
            i, i * g.zone_size, g.zone_size, g.zone_capacity, i * g.zone_size, E)
    assert g.zone_capacity < g.zone_size  # the suite's geometry exercises capacity < size


def test_report_range_and_out_of_range(any_device):
    dev = any_device
    n = dev.geometry.nr_zones
    assert [z.index for z in dev.report_zones(2, 3)] == [2, 3, 4]
    assert [z.index for z in dev.report_zones(n - 1)] == [n - 1]
    with pytest.raises(OutOfRangeError):
        dev.report_zones(n)
    with pytest.raises(OutOfRangeError):
        dev.report_zones(n - 1, 2)


# -- writes ---------------------------------------------------------------------------------------

def test_write_at_wp_opens_implicitly_and_advances_wp(any_device):
    dev = any_device
    bs = dev.geometry.block_size
    z1 = dev.zone(1)
    dev.write(z1.start, blocks(dev, 2))
    z = dev.zone(1)
    assert (z.cond, z.wp) == (IO, z1.start + 2 * bs)
    dev.write(z.wp, blocks(dev, 1, seed=2))
    assert dev.zone(1).wp == z1.start + 3 * bs


def test_write_not_at_wp_is_zone_invalid_write(any_device):
    dev = any_device
    bs = dev.geometry.block_size
    start = dev.zone(0).start
    with pytest.raises(ZoneInvalidWriteError) as ei:
        dev.write(start + bs, blocks(dev, 1))  # ahead of an empty zone's wp
    assert ei.value.zone == 0
    assert dev.zone(0).cond == E
    dev.write(start, blocks(dev, 2))
    with pytest.raises(ZoneInvalidWriteError):
        dev.write(start, blocks(dev, 1))  # behind the wp
    assert dev.zone(0).wp == start + 2 * bs


def test_write_past_capacity_is_zone_boundary_error_and_writes_nothing(any_device):
    dev = any_device
    g = dev.geometry
    start = dev.zone(2).start
    dev.write(start, blocks(dev, 1))
    n_left = g.zone_capacity // g.block_size - 1
    with pytest.raises(ZoneBoundaryError) as ei:
        dev.write(start + g.block_size, blocks(dev, n_left + 1))
    assert ei.value.zone == 2
    assert dev.zone(2).wp == start + g.block_size


def test_write_filling_capacity_makes_zone_full_reported_at_start_plus_size(any_device):
    dev = any_device
    g = dev.geometry
    z = dev.zone(3)
    dev.write(z.start, blocks(dev, g.zone_capacity // g.block_size))
    z = dev.zone(3)
    assert (z.cond, z.wp) == (F, z.start + g.zone_size)
    with pytest.raises(ZoneFullError):
        dev.write(z.start + g.zone_capacity, blocks(dev, 1))


def test_misaligned_and_out_of_range_io(any_device):
    dev = any_device
    g = dev.geometry
    start = dev.zone(0).start
    with pytest.raises(MisalignedIOError):
        dev.write(start, b"x" * (g.block_size - 1))
    with pytest.raises(MisalignedIOError):
        dev.write(start + 1, blocks(dev, 1))
    with pytest.raises(MisalignedIOError):
        dev.read(start, g.block_size + 1)
    with pytest.raises(OutOfRangeError):
        dev.read(g.size, g.block_size)
    assert dev.zone(0).cond == E


# -- append ---------------------------------------------------------------------------------------

def test_zone_append_returns_offsets_in_order(any_device):
    dev = any_device
    bs = dev.geometry.block_size
    first = dev.append(4, blocks(dev, 1, seed=3))     # every device has it (LinuxZonedDevice emulates it)
    second = dev.append(4, blocks(dev, 2, seed=4))
    start = dev.zone(4).start
    assert (first, second) == (start, start + bs)
    assert dev.zone(4).wp == start + 3 * bs
    assert dev.read(start, 3 * bs) == blocks(dev, 1, seed=3) + blocks(dev, 2, seed=4)


def test_zone_append_to_full_zone_and_past_capacity(any_device):
    dev = any_device
    g = dev.geometry
    dev.append(5, blocks(dev, 1))
    with pytest.raises(ZoneBoundaryError):
        dev.append(5, blocks(dev, g.zone_capacity // g.block_size))
    dev.finish_zone(5)
    with pytest.raises(ZoneFullError):
        dev.append(5, blocks(dev, 1))


# -- reads ----------------------------------------------------------------------------------------

def test_read_written_data_and_zeros_past_wp_across_zones(any_device):
    dev = any_device
    g = dev.geometry
    bs = g.block_size
    a, b = blocks(dev, 2, seed=5), blocks(dev, 1, seed=6)
    dev.write(dev.zone(0).start, a)
    dev.write(dev.zone(1).start, b)
    assert dev.read(0, 2 * bs) == a
    assert dev.read(2 * bs, bs) == bytes(bs)  # unwritten space reads zeros
    # one read across the zone boundary: the end of zone 0 (the whole zone when zones are small;
    # its last MiB when they are GiBs) and as much of zone 1
    span = min(g.zone_size, 1 << 20)
    lo = g.zone_size - span
    whole = dev.read(lo, 2 * span)
    head = a + bytes(span - 2 * bs)
    assert whole[:span] == (head if lo == 0 else bytes(span))
    assert dev.read(0, span) == head
    assert whole[span:span + bs] == b
    assert whole[span + bs:] == bytes(span - bs)


# -- explicit open / close ------------------------------------------------------------------------

def test_open_close_transitions(any_device):
    dev = any_device
    dev.open_zone(0)
    assert dev.zone(0).cond == EO
    dev.open_zone(0)  # open of an explicitly open zone: no change
    assert dev.zone(0).cond == EO
    dev.close_zone(0)  # nothing written: back to empty
    assert dev.zone(0).cond == E
    dev.open_zone(0)
    dev.write(dev.zone(0).start, blocks(dev, 1))
    assert dev.zone(0).cond == EO  # a write keeps an explicitly open zone explicitly open
    dev.close_zone(0)
    assert dev.zone(0).cond == C
    dev.close_zone(0)  # close of a closed zone: no change
    assert dev.zone(0).cond == C
    dev.write(dev.zone(0).wp, blocks(dev, 1))  # writing a closed zone opens it implicitly
    assert dev.zone(0).cond == IO
    dev.open_zone(0)  # implicitly -> explicitly open
    assert dev.zone(0).cond == EO
    with pytest.raises(InvalidZoneTransitionError):
        dev.close_zone(1)  # empty
    dev.finish_zone(2)
    with pytest.raises(InvalidZoneTransitionError):
        dev.close_zone(2)  # full
    with pytest.raises(InvalidZoneTransitionError):
        dev.open_zone(2)  # full


# -- finish / reset -------------------------------------------------------------------------------

@pytest.mark.parametrize("start_state", ["empty", "implicit", "explicit", "closed", "full"])
def test_finish_from_every_state_makes_full_at_start_plus_size(any_device, start_state):
    dev = any_device
    g = dev.geometry
    z = dev.zone(1)
    data = blocks(dev, 2, seed=7)
    if start_state != "empty":
        if start_state == "explicit":
            dev.open_zone(1)
        dev.write(z.start, data)
        if start_state == "closed":
            dev.close_zone(1)
        if start_state == "full":
            dev.finish_zone(1)
    dev.finish_zone(1)
    z = dev.zone(1)
    assert (z.cond, z.wp) == (F, z.start + g.zone_size)
    expect = (bytes(2 * g.block_size) if start_state == "empty" else data)
    assert dev.read(z.start, 2 * g.block_size) == expect
    assert dev.read(z.start + 2 * g.block_size, g.block_size) == bytes(g.block_size)


@pytest.mark.parametrize("start_state", ["empty", "implicit", "explicit", "closed", "full"])
def test_reset_from_every_state_makes_empty_and_zeros(any_device, start_state):
    dev = any_device
    bs = dev.geometry.block_size
    z = dev.zone(2)
    if start_state != "empty":
        if start_state == "explicit":
            dev.open_zone(2)
        dev.write(z.start, blocks(dev, 3))
        if start_state == "closed":
            dev.close_zone(2)
        if start_state == "full":
            dev.finish_zone(2)
    dev.reset_zone(2)
    z = dev.zone(2)
    assert (z.cond, z.wp) == (E, z.start)
    assert dev.read(z.start, 3 * bs) == bytes(3 * bs)
    dev.write(z.start, blocks(dev, 1, seed=9))  # writable from the start again
    assert dev.read(z.start, bs) == blocks(dev, 1, seed=9)


def test_zone_op_on_missing_zone(any_device):
    with pytest.raises(OutOfRangeError):
        any_device.reset_zone(any_device.geometry.nr_zones)


# -- open and active limits -------------------------------------------------------------------------

def _limits(dev):
    g = dev.geometry
    if not g.max_open or not g.max_active or g.max_active <= g.max_open:
        pytest.skip("needs 0 < max_open < max_active")
    return g.max_open, g.max_active


def test_implicit_open_beyond_open_limit_closes_an_implicitly_open_zone(any_device):
    dev = any_device
    max_open, _ = _limits(dev)
    for z in range(max_open):
        dev.write(dev.zone(z).start, blocks(dev, 1))
    dev.write(dev.zone(max_open).start, blocks(dev, 1))
    got = conds(dev)[:max_open + 1]
    assert got.count(IO) == max_open
    assert got.count(C) == 1
    assert got[max_open] == IO
    if dev.info.kind in ("memory", "file") or dev.info.kind.startswith("faulty"):
        assert got[0] == C  # the emulators close the oldest implicitly open zone


def test_open_limit_with_all_explicit_fails_too_many_open(any_device):
    dev = any_device
    max_open, _ = _limits(dev)
    for z in range(max_open):
        dev.open_zone(z)
    with pytest.raises(TooManyOpenZonesError):
        dev.write(dev.zone(max_open).start, blocks(dev, 1))
    with pytest.raises(TooManyOpenZonesError):
        dev.open_zone(max_open)
    assert dev.zone(max_open).cond == E
    dev.close_zone(0)  # frees an open resource
    dev.open_zone(max_open)
    assert dev.zone(max_open).cond == EO


def test_active_limit_refuses_new_zones_but_allows_closed_ones(any_device):
    dev = any_device
    max_open, max_active = _limits(dev)
    for z in range(max_active):  # max_active zones with data; the oldest get closed
        dev.write(dev.zone(z).start, blocks(dev, 1))
    assert sum(c.is_active for c in conds(dev)) == max_active
    nxt = max_active
    with pytest.raises(TooManyActiveZonesError):
        dev.write(dev.zone(nxt).start, blocks(dev, 1))
    with pytest.raises(TooManyActiveZonesError):
        dev.open_zone(nxt)
    with pytest.raises(TooManyActiveZonesError):
        dev.finish_zone(nxt)  # finishing an empty zone needs an active resource too
    assert dev.zone(nxt).cond == E
    closed = [i for i, c in enumerate(conds(dev)) if c == C]
    assert closed
    dev.write(dev.zone(closed[0]).wp, blocks(dev, 1))  # a closed zone is already active
    dev.finish_zone(0 if 0 not in closed else closed[0])  # a full zone releases its active resource
    dev.write(dev.zone(nxt).start, blocks(dev, 1))
    assert dev.zone(nxt).cond == IO


def test_reset_and_full_release_resources(any_device):
    dev = any_device
    g = dev.geometry
    _, max_active = _limits(dev)
    dev.open_zone(0)
    for z in range(1, max_active):
        dev.write(dev.zone(z).start, blocks(dev, 1))
    assert sum(c.is_active for c in conds(dev)) == max_active
    with pytest.raises(TooManyActiveZonesError):
        dev.write(dev.zone(max_active).start, blocks(dev, 1))
    dev.reset_zone(0)  # reset releases the active resource
    dev.write(dev.zone(max_active).start, blocks(dev, g.zone_capacity // g.block_size))
    assert dev.zone(max_active).cond == F  # filling a zone releases it too
    assert sum(c.is_active for c in conds(dev)) == max_active - 1
    dev.write(dev.zone(max_active + 1).start, blocks(dev, 1))
    assert dev.zone(max_active + 1).cond == IO


@pytest.mark.parametrize("target", ["empty", "closed"])
def test_finish_takes_no_open_resource_when_every_open_zone_is_explicit(any_device, target):
    """ZNS 2.1.1: finish takes a zone to Full directly; it needs no open resource (an Empty zone
    needs a free active one, as the model has it).  With every open resource held by an explicitly
    open zone, an Empty or a Closed zone still finishes, and the explicitly open zones stay as they
    were (null_blk wants a free open resource here: LinuxZonedDevice lends one, see its docstring)."""
    dev = any_device
    g = dev.geometry
    max_open, max_active = _limits(dev)
    t = max_open  # the zone to finish
    kept = blocks(dev, 2, seed=3)
    if target == "closed":
        dev.write(dev.zone(t).start, kept)
        dev.close_zone(t)
        assert dev.zone(t).cond == C
    for z in range(max_open):
        dev.open_zone(z)
    dev.write(dev.zone(0).start, blocks(dev, 1, seed=4))  # one lender candidate holds data
    before = dev.report_zones()
    assert [z.cond for z in before[:max_open]] == [EO] * max_open
    assert sum(z.cond.is_active for z in before) == max_open + (target == "closed") <= max_active
    dev.finish_zone(t)
    after = dev.report_zones()
    assert (after[t].cond, after[t].wp) == (F, after[t].start + g.zone_size)
    assert [(z.cond, z.wp) for z in after[:max_open]] == [(EO, z.wp) for z in before[:max_open]]
    assert [z.cond for z in after[t + 1:]] == [E] * (g.nr_zones - t - 1)
    assert dev.read(dev.zone(0).start, g.block_size) == blocks(dev, 1, seed=4)
    if target == "closed":
        assert dev.read(dev.zone(t).start, 2 * g.block_size) == kept
    with pytest.raises(TooManyOpenZonesError):  # the open resources are all still held
        dev.open_zone(t + 1)
    dev.write(dev.zone(1).start, blocks(dev, 1, seed=5))  # the explicitly open zones still take writes
    assert dev.zone(1).cond == EO
