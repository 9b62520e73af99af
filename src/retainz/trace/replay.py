"""Trace replay: run a trace through the real store and measure it.

Replay is not a model of the store: it drives :class:`~retainz.store.Store` (the one backend) on a
device, event by event (DESIGN.md principle 1):

====================  =====================================================================
trace event           what replay does
====================  =====================================================================
``save``              ``store.begin_generation(id, step, hint=..., declared_size=total)``, then
                      ``write_shard`` for every shard (a byte count on the payload-less memory
                      device; verifiable pattern bytes on a payload device)
``commit``            ``writer.commit()``
``delete``            ``store.delete(id, step=step)``
``crash``             the power is cut (the store is abandoned mid-flight), the device is
                      power-cycled keeping what it completed, and the store is reopened (recovery)
====================  =====================================================================

A :class:`~retainz.errors.NoSpaceError` at admission or while writing is a *capacity stop*: the run
ends cleanly there and records the step (DESIGN.md: "the honest outcome when no space can be made"),
its cause (``capacity_stop_cause``: ``admission``, ``allocation``, ``gc`` or ``journal``, see
:class:`~retainz.errors.NoSpaceError`) and the zone state at the refusal (``capacity_stop_state``:
empty zones, free bytes stranded in partly filled zones, dead and live bytes).

Device sizing: ``zones`` is the number of usable data zones; ``pressure`` derives it from the trace's
peak live bytes (every saved and not yet deleted generation, block-rounded, in-flight ones included):
``zones = ceil(peak_live / (pressure * zone_capacity))``.  The device then has ``meta_zones +
reserve_zones + zones`` zones, the reserve being the store's GC reserve: every policy gets the same
device, and admission holds the reserve back only for a policy whose GC needs empty zones
(``admission_reserve_zones`` in the result: 0 for ZenFS).  Pressure is quantised by whole zones:
``effective_pressure = peak_live / (zones * zone_capacity)`` is at most the requested pressure,
and adjacent zone counts differ by ``1 / zones`` of the capacity (about 3 % at 32 zones).

The default geometry is that of a Western Digital Ultrastar DC ZN540 (2 GiB zones of 1077 MiB capacity,
14 open and 14 active zones), the reference ZNS SSD of the ZenFS work.

Determinism: the same trace and arguments give the same result dict, byte for byte, except the
``decision_cpu_seconds`` and ``wall_seconds`` timings.
"""

from __future__ import annotations

import hashlib
import math
import os
import posixpath
import time
from dataclasses import dataclass, replace

from retainz.errors import NoSpaceError, PowerCutError
from retainz.hint import Hint
from retainz.trace.format import (
    CommitEvent,
    CrashEvent,
    DeleteEvent,
    SaveEvent,
    TraceHeader,
    TraceReader,
    actual_reclaim_steps,
)
from retainz.zoned import FaultyDevice, FileDevice, Geometry, MemoryDevice, ZonedDevice
from retainz.zoned.model import MAX_ZONES

__all__ = ["replay", "trace_stats", "TraceStats", "DEFAULT_GEOMETRY", "ZONE_MAP_MAX_STEPS",
           "ZONE_MAP_MAX_ROWS"]

#: ZN540-like geometry (bytes): zone size, zone capacity, max active, max open.
DEFAULT_GEOMETRY = {"zone_size": 2 << 30, "zone_capacity": 1077 << 20, "max_active": 14, "max_open": 14}
ZONE_MAP_MAX_STEPS = 200
ZONE_MAP_MAX_ROWS = 256
_PATTERN_CHUNK = 1 << 20


@dataclass(frozen=True)
class TraceStats:
    """What replay needs to know about a trace before running it.

    Attributes:
        sha256: hex digest of the trace file's bytes.
        header: the trace header.
        peak_live_bytes: the most bytes saved and not yet deleted at any point (shards rounded up to
            ``block_size``; generations in flight included).
        event_steps: the distinct steps of the events, ascending.
        saves: number of save events.
        actual_reclaim: gen -> the step it is really deleted (``math.inf``: never), for the oracle.
    """

    sha256: str
    header: TraceHeader
    peak_live_bytes: int
    event_steps: tuple[int, ...]
    saves: int
    actual_reclaim: dict


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def trace_stats(path: str, block_size: int = 4096) -> TraceStats:
    """Read and validate a trace once: its hash, header, peak live bytes and event steps.

    Raises:
        TraceFormatError: a malformed line (with its line number) or an unknown version.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    size: dict[int, int] = {}
    live = peak = saves = 0
    steps: set[int] = set()
    events = []
    with TraceReader(path) as reader:
        header = reader.header
        for ev in reader:
            steps.add(ev.step)
            if isinstance(ev, SaveEvent):
                saves += 1
                n = sum(_round_up(s.nbytes, block_size) for s in ev.shards)
                size[ev.gen] = n
                live += n
                peak = max(peak, live)
                events.append(ev)
            elif isinstance(ev, (DeleteEvent, CrashEvent)) and ev.gen is not None:
                live -= size.pop(ev.gen, 0)
                events.append(ev)
    return TraceStats(h.hexdigest(), header, peak, tuple(sorted(steps)), saves, actual_reclaim_steps(events))


def _gen_id(ev: SaveEvent) -> str:
    """A store id unique in the trace (names may repeat after a crash abandoned the first holder)."""
    return f"{ev.gen:08d}-{ev.name}"


def _hint(ev: SaveEvent, actual: dict) -> Hint:
    """The save's recorded hint with the step the trace deletes the generation at (the oracle's)."""
    act = actual.get(ev.gen)
    return Hint(actual_reclaim_step=act) if ev.hint is None else replace(ev.hint, actual_reclaim_step=act)


def _inferred_hint(inference, ev: SaveEvent, actual: dict) -> Hint:
    """The ``retainz-inferred`` policy's hint: what the retention inference predicts for this save
    from the events before it (``retainz mount --retention auto``), then the save is observed."""
    series = posixpath.dirname(ev.name)
    h = inference.hint(series, ev.step)
    inference.observe_save(series, str(ev.gen), ev.step)
    if h is None:
        return Hint(actual_reclaim_step=actual.get(ev.gen))
    return replace(h, actual_reclaim_step=actual.get(ev.gen))


def _pattern(gen: int, shard: str, nbytes: int):
    """Deterministic, position-dependent bytes for a shard (verifiable after read-back)."""
    seed = hashlib.sha256(f"{gen}/{shard}".encode()).digest()
    base = (seed * (_PATTERN_CHUNK // len(seed)))
    off = 0
    i = 0
    while off < nbytes:
        n = min(_PATTERN_CHUNK, nbytes - off)
        tag = i.to_bytes(8, "little")
        yield (tag + base[8:])[:n]
        off += n
        i += 1


def _make_device(device: str, geometry: Geometry) -> ZonedDevice:
    if device == "memory":
        return MemoryDevice(geometry, payload=False)
    if device == "memory-payload":
        return MemoryDevice(geometry, payload=True)
    if device.startswith("file:"):
        return FileDevice.create(device[5:], geometry)
    if device.startswith("/dev/") or device.startswith("zbd:"):
        from retainz.zoned import open_device

        return open_device(device)
    raise ValueError(f"unknown replay device {device!r}; valid: memory, memory-payload, file:PATH, /dev/NAME")


class _ZoneMap:
    """Samples the data zones' live/dead/unused shares at the ends of equal step buckets
    (docs/experiments.md, "Zone map (format 1)")."""

    def __init__(self, event_steps: tuple[int, ...], zones: list[int]):
        first, last = event_steps[0], event_steps[-1]
        b = max(1, min(ZONE_MAP_MAX_STEPS, len(event_steps)))
        self.ends = sorted({first + (last - first) * (i + 1) // b for i in range(b)})
        self.zones = zones
        z = len(zones)
        g = min(z, ZONE_MAP_MAX_ROWS)
        self.rows = [zones[i * z // g:(i + 1) * z // g] for i in range(g)]
        self.steps: list[int] = []
        self.live: list[list[int]] = []
        self.dead: list[list[int]] = []
        self.unused: list[list[int]] = []
        self._next = 0

    def before(self, step: int, table) -> None:
        """Record every bucket end that lies before ``step`` (the state after all earlier events)."""
        while self._next < len(self.ends) and self.ends[self._next] < step:
            self._sample(self.ends[self._next], table)
            self._next += 1

    def _sample(self, step: int, table) -> None:
        live, dead, unused = [], [], []
        for row in self.rows:
            cap = sum(table[z].capacity for z in row) or 1
            live.append(round(100 * sum(table[z].live for z in row) / cap))
            dead.append(round(100 * sum(table[z].dead for z in row) / cap))
            unused.append(round(100 * sum(table[z].unused for z in row) / cap))
        self.steps.append(step)
        self.live.append(live)
        self.dead.append(dead)
        self.unused.append(unused)

    def finish(self, table, stop_step: int | None) -> dict:
        if stop_step is None:
            self.before(math.inf, table)
        elif not self.steps or self.steps[-1] < stop_step:
            self._sample(stop_step, table)
        return {"format": 1, "steps": self.steps, "zones": len(self.zones), "groups": len(self.rows),
                "live": self.live, "dead": self.dead, "unused": self.unused}


def replay(trace_path: str, *, policy: str = "retainz", zones: int | None = None,
           pressure: float | None = None, reserve_zones: int = 2, meta_zones: int = 3,
           zone_size: int = DEFAULT_GEOMETRY["zone_size"],
           zone_capacity: int | None = None,
           max_active: int = DEFAULT_GEOMETRY["max_active"], max_open: int = DEFAULT_GEOMETRY["max_open"],
           block_size: int = 4096, device: str = "memory", seed: int = 0, zone_map: bool = False,
           verify_summaries: bool = False, verify_payload: bool = True) -> dict:
    """Replay a trace through the store and return its metrics.

    Args:
        trace_path: a trace v1 file (docs/trace-format.md).
        policy: placement policy spec (``retainz``, ``zenfs``, ``retainz-noisy:error=0.5,seed=1``...);
            ``retainz-inferred`` replaces each save's hint by the retention rule inferred from the
            trace's earlier saves and deletions (:mod:`retainz.retention.inference`).
        zones: usable data zones (exclusive with ``pressure``).
        pressure: peak live bytes / usable data capacity, in (0, 1]; sizes ``zones``.
        reserve_zones: zones added on top for the store's GC reserve.
        meta_zones: journal zones added on top.
        zone_size, zone_capacity: bytes; ``zone_capacity=None`` takes the ZN540's 1077 MiB with its
            default 2 GiB zone size, and the zone size itself with any other zone size.
        max_active, max_open: zone limits (0 = unlimited).
        block_size: bytes (4096 or 512).
        device: ``memory`` (payload-less, the experiment instrument), ``memory-payload``,
            ``file:PATH`` (a new FileDevice at PATH with pattern payload), or a real zoned block device
            ``/dev/NAME`` (its own geometry is used).
        seed: recorded for provenance (policies take their own seeds in their specs).
        zone_map: add ``zone_map`` (the zone-state timeline, docs/experiments.md format 1).
        verify_summaries: run the store in recompute mode (summaries rebuilt and checked before
            every decision).
        verify_payload: on a payload device, read back and check every generation still committed
            at the end (``bytes_verified`` in the result).

    Returns:
        A JSON-able dict: host_bytes, gc_bytes, waf, resets, finishes, dead_space_byte_steps,
        unused_capacity_bytes, unused_capacity_byte_steps, peak_occupancy, capacity_stop_step (None
        when none), capacity_stop_cause and capacity_stop_state (None when no stop),
        admission_reserve_zones, generations_committed, generations_deleted, decisions, decision_cpu_seconds,
        crashes, bytes_verified, policy, geometry, zones (data), pressure, peak_live_bytes,
        trace_sha256, trace header fields, wall_seconds; and zone_map if asked.

    Raises:
        ValueError: both or neither of zones/pressure, a bad pressure, an unknown device or policy,
            a device the policy refuses (ZenFS: fewer than 32 zones, meta and reserve included).
        TraceFormatError: a malformed trace (with its line number).
        ChecksumError: payload read back wrong (never silently).
    """
    from retainz.store import Store

    if (zones is None) == (pressure is None):
        raise ValueError("give exactly one of zones (usable data zones) or pressure")
    if pressure is not None and not 0 < pressure <= 1:
        raise ValueError(f"pressure must be in (0, 1], not {pressure}")
    if zones is not None and zones < 2:
        raise ValueError(f"zones must be at least 2 (a store needs 2 data zones besides the GC reserve), "
                         f"not {zones}")
    if zone_capacity is None:
        zone_capacity = DEFAULT_GEOMETRY["zone_capacity"] if zone_size == DEFAULT_GEOMETRY["zone_size"] \
            else zone_size
    for what, value in (("zone size", zone_size), ("zone capacity", zone_capacity)):
        if value <= 0:
            raise ValueError(f"{what} must be a positive number of bytes, not {value}")
    t0 = time.perf_counter()
    stats = trace_stats(trace_path, block_size)
    if zones is None:
        zones = max(1, math.ceil(stats.peak_live_bytes / (pressure * zone_capacity)))
    if zones > MAX_ZONES:
        raise ValueError(f"the replay device would need {zones:,} data zones of {zone_capacity:,} bytes "
                         f"(peak live {stats.peak_live_bytes:,} bytes at pressure {pressure}); the limit is "
                         f"{MAX_ZONES:,}: raise --pressure or the zone size")
    geometry = Geometry(nr_zones=meta_zones + reserve_zones + zones, zone_size=zone_size,
                        zone_capacity=zone_capacity, block_size=block_size, max_open=max_open,
                        max_active=max_active)
    base = _make_device(device, geometry)
    geometry = base.geometry
    payload = base.info.payload
    crashes = stats.header.crash_every is not None
    dev = FaultyDevice(base) if crashes and hasattr(base, "power_loss") else base
    store = Store.format(dev, meta_zones=meta_zones, policy=policy, gc_reserve_zones=reserve_zones,
                         verify_summaries=verify_summaries)
    zmap = _ZoneMap(stats.event_steps, list(store.table.zones)) if zone_map and stats.event_steps else None
    carried = {}  # metrics of sessions ended by a crash
    writers = {}
    saved_at: dict[int, SaveEvent] = {}
    stop_step = stop_cause = stop_state = None
    n_crashes = 0
    inference = None
    if getattr(store.allocator, "hint_source", None) == "inferred":
        from retainz.retention.inference import RetentionInference

        inference = RetentionInference()
    try:
        with TraceReader(trace_path) as reader:
            for ev in reader:
                if zmap:
                    zmap.before(ev.step, store.table)
                try:
                    if isinstance(ev, SaveEvent):
                        gid = _gen_id(ev)
                        hint = (_hint(ev, stats.actual_reclaim) if inference is None
                                else _inferred_hint(inference, ev, stats.actual_reclaim))
                        w = store.begin_generation(gid, ev.step, hint=hint, declared_size=ev.nbytes)
                        writers[ev.gen] = w
                        saved_at[ev.gen] = ev
                        for s in ev.shards:
                            if payload:
                                w.write_shard(s.name, _pattern(ev.gen, s.name, s.nbytes))
                            else:
                                w.write_shard(s.name, size=s.nbytes)
                    elif isinstance(ev, CommitEvent):
                        writers.pop(ev.gen).commit()
                    elif isinstance(ev, DeleteEvent):
                        store.delete(_gen_id(saved_at.pop(ev.gen)), step=ev.step)
                        if inference is not None:
                            inference.observe_delete(str(ev.gen), ev.step)
                    elif isinstance(ev, CrashEvent):
                        n_crashes += 1
                        _add(carried, store.metrics.to_dict())
                        store = _crash_and_recover(store, dev, Store)
                        _sub(carried, store.metrics.to_dict())
                        writers.clear()
                        if ev.gen is not None:
                            saved_at.pop(ev.gen, None)
                            if inference is not None:
                                inference.observe_abort(str(ev.gen))
                except NoSpaceError as e:
                    stop_step = ev.step
                    # the store names its own refusals; what is left is the journal's append
                    stop_cause = e.cause or "journal"
                    stop_state = e.state if e.state is not None else store.stop_state()
                    break
        result = {**store.metrics.to_dict()}
        _add(result, carried)
        admission_reserve = store.admission_reserve_zones
        verified = _verify_payload(store, saved_at) if payload and verify_payload else 0
        table = store.table
        out_zmap = zmap.finish(table, stop_step) if zmap else None
    finally:
        for w in writers.values():
            try:
                w.abort()
            except Exception:  # noqa: BLE001 - the store may already be stopped
                pass
        store.close()
        dev.close()
    result["waf"] = ((result["host_bytes"] + result["gc_bytes"]) / result["host_bytes"]
                     if result["host_bytes"] else 1.0)
    h = stats.header
    result.update({
        "capacity_stop_step": stop_step,
        "capacity_stop_cause": stop_cause,
        "capacity_stop_state": stop_state,
        "admission_reserve_zones": admission_reserve,
        "crashes": n_crashes,
        "bytes_verified": verified,
        "policy": policy,
        "device": device if not device.startswith("file:") else "file",
        "geometry": {"nr_zones": geometry.nr_zones, "zone_size": geometry.zone_size,
                     "zone_capacity": geometry.zone_capacity, "block_size": geometry.block_size,
                     "max_open": geometry.max_open, "max_active": geometry.max_active,
                     "meta_zones": meta_zones, "reserve_zones": reserve_zones},
        "zones": geometry.nr_zones - meta_zones - reserve_zones,
        "pressure": pressure,
        "effective_pressure": stats.peak_live_bytes / ((geometry.nr_zones - meta_zones - reserve_zones)
                                                       * geometry.zone_capacity),
        "peak_live_bytes": stats.peak_live_bytes,
        "trace_sha256": stats.sha256,
        "trace": {"layout": h.layout.get("name"), "retention": h.retention, "steps": h.schedule.get("steps"),
                  "saves": stats.saves, "seed": h.seed, "crash_every": h.crash_every},
        "seed": seed,
        "verify_summaries": verify_summaries,
        "wall_seconds": time.perf_counter() - t0,
    })
    if out_zmap is not None:
        result["zone_map"] = out_zmap
    return result


def _add(acc: dict, d: dict) -> None:
    for k, v in d.items():
        if k != "waf" and k != "peak_occupancy" and isinstance(v, (int, float)):
            acc[k] = acc.get(k, 0) + v
        elif k == "peak_occupancy":
            acc[k] = max(acc.get(k, 0), v)


def _sub(acc: dict, d: dict) -> None:
    """Remove what the reopened store already counts (metrics resume from the journal)."""
    for k, v in d.items():
        if k not in ("waf", "peak_occupancy") and isinstance(v, (int, float)):
            acc[k] = acc.get(k, 0) - v


def _crash_and_recover(store, dev, Store):
    """Abandon the store as a power cut would, power-cycle the device, reopen (recovery)."""
    if not isinstance(dev, FaultyDevice):
        raise ValueError("a crash event needs an emulated device (memory or file)")
    dev.cut_now()
    try:
        store.close()
    except PowerCutError:
        pass
    dev.reboot()
    return Store.open(dev)


def _verify_payload(store, live: dict[int, SaveEvent]) -> int:
    """Read back every committed generation and compare with the pattern; returns bytes checked."""
    from retainz.errors import ChecksumError

    committed = {g.id for g in store.generations()}
    checked = 0
    for gen, ev in sorted(live.items()):
        gid = _gen_id(ev)
        if gid not in committed:
            continue
        for s in ev.shards:
            want = b"".join(_pattern(gen, s.name, s.nbytes))
            got = b"".join(store.read_shard(gid, s.name))
            if got != want:
                raise ChecksumError(f"replay read-back of {gid}/{s.name} differs from what was written")
            checked += len(got)
    return checked


def default_device_path(tmpdir: str) -> str:
    """A scratch FileDevice path for payload replays."""
    return "file:" + os.path.join(tmpdir, "replay.img")
