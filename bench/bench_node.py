"""Aggregate save and load of N client processes on one device through the node service, versus the same
N processes writing their own files with ``pwrite`` + ``fdatasync`` in a directory of the same file
system (issue 29, item 4).  In ``make bench`` at 4 and 8 ranks (``python -m bench``, :func:`run`).

Each process holds ``--mib`` MiB of random bytes (made before the clock starts). On a start signal, it saves
them: through the service, one generation with one shard, committed; as the baseline, one file,
``pwrite`` in 8 MiB pieces, then ``fdatasync``.  Then it reads them back: ``read_shard`` verified
against the crcs; as the baseline, ``pread``.  Aggregate throughput = N x bytes / wall seconds from the
start signal until the last process is done (median over repetitions; the order alternates).  The loads
read a warm page cache on both sides.

Usage: python -m bench.bench_node [--ranks 4 8] [--mib 128] [--reps 3] [--dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
PIECE = 8 * MiB


def _node_rank(device: str, rank: int, rep: int, mib: int, start, done) -> None:
    from retainz.node import NodeStore

    data = os.urandom(mib * MiB)
    gen = f"bench%2Fr{rank}-rep{rep}"          # bench/r0-rep0: the series of the job "bench"
    with NodeStore.connect(device, job="bench") as store:
        start.wait()
        t0 = time.perf_counter()
        w = store.begin_generation(gen, rep + 1)
        w.write_shard("data", [memoryview(data)[i:i + PIECE] for i in range(0, len(data), PIECE)])
        w.commit()
        t1 = time.perf_counter()
        back = bytearray()
        for chunk in store.read_shard(gen, "data"):
            back += chunk
        t2 = time.perf_counter()
        assert back == data
        store.delete(gen)
    done.put((t0, t1, t2))


def _raw_rank(directory: str, rank: int, rep: int, mib: int, start, done) -> None:
    data = os.urandom(mib * MiB)
    path = os.path.join(directory, f"r{rank}-rep{rep}.bin")
    start.wait()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    view = memoryview(data)
    for i in range(0, len(data), PIECE):
        os.pwrite(fd, view[i:i + PIECE], i)
    os.fdatasync(fd)
    t1 = time.perf_counter()
    back = bytearray()
    for i in range(0, len(data), PIECE):
        back += os.pread(fd, PIECE, i)
    t2 = time.perf_counter()
    os.close(fd)
    assert back == data
    os.unlink(path)
    done.put((t0, t1, t2))


def _round(target, arg: str, ranks: int, rep: int, mib: int) -> tuple[float, float]:
    """(aggregate save MiB/s, aggregate load MiB/s) of one round."""
    ctx = mp.get_context("spawn")
    start, done = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(arg, r, rep, mib, start, done)) for r in range(ranks)]
    for p in procs:
        p.start()
    time.sleep(2.0)                  # every process has made its bytes and connected
    start.set()
    times = [done.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        assert p.exitcode == 0
    t0 = min(t[0] for t in times)
    total = ranks * mib
    return total / (max(t[1] for t in times) - t0), total / (max(t[2] for t in times) - max(t[1] for t in times))


def run(directory: str, ranks: list[int], mib: int, reps: int) -> dict:
    """Save and load ``mib`` MiB per rank from each of ``ranks`` processes through one service, and the
    same processes with ``pwrite`` files in ``directory`` (the same file system), side by side.

    Returns:
        ``{"mib_per_rank", "reps", "by_ranks": {N: {"save_mib_s", "load_mib_s", "raw_save_mib_s",
        "raw_load_mib_s", "ratio_save", "ratio_load"}}}`` (MiB/s aggregate, medians over ``reps``).
    """
    from retainz.node import NodeStore
    from retainz.store import Store
    from retainz.zoned import FileDevice, Geometry

    work = tempfile.mkdtemp(prefix="bench-node-", dir=directory)
    out = {"mib_per_rank": mib, "reps": reps, "by_ranks": {}}
    try:
        device = os.path.join(work, "dev.img")
        zones = max(64, 2 * max(ranks) * mib // 64 + 16)
        dev = FileDevice.create(device, Geometry(nr_zones=zones, zone_size=64 * MiB, zone_capacity=64 * MiB))
        Store.format(dev).close()
        dev.close()
        raw_dir = os.path.join(work, "raw")
        os.mkdir(raw_dir)
        svc = subprocess.Popen([sys.executable, "-m", "retainz.cli", "serve", device],
                               stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        while True:
            try:
                NodeStore.connect(device).close()
                break
            except (ConnectionRefusedError, FileNotFoundError):
                if svc.poll() is not None:
                    raise RuntimeError("retainz serve exited before it served the bench device") from None
                time.sleep(0.05)
        try:
            for n in ranks:
                node, raw = [], []
                for rep in range(reps):
                    order = [("node", _node_rank, device), ("raw", _raw_rank, raw_dir)]
                    for name, target, arg in (order if rep % 2 == 0 else order[::-1]):
                        (node if name == "node" else raw).append(_round(target, arg, n, rep, mib))
                med = {k: (statistics.median(s for s, _ in v), statistics.median(r for _, r in v))
                       for k, v in (("node", node), ("raw", raw))}
                out["by_ranks"][n] = {
                    "save_mib_s": med["node"][0], "load_mib_s": med["node"][1],
                    "raw_save_mib_s": med["raw"][0], "raw_load_mib_s": med["raw"][1],
                    "ratio_save": med["node"][0] / med["raw"][0], "ratio_load": med["node"][1] / med["raw"][1]}
        finally:
            svc.send_signal(signal.SIGTERM)
            svc.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = run(args.dir, args.ranks, args.mib, args.reps)
    print(json.dumps(out, indent=1))
    for n, r in out["by_ranks"].items():
        print(f"{n} ranks x {args.mib} MiB: save {r['save_mib_s']:.0f} vs {r['raw_save_mib_s']:.0f} MiB/s = "
              f"{r['ratio_save']:.2f} (target 0.9); load {r['load_mib_s']:.0f} vs {r['raw_load_mib_s']:.0f} MiB/s "
              f"= {r['ratio_load']:.2f} (target 0.9)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
