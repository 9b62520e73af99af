"""Issue 15 item 7: ZenFS's active-token budget is the device's max active zones minus its
``reserved_zones`` (2) (``ZonedBlockDevice::Open``, fs/zbd_zenfs.cc).  A device limited to 2 or fewer
active zones is refused up front, at format, open, replay and in the CLI, with a line naming the
active-zone limit, instead of a NoSpaceError at the first write."""

from __future__ import annotations

import pytest

from retainz.cli import main
from retainz.experiments.runner import scaled_layout
from retainz.store import Store
from retainz.trace.generate import write_generated
from retainz.trace.replay import ReplayConfig, replay
from retainz.zoned import Geometry, MemoryDevice, ZoneCond

TOO_SMALL = r"active-zone limit \(max_active 2\) is too small for the policy"


def _geom(max_active: int, nr_zones: int = 32) -> Geometry:
    return Geometry(nr_zones=nr_zones, zone_size=64 << 10, zone_capacity=48 << 10, block_size=4096,
                    max_open=max_active, max_active=max_active)


@pytest.mark.parametrize("policy", ["zenfs", "zenfs-nohint", "zenfs:migrate=all"])
def test_format_refuses_a_device_of_two_active_zones_and_writes_nothing(policy):
    dev = MemoryDevice(_geom(2), payload=False)
    with pytest.raises(ValueError, match=TOO_SMALL):
        Store.format(dev, policy=policy)
    assert all(z.cond == ZoneCond.EMPTY for z in dev.report_zones())


def test_a_third_active_zone_is_enough_and_no_limit_is_fine():
    for max_active in (3, 0):
        with Store.format(MemoryDevice(_geom(max_active), payload=False), policy="zenfs") as s:
            w = s.begin_generation("g", 1, declared_size=100_000)
            w.write_shard("s", [b"x" * 100_000])
            w.commit()
            assert [g.id for g in s.generations()] == ["g"]


def test_reserved_zones_sets_the_limit():
    with pytest.raises(ValueError, match=r"\(max_active 3\) is too small .* reserved_zones=3 .* at least 4"):
        Store.format(MemoryDevice(_geom(3), payload=False), policy="zenfs:reserved_zones=3")
    Store.format(MemoryDevice(_geom(2), payload=False), policy="zenfs:reserved_zones=1").close()


def test_open_refuses_the_policy_on_such_a_device_and_leaves_the_store_as_it_was():
    dev = MemoryDevice(_geom(2), payload=False)
    with Store.format(dev, policy="greedy") as s:
        w = s.begin_generation("g", 1)
        w.write_shard("s", [b"y" * 5000])
        w.commit()
    with pytest.raises(ValueError, match=TOO_SMALL):
        Store.open(dev, policy="zenfs")
    with Store.open(dev) as s:
        assert [g.id for g in s.generations()] == ["g"] and s.fsck().ok


def _trace(tmp_path):
    path = str(tmp_path / "t.jsonl")
    write_generated(path, scaled_layout("smollm2-135m-dcp", "1/16384"), "torchtitan:interval=10,keep_latest_k=3",
                    100)
    return path


def test_replay_refuses_before_the_first_save(tmp_path):
    t = _trace(tmp_path)
    with pytest.raises(ValueError, match=TOO_SMALL):
        replay(t, ReplayConfig(policy="zenfs", zones=40, zone_size=64 << 10, zone_capacity=48 << 10, max_active=2,
                               max_open=2))
    # the same trace replays on the same device with one more active zone
    r = replay(t, ReplayConfig(policy="zenfs", zones=40, zone_size=64 << 10, zone_capacity=48 << 10, max_active=3,
                               max_open=3))
    assert r["host_bytes"] > 0 and r["capacity_stop_step"] is None


def test_cli_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "dev.img"
    assert main(["device", "create", str(path), "--zones", "32", "--zone-size", "64KiB", "--zone-capacity",
                 "48KiB", "--max-open", "2", "--max-active", "2"]) == 0
    capsys.readouterr()
    assert main(["mkfs", str(path), "--policy", "zenfs"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "too small for the policy" in err and "max_active 2" in err
    t = _trace(tmp_path)
    assert main(["replay", t, "--policy", "zenfs", "--zones", "40", "--zone-size", "64KiB", "--zone-capacity",
                 "48KiB", "--max-active", "2", "--max-open", "2"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "too small for the policy" in err
