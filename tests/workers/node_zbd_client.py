"""A client process of a node service on a zoned block device (tests/test_node_zbd.py).

    python tests/workers/node_zbd_client.py write DEVICE JOB GENERATIONS    # writes JOB%2Fg0 ... and commits
    python tests/workers/node_zbd_client.py stall DEVICE GEN NBYTES PART    # claims NBYTES, writes PART of them, waits

``write`` prints ``committed GEN`` per acknowledged commit; shard sizes and bytes are functions of the
names (:func:`shards`).  ``stall`` claims one extent, writes only its first PART bytes with O_DIRECT,
prints ``stalled ZONE OFFSET LENGTH`` and sleeps (the test SIGKILLs it: a client dead mid-claim).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.pattern import block, seed_of  # noqa: E402


def shards(gen_id: str) -> dict[str, bytes]:
    """Two ragged shards per generation (a few blocks to a few hundred KiB: the lane's devices hold ~8 MiB)."""
    k = seed_of(gen_id, "n") % 3
    sizes = {"a": (5000, 100_000, 200_017)[k], "b": (70_001, 3, 131_072)[k]}
    return {n: block(seed_of(gen_id, n), 0, s) for n, s in sizes.items()}


def write(device: str, job: str, n: int) -> int:
    from retainz.node import NodeStore
    from retainz.retention.series import series_generation_id

    with NodeStore.connect(device, job=job) as store:
        assert store.data_path == "direct", store.data_reason
        store.batch = 64 << 10            # many small claims: the clients take turns in each zone often
        for k in range(n):
            gen = series_generation_id(job, f"g{k}")
            w = store.begin_generation(gen, k + 1)
            for name, data in shards(gen).items():
                s = w.open_shard(name)
                for i in range(0, len(data), 40_000):          # ragged: several claims per shard
                    s.write(data[i:i + 40_000])
                s.close()
            w.commit()
            print(f"committed {gen}", flush=True)
    return 0


def stall(device: str, gen: str, nbytes: int, part: int) -> int:
    import mmap

    from retainz.node import NodeStore

    store = NodeStore.connect(device)
    w = store.begin_generation(gen, 1)
    s = w.open_shard("x")
    (z, off, length), = store._call("claim", shard=s._handle, nbytes=nbytes)["extents"]
    buf = mmap.mmap(-1, part)
    buf[:] = b"\x5a" * part
    os.pwrite(store._wfd, buf, z * store.zone_size + off)
    print(f"stalled {z} {off} {length}", flush=True)
    time.sleep(600)
    return 1


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "write":
        sys.exit(write(args[0], args[1], int(args[2])))
    sys.exit(stall(args[0], args[1], int(args[2]), int(args[3])))
