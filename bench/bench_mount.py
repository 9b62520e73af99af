"""Checkpoints through ``retainz mount`` against the same operations on a local directory of the same file
system, and against ZonedStorageWriter/Reader on the same kind of device, side by side in one run
(``make bench-mount``; also part of ``make bench``; issue 28.2's targets).

One state dict of large float32 tensors (:func:`bench.bench_dcp.make_state`) is saved and loaded by

* ``torch``: ``torch.save`` of the whole dict as one file, ``torch.load`` back;
* ``dcp``: DCP's stock ``FileSystemWriter``/``FileSystemReader`` into a checkpoint directory;
* ``safetensors``: ``safetensors.torch.save_file``/``load_file`` (when safetensors is installed);
* ``dd``: ``dd bs=4M`` copying the torch file in (save) and reading it to ``/dev/null`` (load);
* ``resave``: ``torch.save`` over a file of the same name saved and loaded just before (untimed), then
  ``torch.load``: through the mount a write-only re-save that nobody reads is written through the page
  cache, which the first open after its commit keeps (issue 44.8);

each into ``MNT/...`` (a ``retainz mount`` of a FileDevice; the FUSE server is a separate process) and into
a local directory beside the device file, and DCP also through ``ZonedStorageWriter``/``Reader`` on a second
FileDevice there (``zoned``, no kernel crossing).  Every save ends durable (fsync for ``torch``,
``safetensors`` and ``dd``, ``sync_files=True`` for DCP; a mounted file commits at close).  Loads run warm
(right after the save) and, where ``/proc/sys/vm/drop_caches`` is writable, cold (caches dropped first).
Every load is checked against the saved tensors.  The order of the places rotates between repetitions;
figures are medians.  The mount server's peak resident memory (``VmHWM``) is read from ``/proc`` at the
end.

Throughput = state-dict tensor bytes / wall seconds.  Ratios: mount / local per operation (target 0.9),
DCP load mount / zoned (target 0.8), server memory (target < 256 MiB).

Usage: python -m bench.bench_mount [--dir DIR] [--mib N] [--reps N] [--no-cold] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed.checkpoint as dcp
from bench.bench_dcp import MiB, drop_caches, empty_like, make_state, nbytes, same
from bench.scratch import in_scratch, report

from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter
from retainz.jobs import stores
from retainz.zoned import FileDevice, Geometry

try:
    from safetensors.torch import load_file, save_file
except ImportError:           # the payload extra brings it (transformers)
    load_file = save_file = None

OPS = ("torch", "dcp", "safetensors", "dd", "resave")


def _retainz(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "retainz.cli", *args], check=True, capture_output=True, text=True)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _server_hwm(device: str) -> int | None:
    """Peak resident bytes (VmHWM) of the process serving ``device``'s mount, or None if not found."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"mount" not in argv or device.encode() not in argv:
                continue
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            continue
    return None


def _tensors(sd: dict) -> dict:
    """The tensors of ``sd`` (safetensors holds tensors only; the dict's step counter stays out)."""
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def _save(op: str, place: str, root: str, sd: dict, name: str, zoned_dev: str, src_file: str) -> None:
    if place == "zoned":
        dcp.save(sd, storage_writer=ZonedStorageWriter(zoned_dev), checkpoint_id=name)
        return
    path = os.path.join(root, name)
    if op in ("torch", "resave"):
        with open(path, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
    elif op == "dcp":
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(path, sync_files=True))
    elif op == "safetensors":
        save_file(_tensors(sd), path)
        _fsync_path(path)
    else:
        subprocess.run(["dd", f"if={src_file}", f"of={path}", "bs=4M", "conv=fsync", "status=none"], check=True)


def _load(op: str, place: str, root: str, sd: dict, name: str, zoned_dev: str) -> None:
    if place == "zoned":
        out = empty_like(sd)
        dcp.load(out, storage_reader=ZonedStorageReader(zoned_dev), checkpoint_id=name)
    else:
        path = os.path.join(root, name)
        if op in ("torch", "resave"):
            out = torch.load(path, weights_only=True)
        elif op == "dcp":
            out = empty_like(sd)
            dcp.load(out, storage_reader=dcp.FileSystemReader(path))
        elif op == "safetensors":
            out, sd = load_file(path), _tensors(sd)
        else:
            subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M", "status=none"], check=True)
            return
    if not same(sd, out):
        raise AssertionError(f"{op} load from {place} returned different bytes")


def _remove(op: str, place: str, root: str, name: str, store) -> None:
    if place == "zoned":
        store.delete(name)
        return
    path = os.path.join(root, name)
    shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)


def run(d: str, mib: int, reps: int, cold: bool = True) -> dict:
    """Measure every operation at every place ``reps`` times in scratch folder ``d``; returns the report
    (``MiB_per_s`` per ``OP_PLACE_save|load[_cold]``, the ratios, ``server_hwm_bytes``)."""
    from retainz.mount.runner import load_fuse

    load_fuse()
    sd = make_state(mib)
    size = nbytes(sd)
    zone = 64 * MiB
    geometry = Geometry(nr_zones=4 * size // zone + 16, zone_size=zone, zone_capacity=zone, max_open=14,
                        max_active=14)
    zoned_dev, mount_dev = os.path.join(d, "zoned.img"), os.path.join(d, "mount.img")
    FileDevice.create(mount_dev, geometry).close()
    _retainz("mkfs", mount_dev)
    mnt, local = os.path.join(d, "mnt"), os.path.join(d, "local")
    os.makedirs(mnt)
    os.makedirs(local)
    src_file = os.path.join(d, "src.pt")               # what dd copies in: the torch file, from local disk
    torch.save(sd, src_file)
    ops = [op for op in OPS if op != "safetensors" or save_file is not None]
    cold = cold and drop_caches(True)
    t: dict[str, list[float]] = {}
    _retainz("mount", mount_dev, mnt)
    try:
        with stores.using(zoned_dev, geometry=geometry) as store:
            for r in range(reps):
                for op in ops:
                    places = ["mount", "local"] + (["zoned"] if op == "dcp" else [])
                    places = places[r % len(places):] + places[:r % len(places)]
                    for place in places:
                        root = mnt if place == "mount" else local
                        name = f"step-{r}" if op == "dcp" else f"{op}-{r}.bin"
                        if op == "resave":        # the version it replaces: committed, its pages cached
                            _save(op, place, root, sd, name, zoned_dev, src_file)
                            _load(op, place, root, sd, name, zoned_dev)
                        s = time.perf_counter()
                        _save(op, place, root, sd, name, zoned_dev, src_file)
                        t.setdefault(f"{op}_{place}_save", []).append(time.perf_counter() - s)
                        s = time.perf_counter()
                        _load(op, place, root, sd, name, zoned_dev)
                        t.setdefault(f"{op}_{place}_load", []).append(time.perf_counter() - s)
                        if cold:
                            drop_caches(True)
                            s = time.perf_counter()
                            _load(op, place, root, sd, name, zoned_dev)
                            t.setdefault(f"{op}_{place}_load_cold", []).append(time.perf_counter() - s)
                        _remove(op, place, root, name, store)
        hwm = _server_hwm(mount_dev)
    finally:
        _retainz("umount", mnt)
    mbps = {k: size / statistics.median(v) / MiB for k, v in t.items()}
    ratios = {}
    for k in mbps:
        op, place, *what = k.split("_")
        if place == "mount":
            ratios[f"{op}_{'_'.join(what)}_mount_vs_local"] = round(mbps[k] / mbps[f"{op}_local_{'_'.join(what)}"], 3)
            if op == "dcp":
                ratios[f"dcp_{'_'.join(what)}_mount_vs_zoned"] = round(mbps[k] / mbps[f"dcp_zoned_{'_'.join(what)}"], 3)
    return {"state_dict_bytes": size, "reps": reps, "cold": cold,
            "MiB_per_s": {k: round(v, 1) for k, v in sorted(mbps.items())}, "ratios": ratios,
            "server_hwm_bytes": hwm, "torch": torch.__version__, "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temp dir under out/)")
    ap.add_argument("--mib", type=int, default=2048, help="state dict size (MiB)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-cold", action="store_true", help="warm loads only (no drop_caches)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    res = in_scratch("bench-mount-", args.dir, lambda d: run(d, args.mib, args.reps, cold=not args.no_cold))
    report(res, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
