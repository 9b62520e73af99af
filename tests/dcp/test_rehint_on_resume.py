"""A retention rule that changes on resume (keep_latest_k 10 -> 3): the retention callbacks give the
survivors the new rule's hints, journaled, so a remount sees them (the retainz:// route:
tests/fsspec_fs/test_fsspec_fs.py)."""

from __future__ import annotations

from retainz.integrations.retention_callbacks import KeepLatestK
from retainz.retention import rule_hint
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice

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
