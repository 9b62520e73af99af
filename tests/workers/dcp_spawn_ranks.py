"""torch.multiprocessing.spawn worker for tests/jobs/test_jobs_served.py: 2 ranks started without torchrun
(no WORLD_SIZE, RANK or MASTER_* in the environment; the process group from a file rendezvous), DCP's
own writer on ``retainz://DEVICE/ckpt/step-2``; nothing started, no RETAINZ_JOB.

Usage: python tests/workers/dcp_spawn_ranks.py DEVICE RENDEZVOUS_FILE
Prints "RANK r OK" per rank after loading the checkpoint back and checking every value.
"""

from __future__ import annotations

import os
import sys


def run(rank: int, device: str, rendezvous: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    state = {f"w{rank}": torch.full((64,), float(rank + 1)), "shared": torch.arange(16.0)}
    dcp.save(state, checkpoint_id=f"retainz://{device}/ckpt/step-2")
    dist.barrier()
    out = {f"w{rank}": torch.zeros(64), "shared": torch.zeros(16)}
    dcp.load(out, checkpoint_id=f"retainz://{device}/ckpt/step-2")
    assert torch.equal(out[f"w{rank}"], state[f"w{rank}"]) and torch.equal(out["shared"], state["shared"])
    dist.barrier()
    print(f"RANK {rank} OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)      # as the torchrun workers: skip torch's c10d teardown at exit


if __name__ == "__main__":
    import torch.multiprocessing as mp

    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RETAINZ_JOB"):
        os.environ.pop(var, None)
    mp.spawn(run, args=(sys.argv[1], sys.argv[2]), nprocs=2)
