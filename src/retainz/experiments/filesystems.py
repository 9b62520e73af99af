"""Host side of the file-system comparison: one manifest case (``system`` set) -> one QEMU guest that
runs :mod:`retainz.experiments.fsworkload` on a fresh NVMe ZNS namespace.

Every system gets the same namespace: ``zones`` raw zones when the case names them, else
``ceil(peak live bytes / (pressure * zone capacity))`` - pressure here is against the *raw* namespace,
because every system pays its own metadata out of it (btrfs: superblock log zones and DUP metadata
block groups; f2fs: overprovisioning and GC sections; RetainZ: journal zones and the GC reserve).
f2fs also gets a small regular disk for its metadata (:func:`f2fs_meta_bytes`).

The guest timeout is ``$RETAINZ_FS_TIMEOUT`` seconds (default 900): btrfs can hang in ``sync`` after an
ENOSPC; the driver writes its result file before syncing, so a killed guest still leaves the replay's
measurements, recorded with ``guest_timed_out: true``.
"""

from __future__ import annotations

import json
import math
import os
import sys

__all__ = ["namespace_zones", "guest_config", "run_filesystem_case", "f2fs_meta_bytes", "FS_METRIC_KEYS"]

#: Smallest regular virtio disk f2fs keeps its metadata on (its writes count as device writes).
F2FS_META_MIN_BYTES = 64 << 20


def f2fs_meta_bytes(zone_size: int) -> int:
    """Bytes of the regular disk that holds f2fs's metadata in front of a namespace of ``zone_size`` zones:
    :data:`F2FS_META_MIN_BYTES`, or two zones when that is more.

    The rule is mkfs.f2fs's (f2fs-tools mkfs/f2fs_format.c, ``f2fs_prepare_super_block``): segment0
    starts at a zone boundary (``zone_align_start_offset``), the metadata areas (checkpoint, SIT, NAT,
    SSA) are rounded up to whole zones (``ZONE_ALIGN``) and the main area starts on a zone, so the
    regular device must hold the superblock's zone and at least one zone of metadata.  mkfs.f2fs 1.15
    refuses a 64 MiB disk in front of 256 MiB zones ("Conventional device /dev/vda is too small,
    (512 MiB needed)"); 64 MiB serves zones up to 32 MiB.  The disk is a sparse file, so its size
    costs nothing; only what f2fs writes to it counts.
    """
    return max(F2FS_META_MIN_BYTES, 2 * zone_size)
#: Metrics every ok file-system record carries (``retainz verify`` checks them).
FS_METRIC_KEYS = ("system", "device_bytes_written", "checkpoint_bytes", "device_waf", "enospc_step",
                  "enospc_fill", "peak_fill", "zone_resets", "capacity_stop_step", "raw_capacity_bytes",
                  "verify_ok", "bytes_verified", "save_throughput")
#: Smallest namespace: btrfs needs 8 active zones (3 superblock mirrors + system, metadata, data,
#: tree-log and relocation block groups: BTRFS_MIN_ACTIVE_ZONES in fs/btrfs/zoned.c).
MIN_NAMESPACE_ZONES = 8


def namespace_zones(peak_live_bytes: int, zone_capacity: int, *, pressure: float | None,
                    zones: int | None) -> int:
    """Raw zones of the guest namespace for a case (see the module docstring).

    Raises:
        ValueError: fewer than :data:`MIN_NAMESPACE_ZONES` zones.
    """
    n = zones if zones is not None else math.ceil(peak_live_bytes / (pressure * zone_capacity))
    if n < MIN_NAMESPACE_ZONES:
        raise ValueError(f"the namespace would have {n} zones; the comparison needs at least "
                         f"{MIN_NAMESPACE_ZONES} (btrfs's minimum of active zones)")
    return n


def guest_config(system: str, nr_zones: int, inputs: dict, *, timeout: float, cwd: str):
    """The :class:`~retainz.vm.guest.GuestConfig` of one case: the namespace, the modules the system
    needs, f2fs's metadata disk, mq-deadline on the zoned device (f2fs requires it on ZNS; every system
    gets the same), ``inputs["guest_memory_mib"]`` of RAM (512 MiB when absent)."""
    from retainz.experiments.fsworkload import parse_system
    from retainz.experiments.manifest import CASE_DEFAULTS
    from retainz.vm.guest import DiskConfig, GuestConfig, ZNSConfig

    name = parse_system(system).name
    zns = ZNSConfig(zones=nr_zones, zone_size=inputs["zone_size"], zone_capacity=inputs["zone_capacity"],
                    max_open=inputs["max_open"], max_active=inputs["max_active"])
    import retainz

    # the guest imports this very source tree (a worktree's, not whatever the venv has installed)
    env = {"PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(retainz.__file__)))}
    return GuestConfig(zns=zns, nullblk=None, disk=DiskConfig(f2fs_meta_bytes(zns.zone_size)) if name == "f2fs" else None,
                       modules=() if name == "retainz" else (name,), scheduler="mq-deadline",
                       memory_mb=inputs.get("guest_memory_mib", CASE_DEFAULTS["guest_memory_mib"]), timeout=timeout, cwd=cwd, env=env)


def run_filesystem_case(trace_path: str, case, workdir: str) -> dict:
    """Run one ``system`` case in a fresh guest; returns the driver's result dict plus the guest's.

    Raises:
        RuntimeError: the guest tooling is missing, or the guest produced no result file (the message
            carries the console's tail).
    """
    from retainz.trace.replay import trace_stats
    from retainz.vm.guest import run_in_guest
    from retainz.vm.setup import VMSetupError

    i = case.inputs
    stats = trace_stats(trace_path)
    nr = namespace_zones(stats.peak_live_bytes, i["zone_capacity"], pressure=i["pressure"], zones=i["zones"])
    out = os.path.join(os.path.abspath(workdir), case.id)
    os.makedirs(out, exist_ok=True)
    result_file = os.path.join(out, "result.json")
    for stale in (result_file, result_file + ".part"):
        if os.path.exists(stale):
            os.unlink(stale)
    timeout = float(os.environ.get("RETAINZ_FS_TIMEOUT", "900"))
    cfg = guest_config(i["system"], nr, i, timeout=timeout, cwd=os.getcwd())
    argv = [sys.executable, "-m", "retainz.experiments.fsworkload", "--system", i["system"], "--trace",
            os.path.abspath(trace_path), "--out", result_file, "--policy", i["policy"],
            "--reserve-zones", str(i["reserve_zones"])]
    try:
        res = run_in_guest(argv, out, cfg, install=False)
    except VMSetupError as e:
        raise RuntimeError(f"device 'guest' is unavailable: {e} (run `retainz vm setup`)") from None
    if not os.path.exists(result_file):
        raise RuntimeError(f"the guest left no result (exit {res.status}):\n{res.console_tail()}")
    with open(result_file, encoding="utf-8") as f:
        result = json.load(f)
    if "device_waf" not in result:
        raise RuntimeError(f"the guest stopped before the run was measured (exit {res.status}):\n"
                           f"{res.console_tail()}")
    result.update(guest_status=res.status, guest_timed_out=res.timed_out, guest_seconds=round(res.seconds, 1),
                  pressure=i["pressure"], trace_sha256=stats.sha256, trace_peak_live_bytes=stats.peak_live_bytes)
    return result
