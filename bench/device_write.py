"""Device write benchmark: RetainZ's devices against plain ``os.pwrite`` on the same storage, side by side.

Two comparisons, each measured in one run with the two methods interleaved round by round:

1. ``LinuxZonedDevice`` vs plain ``os.pwrite`` on the same ``O_DIRECT`` descriptor type, sequential
   zone writes on the QEMU guest's NVMe ZNS namespace (``/dev/nvme0n1``), in the same guest run.
   Both write the same page-aligned buffer in the same request size; zones alternate between the two
   methods and are reset between rounds.  Target ratio >= 0.90.  A second row passes ``bytes`` (which
   LinuxZonedDevice must copy into an aligned buffer) for information.
2. ``FileDevice`` vs plain ``os.pwrite`` to a regular file in the same folder (same disk), each zone
   written sequentially and made durable (``flush()`` vs ``fsync``).  Target ratio >= 0.95.

Each ratio is the median over back-to-back pairs (one zone by each method, the order alternating) of
rate(RetainZ) / rate(plain), so slow drifts of the shared machine cancel out.

Usage: ``make bench-device`` (= ``python -m bench.device_write``); ``--no-guest`` skips part 1.
Results are printed and written to ``out/bench/device_write.json``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out" / "bench"
MiB = 1 << 20

# Guest geometry for part 1: 24 zones of 64 MiB (48 MiB writable): a 1.5 GiB sparse raw file.
GUEST_ZONES, GUEST_ZONE_SIZE, GUEST_ZONE_CAP = 24, 64 * MiB, 48 * MiB


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


# -- part 1, inside the guest ------------------------------------------------------------------------

def guest_part(dev_path: str, configs: list[tuple[str, int]], rounds: int, zones_per_round: int,
               result_path: str) -> None:
    """Runs in the guest: for each (scheduler, write size), time LinuxZonedDevice.write vs os.pwrite,
    zone by zone, interleaved; writes the samples as JSON to ``result_path``."""
    results = []
    for scheduler, chunk in configs:
        name = os.path.basename(dev_path)
        Path(f"/sys/block/{name}/queue/scheduler").write_text(scheduler)
        results.append(_guest_config(dev_path, chunk, rounds, zones_per_round))
    Path(result_path).write_text(json.dumps(results, indent=1))


def _guest_config(dev_path: str, chunk: int, rounds: int, zones_per_round: int) -> dict:
    from retainz.zoned.linux import LinuxZonedDevice

    dev = LinuxZonedDevice(dev_path)
    g = dev.geometry
    cap = g.zone_capacity
    if 2 * zones_per_round > g.nr_zones:
        raise SystemExit(f"need {2 * zones_per_round} zones, the device has {g.nr_zones}")
    buf = mmap.mmap(-1, chunk)
    buf.write(os.urandom(chunk))
    as_bytes = bytes(buf)
    # plain pwrite needs its own descriptor: the device holds the node O_EXCL, so open without it
    raw_fd = os.open(dev_path, os.O_RDWR | os.O_DIRECT)
    samples: dict[str, list[float]] = {"device": [], "pwrite": [], "device_bytes": [], "pwrite_b": []}

    def by_device(zone: int, data) -> float:
        start = zone * g.zone_size
        t0 = time.perf_counter()
        for off in range(0, cap, chunk):
            dev.write(start + off, data)
        return time.perf_counter() - t0

    def by_pwrite(zone: int, data) -> float:
        start = zone * g.zone_size
        t0 = time.perf_counter()
        for off in range(0, cap, chunk):
            os.pwrite(raw_fd, data, start + off)
        return time.perf_counter() - t0

    for z in range(2 * zones_per_round):  # warm-up: the raw file's first touch allocates host blocks
        by_pwrite(z, buf)
    for r in range(rounds):
        for z in range(g.nr_zones):
            dev.reset_zone(z)
        for i in range(zones_per_round):
            za, zb = 2 * i, 2 * i + 1
            if (r + i) % 2:  # alternate who goes first
                za, zb = zb, za
            if i % 2 == 0:
                samples["device"].append(_rate(cap, by_device(za, buf)))
                samples["pwrite"].append(_rate(cap, by_pwrite(zb, buf)))
            else:
                samples["device_bytes"].append(_rate(cap, by_device(za, as_bytes)))
                samples["pwrite_b"].append(_rate(cap, by_pwrite(zb, buf)))
    for z in range(g.nr_zones):
        dev.reset_zone(z)
    os.close(raw_fd)
    dev.close()
    return {"device": dev_path, "chunk": chunk, "zone_capacity": cap, "rounds": rounds,
            "scheduler": dev.scheduler, "max_write": dev.max_write, "samples_mb_s": samples}


#: (scheduler, bytes per write) measured in the guest: the NVMe default scheduler with writes of the
#: largest request (512 KiB), and mq-deadline (which orders writes per zone) with 4 MiB writes.
GUEST_CONFIGS = [("none", 512 * 1024), ("mq-deadline", 4 * MiB)]


def run_guest(rounds: int, zones_per_round: int) -> list[dict] | None:
    from retainz.vm.guest import GuestConfig, ZNSConfig, run_in_guest
    from retainz.vm.setup import VMSetupError

    out = OUT / "guest"
    out.mkdir(parents=True, exist_ok=True)
    result_path = out / "linux_device.json"
    result_path.unlink(missing_ok=True)
    cfg = GuestConfig(zns=ZNSConfig(zones=GUEST_ZONES, zone_size=GUEST_ZONE_SIZE,
                                    zone_capacity=GUEST_ZONE_CAP, max_open=0, max_active=0),
                      nullblk=None, memory_mb=512, timeout=600, cwd=str(ROOT), raw_dir=str(OUT))
    configs = ",".join(f"{sched}:{chunk}" for sched, chunk in GUEST_CONFIGS)
    cmd = [sys.executable, "-m", "bench.device_write", "--guest-part", "/dev/nvme0n1", "--configs", configs,
           "--rounds", str(rounds), "--zones-per-round", str(zones_per_round), "--result", str(result_path)]
    try:
        res = run_in_guest(cmd, out, cfg)
    except VMSetupError as e:
        print(f"guest part skipped: {e}", file=sys.stderr)
        return None
    if res.status != 0 or not result_path.exists():
        print(f"guest part failed (exit {res.status}); console:\n{res.console_tail()}", file=sys.stderr)
        return None
    return json.loads(result_path.read_text())


# -- part 2, on the host -----------------------------------------------------------------------------

def file_part(zone_size: int, zones: int, chunk: int, rounds: int) -> dict:
    """FileDevice.write + flush vs os.pwrite + fsync to a regular file in the same folder."""
    from retainz.zoned import FileDevice, Geometry

    OUT.mkdir(parents=True, exist_ok=True)
    geometry = Geometry(nr_zones=zones, zone_size=zone_size, zone_capacity=zone_size, max_open=0,
                        max_active=0)
    dev_path, plain_path = OUT / "bench_filedevice.img", OUT / "bench_plain.img"
    data = os.urandom(chunk)
    samples: dict[str, list[float]] = {"filedevice": [], "pwrite": []}
    dev = FileDevice.create(dev_path, geometry, force=True)
    fd = os.open(plain_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, geometry.size)
    try:
        for r in range(rounds):
            for z in range(zones):
                def by_device(z=z):
                    t0 = time.perf_counter()
                    for off in range(0, zone_size, chunk):
                        dev.write(z * zone_size + off, data)
                    dev.flush()
                    return time.perf_counter() - t0

                def by_pwrite(z=z):
                    t0 = time.perf_counter()
                    for off in range(0, zone_size, chunk):
                        os.pwrite(fd, data, z * zone_size + off)
                    os.fsync(fd)
                    return time.perf_counter() - t0

                first, second = (by_device, by_pwrite) if (r + z) % 2 == 0 else (by_pwrite, by_device)
                t1, t2 = first(), second()
                td, tp = (t1, t2) if first is by_device else (t2, t1)
                samples["filedevice"].append(_rate(zone_size, td))
                samples["pwrite"].append(_rate(zone_size, tp))
            for z in range(zones):
                dev.reset_zone(z)
            os.ftruncate(fd, 0)
            os.ftruncate(fd, geometry.size)
    finally:
        dev.close()
        os.close(fd)
        dev_path.unlink(missing_ok=True)
        plain_path.unlink(missing_ok=True)
    return {"folder": str(OUT), "zone_size": zone_size, "chunk": chunk, "rounds": rounds,
            "samples_mb_s": samples}


def _ratio(samples: dict, a: str, b: str) -> tuple[float, float, float]:
    """Medians of both rates, and the median of the per-pair ratios (sample i of ``a`` and of ``b`` were
    taken back to back, so a pair shares the machine's state: this is robust to the drift of a shared
    disk or CPU that the medians of the rates are not)."""
    ma, mb = statistics.median(samples[a]), statistics.median(samples[b])
    return ma, mb, statistics.median(x / y for x, y in zip(samples[a], samples[b], strict=True))


def main(argv: list[str] | None = None) -> int:
    """Run both comparisons and print the ratios (exit 0 whatever they are: a benchmark, not a test)."""
    ap = argparse.ArgumentParser(prog="python -m bench.device_write", description=__doc__.split("\n")[0])
    ap.add_argument("--guest-part", metavar="DEV", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--configs", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--zones-per-round", type=int, default=8)
    ap.add_argument("--file-chunk", type=int, default=MiB)
    ap.add_argument("--file-zone-size", type=int, default=64 * MiB)
    ap.add_argument("--file-zones", type=int, default=8)
    ap.add_argument("--no-guest", action="store_true", help="skip the guest (LinuxZonedDevice) part")
    args = ap.parse_args(argv)
    if args.guest_part:
        configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
        guest_part(args.guest_part, configs, args.rounds, args.zones_per_round, args.result)
        return 0

    t0 = time.monotonic()
    report: dict = {}
    if not args.no_guest:
        g = run_guest(args.rounds, args.zones_per_round)
        if g:
            report["linux"] = []
            for cfg in g:
                s = cfg["samples_mb_s"]
                dev_mb, pw_mb, ratio = _ratio(s, "device", "pwrite")
                _, _, ratio_b = _ratio(s, "device_bytes", "pwrite_b")
                report["linux"].append({**cfg, "median_device_mb_s": dev_mb, "median_pwrite_mb_s": pw_mb,
                                        "ratio": ratio, "ratio_bytes_input": ratio_b, "target": 0.90})
    f = file_part(args.file_zone_size, args.file_zones, args.file_chunk, args.rounds)
    fd_mb, fp_mb, fratio = _ratio(f["samples_mb_s"], "filedevice", "pwrite")
    report["file"] = {**f, "median_filedevice_mb_s": fd_mb, "median_pwrite_mb_s": fp_mb, "ratio": fratio,
                      "target": 0.95}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "device_write.json").write_text(json.dumps(report, indent=1))

    print("\nDevice write benchmark (MB/s: medians of per-zone samples; ratio: median of back-to-back pairs)")
    if "linux" in report:
        for r in report["linux"]:
            print(f"  LinuxZonedDevice vs os.pwrite, {r['device']} in the QEMU guest, {r['scheduler']} "
                  f"scheduler, {r['chunk'] // 1024} KiB writes, {r['zone_capacity'] // MiB} MiB zones:")
            print(f"    aligned buffer: {r['median_device_mb_s']:.0f} vs {r['median_pwrite_mb_s']:.0f} MB/s  "
                  f"ratio {r['ratio']:.3f} (target >= 0.90) {'OK' if r['ratio'] >= 0.90 else 'BELOW TARGET'}")
            print(f"    bytes input (copied to an aligned buffer): ratio {r['ratio_bytes_input']:.3f}")
    else:
        print("  LinuxZonedDevice vs os.pwrite: not measured (no guest)")
    r = report["file"]
    print(f"  FileDevice vs os.pwrite+fsync, regular files in {r['folder']}, {r['chunk'] // MiB} MiB writes, "
          f"{r['zone_size'] // MiB} MiB zones, flushed per zone:")
    print(f"    {r['median_filedevice_mb_s']:.0f} vs {r['median_pwrite_mb_s']:.0f} MB/s  ratio "
          f"{r['ratio']:.3f} (target >= 0.95) {'OK' if r['ratio'] >= 0.95 else 'BELOW TARGET'}")
    print(f"  ({time.monotonic() - t0:.0f} s; details in {OUT / 'device_write.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
