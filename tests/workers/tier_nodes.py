"""torchrun worker for tests/tier/test_tier_nodes.py: 2 ranks (gloo on CPU), one device file per rank (each a
simulated node), saving a DTensor sharded across them through the DCP plugin with TorchTitan's
keep_latest_k=2 while each rank's device promotes its own shards to ONE destination (no ``{rank}``).

Usage: torchrun --standalone --nproc_per_node=2 tests/workers/tier_nodes.py DIR URL
Prints one JSON line per rank: {"rank": r, "ok": finish's result, "states": {gen: state},
"deferred_seen": [...], "lost": [saves neither on the rank's device nor durable after some save]}.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh

from retainz.integrations.dcp import ZonedStorageWriter
from retainz.jobs import stores
from retainz.tier import Destination
from retainz.zoned import Geometry
from tests.workers.dcp_ranks import state

GEOMETRY = Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20)


def main() -> None:
    root, url = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    w = ZonedStorageWriter(root, retention="torchtitan:interval=10,keep_latest_k=2", geometry=GEOMETRY,
                           promote=url, promote_bandwidth=4 << 10)
    seen, lost = set(), []
    dest = Destination(url)
    for step in (10, 20, 30, 40):
        dcp.save(state(step, mesh), storage_writer=w, checkpoint_id=f"{root}/step-{step}")
        seen.update(w.promoter.deferred)
        # nothing committed is lost: each save is on this rank's device or durable (every rank's part)
        with stores.using(os.path.join(root, f"rank{rank}.img")) as store:
            here = {g.id for g in store.generations()}
        lost += [f"step-{s}" for s in range(10, step + 1, 10)
                 if f"step-{s}" not in here and f"step-{s}" not in dest.generations()]
    ok = w.promoter.finish(newest=True, timeout=240)
    states = {r.id: r.state for r in w.promoter.status()}
    dist.barrier()
    w.close()
    # the ranks share torchrun's stdout: written at once, the two lines could interleave (a line of
    # both that json cannot read), so each rank writes its line in turn, in one write
    line = json.dumps({"rank": rank, "ok": ok, "states": states, "deferred_seen": sorted(seen), "lost": lost,
                       "node": f"rank{rank}"}) + "\n"
    for turn in range(dist.get_world_size()):
        if turn == rank:
            sys.stdout.write(line)
            sys.stdout.flush()
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)   # as tests/workers/dcp_ranks.py: skip torch's c10d teardown at exit


if __name__ == "__main__":
    main()
