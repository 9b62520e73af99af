"""Worker for tests/peers/test_runtime_torchtitan.py: TorchTitan 0.3.0's own CheckpointManager (unmodified)
saving to and purging from a ``retainz://`` folder; prints one JSON line.

Usage: python tests/workers/torchtitan_run.py DEVICE_FILE MODE(disabled|async)
"""

from __future__ import annotations

import json
import os
import sys
import time

import fsspec
import torch
import torch.distributed as dist
from torch import nn
from torchtitan.components.checkpointer import CheckpointManager

from retainz.jobs import stores


class Box:
    """A Stateful holding one tensor (stands in for the optimizer, lr scheduler and dataloader)."""

    def __init__(self, value):
        self.value = torch.tensor(float(value))

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, sd):
        self.value.copy_(sd["value"])


def generations(device):
    with stores.using(device) as store:
        return {g.id: (g.step, g.hint.reclaim_step) for g in store.generations()}


def settle(cm, folder):
    """Wait until TorchTitan's purge thread has drained its queue and the folder stops changing."""
    fs, path = fsspec.core.url_to_fs(folder)
    last, stable_since = None, time.monotonic()
    while True:
        now = sorted(fs.ls(path, detail=False)) if fs.exists(path) else []
        if now != last:
            last, stable_since = now, time.monotonic()
        elif (getattr(cm, "purge_queue", None) is None or cm.purge_queue.empty()) and \
                time.monotonic() - stable_since > 0.3:
            return [p.rsplit("/", 1)[-1] for p in now]
        time.sleep(0.05)


def main():
    device, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{device}.pg", rank=0, world_size=1)
    fsspec.config.conf["retainz"] = {"retention": "torchtitan:interval=10,keep_latest_k=2"}
    folder = f"retainz://{device}/ckpt"
    torch.manual_seed(0)
    model = nn.Linear(16, 8)
    cfg = CheckpointManager.Config(enable=True, folder=folder, interval=10, keep_latest_k=2, async_mode=mode,
                                   last_save_model_only=True)
    cm = CheckpointManager(cfg, dataloader=Box(0), model_parts=[model], optimizers=Box(1), lr_schedulers=Box(2),
                           states={}, sd_adapter=None)
    after = {}
    for step in range(1, 51):
        with torch.no_grad():
            model.weight.add_(step)
        saved = cm.save(step, last_step=(step == 50))
        if step == 40:
            weight_at_40 = model.weight.detach().clone()
        if saved:
            if mode != "disabled":
                # the purge was decided right after dispatch (inside save); wait for the in-flight
                # save itself so the listing below does not race its first file
                cm.maybe_wait_for_saving()
            after[step] = settle(cm, folder)
    cm.close()
    final_weight = model.weight.detach().clone()
    final = generations(device)

    # resume with the runtime's own load of step 40 (the last step, 50, is model-only)
    torch.manual_seed(1)
    fresh = nn.Linear(16, 8)
    cm2 = CheckpointManager(cfg, dataloader=Box(0), model_parts=[fresh], optimizers=Box(9), lr_schedulers=Box(9),
                            states={}, sd_adapter=None)
    load_step = cm2._find_load_step()      # the runtime's discovery: latest step-N holding .metadata
    loaded = cm2.load(step=40)
    cm2.close()
    print(json.dumps({"after": after, "final": final, "loaded": loaded,
                      "weights_equal": bool(torch.equal(fresh.weight, weight_at_40)),
                      "weights_differ_from_final": not bool(torch.equal(fresh.weight, final_weight)),
                      "load_step": load_step}))
    from retainz.integrations.fsspec_fs import RetainZFileSystem

    RetainZFileSystem.close_all()
    dist.destroy_process_group()
    os.remove(f"{device}.pg") if os.path.exists(f"{device}.pg") else None


if __name__ == "__main__":
    main()
