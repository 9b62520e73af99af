"""The guest workload driver of the file-system comparison: one checkpoint trace, written as real files
on a zoned file system (btrfs, f2fs) or through RetainZ on the raw namespace, measured at the device.

It runs *inside* the QEMU guest of :mod:`retainz.vm.guest` (``python -m retainz.experiments.fsworkload``; the
host side is :mod:`retainz.experiments.filesystems`), on the NVMe ZNS namespace ``/dev/nvme0n1``:

==========  ======================================================================================
system      what happens
==========  ======================================================================================
``btrfs``   ``mkfs.btrfs -f -O zoned`` (btrfs-progs; zoned mode since Linux 5.12), mount, replay as
            files.  Option ``bg_reclaim_threshold=N``: written to both
            ``/sys/fs/btrfs/<UUID>/bg_reclaim_threshold`` (the file-system-wide knob zoned reclaim
            checks) and ``/sys/fs/btrfs/<UUID>/allocation/data/bg_reclaim_threshold`` (per space info
            since Linux 5.19, 0-100); the kernel's default is 75 % unusable space per block group.
``f2fs``    ``mkfs.f2fs -f -m -c /dev/nvme0n1 /dev/vda`` (``-m`` zoned mode; the regular virtio disk
            ``/dev/vda`` holds the metadata f2fs keeps at fixed places; one section = one zone),
            ``mount /dev/vda``, replay as files.
``retainz`` :func:`retainz.trace.replay.replay` on ``/dev/nvme0n1`` (LinuxZonedDevice) with the case's
            placement policy (``retainz``, ``greedy``, ``zenfs``), then the store reopened from the
            device and every surviving generation read back.
==========  ======================================================================================

Replay as files: each ``save`` creates ``<mnt>/<gen id>/`` and writes every shard as a file of the
layout's size filled with the same position-dependent pattern bytes trace replay writes; ``commit``
fsyncs every shard file and the folder; ``delete`` removes the folder.  The first ``OSError`` (ENOSPC:
the capacity stop; anything else is recorded as the stop error) ends the replay.  Then ``sync``,
unmount, mount again (so nothing is read from the page cache) and every generation that committed and
was not deleted is read back and compared with its pattern.

Measured (record fields, all from this guest's devices):

* ``device_bytes_written``: sectors written (field 7 of ``/sys/block/DEV/stat``, 512-byte units),
  from after mount (btrfs, f2fs) / before format (retainz) to after the final unmount, summed over the
  zoned namespace and, for f2fs, the metadata disk (also given apart: ``zoned_bytes_written``,
  ``conventional_bytes_written``);
* ``checkpoint_bytes``: shard bytes the workload wrote (files: bytes ``write`` accepted; retainz: the
  store's ``host_bytes``); ``device_waf`` = device bytes / checkpoint bytes;
* ``zone_resets``: retainz: the store's count; file systems: zones whose write pointer went back,
  sampled after every trace event (a lower bound: a zone reset and refilled past its old write
  pointer between two samples is missed);
* ``enospc_step``: training step of the first failure (None: the trace completed);
  ``enospc_fill``: bytes the workload asked the device to hold at that moment (every generation saved
  and not deleted, the failing one whole) / raw namespace capacity; ``peak_fill``: the most live
  bytes held before any failure / raw capacity;
* ``kernel_errors``: file systems: the first error lines the guest's kernel logged about the file
  system (``dmesg --level=emerg,alert,crit,err``, lines naming it), the cause behind a stop whose
  errno (EROFS, EIO) only says the file system gave up;
* ``replay_seconds`` and ``save_throughput`` (checkpoint bytes / replay seconds): TCG-emulated, so
  only ratios between systems mean anything.
"""

from __future__ import annotations

import argparse
import errno
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from retainz.spec import parse_spec
from retainz.trace.format import CommitEvent, CrashEvent, DeleteEvent, SaveEvent
from retainz.trace.io import TraceReader
from retainz.trace.replay import shard_pattern

__all__ = ["SYSTEMS", "SystemSpec", "parse_system", "sectors_written", "ZoneResetCounter", "FileReplay", "same_stream",
           "survivors_before", "fill_at", "kernel_errors", "run_system", "ZONED_DEVICE", "META_DEVICE", "MOUNT_POINT"]

#: Systems the driver knows.  retainz's placement policy is the case's ``policy``.
SYSTEMS = ("retainz", "btrfs", "f2fs")
#: Options each system takes in its spec (``btrfs:bg_reclaim_threshold=50``).
SYSTEM_OPTIONS = {"retainz": (), "btrfs": ("bg_reclaim_threshold",), "f2fs": ()}
ZONED_DEVICE = "/dev/nvme0n1"
#: The regular disk f2fs keeps its metadata on (:class:`retainz.vm.guest.DiskConfig`).
META_DEVICE = "/dev/vda"
#: Mount point inside the guest (its tmpfs; the shared root is read-only).
MOUNT_POINT = "/dev/shm/retainz-fs"
#: Seconds a sync / umount / mount may take before the driver gives up on it (btrfs can hang in sync
#: after an ENOSPC).
COMMAND_TIMEOUT = 120.0


@dataclass(frozen=True)
class SystemSpec:
    """A system and its options, parsed from ``NAME[:key=value,...]``.

    Attributes: name (one of :data:`SYSTEMS`); options (``{"bg_reclaim_threshold": 50}``).
    """

    name: str
    options: dict = field(default_factory=dict, hash=False)

    def spec(self) -> str:
        """The canonical spec string."""
        rest = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return self.name + (f":{rest}" if rest else "")


def parse_system(spec: str) -> SystemSpec:
    """``"btrfs"``, ``"btrfs:bg_reclaim_threshold=50"``, ``"f2fs"``, ``"retainz"`` -> :class:`SystemSpec`.

    Raises:
        ValueError: an item that is not ``key=value`` (:func:`retainz.spec.parse_spec`), an unknown
            system or option, or a threshold outside 0-100 (the range the kernel's
            sysfs store accepts since Linux 5.19).
    """
    name, pairs = parse_spec(str(spec), "system")
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r} (valid: {', '.join(SYSTEMS)})")
    options: dict = {}
    for key, value in pairs:
        if key not in SYSTEM_OPTIONS[name]:
            valid = ", ".join(SYSTEM_OPTIONS[name]) or "none"
            raise ValueError(f"system {name!r}: unknown option {key + '=' + value!r} (valid: {valid})")
        try:
            v = int(value)
        except ValueError:
            raise ValueError(f"system {name!r}: {key} must be an integer, got {value!r}") from None
        if not 0 <= v <= 100:
            raise ValueError(f"system {name!r}: {key} must be a percentage 0-100, got {v}")
        options[key] = v
    return SystemSpec(name, options)


def sectors_written(device: str) -> int:
    """Bytes written to ``device`` since boot: field 7 (sectors written, 512-byte units whatever the
    block size) of ``/sys/block/NAME/stat`` times 512 (Documentation/block/stat.rst)."""
    name = os.path.basename(device)
    with open(f"/sys/block/{name}/stat") as f:
        return int(f.read().split()[6]) * 512


class ZoneResetCounter:
    """Counts zone resets of a zoned block device by sampling its write pointers (``BLKREPORTZONE``).

    A zone whose write pointer is lower than at the previous sample was reset in between.  Opens the
    device read-only and shared, so it works while a file system has it mounted.
    """

    def __init__(self, device: str):
        from retainz.zoned import syscalls

        self._report_zones = syscalls.report_zones
        self._fd = os.open(device, os.O_RDONLY)
        self.resets = 0
        self._wp = self._report()

    def _report(self) -> list[int]:
        wps: list[int] = []
        sector = 0
        while True:
            _, zones = self._report_zones(self._fd, sector, 256)
            if not zones:
                return wps
            wps += [z.wp - z.start for z in zones]
            sector = zones[-1].start + zones[-1].len

    def sample(self) -> None:
        """Compare the write pointers with the previous sample and count the zones that went back."""
        now = self._report()
        self.resets += sum(1 for a, b in zip(self._wp, now, strict=True) if b < a)
        self._wp = now

    def written_zones(self) -> int:
        """Zones whose write pointer is past their start now."""
        return sum(1 for w in self._wp if w > 0)

    def close(self) -> None:
        os.close(self._fd)


def same_stream(got: Iterator[bytes], want: Iterator[bytes]) -> tuple[bool, int]:
    """Compare two byte streams chunked differently without joining them; returns (equal, bytes that
    matched before the first difference or the end)."""
    want_it = iter(want)
    buf = memoryview(b"")
    n = 0
    for chunk in got:
        mv = memoryview(chunk)
        while mv:
            if not buf:
                buf = memoryview(next(want_it, b""))
                if not buf:
                    return False, n          # longer than expected
            k = min(len(buf), len(mv))
            if mv[:k] != buf[:k]:
                return False, n
            mv, buf, n = mv[k:], buf[k:], n + k
    return not buf and not next(want_it, b""), n


def _gen_dir(ev: SaveEvent) -> str:
    return f"{ev.gen:08d}-{ev.name}"


def survivors_before(events: list, stop: int | None) -> dict[int, SaveEvent]:
    """Generations committed and not deleted among ``events[:stop]`` (all events if ``stop`` is None)."""
    saved: dict[int, SaveEvent] = {}
    committed: dict[int, SaveEvent] = {}
    for ev in events[:stop]:
        if isinstance(ev, SaveEvent):
            saved[ev.gen] = ev
        elif isinstance(ev, CommitEvent):
            committed[ev.gen] = saved[ev.gen]
        elif isinstance(ev, DeleteEvent):
            committed.pop(ev.gen, None)
            saved.pop(ev.gen, None)
        elif isinstance(ev, CrashEvent) and ev.gen is not None:
            saved.pop(ev.gen, None)
    return committed


def fill_at(events: list, index: int) -> int:
    """Bytes the workload asks the device to hold at event ``index``: every generation saved and not
    deleted before it, plus the event's own save whole if it is one."""
    live: dict[int, int] = {}
    for ev in events[:index + 1]:
        if isinstance(ev, SaveEvent):
            live[ev.gen] = ev.nbytes
        elif isinstance(ev, DeleteEvent):
            live.pop(ev.gen, None)
    return sum(live.values())


def _first_index_at_step(events: list, step: int) -> int:
    return next(i for i, ev in enumerate(events) if ev.step >= step)


def kernel_errors(log: str, system: str, limit: int = 5) -> list[str]:
    """The first ``limit`` lines of a kernel log (``dmesg --notime`` text) that name ``system``
    (``btrfs`` matches ``BTRFS: error ...``, ``f2fs`` matches ``F2FS-fs (vda): ...``), stripped."""
    tag = system.upper()
    return [ln.strip() for ln in log.splitlines() if tag in ln.upper()][:limit]


def _kernel_errors(system: str) -> list[str]:
    try:
        log = _run(["dmesg", "--notime", "--level=emerg,alert,crit,err"], "dmesg")
    except (OSError, RuntimeError, TimeoutError) as e:
        return [f"dmesg: {e}"]
    return kernel_errors(log, system)


def _run(argv: list[str], what: str, timeout: float = COMMAND_TIMEOUT) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{what}: `{' '.join(argv)}` did not finish in {timeout:.0f} s") from None
    if r.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(argv)}` exited {r.returncode}: {(r.stderr or r.stdout).strip()[-800:]}")
    return r.stdout


def _sync(timeout: float = COMMAND_TIMEOUT) -> None:
    _run(["sync"], "sync", timeout)


@dataclass
class FileReplay:
    """Replays trace events as files under ``root`` (see the module docstring).

    Attributes filled while running: checkpoint_bytes, saves_committed, generations_deleted,
    stop_index / stop_step / stop_errno / stop_error (the first failure), peak_live (bytes held).
    The generation whose save, commit or delete failed is *in doubt*: the file system may hold all, part
    or none of it, so the read-back neither requires nor forbids it.
    """

    root: str
    counter: ZoneResetCounter | None = None
    checkpoint_bytes: int = 0
    saves_committed: int = 0
    generations_deleted: int = 0
    stop_index: int | None = None
    stop_step: int | None = None
    stop_errno: str | None = None
    stop_error: str | None = None
    peak_live: int = 0
    in_doubt: str | None = None
    _open: dict = field(default_factory=dict)
    _live: dict = field(default_factory=dict)
    _dirs: dict = field(default_factory=dict)

    def _save(self, ev: SaveEvent) -> None:
        d = os.path.join(self.root, _gen_dir(ev))
        self._dirs[ev.gen] = _gen_dir(ev)
        os.mkdir(d)
        self._open[ev.gen] = (ev, d)
        for s in ev.shards:
            fd = os.open(os.path.join(d, s.name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                for chunk in shard_pattern(ev.gen, s.name, s.nbytes):
                    view = memoryview(chunk)
                    while view:
                        n = os.write(fd, view)
                        self.checkpoint_bytes += n
                        view = view[n:]
            finally:
                os.close(fd)

    def _commit(self, ev: CommitEvent) -> None:
        save, d = self._open[ev.gen]
        for s in save.shards:
            fd = os.open(os.path.join(d, s.name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for path in (d, self.root):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        del self._open[ev.gen]
        self._live[ev.gen] = save
        self.saves_committed += 1
        self.peak_live = max(self.peak_live, sum(e.nbytes for e in self._live.values()))

    def _delete(self, ev: DeleteEvent) -> None:
        shutil.rmtree(os.path.join(self.root, _gen_dir(self._live[ev.gen])))
        del self._live[ev.gen]
        self.generations_deleted += 1

    def run(self, events: list) -> None:
        """Replay ``events`` until the end or the first OSError (recorded, not raised).

        Raises:
            ValueError: a crash event (a power cut needs an emulated device, not a file system).
        """
        for i, ev in enumerate(events):
            try:
                if isinstance(ev, SaveEvent):
                    self._save(ev)
                elif isinstance(ev, CommitEvent):
                    self._commit(ev)
                elif isinstance(ev, DeleteEvent):
                    self._delete(ev)
                elif isinstance(ev, CrashEvent):
                    raise ValueError("trace has crash events: the file-system comparison replays none")
            except OSError as e:
                self.stop_index, self.stop_step = i, ev.step
                self.stop_errno = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else None
                self.stop_error = f"{type(ev).__name__} of generation {ev.gen} at step {ev.step}: {e}"
                self.in_doubt = self._dirs.get(ev.gen)
                return
            finally:
                if self.counter is not None:
                    self.counter.sample()

    def verify(self, events: list) -> tuple[int, int, list[str]]:
        """Read back every surviving generation; returns (generations, bytes, problems).

        Survivors are the generations committed and not deleted before the stop, less the one in doubt;
        a folder that is neither a survivor, an open save's nor the one in doubt is a problem.
        """
        expect = {g: ev for g, ev in survivors_before(events, self.stop_index).items()
                  if _gen_dir(ev) != self.in_doubt}
        nbytes, problems = 0, []
        for gen, ev in sorted(expect.items()):
            d = os.path.join(self.root, _gen_dir(ev))
            for s in ev.shards:
                path = os.path.join(d, s.name)
                try:
                    with open(path, "rb", buffering=0) as f:
                        for want in shard_pattern(gen, s.name, s.nbytes):
                            got = f.read(len(want))
                            if got != want:
                                problems.append(f"{path}: differs at byte {nbytes}")
                                break
                            nbytes += len(got)
                        else:
                            if f.read(1):
                                problems.append(f"{path}: longer than {s.nbytes} bytes")
                except OSError as e:
                    problems.append(f"{path}: {e}")
        present = sorted(os.listdir(self.root))
        extra = sorted(set(present) - {_gen_dir(ev) for ev in expect.values()}
                       - {_gen_dir(ev) for ev, _ in self._open.values()} - {self.in_doubt})
        problems += [f"{self.root}/{x}: not a surviving generation" for x in extra]
        return len(expect), nbytes, problems


def _mkfs_and_mount(spec: SystemSpec) -> dict:
    """Format the namespace for ``spec`` and mount it at :data:`MOUNT_POINT`; returns what was set."""
    os.makedirs(MOUNT_POINT, exist_ok=True)
    info: dict = {}
    if spec.name == "btrfs":
        info["mkfs"] = ["mkfs.btrfs", "-f", "-O", "zoned", ZONED_DEVICE]
        _run(info["mkfs"], "mkfs.btrfs")
        _run(["mount", "-t", "btrfs", ZONED_DEVICE, MOUNT_POINT], "mount btrfs")
        if "bg_reclaim_threshold" in spec.options:
            value = str(spec.options["bg_reclaim_threshold"])
            knobs = sorted(glob.glob("/sys/fs/btrfs/*/bg_reclaim_threshold")
                           + glob.glob("/sys/fs/btrfs/*/allocation/data/bg_reclaim_threshold"))
            if not knobs:
                raise RuntimeError("btrfs: no bg_reclaim_threshold in /sys/fs/btrfs/*/")
            info["bg_reclaim_threshold"] = {}
            for k in knobs:
                try:
                    with open(k, "w") as f:
                        f.write(value)
                except OSError as e:  # the file-system-wide knob takes 51-100 only on some kernels
                    info["bg_reclaim_threshold"][k + " (refused)"] = f"{value}: {e.strerror}"
                with open(k) as f:
                    info["bg_reclaim_threshold"][k] = f.read().strip()
    elif spec.name == "f2fs":
        info["mkfs"] = ["mkfs.f2fs", "-f", "-m", "-c", ZONED_DEVICE, META_DEVICE]
        _run(info["mkfs"], "mkfs.f2fs")
        _run(["mount", "-t", "f2fs", META_DEVICE, MOUNT_POINT], "mount f2fs")
    else:  # pragma: no cover - parse_system refuses others
        raise ValueError(spec.name)
    st = os.statvfs(MOUNT_POINT)
    info["fs_capacity_bytes"] = st.f_blocks * st.f_frsize
    info["fs_available_bytes"] = st.f_bavail * st.f_frsize
    return info


def _mount_again(spec: SystemSpec) -> None:
    dev = META_DEVICE if spec.name == "f2fs" else ZONED_DEVICE
    _run(["mount", "-t", spec.name, dev, MOUNT_POINT], f"mount {spec.name} again")


def _raw_capacity() -> tuple[int, int, int]:
    """(zones, zone capacity, raw capacity) of the namespace from a zone report."""
    from retainz.zoned import open_device

    dev = open_device(ZONED_DEVICE, readonly=True)
    try:
        g = dev.geometry
        return g.nr_zones, g.zone_capacity, g.nr_zones * g.zone_capacity
    finally:
        dev.close()


def _run_filesystem(spec: SystemSpec, events: list, out: dict, write) -> None:
    devices = [ZONED_DEVICE] + ([META_DEVICE] if spec.name == "f2fs" else [])
    out.update(_mkfs_and_mount(spec))
    before = {d: sectors_written(d) for d in devices}
    counter = ZoneResetCounter(ZONED_DEVICE)
    fr = FileReplay(MOUNT_POINT, counter)
    t0 = time.perf_counter()
    fr.run(events)
    out["replay_seconds"] = time.perf_counter() - t0
    out.update(checkpoint_bytes=fr.checkpoint_bytes, saves_committed=fr.saves_committed,
               generations_deleted=fr.generations_deleted, enospc_step=fr.stop_step,
               stop_errno=fr.stop_errno, stop_error=fr.stop_error, peak_live_bytes=fr.peak_live,
               stop_index=fr.stop_index, kernel_errors=_kernel_errors(spec.name))
    # a hung sync below must not lose what the replay measured: write it with the bytes so far
    out["zoned_bytes_written"] = sectors_written(ZONED_DEVICE) - before[ZONED_DEVICE]
    out["conventional_bytes_written"] = (sectors_written(META_DEVICE) - before[META_DEVICE]
                                         if META_DEVICE in before else 0)
    out["zone_resets"] = counter.resets
    out["measured_after_unmount"] = False
    write(out)
    phase = "sync"
    try:
        st = os.statvfs(MOUNT_POINT)
        out["fs_available_bytes_at_end"] = st.f_bavail * st.f_frsize
        _sync()
        counter.sample()
        phase = "umount"
        _run(["umount", MOUNT_POINT], "umount")
        counter.sample()
        out["zoned_bytes_written"] = sectors_written(ZONED_DEVICE) - before[ZONED_DEVICE]
        out["conventional_bytes_written"] = (sectors_written(META_DEVICE) - before[META_DEVICE]
                                             if META_DEVICE in before else 0)
        out["zone_resets"] = counter.resets
        out["measured_after_unmount"] = True
        write(out)
        phase = "mount again"
        _mount_again(spec)
        phase = "read back"
        gens, nbytes, problems = fr.verify(events)
        out.update(verified_generations=gens, bytes_verified=nbytes, verify_problems=problems[:20],
                   verify_ok=not problems)
        _run(["umount", MOUNT_POINT], "umount after read-back")
    except (OSError, RuntimeError, TimeoutError) as e:
        out.update(verify_ok=False, verify_problems=[f"{phase}: {e}"])
    out["zone_resets"] = counter.resets
    out["zones_written_at_end"] = counter.written_zones()
    counter.close()


def _run_retainz(policy: str, reserve_zones: int, meta_zones: int, trace_path: str, events: list,
                 out: dict) -> None:
    from retainz.store import Store
    from retainz.trace.replay import ReplayConfig, replay
    from retainz.zoned import open_device

    nr_zones = out["namespace_zones"]
    before = sectors_written(ZONED_DEVICE)
    t0 = time.perf_counter()
    res = replay(trace_path, ReplayConfig(policy=policy, zones=max(2, nr_zones - meta_zones - reserve_zones),
                                          reserve_zones=reserve_zones, meta_zones=meta_zones, device=ZONED_DEVICE,
                                          verify_payload=False))
    out["replay_seconds"] = time.perf_counter() - t0
    out["zoned_bytes_written"] = sectors_written(ZONED_DEVICE) - before
    out["conventional_bytes_written"] = 0
    out["measured_after_unmount"] = True
    stop_step = res["capacity_stop_step"]
    stop_index = None if stop_step is None else _first_index_at_step(events, stop_step)
    out.update(checkpoint_bytes=res["host_bytes"], gc_bytes=res["gc_bytes"], store_waf=res["waf"],
               zone_resets=res["resets"], finishes=res["finishes"], saves_committed=res["generations_committed"],
               generations_deleted=res.get("generations_deleted"), enospc_step=stop_step,
               stop_errno="ENOSPC" if stop_step is not None else None, stop_index=stop_index,
               stop_error=None if stop_step is None else f"capacity stop (NoSpaceError) at step {stop_step}",
               peak_occupancy=res["peak_occupancy"], store_zones=res["geometry"])
    expect = survivors_before(events, stop_index)
    out["peak_live_bytes"] = max((fill_at(events, i) for i, ev in enumerate(events[:stop_index])
                                  if isinstance(ev, CommitEvent)), default=0)
    # read back from a store reopened on the device (recovery from the journal), not the replay's own
    dev = open_device(ZONED_DEVICE)
    store = Store.open(dev)
    problems, nbytes = [], 0
    try:
        have = {g.id for g in store.generations()}
        want = {f"{gen:08d}-{ev.name}": (gen, ev) for gen, ev in expect.items()}
        problems += [f"{g}: committed on the device but deleted by the trace" for g in sorted(have - set(want))]
        for gid, (gen, ev) in sorted(want.items()):
            if gid not in have:
                problems.append(f"{gid}: missing after reopen")
                continue
            for s in ev.shards:
                ok, n = same_stream(store.read_shard(gid, s.name), shard_pattern(gen, s.name, s.nbytes))
                if not ok:
                    problems.append(f"{gid}/{s.name}: read back differs at byte {n}")
                nbytes += n
    finally:
        store.close()
        dev.close()
    out.update(verified_generations=len(expect), bytes_verified=nbytes, verify_problems=problems[:20],
               verify_ok=not problems)


def run_system(system: str, trace_path: str, *, policy: str | None = None, reserve_zones: int = 2,
               meta_zones: int = 3, write=None) -> dict:
    """Run the trace on one system in this guest and return the record fields (module docstring).

    Args:
        system: a system spec (:func:`parse_system`).
        trace_path: a trace v1 file without crash events.
        policy: placement policy for ``retainz`` (``retainz``, ``greedy``, ``zenfs``...).
        reserve_zones, meta_zones: the store's GC reserve and journal zones (``retainz`` only).
        write: called with the partial result dict at checkpoints (so a hang loses nothing measured).

    Raises:
        ValueError: a bad system spec, a missing policy for retainz, a trace with crash events.
        RuntimeError: mkfs or mount failed (the message carries the tool's output).
    """
    spec = parse_system(system)
    if spec.name == "retainz" and not policy:
        raise ValueError("system retainz needs a placement policy")
    sink = write or (lambda d: None)
    with TraceReader(trace_path) as reader:
        events = list(reader)
    if any(isinstance(ev, CrashEvent) for ev in events):
        raise ValueError("trace has crash events: the file-system comparison replays none")
    nr_zones, zone_capacity, raw = _raw_capacity()
    out: dict = {"system": spec.name, "system_spec": spec.spec(), "policy": policy if spec.name == "retainz" else None,
                 "namespace_zones": nr_zones, "zone_capacity": zone_capacity, "raw_capacity_bytes": raw,
                 "trace_bytes": sum(ev.nbytes for ev in events if isinstance(ev, SaveEvent)),
                 "trace_saves": sum(isinstance(ev, SaveEvent) for ev in events),
                 "kernel": os.uname().release}

    def write(d: dict) -> None:
        _derive(d, events, raw)
        sink(d)

    if spec.name == "retainz":
        _run_retainz(policy, reserve_zones, meta_zones, trace_path, events, out)
    else:
        _run_filesystem(spec, events, out, write)
    write(out)
    return out


def _derive(out: dict, events: list, raw: int) -> None:
    """The record fields computed from the measured ones (module docstring)."""
    out["device_bytes_written"] = out["zoned_bytes_written"] + out["conventional_bytes_written"]
    out["device_waf"] = out["device_bytes_written"] / out["checkpoint_bytes"] if out["checkpoint_bytes"] else None
    idx = out["stop_index"]
    out["enospc_fill"] = None if idx is None else fill_at(events, idx) / raw
    out["peak_fill"] = out["peak_live_bytes"] / raw
    out["capacity_stop_step"] = out["enospc_step"]
    out["save_throughput"] = out["checkpoint_bytes"] / out["replay_seconds"] if out["replay_seconds"] else None


def main(argv: list[str] | None = None) -> int:
    """``python -m retainz.experiments.fsworkload --system S --trace T --out result.json [--policy P]`` (in the
    guest).  Exit 0 when the run was measured (a capacity stop included), 1 when the read-back found a
    problem, 2 on bad arguments."""
    ap = argparse.ArgumentParser(prog="python -m retainz.experiments.fsworkload")
    ap.add_argument("--system", required=True, help="retainz, btrfs, btrfs:bg_reclaim_threshold=N, f2fs")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--out", required=True, help="result JSON (rewritten at every checkpoint)")
    ap.add_argument("--policy", default=None, help="placement policy (system retainz)")
    ap.add_argument("--reserve-zones", type=int, default=2)
    ap.add_argument("--meta-zones", type=int, default=3)
    args = ap.parse_args(argv)

    def write(d: dict) -> None:
        tmp = args.out + ".part"
        with open(tmp, "w") as f:
            json.dump(d, f, indent=1, sort_keys=True)
        os.replace(tmp, args.out)

    try:
        parse_system(args.system)
    except ValueError as e:
        print(f"fsworkload: error: {e}", file=sys.stderr)
        return 2
    out = run_system(args.system, args.trace, policy=args.policy, reserve_zones=args.reserve_zones,
                     meta_zones=args.meta_zones, write=write)
    print(json.dumps({k: out.get(k) for k in ("system_spec", "policy", "device_waf", "enospc_step", "enospc_fill",
                                              "zone_resets", "verify_ok")}))
    return 0 if out.get("verify_ok") else 1


if __name__ == "__main__":
    sys.exit(main())
