"""Store benchmarks, each measured side by side with its baseline in one run (``make bench-store``).

1. write: a generation streamed into a store on a FileDevice, versus plain ``pwrite`` of the same
   bytes (1 MiB writes, one ``fdatasync`` at the end, the FileDevice's sync) to a file in the same
   directory.  Target >= 0.95.  The store's commit syncs four times (data, zone state; commit
   record, zone state), as its durability order requires; the FileDevice starts the kernel's
   writeback every ``WRITEBACK_BYTES`` while the plain baseline does not, so the same baseline with
   that early writeback is measured too (shown for information).
2. mount: ``Store.open`` of a journal holding ~100,000 records (commit + deletion records of a
   payload-less store): records replayed per second.
3. gc: copying GC on a FileDevice (read, verify, write, flush, journal, reset) versus a raw copy of
   the same number of bytes between two files (pread + pwrite, fdatasync); both timed after a sync of
   the setup's dirty pages, median of 3.
4. replay: extents placed per second by a payload-less write/commit/delete loop on 4,096 zones
   (the trace-replay hot path; target 200,000).
5. format: ``retainz mkfs`` and a first open of a FileDevice of N zones (64 KiB zones, the smallest a
   journal takes: the zone count, not the bytes, is what costs; a sparse file), in seconds each; at 1,048,576 zones (the largest device) and at
   1/16 of it, so the growth shows (issue 44.2: 3 min 12 s at 1,048,576 zones; target under 5 s: format +
   open measured 33.5 + 21.6 s before and 2.9 + 1.4 s after the fixes of docs/performance.md, loaded machine).

Usage: python bench/bench_store.py [--dir DIR] [--mib N] [--records N] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time

from retainz.hint import Hint
from retainz.placement.base import PERMANENT
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice
from retainz.zoned.file import WRITEBACK_BYTES
from retainz.zoned.syscalls import start_writeback

MiB = 1 << 20
#: The sync the baselines use: the same one the FileDevice uses (``fdatasync`` where available), so a
#: ratio compares the store with plain I/O of the same durability, not two sync primitives.
_datasync = getattr(os, "fdatasync", os.fsync)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bench_write(d: str, mib: int, reps: int) -> dict:
    buf = random.Random(1).randbytes(MiB)
    zone = 64 * MiB
    geometry = Geometry(nr_zones=mib // 64 + 8, zone_size=zone, zone_capacity=zone, max_open=14,
                        max_active=14)
    store_t, raw_t, raw_wb_t = [], [], []
    for r in range(reps):
        # raw: pwrite the same bytes, 1 MiB at a time, fdatasync; and the same with the FileDevice's
        # early writeback
        path = os.path.join(d, "raw.bin")
        raw_t.append(_raw_write(path, buf, mib, writeback=False))
        raw_wb_t.append(_raw_write(path, buf, mib, writeback=True))
        # store: one generation, 8 shards streamed in 1 MiB chunks, commit (fsync)
        dpath = os.path.join(d, "store.img")
        dev = FileDevice.create(dpath, geometry, force=True)
        s = Store.format(dev)
        per = mib // 8
        t = time.perf_counter()
        w = s.begin_generation(f"g{r}", 1, declared_size=mib * MiB)
        for j in range(8):
            w.write_shard(f"shard{j}", (buf for _ in range(per)))
        w.commit()
        store_t.append(time.perf_counter() - t)
        s.close()
        dev.close()
        os.unlink(dpath)
    raw, raw_wb, store = statistics.median(raw_t), statistics.median(raw_wb_t), statistics.median(store_t)
    nbytes = mib * MiB
    return {"bytes": nbytes, "raw_MBps": nbytes / raw / 1e6, "raw_writeback_MBps": nbytes / raw_wb / 1e6,
            "store_MBps": nbytes / store / 1e6, "ratio": raw / store, "ratio_writeback": raw_wb / store,
            "reps": reps}


def _raw_write(path: str, buf: bytes, mib: int, *, writeback: bool) -> float:
    """Seconds to ``pwrite`` ``buf`` ``mib`` times (1 MiB each) to a new file and ``fdatasync`` it;
    ``writeback``: also start the kernel's writeback every ``WRITEBACK_BYTES``, as the FileDevice
    does (:func:`retainz.zoned.syscalls.start_writeback`)."""
    every = max(1, WRITEBACK_BYTES // MiB)
    t = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    for i in range(mib):
        os.pwrite(fd, buf, i * MiB)
        if writeback and (i + 1) % every == 0:
            start_writeback(fd)
    _datasync(fd)
    os.close(fd)
    dt = time.perf_counter() - t
    os.unlink(path)
    return dt


def _loop(store: Store, n: int, shards: int, size: int, keep: int) -> None:
    live = []
    for i in range(n):
        w = store.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=i + keep))
        for j in range(shards):
            w.write_counted_shard(f"s{j}", size)
        w.commit()
        live.append(f"g{i}")
        if len(live) > keep:
            store.delete(live.pop(0), step=i)


def bench_format(d: str, zones: int) -> dict:
    """``Store.format`` then ``Store.open`` (what ``retainz mkfs`` and the next command do) of a fresh
    FileDevice of ``zones`` 64 KiB zones in ``d``: seconds of each (the device file's creation is not
    timed)."""
    path = os.path.join(d, f"format-{zones}.img")
    g = Geometry(nr_zones=zones, zone_size=4096 * 16, zone_capacity=4096 * 16)
    FileDevice.create(path, g, force=True).close()
    try:
        t = time.perf_counter()
        with FileDevice(path) as dev:
            Store.format(dev).close()
        t_format = time.perf_counter() - t
        t = time.perf_counter()
        with FileDevice(path) as dev:
            Store.open(dev).close()
        t_open = time.perf_counter() - t
    finally:
        os.unlink(path)
    return {"zones": zones, "format_s": t_format, "open_s": t_open}


def bench_mount(records: int) -> dict:
    # ~records journal records need records * 2 * 4 KiB of meta zone (one block per record, two copies
    # since store format 5), so the chain the open replays is not cut short by a rollover's snapshot
    zone = max(64 * MiB, ((records * 2 * 4096 * 5 // 4) // MiB + 1) * MiB)
    g = Geometry(nr_zones=67, zone_size=zone, zone_capacity=zone, max_open=14, max_active=14)
    dev = MemoryDevice(g, payload=False)
    s = Store.format(dev)
    _loop(s, records // 2, 2, 4096, 5)
    s.close()
    rolls = s.metrics.rollovers
    t = time.perf_counter()
    s = Store.open(dev)
    dt = time.perf_counter() - t
    n = s.recovery.records
    s.close()
    return {"records": n, "seconds": dt, "records_per_s": n / dt, "rollovers_while_building": rolls}


def _settle() -> None:
    """Write back dirty pages before a timed section, so neither side pays for the other's setup."""
    os.sync()
    time.sleep(0.5)


def bench_gc(d: str, mib: int, zone: int = 32 * MiB, save: int = 2 * MiB, reps: int = 3) -> dict:
    """GC of a store whose every zone mixes permanent and deleted saves, versus a raw copy of the
    same bytes; each side timed after a settle (sync), median of ``reps``, interleaved."""
    geometry = Geometry(nr_zones=(2 * mib * save) // zone + 12, zone_size=zone, zone_capacity=zone, max_open=14,
                        max_active=14)
    gc_t, raw_t = [], []
    for _ in range(reps):
        dpath = os.path.join(d, "gc.img")
        dev = FileDevice.create(dpath, geometry, force=True)
        s = Store.format(dev, gc_reserve_zones=0, policy="greedy")   # retainz would separate them: no copy
        rnd = random.Random(2)
        for i in range(2 * mib):   # alternate permanent / temporary saves: every zone mixes them
            w = s.begin_generation(f"g{i}", i, hint=Hint(reclaim_step=PERMANENT if i % 2 else i + 1))
            w.write_shard("s", [rnd.randbytes(save)])
            w.commit()
        for i in range(0, 2 * mib, 2):
            s.delete(f"g{i}")
        _settle()
        t = time.perf_counter()
        rep = s.gc(force=True)
        gc_t.append(time.perf_counter() - t)
        copied = rep.bytes_copied
        s.close()
        dev.close()
        os.unlink(dpath)
        src, dst = os.path.join(d, "src.bin"), os.path.join(d, "dst.bin")
        with open(src, "wb") as f:
            for _ in range(max(copied // MiB, 1)):
                f.write(rnd.randbytes(MiB))
        _settle()
        t = time.perf_counter()
        fi, fo = os.open(src, os.O_RDONLY), os.open(dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        off = 0
        while chunk := os.pread(fi, MiB, off):
            os.pwrite(fo, chunk, off)
            off += len(chunk)
        _datasync(fo)
        os.close(fi)
        os.close(fo)
        raw_t.append(time.perf_counter() - t)
        os.unlink(src)
        os.unlink(dst)
    g, r = statistics.median(gc_t), statistics.median(raw_t)
    return {"bytes_copied": copied, "victims": len(rep.victims), "gc_MBps": copied / g / 1e6,
            "raw_copy_MBps": off / r / 1e6, "ratio": (copied / g) / (off / r), "reps": reps}


def bench_replay(gens: int) -> dict:
    g = Geometry(nr_zones=4096, zone_size=256 * MiB, zone_capacity=256 * MiB, max_open=14, max_active=14)
    s = Store.format(MemoryDevice(g, payload=False))
    t, c = time.perf_counter(), time.process_time()
    _loop(s, gens, 8, 24 * MiB, 5)
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    m = s.metrics
    s.close()
    return {"generations": gens, "extents": m.decisions, "seconds": dt, "cpu_seconds": cpu,
            "extents_per_s": m.decisions / dt, "extents_per_cpu_s": m.decisions / cpu,
            "generations_per_s": gens / dt, "decision_share": m.decision_cpu_seconds / dt}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="out/bench", help="scratch directory on the disk to measure")
    ap.add_argument("--mib", type=int, default=512, help="MiB written by the write benchmark")
    ap.add_argument("--records", type=int, default=100_000, help="journal records for the mount benchmark")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.mib, args.records = 64, 4000
    d = os.path.join(args.dir, "bench_store.tmp")
    os.makedirs(d, exist_ok=True)
    try:
        res = {
            "write": bench_write(d, args.mib, reps=5),
            "mount": bench_mount(args.records),
            "gc": bench_gc(d, max(args.mib // 8, 32)),
            "replay": bench_replay(2000 if args.quick else 20000),
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)
    w, m, g, r = res["write"], res["mount"], res["gc"], res["replay"]
    print(f"write   store {w['store_MBps']:8.0f} MB/s   raw pwrite {w['raw_MBps']:8.0f} MB/s   "
          f"ratio {w['ratio']:.3f} (target >= 0.95)   [{w['bytes'] // MiB} MiB, median of {w['reps']}]")
    print(f"mount   {m['records']} records in {m['seconds']:.2f} s: {m['records_per_s']:,.0f} records/s")
    print(f"gc      store {g['gc_MBps']:8.0f} MB/s   raw copy {g['raw_copy_MBps']:8.0f} MB/s   ratio "
          f"{g['ratio']:.3f}   [{g['bytes_copied'] // MiB} MiB from {g['victims']} zones]")
    print(f"replay  {r['extents']} extents in {r['seconds']:.2f} s: {r['extents_per_s']:,.0f} extents/s, "
          f"{r['extents_per_cpu_s']:,.0f} per CPU-second ({r['generations_per_s']:,.0f} generations/s; "
          f"target 200,000 extents/s)")
    print(f"        (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs while measuring)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
