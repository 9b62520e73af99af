"""A training job's checkpoint loop, for tests/dcp/test_dcp_interrupt.py: resume from the newest committed
step on the device, then save step STEP through ``ZonedStorageWriter`` (``overwrite=True``: a restarted
job saves its step again).

Usage: python tests/workers/dcp_interrupt.py DEVICE STEP
SIGINT reaches the save as ``KeyboardInterrupt``, which ``dcp.save`` re-raises wrapped in a
``CheckpointException`` (torch 2.13 collects every rank's failure, ``BaseException`` included); the job
reports either in one line and exits 130, as a training script's handler would; SIGTERM keeps its default action, so the process
dies wherever the save is (a crash).  Prints ``loaded N`` (or ``loaded none``) and ``saved STEP``.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed.checkpoint as dcp

from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter
from retainz.zoned import Geometry

GEOMETRY = Geometry(nr_zones=160, zone_size=1 << 20, zone_capacity=1 << 20)
TENSORS = 6                      # of 1 MiB each


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {**{f"w{i}": torch.randn(1 << 18, generator=g) for i in range(TENSORS)}, "step": step}


def empty() -> dict:
    return {**{f"w{i}": torch.zeros(1 << 18) for i in range(TENSORS)}, "step": -1}


def load(device: str, step: int) -> dict:
    sd = empty()
    dcp.load(sd, storage_reader=ZonedStorageReader(device, f"/ckpt/step-{step}"))
    return sd


def same(a: dict, b: dict) -> bool:
    return a["step"] == b["step"] and all(torch.equal(a[f"w{i}"], b[f"w{i}"]) for i in range(TENSORS))


def newest(device: str) -> int | None:
    import os

    if not os.path.exists(device):
        return None
    from retainz.jobs import stores

    with stores.using(device) as store:
        steps = [g.step for g in store.generations()]
    return max(steps) if steps else None


def main(device: str, step: int) -> int:
    last = newest(device)
    if last is not None:
        if not same(load(device, last), state(last)):
            print(f"step {last} does not read back", file=sys.stderr)
            return 1
    print(f"loaded {last if last is not None else 'none'}", flush=True)
    dcp.save(state(step), storage_writer=ZonedStorageWriter(device, f"/ckpt/step-{step}", geometry=GEOMETRY,
                                                            overwrite=True))
    print(f"saved {step}", flush=True)
    return 0


if __name__ == "__main__":
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        sys.exit(main(sys.argv[1], int(sys.argv[2])))
    except (KeyboardInterrupt, CheckpointException) as e:
        if not isinstance(e, KeyboardInterrupt) and "KeyboardInterrupt" not in str(e):
            raise
        print("interrupted", file=sys.stderr)
        sys.exit(130)
