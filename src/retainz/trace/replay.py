"""Trace replay: run a trace through the real store and measure it.

Replay is not a model of the store: it drives :class:`~retainz.store.Store` (the one backend) on a
device, event by event (one backend: docs/architecture.md):

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

Promotion delay (``promote_bandwidth``, bytes per step): every committed generation is promoted
through a FIFO queue at that bandwidth and kept until durable, so a ``delete`` is deferred to the
step its promotion is verified; the practical policies' hints carry the expected promotion finish
(:mod:`retainz.trace.promotion`).  The deferred deletions are the events the store is fed: every
policy and the oracle see them, and the device is sized from the live bytes they leave.

Saves that take time (``write_bandwidth``, bytes per step; ``retainz replay --write-bandwidth``):
without it every save is written whole at its event (the serialized replay).  With it a save of
``nbytes`` takes ``nbytes / write_bandwidth`` steps, and a job (``j<n>:`` of a mixed or fleet trace's
names, :func:`job_of`) does one thing at a time: its commit, deletions and next save wait until
its save is written, while other jobs' saves overlap it (:func:`timed_schedule`).  Each shard is
opened as its own writer (the ranks of a DCP save, as the node service's clients write them) and
written in ``write_unit`` pieces at ``S_i / D`` bytes per step over the save's ``D`` steps; the
pieces of every save in flight reach the store in time order (at equal times pieces before
events, so a save's last piece precedes its commit).  A deletion carries the step it really happens
at, so pressure sizes the device from the live bytes of the schedule and the oracle is told the
real deletion steps.  ``write_bandwidth = "fleet"`` (:data:`FLEET_RATE`) writes each job's saves at
the rate a format-2 fleet trace's header records for that job (:func:`fleet_rates`: the drive's rate
for a synchronous job, paced to its next save for an asynchronous one; docs/fleet.md).  The result
adds ``write_bandwidth``, ``write_unit`` and ``overlapped_bytes`` (bytes written while another job's
save was in flight).  Crash events are refused there (only the
serialized replay power-cycles).

A :class:`~retainz.errors.NoSpaceError` at admission or while writing is a *capacity stop*: the run
ends cleanly there and records the step (the honest outcome when no space can be made),
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
``occupancy`` sizes it from the trace's **time-averaged** live bytes instead (:mod:`retainz.trace.occupancy`):
``zones = ceil(mean_live / (occupancy * zone_capacity))``; the result then carries ``occupancy``,
``mean_live_bytes`` and ``effective_occupancy = mean_live / (zones * zone_capacity)`` (at most the one
asked for).  The mean runs over the trace's horizon (its schedule's ``steps``, else past its last event).

The default geometry is that of a Western Digital Ultrastar DC ZN540 (2 GiB zones of 1077 MiB capacity,
14 open and 14 active zones), the reference ZNS SSD of the ZenFS work.

Every parameter (policy, sizing, geometry, device, what to measure) is one :class:`ReplayConfig`,
checked when it is built; the CLI, the experiment runner and code callers all build one.

Determinism: the same trace and configuration give the same result dict, byte for byte, except the
``decision_cpu_seconds`` and ``wall_seconds`` timings.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

from retainz.errors import ChecksumError, DeviceFormatError, NoSpaceError, PowerCutError
from retainz.hint import DEFAULT_MEDIUM, DEFAULT_SHORT, Hint, class_bounds
from retainz.ids import series_of
from retainz.placement import make_allocator
from retainz.retention.base import parse_rule
from retainz.retention.durable import until_durable
from retainz.trace.format import (
    CommitEvent,
    CrashEvent,
    DeleteEvent,
    Event,
    SaveEvent,
    TraceHeader,
    actual_reclaim_steps,
)
from retainz.trace.io import TraceReader, sha256_file
from retainz.trace.occupancy import mean_live_bytes, occupancy_data_zones
from retainz.trace.promotion import defer_retirements, promotion_finish
from retainz.zoned import DeviceSpec, FileDevice, Geometry, MemoryDevice, ZonedDevice, parse_device
from retainz.zoned.faulty import FaultyDevice
from retainz.zoned.model import MAX_ZONES, round_up

__all__ = ["replay", "ReplayConfig", "trace_stats", "TraceStats", "DEFAULT_GEOMETRY", "ZONE_MAP_MAX_STEPS",
           "ZONE_MAP_MAX_ROWS", "FLEET_RATE", "fleet_rates", "timed_schedule"]

#: ZN540-like geometry (bytes): zone size, zone capacity, max active, max open.
DEFAULT_GEOMETRY = {"zone_size": 2 << 30, "zone_capacity": 1077 << 20, "max_active": 14, "max_open": 14}
ZONE_MAP_MAX_STEPS = 200
ZONE_MAP_MAX_ROWS = 256
_PATTERN_CHUNK = 1 << 20
#: ``--write-unit`` default: bytes per write of a shard in a replay with time (ZenFS's 1 MiB buffer).
DEFAULT_WRITE_UNIT = 1 << 20
#: ``write_bandwidth`` (``--write-bandwidth``) value for a fleet trace's own rates: each job's save is
#: written at the rate its header records (``jobs[i].write_bandwidth``, :func:`retainz.trace.fleet.write_bandwidth`:
#: the drive's rate for a synchronous job, paced to its next save for an asynchronous one).
FLEET_RATE = "fleet"


#: Data zones of the device on which a configuration sized by pressure is checked before its trace is
#: known: enough for every zone-count rule (a store's 2 data zones, ZenFS's ``ZENFS_MIN_ZONES`` 32).
ANY_SIZE_DATA_ZONES = 64


@dataclass(frozen=True)
class ReplayConfig:
    """Every parameter of a replay: the placement policy, the device and its sizing, and what to measure.

    One configuration is shared by its three clients: ``retainz replay`` builds it from its options
    (:meth:`cli_args` is the way back), the experiment runner from a manifest case's inputs
    (:meth:`retainz.experiments.manifest.Case.replay_config`), and :func:`replay` reads it.  Construction
    checks every field; the first bad one raises ``ValueError`` with one line naming it.

    Attributes:
        policy: placement policy spec (``retainz``, ``zenfs``, ``retainz-noisy:error=0.5,seed=1``...);
            ``retainz-inferred`` replaces each save's hint by the retention rule inferred from the
            trace's earlier saves and deletions (:mod:`retainz.retention.inference`).
        zones: usable data zones (exclusive with ``pressure`` and ``occupancy``; at least 2).
        pressure: peak live bytes / usable data capacity, in (0, 1]; sizes ``zones`` from the trace
            (:meth:`data_zones`).
        occupancy: time-averaged live bytes / usable data capacity, in (0, 1]; sizes ``zones`` from
            the trace's mean live bytes (:func:`~retainz.trace.occupancy.occupancy_data_zones`).
        reserve_zones: zones added on top for the store's GC reserve.
        meta_zones: journal zones added on top.
        zone_size, zone_capacity: bytes; ``zone_capacity=None`` is resolved at construction: the
            ZN540's 1077 MiB with its default 2 GiB zone size, the zone size itself with any other.
        max_active, max_open: zone limits (0 = unlimited).
        block_size: bytes (4096 or 512).
        device: ``memory`` (payload-less, the experiment instrument), ``memory-payload``,
            ``file:PATH`` (a new FileDevice at PATH with pattern payload), ``fdp`` or
            ``fdp:ru_size=...,spare=...,ruh=II|PI,unit=...`` (payload-less, an FDP namespace on the FTL
            model with this geometry, one placement handle per active zone: docs/fdp.md; the result
            gains ``fdp``, the device's statistics), or a real zoned block device ``/dev/NAME`` or
            ``zbd:NAME`` (its own geometry is used).
        seed: recorded for provenance (policies take their own seeds in their specs).
        zone_map: add ``zone_map`` (the zone-state timeline, docs/experiments.md format 1) to the result.
        verify_summaries: run the store in recompute mode (summaries rebuilt and checked before
            every decision).
        verify_payload: on a payload device, read back and check every generation still committed
            at the end (``bytes_verified`` in the result).
        promote_bandwidth: model promotion to a durable tier at this many bytes per step of logical
            time, every generation kept until durable (:mod:`retainz.trace.promotion`); ``None``
            (default): no promotion, deletions at the trace's steps.
        promote_hint: with ``promote_bandwidth``, the hints carry the expected promotion finish
            (default True, what a live writer does); False gives the rule's hints alone (the
            ablation: the same deferred deletions, placed without knowing of them).
        write_bandwidth: replay with time (module docstring, "Saves that take time"): one job's
            save is written at this many bytes per step, so saves of different jobs overlap;
            :data:`FLEET_RATE` (``"fleet"``): each job at the rate a format-2 fleet trace's header
            records for it (docs/fleet.md, "Save bandwidth"); ``None`` (default): every save is
            written whole at its event (the serialized replay).
        write_unit: with ``write_bandwidth``, bytes per write of a shard (a positive multiple of
            the block size; default 1 MiB, ZenFS's write buffer).

    Raises:
        ValueError: a field of the wrong type; both or neither of zones/pressure; a pressure outside
            (0, 1]; fewer than 2 zones; a negative zone count; an unknown policy or policy parameter
            (:func:`retainz.placement.make_allocator`); a geometry the zone model refuses
            (:class:`~retainz.zoned.Geometry`: block size, zone capacity above the zone size, limits);
            an unknown device.
    """

    policy: str = "retainz"
    zones: int | None = None
    pressure: float | None = None
    occupancy: float | None = None
    reserve_zones: int = 2
    meta_zones: int = 3
    zone_size: int = DEFAULT_GEOMETRY["zone_size"]
    zone_capacity: int | None = None
    max_active: int = DEFAULT_GEOMETRY["max_active"]
    max_open: int = DEFAULT_GEOMETRY["max_open"]
    block_size: int = 4096
    device: str = "memory"
    seed: int = 0
    zone_map: bool = False
    verify_summaries: bool = False
    verify_payload: bool = True
    promote_bandwidth: int | None = None
    promote_hint: bool = True
    write_bandwidth: int | str | None = None
    write_unit: int = DEFAULT_WRITE_UNIT

    def __post_init__(self) -> None:
        for name in ("reserve_zones", "meta_zones", "zone_size", "max_active", "max_open", "block_size", "seed"):
            _need_int(name, getattr(self, name))
        _need_int("write_unit", self.write_unit)
        for name in ("zones", "zone_capacity", "promote_bandwidth", "write_bandwidth"):
            if getattr(self, name) is not None and not (name == "write_bandwidth"
                                                        and getattr(self, name) == FLEET_RATE):
                _need_int(name, getattr(self, name))
        for name in ("zone_map", "verify_summaries", "verify_payload", "promote_hint"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"{name} must be true or false, not {getattr(self, name)!r}")
        if not isinstance(self.policy, str) or not self.policy:
            raise ValueError(f"policy must be a policy spec such as 'retainz', not {self.policy!r}")
        make_allocator(self.policy)
        if sum(v is not None for v in (self.zones, self.pressure, self.occupancy)) != 1:
            raise ValueError("give exactly one of zones (usable data zones), pressure or occupancy")
        for name in ("pressure", "occupancy"):
            v = getattr(self, name)
            if v is not None and (type(v) not in (int, float) or not 0 < v <= 1):
                raise ValueError(f"{name} must be in (0, 1], not {v}")
        if self.zones is not None and self.zones < 2:
            raise ValueError(f"zones must be at least 2 (a store needs 2 data zones besides the GC reserve), "
                             f"not {self.zones}")
        if self.promote_bandwidth is not None and self.promote_bandwidth <= 0:
            raise ValueError(f"promote_bandwidth must be a positive number of bytes per step, not "
                             f"{self.promote_bandwidth}")
        if self.write_bandwidth not in (None, FLEET_RATE) and self.write_bandwidth <= 0:
            raise ValueError(f"write_bandwidth must be a positive number of bytes per step, not "
                             f"{self.write_bandwidth}")
        if self.write_bandwidth is None and self.write_unit != DEFAULT_WRITE_UNIT:
            raise ValueError("write_unit (--write-unit) needs write_bandwidth (--write-bandwidth): a serialized "
                             "replay writes every shard whole")
        if self.write_unit <= 0 or self.write_unit % self.block_size:
            raise ValueError(f"write_unit must be a positive multiple of the block size ({self.block_size}), "
                             f"not {self.write_unit}")
        for name in ("reserve_zones", "meta_zones"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} cannot be negative, not {getattr(self, name)}")
        if self.zone_capacity is None:
            object.__setattr__(self, "zone_capacity", DEFAULT_GEOMETRY["zone_capacity"]
                               if self.zone_size == DEFAULT_GEOMETRY["zone_size"] else self.zone_size)
        for what, value in (("zone size", self.zone_size), ("zone capacity", self.zone_capacity)):
            if value <= 0:
                raise ValueError(f"{what} must be a positive number of bytes, not {value}")
        # the zone model's rules (block size, capacity <= size, limits), then the store's: on the
        # device when its size is given; sized by pressure, the device follows from the trace, so only
        # the rules that hold at any size (active zones, capacity) are checked, on a device large
        # enough for every count rule (ZenFS's 32 zones)
        from retainz.store import Store

        data = self.data_zones(0) if self.zones is not None else ANY_SIZE_DATA_ZONES
        Store.check_geometry(self.geometry(data), policy=self.policy, meta_zones=self.meta_zones,
                             gc_reserve_zones=self.reserve_zones)
        d = self.device
        if not isinstance(d, str) or not (d in ("memory", "memory-payload") or d == "fdp" or d.startswith("fdp:")
                                          or _named_device(d) is not None):
            raise ValueError(f"unknown replay device {d!r}; valid: memory, memory-payload, file:PATH, "
                             "fdp[:KEY=VALUE,...], /dev/NAME, zbd:/dev/NAME")
        if d.startswith("fdp"):
            _fdp_options(d)

    def data_zones(self, peak_live_bytes: int, mean_live_bytes: Fraction | int = 0) -> int:
        """Usable data zones for a trace of ``peak_live_bytes`` and time-averaged ``mean_live_bytes``
        (bytes, block-rounded, :class:`TraceStats`): ``zones`` as given, or ``ceil(peak_live /
        (pressure * zone_capacity))``, or ``ceil(mean_live / (occupancy * zone_capacity))`` (at least 1).

        Raises:
            ValueError: more than :data:`~retainz.zoned.model.MAX_ZONES` data zones; sizing by pressure or
                occupancy a trace that keeps nothing live.
        """
        zones = self.zones
        if self.occupancy is not None:
            if mean_live_bytes <= 0:
                raise ValueError("the trace keeps nothing live (mean live 0 bytes): no device size follows "
                                 "from --occupancy; give --zones")
            zones = occupancy_data_zones(mean_live_bytes, self.occupancy, self.zone_capacity)
        elif zones is None:
            if peak_live_bytes <= 0:
                raise ValueError("the trace saves nothing (peak live 0 bytes): no device size follows from "
                                 "--pressure; give --zones")
            zones = max(1, math.ceil(peak_live_bytes / (self.pressure * self.zone_capacity)))
        if zones > MAX_ZONES:
            if self.zones is not None:
                raise ValueError(f"--zones {zones:,} is over the limit of {MAX_ZONES:,} data zones")
            sized = (f"mean live {float(mean_live_bytes):,.0f} bytes at occupancy {self.occupancy}"
                     if self.occupancy is not None else f"peak live {peak_live_bytes:,} bytes at pressure {self.pressure}")
            flag = "--occupancy" if self.occupancy is not None else "--pressure"
            raise ValueError(f"the replay device would need {zones:,} data zones of {self.zone_capacity:,} bytes "
                             f"({sized}); the limit is {MAX_ZONES:,}: raise {flag} or the zone size")
        return zones

    def geometry(self, data_zones: int) -> Geometry:
        """The emulated device: ``meta_zones + reserve_zones + data_zones`` zones of this geometry.

        Raises:
            DeviceFormatError: (a ValueError) a geometry the zone model refuses.
        """
        return Geometry(nr_zones=self.meta_zones + self.reserve_zones + data_zones, zone_size=self.zone_size,
                        zone_capacity=self.zone_capacity, block_size=self.block_size, max_open=self.max_open,
                        max_active=self.max_active)

    def cli_args(self) -> list[str]:
        """The ``retainz replay`` options that give back this configuration (the trace path and
        ``--json`` not included): how the experiment runner runs a case inside the QEMU guest."""
        argv = ["--policy", self.policy]
        argv += (["--zones", str(self.zones)] if self.zones is not None else
                 ["--occupancy", repr(self.occupancy)] if self.occupancy is not None else
                 ["--pressure", repr(self.pressure)])
        argv += ["--reserve-zones", str(self.reserve_zones), "--meta-zones", str(self.meta_zones),
                 "--zone-size", str(self.zone_size), "--zone-capacity", str(self.zone_capacity),
                 "--max-active", str(self.max_active), "--max-open", str(self.max_open),
                 "--block-size", str(self.block_size), "--device", self.device, "--seed", str(self.seed)]
        if self.zone_map:
            argv.append("--zone-map")
        if self.verify_summaries:
            argv.append("--verify-summaries")
        if not self.verify_payload:
            argv.append("--no-verify-payload")
        if self.promote_bandwidth is not None:
            argv += ["--promote-bandwidth", str(self.promote_bandwidth)]
        if not self.promote_hint:
            argv.append("--no-promote-hint")
        if self.write_bandwidth is not None:
            argv += ["--write-bandwidth", str(self.write_bandwidth), "--write-unit", str(self.write_unit)]
        return argv


def _need_int(name: str, value) -> None:
    if type(value) is not int:
        raise ValueError(f"{name} must be an integer, not {value!r}")


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
        mean_live_bytes: the live bytes averaged over the trace's horizon (bytes, exact;
            :func:`~retainz.trace.occupancy.mean_live_bytes`): its schedule's ``steps`` (what
            ``retainz trace fleet`` reports), or one step past its last event when the header has none.
    """

    sha256: str
    header: TraceHeader
    peak_live_bytes: int
    event_steps: tuple[int, ...]
    saves: int
    actual_reclaim: dict
    mean_live_bytes: Fraction = Fraction(0)


def trace_stats(path: str, block_size: int = 4096) -> TraceStats:
    """Read and validate a trace once: its hash, header, peak live bytes and event steps.

    Raises:
        TraceFormatError: a malformed line (with its line number) or an unknown version.
    """
    return read_events(path, block_size)[0]


def read_events(path: str, block_size: int = 4096) -> tuple[TraceStats, list[Event]]:
    """:func:`trace_stats` and the trace's validated events, in order: :func:`replay` parses a
    trace once and drives the store from this list (parsing is the largest cost of replay after
    the store itself; issue 17).

    Raises:
        TraceFormatError: a malformed line (with its line number) or an unknown version.
    """
    digest = sha256_file(path)
    with TraceReader(path) as reader:
        header = reader.header
        events: list[Event] = list(reader)
    return stats_of(digest, header, events, block_size), events


def stats_of(digest: str, header: TraceHeader, events: list[Event], block_size: int = 4096) -> TraceStats:
    """The :class:`TraceStats` of a trace's events (validated, in order): peak live bytes, event
    steps, saves and actual reclaim steps."""
    size: dict[int, int] = {}
    live = peak = saves = 0
    steps: set[int] = set()
    for ev in events:
        steps.add(ev.step)
        if isinstance(ev, SaveEvent):
            saves += 1
            n = sum(round_up(s.nbytes, block_size) for s in ev.shards)
            size[ev.gen] = n
            live += n
            peak = max(peak, live)
        elif isinstance(ev, (DeleteEvent, CrashEvent)) and ev.gen is not None:
            live -= size.pop(ev.gen, 0)
    horizon = int(header.schedule.get("steps") or 0) or ((max(steps) + 1) if steps else 1)
    return TraceStats(digest, header, peak, tuple(sorted(steps)), saves, actual_reclaim_steps(events),
                      mean_live_bytes(events, horizon, block_size))


def _gen_id(ev: SaveEvent) -> str:
    """A store id unique in the trace (names may repeat after a crash abandoned the first holder)."""
    return f"{ev.gen:08d}-{ev.name}"


def _hint(ev: SaveEvent, actual: dict) -> Hint:
    """The save's recorded hint with the step the trace deletes the generation at (the oracle's)."""
    act = actual.get(ev.gen)
    return Hint(actual_reclaim_step=act) if ev.hint is None else replace(ev.hint, actual_reclaim_step=act)


def _class_bounds(retention: str | None) -> tuple[int, int]:
    """The lifetime class bounds of a trace's retention rule (:func:`retainz.hint.class_bounds` of its
    save interval); the default bounds for a mix, a fleet or a rule this version does not parse."""
    try:
        return class_bounds(parse_rule(retention).base_interval)
    except (ValueError, TypeError, NotImplementedError):
        return DEFAULT_SHORT, DEFAULT_MEDIUM


def _inferred_hint(inference, ev: SaveEvent, actual: dict) -> Hint:
    """The ``retainz-inferred`` policy's hint: what the retention inference predicts for this save
    from the events before it (``retainz mount --retention auto``), then the save is observed."""
    series = series_of(ev.name)
    h = inference.hint(series, ev.step)
    inference.observe_save(series, str(ev.gen), ev.step)
    if h is None:
        return Hint(actual_reclaim_step=actual.get(ev.gen))
    return replace(h, actual_reclaim_step=actual.get(ev.gen))


def shard_pattern(gen: int, shard: str, nbytes: int) -> Iterator[bytes]:
    """The bytes replay writes for shard ``shard`` of generation number ``gen`` on a payload device:
    ``nbytes`` bytes in chunks of at most ``_PATTERN_CHUNK`` (each chunk tagged with its index, the rest
    from sha256 of ``"gen/shard"``), so any copy of them (a store, a file on btrfs or f2fs) is verified
    after read-back without keeping one.  Deterministic across processes and hosts."""
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


def replay(trace_path: str, config: ReplayConfig) -> dict:
    """Replay a trace through the store and return its metrics.

    The parts, in order: read the trace once (:func:`read_events`), size and open the device and
    format the store (:meth:`_Run.start`), feed it every event until the trace ends or a capacity
    stop (:meth:`_Run.drive`), measure (:meth:`_Run.measure`) and write the result
    (:func:`_result`).

    Args:
        trace_path: a trace v1 file (docs/trace-format.md).
        config: what to replay it on and what to measure (:class:`ReplayConfig`).

    Returns:
        A JSON-able dict (with ``write_bandwidth``: also write_bandwidth, write_unit and
        overlapped_bytes): host_bytes, gc_bytes, waf, resets, finishes, dead_space_byte_steps,
        unused_capacity_bytes, unused_capacity_byte_steps, peak_occupancy, capacity_stop_step (None
        when none), capacity_stop_cause and capacity_stop_state (None when no stop),
        admission_reserve_zones, generations_committed, generations_deleted, decisions, decision_cpu_seconds,
        crashes, bytes_verified, policy, geometry, zones (data), pressure, peak_live_bytes,
        trace_sha256, trace header fields, wall_seconds; zone_map if asked; with ``occupancy``: also
        occupancy, mean_live_bytes and effective_occupancy.

    Raises:
        ValueError: a trace too large for the device limit at this pressure, a device the policy
            refuses (ZenFS: fewer than 32 zones, meta and reserve included), a crash event on a real
            device or with ``write_bandwidth``.
        TraceFormatError: a malformed trace (with its line number).
        ChecksumError: payload read back wrong (never silently).
    """
    t0 = time.perf_counter()
    stats, events = read_events(trace_path, config.block_size)
    durable_at, promotion = None, None
    if config.promote_bandwidth is not None:
        durable_at = promotion_finish(events, config.promote_bandwidth)
        events, pstats = defer_retirements(events, durable_at, config.promote_bandwidth)
        promotion = {**pstats.to_json(), "peak_live_bytes_undeferred": stats.peak_live_bytes,
                     "hint": config.promote_hint}
        stats = stats_of(stats.sha256, stats.header, events, config.block_size)
    timed = config.write_bandwidth is not None
    if timed and any(isinstance(ev, CrashEvent) for ev in events):
        raise ValueError("--write-bandwidth replays saves that take time; this trace has crash events, which "
                         "only the serialized replay (no --write-bandwidth) power-cycles")
    if timed:
        # saves that take time: each event at its time (a job's events wait for its save), the
        # device sized by the live bytes of that order, the oracle told the deletions' real steps
        rate = fleet_rates(stats.header) if config.write_bandwidth == FLEET_RATE else config.write_bandwidth
        schedule = timed_schedule(events, rate)
        stats = stats_of(stats.sha256, stats.header, [ev for _, ev in schedule], config.block_size)
    run = _Run.start(config, stats, durable_at if config.promote_hint else None)
    try:
        zmap = _ZoneMap(stats.event_steps, list(run.store.table.zones)) \
            if config.zone_map and stats.event_steps else None
        if timed:
            stop = _Timed(run, rate, config.write_unit).drive(schedule, zmap)
        else:
            stop = run.drive(events, zmap)
        measured = run.measure(stop, zmap, verify_payload=config.verify_payload)
    finally:
        run.close()
    result = _result(config, stats, run.geometry, measured, stop, time.perf_counter() - t0)
    if timed:
        result.update({"write_bandwidth": config.write_bandwidth, "write_unit": config.write_unit,
                       "overlapped_bytes": run.overlapped_bytes})
    if promotion is not None:
        result["promotion"] = promotion
    return result


@dataclass(frozen=True)
class _Stop:
    """A capacity stop: the step of the refused event, its cause and the zone state at the refusal."""

    step: int
    cause: str
    state: dict


class _Run:
    """One replay's store on its device, and what the run keeps between events: the writers in
    flight, the saves not yet deleted, the metrics of sessions ended by a crash, and the retention
    inference of the ``retainz-inferred`` policy."""

    def __init__(self, store, dev: ZonedDevice, geometry: Geometry, payload: bool, actual_reclaim: dict,
                 durable_at: dict | None = None, bounds: tuple[int, int] = (DEFAULT_SHORT, DEFAULT_MEDIUM)):
        self.store = store
        self.dev = dev
        self.geometry = geometry  # the device's own (a real zoned device has its own)
        self.payload = payload
        self.actual_reclaim = actual_reclaim
        self.durable_at = durable_at      # gen -> the step its promotion is verified (promotion delay)
        self.bounds = bounds              # the trace rule's lifetime class bounds
        self.writers: dict = {}
        self.saved_at: dict[int, SaveEvent] = {}
        self.carried: dict = {}  # metrics of sessions ended by a crash
        self.crashes = 0
        self.overlapped_bytes = 0   # replay with time: bytes written while another job's save was in flight
        self.inference = None
        if getattr(store.allocator, "hint_source", None) == "inferred":
            from retainz.retention.inference import RetentionInference

            self.inference = RetentionInference()

    @classmethod
    def start(cls, config: ReplayConfig, stats: TraceStats, durable_at: dict | None = None) -> _Run:
        """Size the device for the trace (:meth:`ReplayConfig.data_zones`), open it (wrapped in a
        :class:`FaultyDevice` when the trace has crash events and the device can lose power) and
        format the store on it.  ``durable_at`` (gen -> step its promotion is verified,
        :func:`~retainz.trace.promotion.promotion_finish`) makes each save's hint keep until durable.

        Raises:
            ValueError: too many zones, or the store refuses the device or the policy.
        """
        from retainz.store import Store

        base = _make_device(config.device, config.geometry(config.data_zones(stats.peak_live_bytes,
                                                                              stats.mean_live_bytes)))
        crashes = stats.header.crash_every is not None
        dev = FaultyDevice(base) if crashes and hasattr(base, "power_loss") else base
        try:
            store = Store.format(dev, meta_zones=config.meta_zones, policy=config.policy,
                                 gc_reserve_zones=config.reserve_zones, verify_summaries=config.verify_summaries)
        except BaseException:
            dev.close()
            raise
        return cls(store, dev, base.geometry, base.info.payload, stats.actual_reclaim, durable_at,
                   _class_bounds(stats.header.retention))

    def drive(self, events: list[Event], zmap: _ZoneMap | None) -> _Stop | None:
        """Apply every event of the trace (validated, in order: :func:`read_events`; the table in
        the module docstring); returns the capacity stop (a :class:`~retainz.errors.NoSpaceError`),
        or None when the trace ran to its end."""
        for ev in events:
            if zmap:
                zmap.before(ev.step, self.store.table)
            try:
                self.apply(ev)
            except NoSpaceError as e:
                # the store names its own refusals; what is left is the journal's append
                return _Stop(ev.step, e.cause or "journal",
                             e.state if e.state is not None else self.store.stop_state())
        return None

    def apply(self, ev: Event) -> None:
        """One event: save, commit, delete or crash."""
        if isinstance(ev, SaveEvent):
            self._save(ev)
        elif isinstance(ev, CommitEvent):
            self.writers.pop(ev.gen).commit()
        elif isinstance(ev, DeleteEvent):
            self.store.delete(_gen_id(self.saved_at.pop(ev.gen)), step=ev.step)
            if self.inference is not None:
                self.inference.observe_delete(str(ev.gen), ev.step)
        elif isinstance(ev, CrashEvent):
            self._crash(ev)

    def begin(self, ev: SaveEvent):
        """Admit the save's generation with its hint (the policy's view of it) and keep its writer."""
        hint = (_hint(ev, self.actual_reclaim) if self.inference is None
                else _inferred_hint(self.inference, ev, self.actual_reclaim))
        if self.durable_at is not None:
            short, medium = self.bounds
            hint = until_durable(hint, ev.step, self.durable_at.get(ev.gen), short=short, medium=medium)
        w = self.store.begin_generation(_gen_id(ev), ev.step, hint=hint, declared_size=ev.nbytes)
        self.writers[ev.gen] = w
        self.saved_at[ev.gen] = ev
        return w

    def _save(self, ev: SaveEvent) -> None:
        w = self.begin(ev)
        for s in ev.shards:
            if self.payload:
                w.write_shard(s.name, shard_pattern(ev.gen, s.name, s.nbytes))
            else:
                w.write_counted_shard(s.name, s.nbytes)

    def _crash(self, ev: CrashEvent) -> None:
        """Abandon the store as a power cut would, power-cycle the device and reopen the store
        (recovery); the lost session's metrics are carried over."""
        from retainz.store import Store

        if not isinstance(self.dev, FaultyDevice):
            raise ValueError("a crash event needs an emulated device (memory or file)")
        self.crashes += 1
        _add(self.carried, self.store.metrics.to_dict())
        self.dev.cut_now()
        try:
            self.store.close()
        except PowerCutError:
            pass
        self.dev.reboot()
        self.store = Store.open(self.dev)
        _sub(self.carried, self.store.metrics.to_dict())
        self.writers.clear()
        if ev.gen is not None:
            self.saved_at.pop(ev.gen, None)
            if self.inference is not None:
                self.inference.observe_abort(str(ev.gen))

    def measure(self, stop: _Stop | None, zmap: _ZoneMap | None, *, verify_payload: bool) -> dict:
        """The store's metrics (the crashed sessions' added), ``admission_reserve_zones``,
        ``crashes``, ``bytes_verified`` (read back on a payload device when ``verify_payload``)
        and the finished zone map, if any."""
        out = {**self.store.metrics.to_dict()}
        _add(out, self.carried)
        out["admission_reserve_zones"] = self.store.admission_reserve_zones
        out["crashes"] = self.crashes
        out["bytes_verified"] = self._verify_payload() if self.payload and verify_payload else 0
        if zmap:
            out["zone_map"] = zmap.finish(self.store.table, None if stop is None else stop.step)
        inner = getattr(self.dev, "inner", self.dev)
        if hasattr(inner, "fdp_statistics"):  # an FDP namespace: its statistics log (0x22) and the device WAF
            st = inner.fdp_statistics()
            geo = inner.ftl.geometry
            out["fdp"] = {"host_bytes_written": st.host_bytes_written, "media_bytes_written": st.media_bytes_written,
                          "media_bytes_erased": st.media_bytes_erased, "padding_bytes": st.padding_bytes,
                          "media_reallocated_events": st.media_reallocated_events,
                          "media_reallocated_bytes": st.media_reallocated_bytes, "device_waf": st.waf,
                          "reclaim_units": geo.nr_rus, "ru_bytes": geo.ru_bytes, "spare_factor": inner.spare_factor,
                          "handles": len(inner.ftl.handles),
                          "peak_valid_share": inner.ftl.peak_valid_pages / geo.physical_pages}
        return out

    def _verify_payload(self) -> int:
        """Read back every committed generation and compare with the pattern; returns bytes checked.

        Raises:
            ChecksumError: a shard reads back different from what was written.
        """
        committed = {g.id for g in self.store.generations()}
        checked = 0
        for gen, ev in sorted(self.saved_at.items()):
            gid = _gen_id(ev)
            if gid not in committed:
                continue
            for s in ev.shards:
                want = b"".join(shard_pattern(gen, s.name, s.nbytes))
                got = b"".join(self.store.read_shard(gid, s.name))
                if got != want:
                    raise ChecksumError(f"replay read-back of {gid}/{s.name} differs from what was written")
                checked += len(got)
        return checked

    def close(self) -> None:
        """Abort the writers still in flight, close the store and the device."""
        for w in self.writers.values():
            try:
                w.abort()
            except Exception:  # noqa: BLE001 - the store may already be stopped
                pass
        self.store.close()
        self.dev.close()


def _fdp_options(device: str) -> dict:
    """The FdpNamespaceDevice keyword arguments of an ``fdp[:KEY=VALUE,...]`` replay device.

    Raises:
        ValueError: a malformed spec, a geometry key (the replay sizes the device) or a bad value."""
    from retainz.spec import parse_spec
    from retainz.zoned.spec import FDP_KEYS, parse_fdp_options

    opts = dict(parse_spec(device, "replay device")[1]) if device != "fdp" else {}
    extra = set(opts) - set(FDP_KEYS)
    if extra:
        raise ValueError(f"replay device {device!r}: unknown key(s) {', '.join(sorted(extra))}; valid: "
                         f"{', '.join(FDP_KEYS)} (the replay sizes the zones)")
    try:
        return parse_fdp_options(opts)
    except DeviceFormatError as e:
        raise ValueError(f"replay device {device!r}: {e}") from None


def job_of(name: str) -> str:
    """The job a save belongs to, from its name: ``j<job>`` of a mixed or fleet trace's
    ``j<job>:<name>`` (:mod:`retainz.trace.mix`, :mod:`retainz.trace.fleet`), else ``""`` (one job)."""
    head, sep, _ = name.partition(":")
    return head if sep and head[:1] == "j" and head[1:].isdigit() else ""


def fleet_rates(header: TraceHeader) -> dict[str, int]:
    """Each job's save rate (bytes per step) as a format-2 fleet trace's header records it:
    ``{"j<i>": jobs[i].write_bandwidth}`` (:func:`retainz.trace.fleet.write_bandwidth`; the job names
    of :func:`job_of`).

    Raises:
        ValueError: the header records no per-job rate (not a format-2 fleet trace).
    """
    jobs = header.layout.get("jobs") if isinstance(header.layout, dict) else None
    rates = {}
    for j in jobs or ():
        r = j.get("write_bandwidth") if isinstance(j, dict) else None
        if type(r) is not int or r <= 0 or type(j.get("job")) is not int:
            rates = {}
            break
        rates[f"j{j['job']}"] = r
    if not rates:
        raise ValueError(f"--write-bandwidth {FLEET_RATE} reads each job's rate from a format-2 fleet trace's header "
                         "(retainz trace fleet, \"fleet\": 2); this trace records none: give a RATE such as 64MiB")
    return rates


def timed_schedule(events: list[Event], rate: int | Mapping[str, int]) -> list[tuple[float, Event]]:
    """When each event of a trace happens if one job's save is written at ``rate`` bytes per step:
    ``[(time in steps, event)]`` in time order (ties in trace order).  ``rate`` is one rate for
    every job, or each job's own (``{job: rate}``, the jobs of :func:`job_of`: :func:`fleet_rates`).

    A job (:func:`job_of`) does one thing at a time, in its own order: an event happens at its step
    or, if later, when the job's save in flight is written (``nbytes / rate`` steps after it
    started).  So a job's commit, deletions and next save wait for its save, as TorchTitan, DCP
    ``async_save`` and NVRx wait for the previous checkpoint, while other jobs' saves overlap it.
    A deletion (and a commit) carries the step it really happens at (``floor(time)``): the store is
    told that step, and the oracle's actual reclaim steps are those of the schedule.

    Raises:
        ValueError: ``rate`` is not positive; a job without a rate in a ``{job: rate}``.
    """
    rate_of = _rate_of(rate)
    gen_job: dict[int, str] = {}
    busy: dict[str, float] = {}
    out = []
    for i, ev in enumerate(events):
        if isinstance(ev, SaveEvent):
            gen_job[ev.gen] = job = job_of(ev.name)
        else:
            job = gen_job.get(ev.gen, "")
        t = max(float(ev.step), busy.get(job, 0.0))
        if isinstance(ev, SaveEvent):
            busy[job] = t + ev.nbytes / rate_of(job)
        elif int(t) != ev.step:
            ev = replace(ev, step=int(t))
        out.append((t, i, ev))
    out.sort(key=lambda x: (x[0], x[1]))
    return [(t, ev) for t, _, ev in out]


def _rate_of(rate: int | Mapping[str, int]) -> Callable[[str], int]:
    """A job's rate from one rate or ``{job: rate}`` (:func:`timed_schedule`)."""
    rates = rate if isinstance(rate, Mapping) else None
    for r in (rates.values() if rates is not None else (rate,)):
        if r <= 0:
            raise ValueError(f"write bandwidth must be a positive number of bytes per step, not {r}")
    if rates is None:
        return lambda job: rate

    def of(job: str) -> int:
        if job not in rates:
            raise ValueError(f"no write bandwidth for job {job or '(unnamed)'!r}: the trace's header records "
                             f"rates for {', '.join(sorted(rates)) or 'no job'}")
        return rates[job]
    return of


class _Timed:
    """Replay with time (module docstring, "Saves that take time"): the events of a
    :func:`timed_schedule`, each save's shards written unit by unit, every save in flight
    interleaved in time order (at equal times units come before events, so a save's last unit
    precedes its commit).

    Args:
        run: the replay's store and state.
        rate: bytes per step one job's save is written at (``write_bandwidth``), or each job's own
            (``{job: rate}``, :func:`fleet_rates`).
        unit: bytes per write of a shard (``write_unit``, a multiple of the block size).
    """

    def __init__(self, run: _Run, rate: int | Mapping[str, int], unit: int):
        self.run = run
        self.rate_of = _rate_of(rate)
        self.unit = unit
        self.heap: list[tuple] = []
        self.seq = 0
        self.in_flight: dict[str, int] = {}      # job -> shards of its save still being written

    def _push(self, t: float, kind: int, item: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, item))

    def drive(self, schedule: list[tuple[float, Event]], zmap: _ZoneMap | None) -> _Stop | None:
        """Apply every event at its time and every unit of every save; returns the capacity stop
        or None (as :meth:`_Run.drive`)."""
        for t, ev in schedule:
            self._push(t, 1, (ev,))
        store = self.run.store
        while self.heap:
            t, kind, _, item = heapq.heappop(self.heap)
            step = int(t)
            if zmap:
                zmap.before(step, store.table)
            store.advance(step)
            try:
                if kind:
                    ev = item[0]
                    if isinstance(ev, SaveEvent):
                        self._start_save(t, ev)
                    else:
                        self.run.apply(ev)
                else:
                    self._unit(*item)
            except NoSpaceError as e:
                return _Stop(step, e.cause or "journal", e.state if e.state is not None else store.stop_state())
        return None

    def _start_save(self, t0: float, ev: SaveEvent) -> None:
        """Admit the save and schedule its units: shard ``i`` of ``S_i`` bytes is written at
        ``S_i / D`` bytes per step over the save's ``D = nbytes / rate`` steps (every rank's shard at
        once, each its own writer), so unit ``k`` ends at ``t0 + D * min(S_i, k * unit) / S_i``."""
        run = self.run
        job = job_of(ev.name)
        w = run.begin(ev)
        duration = ev.nbytes / self.rate_of(job)
        shards = 0
        for sh in ev.shards:
            if sh.nbytes == 0:
                if run.payload:
                    w.write_shard(sh.name, [])
                else:
                    w.write_counted_shard(sh.name, 0)
                continue
            sw = w.open_shard(sh.name, size=sh.nbytes)
            src = _Take(shard_pattern(ev.gen, sh.name, sh.nbytes)) if run.payload else None
            shards += 1
            done = 0
            while done < sh.nbytes:
                n = min(self.unit, sh.nbytes - done)
                done += n
                at = t0 + duration if done == sh.nbytes else t0 + duration * done / sh.nbytes
                self._push(at, 0, (job, sw, src, n, done == sh.nbytes))
        if shards:
            self.in_flight[job] = shards

    def _unit(self, job: str, sw, src, n: int, last: bool) -> None:
        """Write one unit of a shard (counted on a payload-less device, pattern bytes otherwise)."""
        if len(self.in_flight) > 1:
            self.run.overlapped_bytes += n
        if src is None:
            sw.count(n)
        else:
            sw.write(src.take(n))
        if last:
            sw.close()
            self.in_flight[job] -= 1
            if not self.in_flight[job]:
                del self.in_flight[job]


class _Take:
    """The next ``n`` bytes of a chunk iterator (a shard's pattern in write units)."""

    def __init__(self, chunks: Iterator[bytes]):
        self.chunks = chunks
        self.buf = b""
        self.pos = 0

    def take(self, n: int) -> bytes:
        if len(self.buf) - self.pos < n:
            rest = [self.buf[self.pos:]]
            have = len(rest[0])
            while have < n:
                chunk = next(self.chunks)
                rest.append(chunk)
                have += len(chunk)
            self.buf, self.pos = b"".join(rest), 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out


def _make_device(device: str, geometry: Geometry) -> ZonedDevice:
    """The device a :attr:`ReplayConfig.device` spec names (checked there)."""
    if device == "memory":
        return MemoryDevice(geometry, payload=False)
    if device == "fdp" or device.startswith("fdp:"):
        from retainz.zoned.fdp import FdpNamespaceDevice

        try:
            return FdpNamespaceDevice(geometry, payload=False, **_fdp_options(device))
        except DeviceFormatError as e:
            raise ValueError(f"replay device {device!r}: {e}") from None
    if device == "memory-payload":
        return MemoryDevice(geometry, payload=True)
    spec = _named_device(device)
    if spec.is_file:
        path = spec.path
        if os.path.lexists(path) and (not os.path.isfile(path) or os.path.getsize(path)):
            raise FileExistsError(f"{path} exists: --device file:PATH makes a new device file for the replay; "
                                  "remove it or name another path")
        return FileDevice.create(path, geometry)
    return spec.open()


def _named_device(device: str) -> DeviceSpec | None:
    """The replay device ``device`` names besides memory (:func:`retainz.zoned.parse_device`): a zoned
    block device, or a device file written ``file:PATH`` (created for the replay); ``None`` for any
    other spec (a bare path could be mistaken for an existing device to keep)."""
    try:
        spec = parse_device(device)
    except ValueError:
        return None
    if spec.kind == "zbd" or (spec.is_file and device.startswith("file:")):
        return spec
    return None


def _result(config: ReplayConfig, stats: TraceStats, geometry: Geometry, measured: dict, stop: _Stop | None,
            wall_seconds: float) -> dict:
    """The replay's result dict (:func:`replay`'s Returns) from what was measured."""
    result = dict(measured)
    zone_map = result.pop("zone_map", None)
    result["waf"] = ((result["host_bytes"] + result["gc_bytes"]) / result["host_bytes"]
                     if result["host_bytes"] else 1.0)
    h = stats.header
    data_zones = geometry.nr_zones - config.meta_zones - config.reserve_zones
    result.update({
        "capacity_stop_step": None if stop is None else stop.step,
        "capacity_stop_cause": None if stop is None else stop.cause,
        "capacity_stop_state": None if stop is None else stop.state,
        "policy": config.policy,
        "device": "file" if (spec := _named_device(config.device)) is not None and spec.is_file else config.device,
        "geometry": {"nr_zones": geometry.nr_zones, "zone_size": geometry.zone_size,
                     "zone_capacity": geometry.zone_capacity, "block_size": geometry.block_size,
                     "max_open": geometry.max_open, "max_active": geometry.max_active,
                     "meta_zones": config.meta_zones, "reserve_zones": config.reserve_zones},
        "zones": data_zones,
        "pressure": config.pressure,
        "effective_pressure": stats.peak_live_bytes / (data_zones * geometry.zone_capacity),
        **({"occupancy": config.occupancy, "mean_live_bytes": float(stats.mean_live_bytes),
            "effective_occupancy": float(stats.mean_live_bytes / (data_zones * geometry.zone_capacity))}
           if config.occupancy is not None else {}),
        "peak_live_bytes": stats.peak_live_bytes,
        "trace_sha256": stats.sha256,
        "trace": {"layout": h.layout.get("name"), "retention": h.retention, "steps": h.schedule.get("steps"),
                  "saves": stats.saves, "seed": h.seed, "crash_every": h.crash_every},
        "seed": config.seed,
        "verify_summaries": config.verify_summaries,
        "wall_seconds": wall_seconds,
    })
    if zone_map is not None:
        result["zone_map"] = zone_map
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
