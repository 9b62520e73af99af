"""A client process of the node service (tests/node/test_node.py): writes generations JOB/g0, JOB/g1, ...
through ``NodeStore`` as job JOB (its series folder: ids ``JOB%2Fg0``...) and logs each acknowledged commit.

    python tests/workers/node_client.py DEVICE LOG JOB GENERATIONS SEED

Shard sizes and bytes are functions of the generation and shard names (:func:`sizes`, tests/pattern.py),
so the verifier recomputes them.  The log gets ``begin GEN`` before a generation starts and
``committed GEN`` (fsynced) after its commit returned.  A lost service ends the process with status 3 and
the ServiceGoneError's line on stderr; one that finds no service listening, with status 4.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.pattern import block, seed_of  # noqa: E402


def sizes(gen_id: str) -> dict[str, int]:
    """Shard name -> size for a generation: 1..3 shards of 0 .. 3 MiB + a ragged tail."""
    rng = random.Random(gen_id)
    return {f"s{i}": rng.choice([0, 1, 4096, 5000, 1 << 20, (1 << 20) + 17]) + rng.randrange(3 << 20)
            for i in range(rng.randint(1, 3))}


def content(gen_id: str, shard: str, size: int) -> bytes:
    return block(seed_of(gen_id, shard), 0, size)


def main(device: str, log_path: str, job: str, n: int, seed: int) -> int:
    from retainz.errors import ServiceGoneError
    from retainz.ids import series_generation_id
    from retainz.node import NodeStore

    rng = random.Random(seed)
    log = open(log_path, "a", buffering=1)

    def note(line: str) -> None:
        log.write(line + "\n")
        log.flush()
        os.fsync(log.fileno())

    try:
        store = NodeStore.connect(device, job=job)
        for k in range(n):
            gen = series_generation_id(job, f"g{k}")       # JOB%2Fg{k}: the job's series folder
            note(f"begin {gen}")
            w = store.begin_generation(gen, k + 1)
            for name, size in sizes(gen).items():
                data = content(gen, name, size)
                s = w.open_shard(name)
                pos = 0
                while pos < size:           # ragged chunks: exercise the client's batching
                    step = rng.choice([1, 4095, 65536, 1 << 20, 3 << 20])
                    s.write(data[pos:pos + step])
                    pos += step
                s.close()
            w.commit()
            note(f"committed {gen}")
        store.close()
    except ServiceGoneError as e:
        print(f"client {job}: {e}", file=sys.stderr)
        return 3
    except ConnectionRefusedError as e:      # the service was gone before this client connected
        print(f"client {job}: {e}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
