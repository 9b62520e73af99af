"""A retention rule that changes on resume (keep_latest_k 10 -> 3): the retention callbacks and the
retainz:// filesystem give the survivors the new rule's hints, journaled, so a remount sees them."""

from __future__ import annotations

import fsspec
import pytest

from retainz.integrations.retention_callbacks import KeepLatestK
from retainz.retention import rule_hint
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice

GEOM = Geometry(nr_zones=48, zone_size=1 << 20, zone_capacity=1 << 20)


def test_keep_latest_k_callback_rehints_the_survivors_on_resume():
    dev = MemoryDevice(GEOM)
    old, new = KeepLatestK(interval=10, k=10), KeepLatestK(interval=10, k=3)
    with Store.format(dev) as s:
        for step in range(10, 130, 10):
            old.before_save(s, step)
            w = s.begin_generation(old.generation_id(step), step, hint=old.hint(step))
            w.write_shard("a", [b"x" * 5000])
            w.commit()
            old.after_commit(s, step)
        survivors = [g.id for g in s.generations()]
        assert len(survivors) == 10
        changed = new.rehint(s, step=125)
        assert changed == survivors                    # every survivor's prediction moved
        assert new.rehint(s) == []                     # idempotent
    with Store.open(dev) as s:
        for g in s.generations():
            want = rule_hint(new.rule, g.step)
            assert (g.hint.reclaim_step, g.hint.condition) == (want.reclaim_step, want.condition)
            assert g.hint.reclaim_step < rule_hint(old.rule, g.step).reclaim_step


@pytest.fixture
def device(tmp_path):
    path = tmp_path / "dev.img"
    dev = FileDevice.create(path, GEOM)
    Store.format(dev).close()
    dev.close()
    fsspec.config.conf.pop("retainz", None)
    yield str(path)
    fsspec.config.conf.pop("retainz", None)
    from retainz.integrations.fsspec_fs import RetainZFileSystem

    RetainZFileSystem.close_all()
    RetainZFileSystem.clear_instance_cache()


def _save(fs, device, step):
    d = f"{device}/ckpt/step-{step}"
    with fs.open(f"{d}/__0_0.distcp", "wb") as f:
        f.write(b"\1" * 10_000)
    with fs.open(f"{d}/.metadata.tmp", "wb") as f:
        f.write(b"md")
    fs.mv(f"{d}/.metadata.tmp", f"{d}/.metadata")


def test_the_retainz_filesystem_rehints_committed_checkpoints_when_its_rule_changed(device):
    from retainz.integrations.fsspec_fs import RetainZFileSystem

    k10, k3 = "torchtitan:interval=10,keep_latest_k=10", "torchtitan:interval=10,keep_latest_k=3"
    fs = fsspec.filesystem("retainz", retention=k10)
    for step in (10, 20, 30):
        _save(fs, device, step)
    RetainZFileSystem.close_all()
    RetainZFileSystem.clear_instance_cache()
    fs = fsspec.filesystem("retainz", retention=k3)
    _save(fs, device, 40)
    RetainZFileSystem.close_all()
    RetainZFileSystem.clear_instance_cache()
    dev = FileDevice(device, readonly=True)
    with Store.open(dev, readonly=True) as s:
        got = {g.step: (g.hint.reclaim_step, g.hint.condition) for g in s.generations()}
    dev.close()
    want = {st: (rule_hint(k3, st).reclaim_step, rule_hint(k3, st).condition) for st in (10, 20, 30, 40)}
    assert got == want
