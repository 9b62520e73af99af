"""A client process of a node service on a zoned block device (tests/node/test_node_zbd.py).

    python tests/workers/node_zbd_client.py write DEVICE JOB GO     # JOB%2Fg0, then (once file GO exists) JOB%2Fg1
    python tests/workers/node_zbd_client.py stall DEVICE GEN NBYTES PART START

Both wait for the service's socket (they are started with it).  ``write`` prints ``committed GEN`` per
acknowledged commit, and ``go`` when it starts its second generation; shard sizes and bytes are
functions of the names (:func:`shards`).  ``stall`` waits for file START, claims NBYTES, writes only the
first PART bytes of its first extent with O_DIRECT, prints ``stalled ZONE OFFSET LENGTH PART`` (that
extent) and sleeps: the test SIGKILLs it, a client dead mid-claim.
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


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + 300
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


def _connect(device: str, **kw):
    from retainz.node import NodeStore

    deadline = time.monotonic() + 300
    while True:
        try:
            return NodeStore.connect(device, **kw)
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def write(device: str, job: str, go: str) -> int:
    from retainz.ids import series_generation_id

    with _connect(device, job=job) as store:
        assert store.data_path == "direct", store.data_reason
        store.batch = 64 << 10            # many small claims: the clients take turns in each zone often
        for k in range(2):
            if k:
                _wait_for(go)
                print("go", flush=True)
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


def stall(device: str, gen: str, nbytes: int, part: int, start: str) -> int:
    import mmap

    store = _connect(device)
    _wait_for(start)
    w = store.begin_generation(gen, 1)
    s = w.open_shard("x")
    ext = store._call("claim", shard=s._handle, nbytes=nbytes)["extents"]
    z, off, length = ext[0]                  # the claim may span two zones: the first is left part written
    part = min(part, length // 4096 * 4096)
    buf = mmap.mmap(-1, part)
    buf[:] = b"\x5a" * part
    os.pwrite(store._wfd, buf, z * store.zone_size + off)
    print(f"stalled {z} {off} {length} {part}", flush=True)
    time.sleep(600)
    return 1


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "write":
        sys.exit(write(args[0], args[1], args[2]))
    sys.exit(stall(args[0], args[1], int(args[2]), int(args[3]), args[4]))
