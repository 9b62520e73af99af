"""Save-to-local and promotion throughput side by side, in one run (docs/tiers.md).

    PYTHONPATH=src python tools/tier_throughput.py [--gens 3] [--size 64MiB] [--s3]

Saves ``--gens`` generations of ``--size`` each onto a fresh file-backed device, then promotes them
(every shard read back and verified, manifest last) to a directory on the same disk and, with
``--s3``, to moto's S3 server on loopback through s3fs.  Prints MiB/s for each; everything is
deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from retainz.store import Store
from retainz.tier import Promoter
from retainz.zoned import FileDevice, Geometry, parse_size


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gens", type=int, default=3)
    ap.add_argument("--size", type=parse_size, default=64 << 20)
    ap.add_argument("--s3", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tier-tp-")
    mib = 1 << 20
    try:
        zones = 8 + 2 * args.gens * -(-args.size // (16 * mib))
        dev = FileDevice.create(os.path.join(tmp, "dev.img"), Geometry(nr_zones=zones, zone_size=16 * mib,
                                                                      zone_capacity=16 * mib, max_open=14,
                                                                      max_active=14))
        store = Store.format(dev)
        block = os.urandom(4 * mib)
        t = time.perf_counter()
        for i in range(args.gens):
            w = store.begin_generation(f"step-{i}", i)
            w.write_shard("model.bin", (block for _ in range(args.size // len(block))))
            w.commit()
        local = time.perf_counter() - t
        total = args.gens * (args.size // len(block)) * len(block)
        rows = [("save to the local device (commit durable)", total, local)]
        p = Promoter(store, "file://" + os.path.join(tmp, "dest"))
        t = time.perf_counter()
        assert p.run_pending()
        rows.append(("promote to a directory (write + read back + manifest)", total, time.perf_counter() - t))
        if args.s3:
            sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
            import s3fs
            from tests.tier.test_tier_s3 import moto_server, options

            with moto_server() as (endpoint, _):
                s3fs.S3FileSystem(**options(endpoint)).call_s3("create_bucket", Bucket="tier-tp")
                p = Promoter(store, "s3://tier-tp/run", storage_options=options(endpoint))
                t = time.perf_counter()
                assert p.run_pending()
                rows.append(("promote to S3 (s3fs -> moto on loopback)", total, time.perf_counter() - t))
        store.close()
        dev.close()
        for what, n, s in rows:
            print(f"{what:58s} {n / mib:8.0f} MiB {s:7.2f} s {n / mib / s:8.1f} MiB/s")
    finally:
        shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
