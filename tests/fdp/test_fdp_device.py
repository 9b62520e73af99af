"""The store on an FDP namespace (retainz.zoned.fdp): zones as LBA ranges, one placement handle per active
zone, reset as Deallocate, finish as RUH Update, and the device WAF of the FTL model under the real store.
(The zoned conformance suite runs on the same device kind: ``any_device[fdp]``.)"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retainz.errors import DeviceFormatError, ZonedDeviceError
from retainz.store import Store
from retainz.zoned import Geometry, ZoneCond, ZoneOp, open_device
from retainz.zoned.fdp import FdpNamespaceDevice

KiB = 1024
GEOM = Geometry(nr_zones=24, zone_size=64 * KiB, zone_capacity=64 * KiB, block_size=4096, max_open=4,
                max_active=4)
ACTIVE = (ZoneCond.IMP_OPEN, ZoneCond.EXP_OPEN, ZoneCond.CLOSED)


def handles_are_exclusive(dev: FdpNamespaceDevice) -> None:
    """Each zone holding a handle is active, and no two zones hold the same handle."""
    held = {z: dev.zone_handle(z) for z in range(dev.geometry.nr_zones) if dev.zone_handle(z) is not None}
    assert len(set(held.values())) == len(held), held
    for z in held:
        assert dev.zone(z).cond in ACTIVE, (z, dev.zone(z).cond)


def model_matches_zones(dev: FdpNamespaceDevice) -> None:
    """The model's mapped pages are exactly the written part of every zone, each written through the
    handle its zone held."""
    ftl, g = dev.ftl, dev.geometry
    pages = g.zone_capacity // 4096  # zones are packed densely in the namespace
    for z in range(g.nr_zones):
        mapped = ftl.l2p[z * pages:(z + 1) * pages] >= 0
        written = dev.zone(z).wp - dev.zone(z).start if dev.zone(z).cond != ZoneCond.FULL else dev._written[z]
        assert mapped.sum() == written // 4096, z
        h = dev.zone_handle(z)
        if h is not None and written:
            assert set(ftl._writer[z * pages:z * pages + written // 4096].tolist()) == {h}
    ftl.check()


ops = st.lists(st.tuples(st.sampled_from(["w", "w", "w", "finish", "reset", "close"]), st.integers(0, 23),
                         st.integers(1, 6)), min_size=1, max_size=80)


@settings(max_examples=60, deadline=None)
@given(ops=ops)
def test_zone_verbs_become_fdp_commands(ops):
    dev = FdpNamespaceDevice(GEOM)
    for op, z, n in ops:
        try:
            if op == "w":
                wp = dev.zone(z).wp
                dev.write(wp, bytes(min(n * 4096, dev.zone(z).start + GEOM.zone_capacity - wp) or 4096))
            elif op == "finish":
                dev.zone_op(ZoneOp.FINISH, z)
            elif op == "reset":
                dev.reset_zone(z)
            else:
                dev.zone_op(ZoneOp.CLOSE, z)
        except ZonedDeviceError:
            pass  # a full zone, the active limit, a close of an empty zone: the zone rules, tested elsewhere
        handles_are_exclusive(dev)
        model_matches_zones(dev)


def test_reset_deallocates_and_finish_makes_an_ruh_update():
    dev = FdpNamespaceDevice(GEOM)
    dev.write(0, bytes(16 * KiB))
    assert dev.zone_handle(0) == 0 and dev.ftl.valid_pages == 4
    dev.zone_op(ZoneOp.FINISH, 0)
    st_ = dev.fdp_statistics()
    assert dev.zone_handle(0) is None
    assert (st_.ru_not_fully_written_events, st_.padding_bytes) == (1, 48 * KiB)  # RU = zone = 64 KiB
    dev.write(GEOM.zone_size, bytes(8 * KiB))
    assert dev.zone_handle(1) == 0  # the handle came back and starts a fresh RU
    assert dev.ftl.l2p[16] // 16 != dev.ftl.l2p[0] // 16
    dev.reset_zone(0)
    assert dev.ftl.valid_pages == 2 and dev.zone_handle(1) == 0


def test_a_coarser_unit_reaches_the_model_when_filled():
    dev = FdpNamespaceDevice(GEOM, unit=16 * KiB)
    dev.write(0, bytes(12 * KiB))
    assert dev.fdp_statistics().host_bytes_written == 0
    dev.write(12 * KiB, bytes(8 * KiB))
    assert dev.fdp_statistics().host_bytes_written == 16 * KiB
    dev.zone_op(ZoneOp.FINISH, 0)  # the partial unit goes with the finish
    assert dev.fdp_statistics().host_bytes_written == 32 * KiB
    dev.write(GEOM.zone_size, bytes(4 * KiB))  # less than a unit, and no handle yet
    dev.zone_op(ZoneOp.FINISH, 1)
    assert dev.fdp_statistics().host_bytes_written == 48 * KiB and dev.zone_handle(1) is None


def test_the_store_keeps_its_guarantees_and_whole_generations_cost_no_device_copy():
    rng = random.Random(1)
    dev = FdpNamespaceDevice(GEOM, spare_factor=0.07)
    blobs = {}
    with Store.format(dev) as s:
        for i in range(60):  # generations of 2 zones' worth, keep-latest-3: more than the device holds
            blob = rng.randbytes(120 * KiB)
            w = s.begin_generation(f"g{i}", i)
            w.write_shard("s", [blob])
            w.commit()
            blobs[f"g{i}"] = blob
            if i >= 3:
                s.delete(f"g{i - 3}")
                del blobs[f"g{i - 3}"]
        for gid, blob in blobs.items():
            assert b"".join(s.read_shard(gid, "s")) == blob
        assert s.fsck().ok
        st_ = dev.fdp_statistics()
        host = s.metrics.host_bytes + s.metrics.gc_bytes
    assert st_.host_bytes_written >= host  # the store's data plus its journal, all through handles
    assert st_.ru_erases > 0 and st_.media_reallocated_events == 0
    assert st_.waf == pytest.approx(1.0 + st_.padding_bytes / st_.host_bytes_written)
    assert dev.ftl.valid_pages * 4096 <= GEOM.nr_zones * GEOM.zone_size


def test_spec_and_bad_geometry():
    dev = open_device("fdp:zones=8,zone_size=1MiB,max_active=3,max_open=3,ru_size=512KiB,spare=0.1,ruh=pi")
    assert dev.info.kind == "fdp" and dev.ftl.geometry.ru_bytes == 512 * KiB
    assert {h.value for h in dev.ftl.handles} == {"PI"} and len(dev.ftl.handles) == 3
    dev.write(0, bytes(4096))
    assert np.count_nonzero(dev.ftl.l2p >= 0) == 1
    for spec, match in (("fdp:max_active=0", "max_active"), ("fdp:spare=1.5", "spare factor"),
                        ("fdp:ruh=XX", "II or PI"), ("fdp:unit=3000", "whole blocks"),
                        ("fdp:ru_size=6KiB", "not a whole number"), ("fdp:spare=lots", "not a number")):
        with pytest.raises(DeviceFormatError, match=match):
            open_device(spec)


def test_counted_writes_reach_the_model_too():
    """A payload-less device (trace replay) is written byte counts; they go through the handles as well."""
    dev = open_device("fdp:zones=8,zone_size=64KiB,max_active=2,max_open=2,payload=false")
    dev.write(0, 8 * KiB)
    dev.write(64 * KiB, 64 * KiB)
    st_ = dev.fdp_statistics()
    assert st_.host_bytes_written == 72 * KiB and st_.host_bytes_by_handle == [8 * KiB, 64 * KiB]
    assert dev.zone_handle(0) == 0 and dev.zone_handle(1) is None  # zone 1 is full: its handle is free


def test_trace_replay_on_an_fdp_namespace_records_the_device_statistics(tmp_path):
    """The same replay on ``memory`` and on ``fdp``: the store's own metrics agree, and the FDP run adds the
    device's statistics log; crash events power-cycle the FDP device like the memory one."""
    from retainz.trace.replay import ReplayConfig, replay
    from tests.trace.test_replay import GEO, _trace

    t = _trace(tmp_path, rule="megatron:save_interval=10,retain_interval=50", crash_every=7)
    mem = replay(t, ReplayConfig(policy="retainz", pressure=0.8, **GEO))
    fdp = replay(t, ReplayConfig(policy="retainz", pressure=0.8, device="fdp:spare=0.1,ruh=PI", **GEO))
    assert "fdp" not in mem and fdp["crashes"] == mem["crashes"] >= 3
    for key in ("host_bytes", "gc_bytes", "resets", "generations_committed"):
        assert fdp[key] == mem[key], key
    dev = fdp["fdp"]
    assert dev["host_bytes_written"] >= fdp["host_bytes"] + fdp["gc_bytes"]  # plus the journal's records
    assert dev["device_waf"] == dev["media_bytes_written"] / dev["host_bytes_written"] >= 1.0
    with pytest.raises(ValueError, match="unknown key"):
        ReplayConfig(policy="retainz", pressure=0.8, device="fdp:zones=4", **GEO)
    with pytest.raises(ValueError, match="spare=x"):
        ReplayConfig(policy="retainz", pressure=0.8, device="fdp:spare=x", **GEO)


@pytest.mark.parametrize("workload", ["mixed", "gc"])
def test_power_cut_campaign_on_an_fdp_namespace(workload):
    """The store's crash guarantees on the FDP device: every write boundary of the workload cut, every
    crash state recovered and checked (retainz.testing.crashtest)."""
    from retainz.testing.crashtest import campaign

    rep = campaign(workload, 1, make_device=lambda g: FdpNamespaceDevice(g))
    assert rep.points > 100 and rep.failures == []


def test_power_loss_drops_the_lost_tail_from_the_model():
    dev = FdpNamespaceDevice(GEOM)
    dev.write(0, bytes(16 * KiB))
    dev.flush()
    dev.write(16 * KiB, bytes(8 * KiB))
    dev.write(GEOM.zone_size, bytes(8 * KiB))
    dev.power_loss()  # the unflushed writes are lost
    assert dev.zone(0).wp == 16 * KiB and dev.zone(1).cond == ZoneCond.EMPTY
    assert dev.zone_handle(1) is None and dev.ftl.valid_pages == 4
    handles_are_exclusive(dev)
    model_matches_zones(dev)


def test_zones_are_packed_densely_in_the_namespace():
    """Zone capacity below zone size (ZN540-like): the namespace holds the capacities only, so the spare
    factor is over-provisioning of what can be written."""
    g = Geometry(nr_zones=10, zone_size=64 * KiB, zone_capacity=48 * KiB, block_size=4096, max_open=2, max_active=2)
    dev = FdpNamespaceDevice(g, spare_factor=0.2)
    assert dev.ftl.logical_pages == 10 * 12 and dev.ftl.geometry.ru_bytes == 48 * KiB
    dev.write(g.zone_size, bytes(4096))  # zone 1, first block
    assert dev.ftl.l2p[12] >= 0 and np.count_nonzero(dev.ftl.l2p >= 0) == 1


def test_one_handle_sends_every_zone_through_handle_zero():
    """handles=1 (a host sending no placement identifier): two zones written at once share handle 0, so
    their pages interleave in one RU and no RUH Update is made when a zone fills."""
    dev = FdpNamespaceDevice(GEOM, spare_factor=0.2, handles=1, payload=False)
    for i in range(16):
        for z in (0, 1):
            dev.write(z * GEOM.zone_size + i * 4096, 4096)
    st = dev.fdp_statistics()
    assert dev.zone_handle(0) == 0 and dev.zone_handle(1) == 0
    assert st.host_bytes_written == 2 * 64 * KiB
    assert st.ru_not_fully_written_events == 0 and st.padding_bytes == 0
    per_zone = FdpNamespaceDevice(GEOM, spare_factor=0.2, payload=False)
    for i in range(16):
        for z in (0, 1):
            per_zone.write(z * GEOM.zone_size + i * 4096, 4096)
    assert {per_zone.zone_handle(0), per_zone.zone_handle(1)} == {None}  # both full: handles given back


def test_handles_other_than_one_refused():
    with pytest.raises(DeviceFormatError, match="handles must be 1"):
        FdpNamespaceDevice(GEOM, handles=2)
    with pytest.raises(DeviceFormatError, match="handles='3'"):
        open_device("fdp:zones=24,zone_size=64KiB,max_active=4,max_open=4,handles=3")


def test_the_spare_factor_is_the_drives_whole_over_provisioning():
    """Sized as a drive is: physical = namespace / (1 - spare), rounded up to whole RUs; the free-RU reserve
    and the RUs open at once (a host RU per handle, one GC RU for the II handles) come out of the spare, not
    on top of it (on top, 8 handles at 7 % made a 276-RU drive 293 RUs: 12.6 % over-provisioning)."""
    g = Geometry(nr_zones=256, zone_size=1 << 20, zone_capacity=1 << 20, block_size=4096, max_open=8, max_active=8)
    for spare, rus in ((0.07, 276), (0.14, 298), (0.28, 356)):
        dev = FdpNamespaceDevice(g, spare_factor=spare, unit=64 * KiB, payload=False)
        assert dev.ftl.geometry.nr_rus == rus
        assert spare <= dev.spare_factor < spare + 1 / rus
    # too few RUs for the reserve and 8 open RUs at 7 %: the fewest that hold them, and the spare says so
    small = FdpNamespaceDevice(GEOM, spare_factor=0.07)
    assert small.ftl.geometry.nr_rus == 24 + 1 + 5 and small.spare_factor == pytest.approx(6 / 30)


def test_open_rus_per_reclaim_group():
    from retainz.fdp.ftl import FlashTranslationLayer as F

    assert F.open_rus_per_rg(("II",) * 8) == 9            # 8 host RUs, one GC RU shared by the II handles
    assert F.open_rus_per_rg(("PI",) * 8) == 16           # a GC RU per PI handle
    assert F.open_rus_per_rg(("II", "PI", "II")) == 5
    assert F.open_rus_per_rg(("II",) * 8, "host_ru") == 8


def test_retainz_keeps_the_unused_capacity_charge_on_an_fdp_namespace(tmp_path):
    """On a zoned device a zone opened for a known death is not charged for the capacity it leaves
    (``open_unused=None`` resolves to free); on an FDP namespace it is (``Allocator.use_device``): a zone
    reset part-written leaves its handle's RU part-filled, and the RUH Update at the next zone's end pads
    the rest.  Three SmolLM2-135M jobs (tests/placement/test_placement_bound.py) at pressure 0.9: the free
    rule pads 9.5 GB (device WAF 1.111) where the charge pads 2.3 GB (1.025), 1.111 against 1.063 end to
    end (store WAF x device WAF)."""
    from retainz.trace.replay import ReplayConfig, replay
    from tests.placement.test_placement_bound import _mix

    path = _mix(tmp_path, (500, 500, 1000))
    run = {}
    for dev in ("memory", "fdp:spare=0.1,unit=1MiB"):
        for pol in ("retainz", "retainz:open_unused=true", "retainz:open_unused=false"):
            r = replay(path, ReplayConfig(policy=pol, pressure=0.9, reserve_zones=4, verify_payload=False, device=dev))
            assert r["capacity_stop_step"] is None, (dev, pol)
            run[dev.split(":")[0], pol] = r
    same = ("waf", "resets", "decisions", "gc_bytes")
    # the default follows the device: free on the zoned device, charged on the FDP namespace
    assert [run["memory", "retainz"][k] for k in same] == [run["memory", "retainz:open_unused=false"][k] for k in same]
    assert [run["fdp", "retainz"][k] for k in same] == [run["fdp", "retainz:open_unused=true"][k] for k in same]
    assert run["memory", "retainz"]["waf"] == 1.0 < run["fdp", "retainz"]["waf"]
    charged, free = run["fdp", "retainz"], run["fdp", "retainz:open_unused=false"]
    assert charged["fdp"]["padding_bytes"] * 2 < free["fdp"]["padding_bytes"]

    def end_to_end(r):
        return r["waf"] * r["fdp"]["device_waf"]

    assert end_to_end(charged) < end_to_end(free)
