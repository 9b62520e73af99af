"""torch.multiprocessing.spawn worker for tests/jobs/test_jobs_served.py: 2 ranks started without torchrun
(no WORLD_SIZE, RANK or LOCAL_RANK in the environment), DCP's own writer on
``retainz://DEVICE/ckpt/step-2``; nothing started, no RETAINZ_JOB.

Usage: python tests/workers/dcp_spawn_ranks.py DEVICE RENDEZVOUS [--parent-first]
RENDEZVOUS: a file for the process group's file rendezvous (``MASTER_*`` removed from the environment), or
``env`` (the ranks meet at the ``MASTER_ADDR``/``MASTER_PORT`` the caller set, as torch's own test harness
sets them).
``--parent-first``: the spawning process uses the device itself first, as one rank (a file written through
``fsspec.open`` and a one-rank ``dcp.save`` to ``retainz://DEVICE/solo/step-1``, no process group), keeps
its ``retainz://`` filesystem cached (no ``close_all``), then spawns the ranks, and afterwards loads their
checkpoint and lists the device with ``retainz ls`` while it still holds it (prints ``LS`` lines and
``PARENT OK``).
Prints "RANK r OK" per rank after loading the checkpoint back and checking every value.
"""

from __future__ import annotations

import os
import sys


def state(rank: int):
    import torch

    return {f"w{rank}": torch.full((64,), float(rank + 1)), "shared": torch.arange(16.0)}


def run(rank: int, device: str, rendezvous: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    init = "env://" if rendezvous == "env" else f"file://{rendezvous}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    saved = state(rank)
    dcp.save(saved, checkpoint_id=f"retainz://{device}/ckpt/step-2")
    dist.barrier()
    out = {f"w{rank}": torch.zeros(64), "shared": torch.zeros(16)}
    dcp.load(out, checkpoint_id=f"retainz://{device}/ckpt/step-2")
    assert torch.equal(out[f"w{rank}"], saved[f"w{rank}"]) and torch.equal(out["shared"], saved["shared"])
    dist.barrier()
    print(f"RANK {rank} OK", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)      # as the torchrun workers: skip torch's c10d teardown at exit


def use_first(device: str) -> None:
    """The spawning process's own use of the device, one rank, no process group; its filesystem stays
    cached and holds the device."""
    import fsspec
    import torch
    import torch.distributed.checkpoint as dcp

    with fsspec.open(f"retainz://{device}/notes/readme.txt", "wb") as f:
        f.write(b"written by the parent before the ranks\n")
    dcp.save({"solo": torch.arange(8.0)}, checkpoint_id=f"retainz://{device}/solo/step-1")


def check_after(device: str) -> None:
    """The ranks' checkpoint loaded in the spawning process (world size 1, no process group) into
    whole tensors, and ``retainz ls`` of the device while this process still holds it."""
    import subprocess

    import torch
    import torch.distributed.checkpoint as dcp

    out = {"w0": torch.zeros(64), "w1": torch.zeros(64), "shared": torch.zeros(16)}
    dcp.load(out, checkpoint_id=f"retainz://{device}/ckpt/step-2")
    want = {**state(0), **state(1)}
    assert all(torch.equal(out[k], want[k]) for k in want), out
    solo = {"solo": torch.zeros(8)}
    dcp.load(solo, checkpoint_id=f"retainz://{device}/solo/step-1")
    assert torch.equal(solo["solo"], torch.arange(8.0))
    ls = subprocess.run([sys.executable, "-m", "retainz.cli", "ls", device], capture_output=True, text=True,
                        timeout=120)
    assert ls.returncode == 0, ls.stderr
    for line in ls.stdout.splitlines():
        print("LS", line, flush=True)
    print("PARENT OK", flush=True)


if __name__ == "__main__":
    import torch.multiprocessing as mp

    device, rendezvous = sys.argv[1], sys.argv[2]
    first = "--parent-first" in sys.argv[3:]
    gone = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RETAINZ_JOB") + (() if rendezvous == "env" else
                                                                  ("MASTER_ADDR", "MASTER_PORT"))
    for var in gone:
        os.environ.pop(var, None)
    if first:
        use_first(device)
    mp.spawn(run, args=(device, rendezvous), nprocs=2)
    if first:
        check_after(device)
