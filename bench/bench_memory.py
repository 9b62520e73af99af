"""Peak memory of ``dcp.save`` and ``dcp.load`` through RetainZ against stock DCP on a local directory,
the same state dict, side by side in one run (part of ``make bench``; issue 44.7: within 10 % of stock
DCP's peak on every face).

Faces: ``stock`` (DCP's ``FileSystemWriter``/``FileSystemReader`` into a local directory), ``plugin``
(``ZonedStorageWriter``/``ZonedStorageReader`` on a FileDevice) and ``fsspec`` (``dcp.save``/``dcp.load``
with a ``retainz://`` checkpoint id: DCP's own ``FsspecWriter``/``FsspecReader`` over RetainZ's fsspec
file system).  Each save and each load runs in a process of its own, which builds the state dict (large
float32 tensors: a runtime hands each one to a single ``write``), records its resident set before the
call, and reports its peak (``ru_maxrss``) after it; a load fills preallocated tensors and is checked.
The faces alternate between repetitions; figures are medians.  Ratio = a face's peak / stock's peak
(target < 1.1).

Usage: python -m bench.bench_memory [--dir DIR] [--mib N] [--tensor-mib N] [--reps N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

from bench.scratch import in_scratch, report

MiB = 1 << 20
FACES = ("stock", "plugin", "fsspec")


def make_state(mib: int, tensor_mib: int) -> dict:
    """``mib`` MiB of float32 tensors of ``tensor_mib`` MiB each (the last smaller), seeded."""
    import torch

    g = torch.Generator().manual_seed(0)
    sd: dict = {}
    left, i = mib * MiB // 4, 0
    while left > 0:
        n = min(left, tensor_mib * MiB // 4)
        sd[f"layers.{i}.weight"] = torch.randn(n, generator=g)
        left -= n
        i += 1
    sd["step"] = 1000
    return sd


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def child(face: str, op: str, d: str, mib: int, tensor_mib: int) -> dict:
    """One save or load by ``face`` in this process; returns ``{"before", "peak", "seconds"}`` (bytes)."""
    import warnings

    warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
    import torch.distributed.checkpoint as dcp
    from bench.bench_dcp import empty_like, same

    from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter

    sd = make_state(mib, tensor_mib)
    target = sd if op == "save" else empty_like(sd)
    dev = os.path.join(d, f"{face}.img")
    before = _rss()
    t = time.perf_counter()
    if face == "stock":
        path = os.path.join(d, "stock")
        if op == "save":
            dcp.save(target, storage_writer=dcp.FileSystemWriter(path, sync_files=True))
        else:
            dcp.load(target, storage_reader=dcp.FileSystemReader(path))
    elif face == "plugin":
        if op == "save":
            dcp.save(target, storage_writer=ZonedStorageWriter(dev), checkpoint_id="step-1")
        else:
            dcp.load(target, storage_reader=ZonedStorageReader(dev), checkpoint_id="step-1")
    else:
        url = f"retainz://{dev}/ckpt/step-1"
        if op == "save":
            dcp.save(target, checkpoint_id=url)
        else:
            dcp.load(target, checkpoint_id=url)
    seconds = time.perf_counter() - t
    if op == "load" and not same(sd, target):
        raise AssertionError(f"{face} load returned different bytes")
    return {"before": before, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "seconds": seconds}


def _fresh(d: str, face: str, mib: int) -> None:
    """An empty store (``plugin``, ``fsspec``) or directory (``stock``) for ``face``'s next save."""
    from retainz.zoned import FileDevice, Geometry

    shutil.rmtree(os.path.join(d, "stock"), ignore_errors=True)
    if face != "stock":
        dev = os.path.join(d, f"{face}.img")
        if os.path.exists(dev):
            os.unlink(dev)
        zone = 64 * MiB
        FileDevice.create(dev, Geometry(nr_zones=2 * mib * MiB // zone + 16, zone_size=zone, zone_capacity=zone,
                                        max_open=14, max_active=14)).close()
        subprocess.run([sys.executable, "-m", "retainz.cli", "mkfs", dev], check=True, capture_output=True)


def _spawn(face: str, op: str, d: str, mib: int, tensor_mib: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.bench_memory", "--child", face, op, "--dir", d,
                          "--mib", str(mib), "--tensor-mib", str(tensor_mib)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(d: str, mib: int, tensor_mib: int, reps: int) -> dict:
    """Save and load with every face ``reps`` times in scratch folder ``d`` (faces rotating); returns
    ``{"peak_MiB": {FACE_OP: median}, "ratios": {FACE_OP_vs_stock: ...}, ...}``."""
    got: dict[str, list[dict]] = {}
    for r in range(reps):
        faces = FACES[r % len(FACES):] + FACES[:r % len(FACES)]
        for face in faces:
            _fresh(d, face, mib)
            for op in ("save", "load"):
                got.setdefault(f"{face}_{op}", []).append(_spawn(face, op, d, mib, tensor_mib))
    peak = {k: statistics.median(x["peak"] for x in v) / MiB for k, v in got.items()}
    before = {k: statistics.median(x["before"] for x in v) / MiB for k, v in got.items()}
    ratios = {f"{k}_vs_stock": round(peak[k] / peak[f"stock_{k.split('_')[1]}"], 3)
              for k in peak if not k.startswith("stock_")}
    return {"state_dict_bytes": mib * MiB, "tensor_bytes": tensor_mib * MiB, "reps": reps,
            "peak_MiB": {k: round(v, 1) for k, v in sorted(peak.items())},
            "before_MiB": {k: round(v, 1) for k, v in sorted(before.items())}, "ratios": ratios,
            "seconds": {k: round(statistics.median(x["seconds"] for x in v), 2) for k, v in sorted(got.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temp dir under out/)")
    ap.add_argument("--mib", type=int, default=1024, help="state dict size (MiB)")
    ap.add_argument("--tensor-mib", type=int, default=256, help="size of each tensor (MiB)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", nargs=2, metavar=("FACE", "OP"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, os.path.abspath(args.dir), args.mib, args.tensor_mib)))
        return 0
    res = in_scratch("bench-memory-", args.dir, lambda d: run(d, args.mib, args.tensor_mib, args.reps),
                     absolute=True)
    report(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
