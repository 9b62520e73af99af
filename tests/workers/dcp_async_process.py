"""Worker for tests/peers/test_peers_dcp.py: ``dcp.async_save`` in PROCESS mode (the save runs in DCP's
background process, which stays for the next save) to each checkpoint id given, then a load in this
process; one process group of world size 1 (gloo, a file rendezvous in PG_FILE).

Usage: python tests/workers/dcp_async_process.py PG_FILE CHECKPOINT_ID...
Prints "OK <id>" per checkpoint loaded back bit-identical, then "DONE".
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType


def main() -> None:
    pg_file, ids = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo", init_method=f"file://{pg_file}", rank=0, world_size=1)
    for i, cid in enumerate(ids):
        g = torch.Generator().manual_seed(i)
        sd = {"w": torch.randn(64, 8, generator=g), "b": torch.randn(8, generator=g), "meta": {"i": i}}
        fut = dcp.async_save(sd, checkpoint_id=cid, async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        fut.result(timeout=240)
        out = {"w": torch.zeros(64, 8), "b": torch.zeros(8), "meta": {"i": -1}}
        dcp.load(out, checkpoint_id=cid)
        assert torch.equal(out["w"], sd["w"]) and torch.equal(out["b"], sd["b"]) and out["meta"] == {"i": i}, cid
        print(f"OK {cid}", flush=True)
    print("DONE", flush=True)
    sys.stdout.flush()
    os._exit(0)      # DCP's background process is left to exit with its parent (its pipe closes)


if __name__ == "__main__":
    main()
