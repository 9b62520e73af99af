"""A checkpoint's life through the jobs layer: one promoter per store for every face, one retirement
that defers to it, one re-hint (retainz.jobs.life, retainz.jobs.promotion)."""

from __future__ import annotations

import pytest

from retainz.hint import Hint
from retainz.jobs import life, promotion
from retainz.jobs.stores import using
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice
from tests.node.test_node import make_device

GEO = Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20)


@pytest.fixture
def device(tmp_path):
    return make_device(tmp_path, GEO)


def test_the_dcp_writer_and_retainz_share_the_stores_one_promoter(device, tmp_path):
    torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    import torch.distributed.checkpoint as dcp

    from retainz.integrations.dcp import ZonedStorageWriter
    from retainz.jobs.tiering import NamespaceTier

    url = (tmp_path / "durable").as_uri()
    with using(device) as store:
        tier = NamespaceTier.shared(store, url, device)
        writer = ZonedStorageWriter(device, promote=url)
        try:
            dcp.save({"w": torch.arange(8.0)}, storage_writer=writer, checkpoint_id=f"{device}/step-10")
            assert writer.promoter is tier.promoter          # one promoter: nothing is copied twice
            writer.promoter.finish(timeout=60)
            assert [r.state for r in tier.promoter.status()] == ["durable"]
        finally:
            writer.close()
            tier.close()
    with pytest.raises(ValueError, match="already promoting to"):
        with using(device) as store:
            p = promotion.acquire(store, url)
            try:
                promotion.acquire(store, (tmp_path / "other").as_uri())
            finally:
                promotion.release(p)


def test_retire_deletes_now_without_a_promoter_and_rehint_changes_only_what_differs():
    store = Store.format(MemoryDevice(GEO))
    try:
        for step in (10, 20):
            w = store.begin_generation(f"step-{step}", step, hint=Hint(step + 10))
            w.write_shard("a", [b"x" * 100])
            w.commit()
        gens = store.generations()
        changed = life.rehint(store, gens, lambda g: Hint(g.step + 10 if g.step == 10 else 30 + 5), step=20,
                              keep=lambda g: False)
        assert changed == ["step-20"] and store.generation("step-20").hint.reclaim_step == 35
        # a hint predicting the reclaim before the save's own step does not describe it: left as it is
        assert life.rehint(store, store.generations(), lambda g: Hint(g.step - 1)) == []
        assert life.retire(store, "step-10", step=20) is True
        assert [g.id for g in store.generations()] == ["step-20"]
    finally:
        store.close()
