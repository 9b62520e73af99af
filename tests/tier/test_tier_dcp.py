"""Tiers through the DCP plugin: ``ZonedStorageWriter(promote=...)`` keeps training going while saves
promote, retention keeps a save until its copy is verified (deferred, not dropped), a device short of
space while deletions wait refuses the save with ``PromotionBacklogError``, and
``ZonedStorageReader(durable=...)`` loads from the durable copy when the local one is gone or damaged."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
pytest.importorskip("fsspec", reason="needs fsspec")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from retainz.errors import PromotionBacklogError  # noqa: E402
from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter  # noqa: E402
from retainz.jobs import stores  # noqa: E402
from retainz.tier import Destination  # noqa: E402
from retainz.zoned import Geometry  # noqa: E402

pytestmark = pytest.mark.dcp

GEO = Geometry(nr_zones=12, zone_size=1 << 20, zone_capacity=1 << 20, block_size=4096, max_open=6, max_active=6)


def state(step: int, n: int = 200_000) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(n // 4, generator=g), "step": step}


def ids(path) -> list[str]:
    with stores.using(str(path)) as store:
        return [g.id for g in store.generations()]


def promoting_writer(tmp_path, monkeypatch, destination, fs):
    """(destination url, device path, a ZonedStorageWriter promoting to ``destination`` under TorchTitan
    keep_latest_k=2) with every promotion going through its faulty client ``fs``."""
    import retainz.tier.promoter as promoter_mod

    real = promoter_mod.Destination
    monkeypatch.setattr(promoter_mod, "Destination", lambda url, **kw: real(url, storage_options=None, fs=fs))
    url = destination.url
    dev = tmp_path / "dev.img"
    return url, dev, ZonedStorageWriter(str(dev), retention="torchtitan:interval=10,keep_latest_k=2",
                                        geometry=GEO, promote=url)


def test_retention_waits_for_promotion_then_retires(tmp_path, monkeypatch, destination):
    fs = destination.faulty()
    fs.gate = threading.Event()                       # the destination stalls
    url, dev, w = promoting_writer(tmp_path, monkeypatch, destination, fs)
    try:
        for step in (10, 20, 30, 40):
            dcp.save(state(step), storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")
        # every save returned while the first copy is stalled; nothing retention named was deleted
        assert ids(dev) == ["step-10", "step-20", "step-30", "step-40"]
        assert w.promoter.deferred == ["step-10", "step-20"]
        fs.gate.set()
        assert w.promoter.wait(60)
        assert ids(dev) == ["step-30", "step-40"]     # retired once durable, and only then
        dest = Destination(url)
        assert dest.generations() == ["step-10", "step-20", "step-30", "step-40"]
    finally:
        fs.gate.set()
        w.close()
    # the durable copy of a retired save loads through the reader's fallback, and says so
    r = ZonedStorageReader(str(dev), durable=url)
    out = state(0)
    dcp.load(out, storage_reader=r, checkpoint_id="/ckpt/step-10")
    assert torch.equal(out["w"], state(10)["w"]) and out["step"] == 10
    assert r.used == {0: f"durable copy at {url}"}
    r2 = ZonedStorageReader(str(dev), durable=url)
    out = state(0)
    dcp.load(out, storage_reader=r2, checkpoint_id="/ckpt/step-40")
    assert torch.equal(out["w"], state(40)["w"]) and r2.used == {0: "local"}


def test_a_device_short_of_space_refuses_with_promotion_backlog(tmp_path, monkeypatch, destination):
    fs = destination.faulty()
    fs.down = True                                    # the destination is down
    url, dev, w = promoting_writer(tmp_path, monkeypatch, destination, fs)
    w_state = lambda s: state(s, 1_500_000)  # noqa: E731 - about 1.5 MB a save on a 7-zone data area
    saved = []
    try:
        with pytest.raises(CheckpointException) as ei:
            for step in range(10, 200, 10):
                dcp.save(w_state(step), storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")
                saved.append(f"step-{step}")
        errors = [e for e, _ in ei.value.failures.values()]
        assert any(isinstance(e, PromotionBacklogError) for e in errors), errors
        err = next(e for e in errors if isinstance(e, PromotionBacklogError))
        assert str(err).startswith("promotion backlog:") and "\n" not in str(err)
        assert err.backlog == len(saved) and err.cause == "admission"
        assert ids(dev) == saved                       # nothing committed was deleted
        fs.down = False                                # the destination comes back
        assert w.promoter.wait(60)
        assert ids(dev) == saved[-2:]
        step = int(saved[-1].split("-")[1]) + 10
        dcp.save(w_state(step), storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")   # fits again
        assert w.promoter.wait(60)
        assert Destination(url).generations() == sorted(saved + [f"step-{step}"])
    finally:
        fs.down = False
        w.close()


_TRAIN = r"""
import sys, time
import torch, torch.distributed.checkpoint as dcp
from retainz.integrations.dcp import ZonedStorageWriter
from retainz.zoned import Geometry
from tests.tier.test_tier_dcp import GEO, state
w = ZonedStorageWriter(sys.argv[1], retention="torchtitan:interval=10,keep_latest_k=2", geometry=GEO,
                       promote=sys.argv[2], promote_bandwidth=64 << 10)
for step in (10, 20, 30, 40):
    dcp.save(state(step), storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")
print("saved", flush=True)
time.sleep(600)
"""


def test_training_killed_mid_promotion_resumes_after_restart(tmp_path, destination):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    dev, url = tmp_path / "dev.img", destination.url       # the child reaches S3 through the AWS_* variables
    proc = subprocess.Popen([sys.executable, "-c", _TRAIN, str(dev), url], stdout=subprocess.PIPE, text=True,
                            cwd=root, env={**os.environ, "PYTHONPATH": f"{root / 'src'}:{root}"})
    try:
        assert proc.stdout.readline().strip() == "saved"      # 4 saves of 200 kB committed, copies at 64 KiB/s
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    # the kill left the copies unfinished: nothing committed is lost (what is gone locally is durable),
    # and the newest is not durable yet
    dest = Destination(url)
    local, durable = set(ids(dev)), set(dest.generations())
    assert local | durable == {"step-10", "step-20", "step-30", "step-40"}
    assert {"step-30", "step-40"} <= local and "step-40" not in durable
    w = ZonedStorageWriter(str(dev), retention="torchtitan:interval=10,keep_latest_k=2", geometry=GEO, promote=url)
    try:
        dcp.save(state(50), storage_writer=w, checkpoint_id="/ckpt/step-50")   # the restarted job saves on
        assert w.promoter.wait(120)
        assert ids(dev) == ["step-40", "step-50"]                            # retired once durable
    finally:
        w.close()
    assert dest.generations() == ["step-10", "step-20", "step-30", "step-40", "step-50"]
    for step in (10, 20, 30, 40, 50):      # every durable copy loads back as what was saved
        out = state(0)
        r = ZonedStorageReader(str(tmp_path / "nodevice.img"), durable=url)
        dcp.load(out, storage_reader=r, checkpoint_id=f"/ckpt/step-{step}")
        assert torch.equal(out["w"], state(step)["w"]) and out["step"] == step


def test_a_save_that_cannot_fit_is_refused_before_any_byte_is_written(tmp_path, monkeypatch, destination):
    """Issue 44.6(a): with the destination down and the device filling, the writer refused only at the
    save's last MiB, after 99.6 % of it was written; DCP's plan gives every tensor's size, so the
    save is refused before it writes (PromotionBacklogError), nothing of it placed on the device."""
    fs = destination.faulty()
    fs.down = True
    url, dev, w = promoting_writer(tmp_path, monkeypatch, destination, fs)
    try:
        dcp.save(state(10, 1_500_000), storage_writer=w, checkpoint_id="/ckpt/step-10")
        saved = [10]
        with pytest.raises(CheckpointException) as ei:
            for step in range(20, 200, 10):
                with stores.using(str(dev)) as store:
                    before = store.metrics.host_bytes
                dcp.save(state(step, 1_500_000), storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")
                saved.append(step)
        err = next(e for e, _ in ei.value.failures.values())
        assert isinstance(err, PromotionBacklogError), err
        assert err.needed >= 1_500_000                 # the whole save asked at once
        with stores.using(str(dev)) as store:
            assert store.metrics.host_bytes == before  # not one byte of the refused save written
        assert ids(dev) == [f"step-{s}" for s in saved]
    finally:
        fs.down = False
        w.close()


def test_saves_back_off_from_a_dead_destination_instead_of_asking_per_deferred_generation(tmp_path, monkeypatch, destination):
    """Issue 44.6(b): with the destination down, every save's retention asked it once per deferred
    generation whether that one was durable yet (save time 0.1 s -> 4.6 s on a dead S3 endpoint).
    After a failure the promoter backs off (``retry_seconds``, doubling up to ``MAX_BACKOFF``): the
    saves ask the destination at most once over six saves, and nothing deferred is deleted."""
    fs = destination.faulty()
    fs.down = True
    asked_by_saves = []
    check = fs._check

    def counting():
        if threading.current_thread() is threading.main_thread():
            asked_by_saves.append(1)
        check()
    fs._check = counting
    url, dev, w = promoting_writer(tmp_path, monkeypatch, destination, fs)
    try:
        dcp.save(state(10), storage_writer=w, checkpoint_id="/ckpt/step-10")
        w.promoter.retry_seconds = 30.0                 # a back-off longer than the saves take
        asked_by_saves.clear()
        for step in range(20, 80, 10):
            dcp.save(state(step), storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")
        assert w.promoter.deferred == ["step-10", "step-20", "step-30", "step-40", "step-50"]
        assert len(asked_by_saves) <= 1, len(asked_by_saves)
        assert w.promoter.backing_off() > 0
        assert ids(dev) == [f"step-{s}" for s in range(10, 80, 10)]
    finally:
        fs.down = False
        w.close()


def test_a_fresh_writer_retires_what_was_made_durable_since_the_last_run(tmp_path, monkeypatch, destination):
    """Issue 44.6(c): a job stopped with its retirements deferred (the destination was down, the device
    filled); ``retainz tier promote`` made them durable; a fresh writer with the same rule was refused
    on every save, since retention ran only after a commit.  Now retention runs at the writer's first
    save too (docs/tiers.md: the next run's retention deletes them), and the save fits."""
    from retainz.tier import Promoter

    fs = destination.faulty()
    fs.down = True
    url, dev, w = promoting_writer(tmp_path, monkeypatch, destination, fs)
    big = lambda s: state(s, 1_500_000)  # noqa: E731
    saved = []
    try:
        with pytest.raises(CheckpointException):
            for step in range(10, 200, 10):
                dcp.save(big(step), storage_writer=w, checkpoint_id=f"/ckpt/step-{step}")
                saved.append(f"step-{step}")
    finally:
        w.close()
    assert ids(dev) == saved and len(saved) > 2
    fs.down = False
    with stores.using(str(dev)) as store:                 # what `retainz tier promote` does
        assert Promoter(store, url, fs=fs).run_pending()
    assert ids(dev) == saved                                 # promotion never deletes
    step = int(saved[-1].split("-")[1]) + 10
    fresh = ZonedStorageWriter(str(dev), retention="torchtitan:interval=10,keep_latest_k=2", geometry=GEO,
                               promote=url)
    try:
        dcp.save(big(step), storage_writer=fresh, checkpoint_id=f"/ckpt/step-{step}")
        assert ids(dev) == [saved[-1], f"step-{step}"]       # keep_latest_k=2, the rest durable
    finally:
        fresh.close()
