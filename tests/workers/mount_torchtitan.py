"""Worker for tests/mount/test_mount_runtimes.py: TorchTitan 0.3.0's own CheckpointManager (unmodified) saving
to, purging from and loading from a folder on a ``retainz mount``; prints one JSON line.

Usage: python tests/workers/mount_torchtitan.py FOLDER PG_FILE (the process group's rendezvous file, off the mount)
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torchtitan.components.checkpointer import CheckpointManager

from tests.workers.torchtitan_run import Box


def main():
    folder, pg = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{pg}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = nn.Linear(16, 8)
    cfg = CheckpointManager.Config(enable=True, folder=folder, interval=10, keep_latest_k=2, async_mode="disabled",
                                   last_save_model_only=False)
    cm = CheckpointManager(cfg, dataloader=Box(0), model_parts=[model], optimizers=Box(1), lr_schedulers=Box(2),
                           states={}, sd_adapter=None)
    after = {}
    for step in range(1, 41):
        with torch.no_grad():
            model.weight.add_(step)
        if cm.save(step, last_step=(step == 40)):
            after[step] = sorted(os.listdir(folder))
    cm.close()                                   # joins the purge thread
    final = sorted(os.listdir(folder))
    weight = model.weight.detach().clone()
    torch.manual_seed(1)
    fresh = nn.Linear(16, 8)
    cm2 = CheckpointManager(cfg, dataloader=Box(0), model_parts=[fresh], optimizers=Box(9), lr_schedulers=Box(9),
                            states={}, sd_adapter=None)
    load_step = cm2._find_load_step()
    loaded = cm2.load(step=load_step)
    cm2.close()
    print(json.dumps({"after": after, "final": final, "load_step": load_step, "loaded": loaded,
                      "weights_equal": bool(torch.equal(fresh.weight, weight))}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
