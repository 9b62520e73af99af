"""A 512 MiB checkpoint written through ``retainz mount`` vs ZonedStorageWriter vs a local file system,
side by side, one run (``make bench-mount``).

The same state dict (:func:`bench.bench_dcp.make_state`) is saved with ``dcp.save`` three ways, order
rotating between repetitions, all on the same disk:

* ``mount``: torch's stock ``FileSystemWriter`` into ``MNT/step-R`` on a ``retainz mount`` of a
  FileDevice (the FUSE server is a separate process; writes arrive as 1 MiB FUSE requests, the
  connection's ``max_write``), committed at DCP's ``.metadata``;
* ``zoned``: ``ZonedStorageWriter`` on a FileDevice (no kernel crossing);
* ``local``: ``FileSystemWriter`` into a directory of the local file system (``sync_files=True``).

Each is then loaded back with the matching reader (``FileSystemReader`` through the mount) and the
bytes checked.  Throughput = state-dict tensor bytes / wall seconds (median over repetitions); the
ratios are mount/zoned and mount/local.

Usage: python -m bench.bench_mount [--dir DIR] [--mib N] [--reps N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed.checkpoint as dcp
from bench.bench_dcp import MiB, empty_like, make_state, nbytes, same

from retainz.integrations import _stores
from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter
from retainz.zoned import FileDevice, Geometry


def _retainz(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "retainz.cli", *args], check=True, capture_output=True, text=True)


def run(d: str, mib: int, reps: int) -> dict:
    from retainz.mount.runner import load_fuse

    load_fuse()
    sd = make_state(mib)
    size = nbytes(sd)
    zone = 64 * MiB
    geometry = Geometry(nr_zones=2 * size // zone + 12, zone_size=zone, zone_capacity=zone, max_open=14,
                        max_active=14)
    zoned_dev = os.path.join(d, "zoned.img")
    mount_dev = os.path.join(d, "mount.img")
    FileDevice.create(mount_dev, geometry).close()
    _retainz("mkfs", mount_dev)
    mnt = os.path.join(d, "mnt")
    local = os.path.join(d, "local")
    os.makedirs(mnt)
    os.makedirs(local)
    t = {f"{w}_{op}": [] for w in ("mount", "zoned", "local") for op in ("save", "load")}
    _retainz("mount", mount_dev, mnt)
    try:
        with _stores.using(zoned_dev, geometry=geometry) as store:
            for r in range(reps):
                cid = f"step-{r}"
                order = ["mount", "zoned", "local"]
                order = order[r % 3:] + order[:r % 3]
                for w in order:
                    s = time.perf_counter()
                    if w == "zoned":
                        dcp.save(sd, storage_writer=ZonedStorageWriter(zoned_dev), checkpoint_id=cid)
                    else:
                        root = mnt if w == "mount" else local
                        dcp.save(sd, storage_writer=dcp.FileSystemWriter(os.path.join(root, cid)))
                    t[f"{w}_save"].append(time.perf_counter() - s)
                for w in order:
                    out = empty_like(sd)
                    s = time.perf_counter()
                    if w == "zoned":
                        dcp.load(out, storage_reader=ZonedStorageReader(zoned_dev), checkpoint_id=cid)
                    else:
                        root = mnt if w == "mount" else local
                        dcp.load(out, storage_reader=dcp.FileSystemReader(os.path.join(root, cid)))
                    t[f"{w}_load"].append(time.perf_counter() - s)
                    if not same(sd, out):
                        raise AssertionError(f"{w} load returned different bytes")
                shutil.rmtree(os.path.join(mnt, cid))        # rm -r through the mount retires it
                shutil.rmtree(os.path.join(local, cid))
                store.delete(cid, step=r)
    finally:
        _retainz("umount", mnt)
    med = {k: statistics.median(v) for k, v in t.items()}
    mbps = {k: size / v / MiB for k, v in med.items()}
    return {
        "state_dict_bytes": size,
        "reps": reps,
        "seconds_median": {k: round(v, 4) for k, v in med.items()},
        "MiB_per_s": {k: round(v, 1) for k, v in mbps.items()},
        "ratio_save_mount_vs_zoned": round(mbps["mount_save"] / mbps["zoned_save"], 3),
        "ratio_save_mount_vs_local": round(mbps["mount_save"] / mbps["local_save"], 3),
        "ratio_load_mount_vs_zoned": round(mbps["mount_load"] / mbps["zoned_load"], 3),
        "ratio_load_mount_vs_local": round(mbps["mount_load"] / mbps["local_load"], 3),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where all three write (default: a temp dir under out/)")
    ap.add_argument("--mib", type=int, default=512, help="state dict size (MiB)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    os.makedirs("out", exist_ok=True)
    d = args.dir or tempfile.mkdtemp(prefix="bench-mount-", dir="out")
    try:
        res = run(d, args.mib, args.reps)
    finally:
        if args.dir is None:
            shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(res, indent=2))
    m = res["MiB_per_s"]
    print(f"save: mount {m['mount_save']:.0f}, ZonedStorageWriter {m['zoned_save']:.0f}, local {m['local_save']:.0f} "
          f"MiB/s; mount/zoned = {res['ratio_save_mount_vs_zoned']:.2f}x, mount/local = "
          f"{res['ratio_save_mount_vs_local']:.2f}x")
    print(f"load: mount {m['mount_load']:.0f}, ZonedStorageReader {m['zoned_load']:.0f}, local {m['local_load']:.0f} "
          f"MiB/s; mount/zoned = {res['ratio_load_mount_vs_zoned']:.2f}x, mount/local = "
          f"{res['ratio_load_mount_vs_local']:.2f}x")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
