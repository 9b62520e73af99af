"""Issue 31's "done when": a real training run (a small MLP and Adam, on CPU) saves through the DCP plugin
with TorchTitan's ``keep_latest_k`` retention while its checkpoints promote to an S3 endpoint (s3fs
over HTTP to moto's standalone server on loopback).  The saves return while promotion is behind (the
bandwidth cap holds it back), retention waits for each durable copy, the run ends with every selected
checkpoint durable, and a resume from the durable copy on a fresh device is bit-identical: the model and
optimizer state load back exactly, and training on from them reproduces the uninterrupted run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
pytest.importorskip("s3fs", reason="needs the tier-test extra (s3fs)")
pytest.importorskip("moto.server", reason="needs the tier-test extra (moto[server])")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter  # noqa: E402
from retainz.jobs import stores  # noqa: E402
from retainz.store import Store  # noqa: E402
from retainz.tier import Destination, restore_generation  # noqa: E402
from retainz.zoned import FileDevice, Geometry  # noqa: E402
from tests.tier.test_tier_s3 import BUCKET, options, s3  # noqa: E402,F401 - the moto server fixture

pytestmark = pytest.mark.dcp

GEO = Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20, block_size=4096, max_open=6, max_active=6)
INTERVAL, K, LAST = 10, 2, 60
#: the promotion cap: a save is about 60 kB (weights and Adam's two moments), so each copy takes about
#: a second and the run's saves, milliseconds apart, queue behind it
BANDWIDTH = 48 << 10


class Trainer:
    """A small MLP learning a fixed linear map with Adam; batch ``s`` depends only on ``s``, so a run
    resumed at step ``s`` from exact state continues exactly as the uninterrupted one."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(32, 96), nn.Tanh(), nn.Linear(96, 32))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.target = torch.randn(32, 32, generator=torch.Generator().manual_seed(99))

    def step(self, s: int) -> None:
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1000 + s))
        loss = ((self.model(x) - x @ self.target) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def state(self) -> dict:
        model, optim = get_state_dict(self.model, self.opt)
        return {"model": model, "optim": optim}

    def load(self, sd: dict) -> None:
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def flat(sd: dict, prefix: str = "") -> dict:
    """Every leaf of a nested state dict, by dotted path (tensors cloned)."""
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v.detach().clone() if isinstance(v, torch.Tensor) else v
    return out


def same(a: dict, b: dict) -> bool:
    """Bit-identical: the same leaves, tensors of equal dtype, shape and bytes."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
                    and torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8))):
                return False
        elif x != y:
            return False
    return True


def local_ids(path) -> list[str]:
    with stores.using(str(path)) as store:
        return sorted(g.id for g in store.generations())


def test_training_keeps_going_while_checkpoints_promote_to_s3(s3, tmp_path):  # noqa: F811 - the fixture
    url = f"s3://{BUCKET}/train-run"
    dev = tmp_path / "node.img"
    w = ZonedStorageWriter(str(dev), retention=f"torchtitan:interval={INTERVAL},keep_latest_k={K}", geometry=GEO,
                           promote=url, promote_bandwidth=BANDWIDTH, promote_options=options(s3))
    t = Trainer()
    saved: dict[int, dict] = {}
    behind, deferred_seen = [], set()
    dest = Destination(url, storage_options=options(s3))
    try:
        for s in range(1, LAST + 1):
            t.step(s)
            if s % INTERVAL:
                continue
            saved[s] = flat(t.state())
            dcp.save(t.state(), storage_writer=w, checkpoint_id=f"/ckpt/step-{s}")
            n, nbytes = w.promoter.backlog()
            behind.append(n)
            deferred_seen.update(w.promoter.deferred)
            # nothing committed is lost: what retention deleted locally is durable at the endpoint
            have = set(local_ids(dev)) | set(dest.generations())
            assert have >= {f"step-{x}" for x in saved}, (s, have)
        # the saves returned while promotion was behind: the backlog grew past one checkpoint
        assert max(behind) >= 2, behind
        # retention waited: checkpoints it no longer kept were held until their copy was verified
        assert deferred_seen and deferred_seen <= {f"step-{x}" for x in saved if x <= LAST - K * INTERVAL}
        assert w.promoter.finish(newest=True, timeout=300)       # job end: drain the backlog
        assert w.promoter.backlog() == (0, 0) and w.promoter.deferred == []
        assert {r.state for r in w.promoter.status()} == {"durable"}
    finally:
        w.close()
    every = [f"step-{x}" for x in sorted(saved)]
    assert dest.generations() == sorted(every)                    # every checkpoint durable
    assert local_ids(dev) == sorted(f"step-{x}" for x in (LAST - INTERVAL, LAST))   # keep_latest_k=2 locally
    final = flat(t.state())

    # resume on a fresh node from the durable copy of a checkpoint retention deleted locally
    resume = 30
    fresh = tmp_path / "fresh.img"
    fd = FileDevice.create(fresh, GEO)
    with Store.format(fd) as store:
        restore_generation(store, dest, f"step-{resume}")
    fd.close()
    t2 = Trainer()
    sd = t2.state()
    r = ZonedStorageReader(str(fresh), durable=url, durable_options=options(s3))
    dcp.load(sd, storage_reader=r, checkpoint_id=f"/ckpt/step-{resume}")
    assert r.used == {0: "local"}                                 # the restored copy, on the fresh device
    t2.load(sd)
    assert same(flat(t2.state()), saved[resume])                  # bit-identical model and optimizer state
    for s in range(resume + 1, LAST + 1):
        t2.step(s)
    assert same(flat(t2.state()), final)                          # and training on reproduces the run

    # a node with no device at all reads the durable copy straight from the endpoint, and says so
    t3 = Trainer()
    sd = t3.state()
    r = ZonedStorageReader(str(tmp_path / "none.img"), durable=url, durable_options=options(s3))
    dcp.load(sd, storage_reader=r, checkpoint_id="/ckpt/step-20")
    assert r.used == {0: f"durable copy at {url}"}
    t3.load(sd)
    assert same(flat(t3.state()), saved[20])


def test_torchtitan_checkpoint_manager_through_retainz_promotes_to_s3(s3, tmp_path):  # noqa: F811 - the fixture
    """TorchTitan's own CheckpointManager and purge thread on a ``retainz://`` folder that promotes to S3:
    its purge is kept until durable, every checkpoint ends durable, and its own load resumes on a fresh
    device restored from S3, bit-identical, training on to the same weights."""
    pytest.importorskip("torchtitan", reason="needs the runtimes extra (make setup-torch)")
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    device = tmp_path / "dev.img"
    dev = FileDevice.create(device, Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20))
    Store.format(dev).close()
    dev.close()
    url = f"s3://{BUCKET}/titan"
    env = dict(os.environ, PYTHONPATH=f"{root / 'src'}{os.pathsep}{root}")
    proc = subprocess.run([sys.executable, str(root / "tests/workers/torchtitan_tier.py"), str(device),
                           str(tmp_path / "fresh.img"), url, s3], capture_output=True, text=True, timeout=400,
                          env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr[-5000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    ids = [f"ckpt%2Fstep-{s}" for s in (10, 20, 30, 40)]
    assert r["lost"] == []                                  # after every save: each one local or durable
    assert max(r["backlog"]) >= 2, r["backlog"]             # the saves ran ahead of promotion
    # the purge's view: keep_latest_k=2 after each save (TorchTitan does not purge at the last step)
    assert r["listed"] == {"10": ["step-10"], "20": ["step-10", "step-20"], "30": ["step-20", "step-30"],
                           "40": ["step-20", "step-30", "step-40"]}
    assert "ckpt%2Fstep-10" in r["deferred"]                # its purge waited for the copy
    assert r["finished"] and r["durable"] == ids            # every checkpoint durable at the end
    assert r["local"] == ids[1:]                            # the purged one deleted once durable
    assert r["loaded"] is True and r["resumed_equal"] is True and r["continued_equal"] is True


def test_hf_trainer_through_the_mount_promotes_to_s3(s3, tmp_path, monkeypatch):  # noqa: F811 - the fixture
    """HF Trainer, unmodified, saving through ``retainz mount --promote s3://...``: its
    ``save_total_limit`` rotation (``rm -r`` through the mount) is kept until durable, every checkpoint
    ends durable, and a resume from a rotated-away checkpoint restored from S3 onto a fresh device
    reaches the first run's final weights bit for bit."""
    pytest.importorskip("transformers", reason="needs the payload extra (make setup-torch)")
    import gc
    import os
    import time

    from tests.mount.test_mount_runtimes import _trainer
    from tests.mountcheck import generations, make_device, mounted, require_fuse

    require_fuse()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": s3,
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)                       # the mount server's s3fs reads the usual AWS variables
    url = f"s3://{BUCKET}/hf-run"
    dest = Destination(url, storage_options=options(s3))
    device = make_device(tmp_path, zones=64)
    ids = [f"hf%2Fcheckpoint-{s}" for s in (2, 4, 6)]
    with mounted(device, tmp_path / "mnt", "--retention", "hf:save_steps=2,save_total_limit=2",
                 "--promote", url, "--promote-bandwidth", "64KiB") as mnt:
        t = _trainer(mnt / "hf", 6)
        t.train()
        assert sorted(os.listdir(mnt / "hf")) == ["checkpoint-4", "checkpoint-6"]   # the rotation, as it sees it
        final = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
        del t
        gc.collect()
        deadline = time.monotonic() + 240
        while dest.generations() != ids and time.monotonic() < deadline:
            time.sleep(0.5)
        assert dest.generations() == ids                                  # every checkpoint durable
    assert sorted(generations(device)) == ids[1:]                        # checkpoint-2 deleted once durable
    with open(device + ".mount.log") as f:                                # ...and not before: it was deferred
        assert "hf%2Fcheckpoint-2: retirement deferred until its promotion" in f.read()

    (tmp_path / "fresh").mkdir()
    fresh = make_device(tmp_path / "fresh", zones=64)
    dev = FileDevice(fresh)
    with Store.open(dev) as store:
        restore_generation(store, dest, "hf%2Fcheckpoint-2")
    dev.close()
    with mounted(fresh, tmp_path / "mnt2") as mnt:
        t = _trainer(mnt / "hf", 6)
        t.train(resume_from_checkpoint=str(mnt / "hf" / "checkpoint-2"))
        assert t.state.global_step == 6
        resumed = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
        del t
        gc.collect()
    assert resumed.keys() == final.keys() and all(torch.equal(resumed[k], final[k]) for k in final)
