"""torchrun worker for tests/dcp/test_dcp_multirank.py: 2 ranks, gloo on CPU, DCP's own FsspecWriter and
FsspecReader on ``retainz://DEVICE/ckpt/step-N`` (one device file served by a node service).

Usage: torchrun --standalone --nproc_per_node=2 tests/workers/dcp_fsspec_ranks.py DEVICE
Environment: DCP_SERIES (the checkpoint folder, default ckpt), DCP_RULE (the retention rule, default
torchtitan:interval=10,keep_latest_k=2), DCP_LOAD (the steps to load back, default 10,20).
Saves a DTensor sharded across the ranks plus replicated tensors and bytes, sync (step-10) and async in
THREAD mode (step-20), loads both into fresh tensors and checks every byte; prints "RANK r OK".
"""

from __future__ import annotations

import os
import sys

import fsspec
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from dcp_ranks import (  # the same state and checks as the ZonedStorageWriter worker (this folder)
    check,
    empty,
    state,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh


def main() -> None:
    device = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fsspec.config.conf["retainz"] = {"retention": os.environ.get("DCP_RULE", "torchtitan:interval=10,keep_latest_k=2")}
    url = f"retainz://{device}/{os.environ.get('DCP_SERIES', 'ckpt')}"
    dcp.save(state(10, mesh), checkpoint_id=f"{url}/step-10")
    fut = dcp.async_save(state(20, mesh), checkpoint_id=f"{url}/step-20",
                         async_checkpointer_type=AsyncCheckpointerType.THREAD)
    fut.result()
    dist.barrier()
    for step in (int(x) for x in os.environ.get("DCP_LOAD", "10,20").split(",")):
        out = empty(mesh)
        dcp.load(out, checkpoint_id=f"{url}/step-{step}")
        check(out, step, rank)
    dist.barrier()
    print(f"RANK {rank} OK pid={os.getpid()}", flush=True)
    dist.destroy_process_group()
    # Every check has passed and been reported.  Skip interpreter teardown: torch 2.13's c10d/gloo
    # threads left by async_save occasionally abort at exit ("terminate called without an active
    # exception", SIGABRT on one rank in about one CI run in eight), which is not what this test checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
