"""Every benchmark in ``bench/``, one run, each figure next to its target (``make bench``).

Usage: ``python -m bench [--quick] [--json PATH] [--dir DIR] [--no-guest]``;
``python -m bench --markdown REPORT`` prints a report's figures as a Markdown table.

Runs, in this order, with the sizes of :data:`FULL` (or :data:`QUICK` with ``--quick``, a smoke run of
a minute or two that CI runs without thresholds):

* ``bench_replay``: trace replay through the store on a payload-less MemoryDevice (greedy, retainz),
  extents per CPU-second, and the same trace merely parsed (:class:`retainz.trace.io.TraceReader`);
* ``bench_store``: store write vs ``pwrite`` + ``fdatasync``, GC copy vs raw copy, journal mount;
* ``bench_placement``: the retainz decision cost at 256 and 65,536 zones (growth must stay sub-linear);
* ``bench_dcp``: ``dcp.save`` through ``ZonedStorageWriter`` vs raw ``pwrite`` of the same tensor
  bytes (needs the torch extra, ``make setup-torch``; otherwise not measured);
* ``bench_memory``: the peak memory of ``dcp.save`` and ``dcp.load`` through ``ZonedStorageWriter``/``Reader``
  and through ``retainz://`` vs stock DCP on a local directory, each call in a process of its own
  (issue 44.7; needs the torch extra);
* ``bench_node``: 4 and 8 rank processes saving and loading on one device through the node service
  (``retainz serve``) vs the same processes ``pwrite``-ing their own files in a directory of the same
  file system (issue 29.4);
* ``device_write``: FileDevice vs ``os.pwrite`` on the host, and LinuxZonedDevice vs ``os.pwrite`` in
  the QEMU guest (full size only, when ``make vm-setup`` has run; ``--no-guest`` skips it).

The targets are those of issue 17 ("Speed") and of each benchmark's own docstring.

JSON report (``--json PATH``)::

    {"format": 1, "quick": bool, "cpus": int, "load_average_start": float, "load_average": float,
     "date": "YYYY-MM-DD", "commit": str | null, "seconds": float,
     "figures": [{"name": str, "value": float | null, "target": float | null, "met": bool | null,
                  "comparison": ">=" | "<" | null, "unit": str, "note": str}, ...],
     "details": {benchmark: its raw result}}

``met`` is ``value >= target`` (or ``value < target`` where ``comparison`` is ``<``).  ``value`` is
null when the figure was not measured (``note`` says why); ``target`` (and ``comparison``) is null for
a figure shown for information; ``met`` is null when either is null (never a guess), and for every
figure of a ``--quick`` run (small sizes: shown next to its target, never judged).  The report is strict JSON
(no NaN or Infinity).  The exit status is 0 whatever the figures are: a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


@dataclass(frozen=True)
class Sizes:
    """How much each benchmark does (see each module for the units)."""

    replay_steps: int          # generations of the llama3-8b trace replayed per policy
    replay_zones: int          # data zones of the replay device
    store_mib: int             # MiB written by the store write benchmark (GC uses an eighth, >= 32)
    store_reps: int            # repetitions of the write benchmark (median)
    mount_records: int         # journal records replayed by Store.open
    placement_decisions: int   # place() calls timed per zone count
    dcp_mib: int               # state-dict MiB saved by dcp.save
    dcp_reps: int
    device_zones: int          # FileDevice zones written per round (64 MiB each)
    device_rounds: int
    guest: bool                # the QEMU guest part of device_write
    mount_mib: int             # state-dict MiB through the mount, a local directory and ZonedStorageWriter
    mount_reps: int
    mount_cold: bool           # also cold loads (drop_caches)
    node_mib: int              # MiB each rank saves and loads through the node service (4 and 8 ranks)
    node_reps: int
    format_zones: int          # zones of the device mkfs formats and opens (and 1/16 of it)
    memory_mib: int            # state-dict MiB saved and loaded by each face for its peak memory
    memory_tensor_mib: int     # MiB of each of its tensors
    memory_reps: int


FULL = Sizes(replay_steps=100_000, replay_zones=4096, store_mib=512, store_reps=5, mount_records=100_000,
             placement_decisions=1500, dcp_mib=512, dcp_reps=5, device_zones=8, device_rounds=5, guest=True,
             mount_mib=2048, mount_reps=3, mount_cold=True, node_mib=128, node_reps=3,
             format_zones=1 << 20, memory_mib=2048, memory_tensor_mib=256, memory_reps=3)
QUICK = Sizes(replay_steps=2000, replay_zones=4096, store_mib=64, store_reps=3, mount_records=4000,
              placement_decisions=100, dcp_mib=64, dcp_reps=1, device_zones=2, device_rounds=2, guest=False,
              mount_mib=64, mount_reps=1, mount_cold=False, node_mib=8, node_reps=1, format_zones=1 << 14,
              memory_mib=64, memory_tensor_mib=16, memory_reps=1)


@dataclass
class Figure:
    """One figure of the report: ``value`` against ``target`` (``op`` ``>=`` or ``<``)."""

    name: str
    value: float | None
    unit: str
    target: float | None = None
    op: str = ">="
    note: str = ""
    judged: bool = True      # False at quick sizes: shown next to its target, never judged

    @property
    def met(self) -> bool | None:
        if self.value is None or self.target is None or not self.judged:
            return None
        return self.value >= self.target if self.op == ">=" else self.value < self.target

    def target_text(self) -> str | None:
        if self.target is None:
            return None
        t = f"{self.target:,.0f}" if self.target >= 100 else f"{self.target:g}"
        return f"{self.op} {t}"

    def to_dict(self) -> dict:
        value = None if self.value is None or not math.isfinite(self.value) else self.value
        return {"name": self.name, "value": value, "target": self.target, "met": self.met,
                "comparison": self.op if self.target is not None else None, "unit": self.unit, "note": self.note}


def _replay(sizes: Sizes, trace_dir: str) -> tuple[list[Figure], dict]:
    from bench import bench_replay

    from retainz.trace.io import TraceReader

    path = bench_replay.trace(trace_dir, sizes.replay_steps)
    runs = {p: bench_replay.run(path, p, sizes.replay_zones) for p in ("greedy", "retainz")}
    c = time.process_time()
    with TraceReader(path) as r:
        events = sum(1 for _ in r)
    parse_cpu = time.process_time() - c
    where = f"llama3-8b-fsdp:ranks=8 keep 10, {sizes.replay_steps:,} generations, {sizes.replay_zones:,} zones"
    rz = runs["retainz"]
    figs = [
        Figure("replay greedy: extents per CPU-second", runs["greedy"]["extents_per_cpu_s"], "extents/CPU-s",
               250_000, note=where),
        Figure("replay retainz: extents per CPU-second", rz["extents_per_cpu_s"], "extents/CPU-s", 200_000,
               note=where),
        Figure("replay rate / parse rate (retainz, same trace)", parse_cpu / rz["cpu_seconds"], "ratio", 0.5,
               note=f"parse {parse_cpu:.2f} CPU-s ({events:,} events), replay {rz['cpu_seconds']:.2f} CPU-s"),
    ]
    return figs, {"runs": runs, "parse_cpu_seconds": parse_cpu, "events": events}


def _store(sizes: Sizes, scratch: str) -> tuple[list[Figure], dict]:
    from bench import bench_store

    from retainz.zoned.file import WRITEBACK_BYTES

    d = os.path.join(scratch, "store")
    os.makedirs(d, exist_ok=True)
    try:
        w = bench_store.bench_write(d, sizes.store_mib, reps=sizes.store_reps)
        g = bench_store.bench_gc(d, max(sizes.store_mib // 8, 32))
        m = bench_store.bench_mount(sizes.mount_records)
        fmt = [bench_store.bench_format(d, n) for n in (sizes.format_zones // 16, sizes.format_zones)]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    figs = [
        Figure("store write / pwrite + fdatasync", w["ratio"], "ratio", 0.95,
               note=f"{w['bytes'] >> 20} MiB on a FileDevice, {w['store_MBps']:.0f} vs {w['raw_MBps']:.0f} MB/s, "
                    f"median of {w['reps']}"),
        Figure("store write / pwrite + early writeback + fdatasync", w["ratio_writeback"], "ratio",
               note=f"the raw side also starts writeback every {WRITEBACK_BYTES >> 20} MiB, as the FileDevice "
                    f"does: {w['store_MBps']:.0f} vs {w['raw_writeback_MBps']:.0f} MB/s"),
        Figure("GC copy / raw copy", g["ratio"], "ratio", 0.95,
               note=f"{g['bytes_copied'] >> 20} MiB from {g['victims']} zones, {g['gc_MBps']:.0f} vs "
                    f"{g['raw_copy_MBps']:.0f} MB/s"),
        Figure("journal mount: records per second", m["records_per_s"], "records/s", 250_000,
               note=f"{m['records']:,} records"),
        Figure(f"mkfs + first open, {fmt[1]['zones']:,} zones", fmt[1]["format_s"] + fmt[1]["open_s"], "s", 5,
               op="<", note=f"format {fmt[1]['format_s']:.1f} s + open {fmt[1]['open_s']:.1f} s; at "
                            f"{fmt[0]['zones']:,} zones {fmt[0]['format_s'] + fmt[0]['open_s']:.2f} s (linear: x16)"),
    ]
    return figs, {"write": w, "gc": g, "mount": m, "format": fmt}


def _placement(sizes: Sizes) -> tuple[list[Figure], dict]:
    from bench import bench_placement

    bench_placement.bench_one("retainz", 256, 13, 12, sizes.placement_decisions)   # warm-up, untimed
    us = {n: bench_placement.bench_one("retainz", n, 13, 12, sizes.placement_decisions) for n in (256, 65536)}
    growth = us[65536] / us[256]
    return [Figure("retainz decision cost, 65,536 / 256 zones", growth, "ratio", 256, op="<",
                   note=f"{us[65536]:.1f} us per extent at 65,536 zones, {us[256]:.1f} at 256 (ZN540-like, "
                        "14 active); x256 would be linear")], {"retainz_us": us}


#: Why a ratio to plain ``pwrite`` can exceed 1 (:func:`retainz.zoned.syscalls.start_writeback`).
MIB = 1 << 20
_EARLY = " (above 1: the FileDevice starts writeback early, plain pwrite does not)"


def _dcp(sizes: Sizes, scratch: str) -> tuple[list[Figure], dict]:
    name = "dcp.save via ZonedStorageWriter / raw pwrite"
    try:
        from bench import bench_dcp
    except ImportError as e:
        return [Figure(name, None, "ratio", 0.90, note=f"not measured: {e.name} is not installed "
                                                        "(make setup-torch)")], {}
    d = os.path.join(scratch, "dcp")
    os.makedirs(d, exist_ok=True)
    try:
        res = bench_dcp.run(d, sizes.dcp_mib, sizes.dcp_reps, want_drop=False)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    mbps = res["MiB_per_s"]
    return [Figure(name, res["ratio_save_raw"], "ratio", 0.90,
                   note=f"{res['state_dict_bytes'] >> 20} MiB state dict, {mbps['ours_save']:.0f} vs "
                        f"{mbps['raw_save']:.0f} MiB/s" + (_EARLY if res["ratio_save_raw"] > 1 else "")),
            Figure("dcp.save ours / stock FileSystemWriter", res["ratio_save"], "ratio",
                   note=f"{mbps['ours_save']:.0f} vs {mbps['stock_save']:.0f} MiB/s"),
            Figure("dcp.load ours / stock FileSystemReader", res["ratio_load"], "ratio",
                   note=f"page cache warm; {mbps['ours_load']:.0f} vs {mbps['stock_load']:.0f} MiB/s")], res


def _memory(sizes: Sizes, scratch: str) -> tuple[list[Figure], dict]:
    """Issue 44.7's target: the peak memory of a save and a load through the DCP plugin and through
    ``retainz://`` within 10 % of stock DCP's on a local directory (``bench_memory``)."""
    try:
        import torch  # noqa: F401
        from bench import bench_memory
    except ImportError as e:
        return [Figure("dcp.save peak memory, plugin / stock", None, "ratio", 1.1, op="<",
                       note=f"not measured: {e.name} is not installed (make setup-torch)")], {}
    d = os.path.join(scratch, "memory")
    os.makedirs(d, exist_ok=True)
    try:
        res = bench_memory.run(d, sizes.memory_mib, sizes.memory_tensor_mib, sizes.memory_reps)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    peak = res["peak_MiB"]
    names = {"plugin": "ZonedStorageWriter/Reader", "fsspec": "retainz://"}
    return [Figure(f"dcp.{op} peak memory, {names[face]} / stock", res["ratios"][f"{face}_{op}_vs_stock"],
                   "ratio", 1.1, op="<",
                   note=f"{sizes.memory_mib} MiB state dict of {sizes.memory_tensor_mib} MiB tensors, peak RSS "
                        f"{peak[f'{face}_{op}']:.0f} vs {peak[f'stock_{op}']:.0f} MiB")
            for face in ("plugin", "fsspec") for op in ("save", "load")], res


def _node(sizes: Sizes, scratch: str) -> tuple[list[Figure], dict]:
    """Issue 29.4: aggregate save and load of 4 and 8 ranks on one device through the node service
    >= 0.9x the same ranks pwrite-ing their own files in a directory of the same file system."""
    from bench import bench_node

    d = os.path.join(scratch, "node")
    os.makedirs(d, exist_ok=True)
    try:
        res = bench_node.run(d, [4, 8], sizes.node_mib, sizes.node_reps)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    figs = []
    for n, r in res["by_ranks"].items():
        for op in ("save", "load"):
            figs.append(Figure(f"node service {op}, {n} ranks on one device / pwrite files", r[f"ratio_{op}"],
                               "ratio", 0.90, note=f"{n} x {sizes.node_mib} MiB, {r[f'{op}_mib_s']:.0f} vs "
                                                   f"{r[f'raw_{op}_mib_s']:.0f} MiB/s aggregate"
                                                   + (" (page cache warm)" if op == "load" else "")))
    return figs, res


def _mount(sizes: Sizes, scratch: str) -> tuple[list[Figure], dict]:
    """Issue 28.2's targets: each operation through the mount >= 0.9x a local directory, DCP loads
    >= 0.8x ZonedStorageReader, the server's peak memory < 256 MiB."""
    try:
        from bench import bench_mount

        from retainz.mount.runner import load_fuse

        load_fuse()
    except (ImportError, OSError, RuntimeError) as e:
        return [Figure("mount / local (torch.save)", None, "ratio", 0.90, note=f"not measured: {e}")], {}
    d = os.path.join(scratch, "mount")
    os.makedirs(d, exist_ok=True)
    try:
        res = bench_mount.run(d, sizes.mount_mib, sizes.mount_reps, cold=sizes.mount_cold)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    mbps, figs = res["MiB_per_s"], []
    names = {"torch": "torch.save/load", "dcp": "DCP FileSystemWriter/Reader", "safetensors": "safetensors",
             "dd": "dd bs=4M", "resave": "torch.save/load over the same name"}
    for key, ratio in res["ratios"].items():
        op, *what, _, _, versus = key.split("_")
        what = " ".join(what).replace("load cold", "load (cold)")
        place = "local" if versus == "local" else "zoned"
        other = "local dir" if versus == "local" else "ZonedStorageReader"
        mk = f"{op}_mount_{'_'.join(key.split('_')[1:-3])}"
        figs.append(Figure(f"mount / {other}: {names[op]} {what}", ratio, "ratio",
                           0.90 if versus == "local" else 0.80 if what.startswith("load") else None,
                           note=f"{res['state_dict_bytes'] >> 20} MiB, {mbps[mk]:.0f} vs "
                                f"{mbps[mk.replace('_mount_', f'_{place}_')]:.0f} MiB/s"))
    hwm = res["server_hwm_bytes"]
    figs.append(Figure("mount server peak memory", None if hwm is None else hwm / MIB, "MiB", 256, op="<",
                       note=f"VmHWM while serving a {res['state_dict_bytes'] >> 20} MiB checkpoint"))
    return figs, res


def _device(sizes: Sizes, guest: bool) -> tuple[list[Figure], dict]:
    from bench import device_write

    f = device_write.file_part(64 << 20, sizes.device_zones, 1 << 20, sizes.device_rounds)
    fd_mb, pw_mb, ratio = device_write._ratio(f["samples_mb_s"], "filedevice", "pwrite")
    figs = [Figure("FileDevice write / pwrite + fsync", ratio, "ratio", 0.95,
                   note=f"{fd_mb:.0f} vs {pw_mb:.0f} MB/s, 64 MiB zones flushed per zone"
                        + (_EARLY if ratio > 1 else ""))]
    details = {"file": f}
    linux = device_write.run_guest(sizes.device_rounds, sizes.device_zones) if guest else None
    if linux:
        details["linux"] = linux
        for cfg in linux:
            d_mb, p_mb, r = device_write._ratio(cfg["samples_mb_s"], "device", "pwrite")
            figs.append(Figure(f"LinuxZonedDevice write / pwrite ({cfg['scheduler']}, "
                               f"{cfg['chunk'] >> 10} KiB writes, QEMU guest)", r, "ratio", 0.90,
                               note=f"{d_mb:.0f} vs {p_mb:.0f} MB/s"))
    else:
        why = "--quick" if not sizes.guest else "--no-guest" if not guest else "the guest did not run (make vm-setup)"
        figs.append(Figure("LinuxZonedDevice write / pwrite (QEMU guest)", None, "ratio", 0.90,
                           note=f"not measured: {why}"))
    return figs, details


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if unit != "ratio" else f"{v:.3f}"


def run(sizes: Sizes, scratch: str, guest: bool = True, log=print) -> dict:
    """Run every benchmark at ``sizes``; return the report (see the module docstring)."""
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    figures: list[Figure] = []
    details: dict = {}
    steps = [("replay", lambda: _replay(sizes, os.path.join(scratch, "traces"))),
             ("store", lambda: _store(sizes, scratch)),
             ("placement", lambda: _placement(sizes)),
             ("dcp", lambda: _dcp(sizes, scratch)),
             ("memory", lambda: _memory(sizes, scratch)),
             ("mount", lambda: _mount(sizes, scratch)),
             ("node", lambda: _node(sizes, scratch)),
             ("device", lambda: _device(sizes, guest and sizes.guest))]
    for name, step in steps:
        t = time.monotonic()
        figs, details[name] = step()
        figures += figs
        for f in figs:
            f.judged = sizes != QUICK
            met = {True: "met", False: "NOT MET", None: "quick" if f.target is not None and f.value is not None
                   and not f.judged else ""}[f.met]
            log(f"{f.name:52s} {_fmt(f.value, f.unit):>10s} {f.unit:14s} target {f.target_text() or '-':>10s}  "
                f"{met:7s} {f.note}")
        log(f"  [{name}: {time.monotonic() - t:.0f} s]")
    return {"format": 1, "quick": sizes == QUICK, "cpus": os.cpu_count(), "load_average_start": load0,
            "load_average": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "commit": _commit(), "seconds": round(time.monotonic() - t0, 1),
            "figures": [f.to_dict() for f in figures], "details": details}


def _commit() -> str | None:
    """The checked-out commit (``-dirty`` if the tree has changes), ``None`` outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def markdown(report: dict) -> str:
    """The report's figures as a Markdown table (what README's Benchmarks section shows)."""
    rows = ["| figure | value | target | met | note |", "| --- | ---: | ---: | --- | --- |"]
    for f in report["figures"]:
        fig = Figure(f["name"], f["value"], f["unit"], f["target"], f["comparison"] or ">=", f["note"],
                     judged=not report["quick"])
        met = {True: "yes", False: "**no**", None: "-"}[fig.met]
        unit = "" if fig.unit == "ratio" else f" {fig.unit}"
        rows.append(f"| {fig.name} | {_fmt(fig.value, fig.unit)}{unit if fig.value is not None else ''} | "
                    f"{fig.target_text() or '-'} | {met} | {fig.note} |")
    return "\n".join(rows)


def _finite(obj):
    """``obj`` with non-finite floats as null (the details carry raw results)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a minute or two")
    ap.add_argument("--json", metavar="PATH", help="write the report here (strict JSON)")
    ap.add_argument("--dir", default="out/bench", help="scratch directory on the disk to measure")
    ap.add_argument("--no-guest", action="store_true", help="skip the QEMU guest part")
    ap.add_argument("--markdown", metavar="REPORT", help="print REPORT's figures as a Markdown table (runs nothing)")
    args = ap.parse_args(argv)
    if args.markdown:
        try:
            with open(args.markdown) as f:
                table = markdown(json.load(f))
        except OSError as e:
            print(f"{args.markdown}: {e.strerror}", file=sys.stderr)
            return 2
        except (ValueError, KeyError, TypeError) as e:
            print(f"{args.markdown}: not a benchmark report ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        print(table)
        return 0
    sizes = QUICK if args.quick else FULL
    os.makedirs(args.dir, exist_ok=True)
    print(f"python -m bench{' --quick' if args.quick else ''}: {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}" + ("; quick sizes: a smoke run, fixed costs dominate, so the figures are "
                                          "not comparable with the targets" if args.quick else ""))
    report = run(sizes, args.dir, guest=not args.no_guest)
    met = [f["met"] for f in report["figures"]]
    if args.quick:
        print(f"{len(met)} figures at quick sizes, none judged against its target (make bench judges them); "
              f"{report['seconds']:.0f} s")
    else:
        print(f"{met.count(True)} of {len(met)} figures meet their target, {met.count(False)} do not, "
              f"{met.count(None)} without a target or not measured; {report['seconds']:.0f} s")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(_finite(report), f, indent=1, allow_nan=False)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
