"""torchrun worker for tests/dcp/test_dcp_multirank.py: 2 ranks, gloo on CPU, one device file per rank.

Usage: torchrun --standalone --nproc_per_node=2 tests/workers/dcp_ranks.py DIR [DEVICE]
With DEVICE (a device file a node service serves) every rank saves to and loads from that one device.
Environment: DCP_SERIES (the writer's and reader's series, default the root), DCP_RULE (the retention
rule, default torchtitan:interval=10,keep_latest_k=2), DCP_LOAD (the steps to load back, default 10,20:
the ones the rule keeps), DCP_PREFIX (the checkpoint names' prefix, default step-: checkpoint- for the hf
rule).
Saves a DTensor sharded across the ranks plus replicated tensors and bytes, sync (step-10) and async in
THREAD mode (step-20), loads both into fresh tensors and checks every byte; prints "RANK r OK".
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter
from retainz.zoned import Geometry

GEOMETRY = Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20)


def full(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"sharded": torch.randn(64, 16, generator=g), "replicated": torch.randn(33, generator=g)}


def state(step: int, mesh) -> dict:
    f = full(step)
    return {"sharded": distribute_tensor(f["sharded"], mesh, [Shard(0)]),
            "replicated": f["replicated"].clone(), "meta": {"step": step, "tag": f"s{step}"}}


def empty(mesh) -> dict:
    return {"sharded": distribute_tensor(torch.zeros(64, 16), mesh, [Shard(0)]),
            "replicated": torch.zeros(33), "meta": {"step": -1, "tag": ""}}


def check(out: dict, step: int, rank: int) -> None:
    f = full(step)
    local = out["sharded"].to_local()
    rows = 64 // dist.get_world_size()
    assert torch.equal(local, f["sharded"][rank * rows:(rank + 1) * rows]), f"rank {rank} step {step} shard"
    assert torch.equal(out["replicated"], f["replicated"]), f"rank {rank} step {step} replicated"
    assert out["meta"] == {"step": step, "tag": f"s{step}"}, out["meta"]


def main() -> None:
    root = sys.argv[1]
    device = sys.argv[2] if len(sys.argv) > 2 else root
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rule = os.environ.get("DCP_RULE", "torchtitan:interval=10,keep_latest_k=2")
    series = os.environ.get("DCP_SERIES") or None
    prefix = os.environ.get("DCP_PREFIX", "step-")
    writer = ZonedStorageWriter(device, retention=rule, geometry=GEOMETRY, series=series)
    dcp.save(state(10, mesh), storage_writer=writer, checkpoint_id=f"{root}/{prefix}10")
    fut = dcp.async_save(state(20, mesh), storage_writer=ZonedStorageWriter(device, retention=rule, series=series),
                         checkpoint_id=f"{root}/{prefix}20", async_checkpointer_type=AsyncCheckpointerType.THREAD)
    fut.result()
    dist.barrier()
    for step in (int(x) for x in os.environ.get("DCP_LOAD", "10,20").split(",")):
        out = empty(mesh)
        dcp.load(out, storage_reader=ZonedStorageReader(device, series=series), checkpoint_id=f"{root}/{prefix}{step}")
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
