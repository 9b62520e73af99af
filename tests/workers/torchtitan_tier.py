"""Worker for tests/tier/test_tier_train.py: TorchTitan 0.3.0's own CheckpointManager (unmodified) saving a
small model and its Adam state to a ``retainz://`` folder every 10 steps with keep_latest_k=2, while the
``retainz://`` face promotes every checkpoint to S3 (s3fs to moto's server) under a bandwidth cap; its
purge thread deletes through the face, which keeps each checkpoint until its copy is verified.  Then a
fresh device gets step 10 (purged) back from S3 and TorchTitan's own load resumes from it.  Prints one JSON line.

Usage: python tests/workers/torchtitan_tier.py DEVICE FRESH_DEVICE URL ENDPOINT
"""

from __future__ import annotations

import json
import os
import sys

import fsspec
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
from torchtitan.components.checkpointer import CheckpointManager

from retainz.jobs import stores
from retainz.store import Store
from retainz.tier import Destination, restore_generation
from retainz.zoned import FileDevice, Geometry
from tests.tier.test_tier_s3 import options
from tests.workers.torchtitan_run import Box, settle


class Optim:
    """TorchTitan's optimizers container, reduced to one Adam: a Stateful over DCP's optimizer state."""

    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def state_dict(self):
        return get_optimizer_state_dict(self.model, self.opt)

    def load_state_dict(self, sd):
        set_optimizer_state_dict(self.model, self.opt, sd)


def train_step(model, optim, s: int) -> None:
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1000 + s))
    loss = ((model(x) - x.flip(1)) ** 2).mean()
    optim.opt.zero_grad()
    loss.backward()
    optim.opt.step()


def snapshot(model, optim) -> dict:
    out = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for k, v in optim.opt.state_dict()["state"].items():
        for name, t in v.items():
            out[f"optim.{k}.{name}"] = t.detach().clone() if isinstance(t, torch.Tensor) else t
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)) if isinstance(a[k], torch.Tensor)
        else a[k] == b[k] for k in a)


def manager(folder, model, optim):
    cfg = CheckpointManager.Config(enable=True, folder=folder, interval=10, keep_latest_k=2, async_mode="disabled",
                                   last_save_model_only=False)
    return CheckpointManager(cfg, dataloader=Box(0), model_parts=[model], optimizers=optim, lr_schedulers=Box(2),
                             states={}, sd_adapter=None)


def main():
    device, fresh_device, url, endpoint = sys.argv[1:5]
    dist.init_process_group("gloo", init_method=f"file://{device}.pg", rank=0, world_size=1)
    fsspec.config.conf["retainz"] = {"retention": "torchtitan:interval=10,keep_latest_k=2", "promote": url,
                                     "promote_bandwidth": 24 << 10, "promote_options": options(endpoint)}
    folder = f"retainz://{device}/ckpt"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 32))
    optim = Optim(model)
    cm = manager(folder, model, optim)
    fs, _ = fsspec.core.url_to_fs(folder)
    tier = fs.tier(folder)
    snaps, listed, backlog, deferred = {}, {}, [], set()
    dest = Destination(url, storage_options=options(endpoint))
    lost = []
    for step in range(1, 41):
        train_step(model, optim, step)
        if cm.save(step, last_step=(step == 40)):
            snaps[step] = snapshot(model, optim)
            listed[step] = settle(cm, folder)
            backlog.append(tier.promoter.backlog()[0])
            deferred.update(tier.promoter.deferred)
            with stores.using(device) as store:
                here = {g.id for g in store.generations()}
            lost += [s for s in snaps if f"ckpt%2Fstep-{s}" not in here | set(dest.generations())]
    cm.close()
    finished = tier.promoter.finish(newest=True, timeout=300)
    final = snapshot(model, optim)
    from retainz.integrations.fsspec_fs import RetainZFileSystem

    RetainZFileSystem.close_all()
    with stores.using(device) as store:
        local = sorted(g.id for g in store.generations())
    durable = dest.generations()

    # a fresh node: step 10 (purged locally) restored from S3, then TorchTitan's own load resumes
    dev = FileDevice.create(fresh_device, Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20))
    with Store.format(dev) as store:
        restore_generation(store, dest, "ckpt%2Fstep-10")
    dev.close()
    fsspec.config.conf["retainz"] = {"retention": "torchtitan:interval=10,keep_latest_k=2"}
    torch.manual_seed(1)
    model2 = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 32))
    optim2 = Optim(model2)
    cm2 = manager(f"retainz://{fresh_device}/ckpt", model2, optim2)
    loaded = cm2.load(step=10)
    cm2.close()
    resumed_equal = same(snapshot(model2, optim2), snaps[10])
    for step in range(11, 41):
        train_step(model2, optim2, step)
    RetainZFileSystem.close_all()
    print(json.dumps({"listed": listed, "backlog": backlog, "deferred": sorted(deferred), "lost": lost,
                      "finished": finished, "local": local, "durable": durable, "loaded": loaded,
                      "resumed_equal": resumed_equal, "continued_equal": same(snapshot(model2, optim2), final)}))
    dist.destroy_process_group()
    if os.path.exists(f"{device}.pg"):
        os.remove(f"{device}.pg")


if __name__ == "__main__":
    main()
