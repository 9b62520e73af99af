"""dcp.save / dcp.load throughput: ZonedStorageWriter/Reader on a FileDevice versus torch's stock
FileSystemWriter/Reader, same state dict, same disk, one run (``make bench-dcp``).

Each repetition saves the state dict with both (order alternating between repetitions), then loads it
back with both into preallocated tensors, and checks the loaded bytes.  Both writers make their data
durable before ``dcp.save`` returns (stock: ``sync_files=True``, fsync per file; ours: the store's
flush before the commit record).  Loads read what was just written (page cache warm for both) unless
``--drop-caches`` is given and ``/proc/sys/vm/drop_caches`` is writable.  Throughput = state-dict
tensor bytes / wall seconds (median over repetitions); ratio = ours / stock (target >= 1.0).  A third
writer, raw ``pwrite`` of the same tensor bytes + ``fdatasync`` (:func:`raw_save`), gives the floor:
``ratio_save_raw`` = ours / raw (target >= 0.90, issue 17).

Usage: python -m bench.bench_dcp [--dir DIR] [--mib N] [--reps N] [--drop-caches] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter
from retainz.jobs import stores
from retainz.zoned import Geometry

MiB = 1 << 20
# One process saving and loading on purpose: torch's reminder that no process group is initialised.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def make_state(mib: int) -> dict:
    """~``mib`` MiB of fp32 tensors shaped like a transformer's (a few large matrices, many small)."""
    g = torch.Generator().manual_seed(0)
    sd: dict = {}
    big = max(1, mib * 3 // 4 // 16)          # 16 MiB-ish matrices hold three quarters
    for i in range(big):
        sd[f"layers.{i}.mlp.weight"] = torch.randn(2048, 2048, generator=g)
    rest = (mib * MiB - big * 2048 * 2048 * 4) // 4
    i = 0
    while rest > 0:
        n = min(rest, 576 * 576)
        sd[f"small.{i}"] = torch.randn(n, generator=g)
        rest -= n
        i += 1
    sd["step"] = 1000
    return sd


def nbytes(sd: dict) -> int:
    return sum(v.numel() * v.element_size() for v in sd.values() if isinstance(v, torch.Tensor))


def empty_like(sd: dict) -> dict:
    return {k: torch.empty_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in sd.items()}


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def drop_caches(enabled: bool) -> bool:
    if not enabled:
        return False
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def raw_save(sd: dict, path: str) -> float:
    """Seconds to ``pwrite`` every tensor's bytes (8 MiB at a time, as the writer streams them) to
    ``path`` and ``fdatasync`` it: the floor for ``dcp.save`` of the same bytes on the same disk."""
    datasync = getattr(os, "fdatasync", os.fsync)
    s = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        off = 0
        for v in sd.values():
            if isinstance(v, torch.Tensor):
                view = memoryview(v.contiguous().numpy()).cast("B")
                for i in range(0, len(view), 8 * MiB):
                    off += os.pwrite(fd, view[i:i + 8 * MiB], off)
        datasync(fd)
    finally:
        os.close(fd)
    dt = time.perf_counter() - s
    os.unlink(path)
    return dt


def run(d: str, mib: int, reps: int, want_drop: bool) -> dict:
    sd = make_state(mib)
    size = nbytes(sd)
    zone = 64 * MiB
    geometry = Geometry(nr_zones=2 * size // zone + 12, zone_size=zone, zone_capacity=zone, max_open=14,
                        max_active=14)
    device = os.path.join(d, "dev.img")
    stock_dir = os.path.join(d, "stock")
    t = {"stock_save": [], "ours_save": [], "raw_save": [], "stock_load": [], "ours_load": []}
    dropped = False
    with stores.using(device, geometry=geometry) as store:   # held open across repetitions
        for r in range(reps):
            cid = f"step-{r}"

            def save_stock(cid=cid):
                s = time.perf_counter()
                dcp.save(sd, storage_writer=dcp.FileSystemWriter(os.path.join(stock_dir, cid)))
                t["stock_save"].append(time.perf_counter() - s)

            def save_ours(cid=cid):
                s = time.perf_counter()
                dcp.save(sd, storage_writer=ZonedStorageWriter(device), checkpoint_id=cid)
                t["ours_save"].append(time.perf_counter() - s)

            def save_raw(cid=cid):
                t["raw_save"].append(raw_save(sd, os.path.join(d, f"raw-{cid}.bin")))

            for f in ((save_stock, save_ours, save_raw) if r % 2 == 0 else (save_raw, save_ours, save_stock)):
                f()
            for which in (("stock", "ours") if r % 2 == 0 else ("ours", "stock")):
                out = empty_like(sd)
                dropped = drop_caches(want_drop) or dropped
                s = time.perf_counter()
                if which == "stock":
                    dcp.load(out, storage_reader=dcp.FileSystemReader(os.path.join(stock_dir, cid)))
                else:
                    dcp.load(out, storage_reader=ZonedStorageReader(device), checkpoint_id=cid)
                t[f"{which}_load"].append(time.perf_counter() - s)
                if not same(sd, out):
                    raise AssertionError(f"{which} load returned different bytes")
            shutil.rmtree(os.path.join(stock_dir, cid))
            store.delete(cid, step=r)
    med = {k: statistics.median(v) for k, v in t.items()}
    mbps = {k: size / v / MiB for k, v in med.items()}
    return {
        "state_dict_bytes": size,
        "tensors": sum(isinstance(v, torch.Tensor) for v in sd.values()),
        "reps": reps,
        "page_cache_dropped_before_loads": dropped,
        "seconds_median": {k: round(v, 4) for k, v in med.items()},
        "MiB_per_s": {k: round(v, 1) for k, v in mbps.items()},
        "ratio_save": round(mbps["ours_save"] / mbps["stock_save"], 3),
        "ratio_load": round(mbps["ours_load"] / mbps["stock_load"], 3),
        "ratio_save_raw": round(mbps["ours_save"] / mbps["raw_save"], 3),
        "torch": torch.__version__,
        "dir": d,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where both write (default: a temp dir under out/)")
    ap.add_argument("--mib", type=int, default=512, help="state dict size (MiB)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--drop-caches", action="store_true", help="cold loads (needs root)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    os.makedirs("out", exist_ok=True)
    d = args.dir or tempfile.mkdtemp(prefix="bench-dcp-", dir="out")
    try:
        res = run(d, args.mib, args.reps, args.drop_caches)
    finally:
        if args.dir is None:
            shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(res, indent=2))
    print(f"dcp.save  ours/stock = {res['ratio_save']:.2f}x   ({res['MiB_per_s']['ours_save']:.0f} vs "
          f"{res['MiB_per_s']['stock_save']:.0f} MiB/s)")
    print(f"dcp.load  ours/stock = {res['ratio_load']:.2f}x   ({res['MiB_per_s']['ours_load']:.0f} vs "
          f"{res['MiB_per_s']['stock_load']:.0f} MiB/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
