"""The fleet model: training jobs that arrive, checkpoint to one node-local device and leave (docs/fleet.md).

A *fleet* is the sequence of jobs one node-local zoned device serves over a trace.  A versioned config
(:class:`FleetConfig`, JSON) and a seed draw the jobs:

* **arrivals** - ``round(concurrency)`` jobs start at step 0 (staggered within their first interval),
  then a Poisson process of rate ``concurrency / mean job length`` (Little's law: on average
  ``concurrency`` jobs run at once);
* **per job** - a class (model family and GPU count, ``jobs``), a checkpoint interval (``interval`` x a
  drawn factor), a runtime with its retention rule (``runtimes``: TorchTitan ``keep_latest_k``,
  Megatron retain-interval, Lightning top-k, HF ``save_total_limit`` with the best kept, Orbax), a
  planned length (lognormal, mean ``churn`` x the job's interval, ``length_sigma``) and an end cause
  (``end``: finished, failed, preempted) with a linger (exponential, the cause's mean in steps);
* **what the device sees** - the job's node-local share of each save: the files its first node's
  ``gpus_per_node`` ranks write, plus the files without a rank (``.metadata``, layer files), taken from
  the project's layouts (:func:`node_layout`); the runtime's own saves, hints and deletions
  (:func:`retainz.trace.generate.generate` over the *planned* length, so the hints say what the runtime
  believes), cut at the job's end (a failed or preempted job stops early; a save in flight then never
  commits and is left out), and, ``linger`` steps after the end, a deletion of every checkpoint the
  job left behind (the job's folder cleaned up after an evaluation or a restart elsewhere).

* **the node** (format 2) - the jobs above are *offered* to one node of ``gpus_per_node`` GPUs; a
  job of at least one node takes the whole node (alone on it), sub-node jobs share it up to its GPUs,
  and a job that finds too few free GPUs waits first come, first served (``placement: queue``) or
  runs on another node (``elsewhere``) (:func:`place_on_node`); each job records the bytes per step
  its saves are written at (:func:`write_bandwidth`: the drive's ``save_bandwidth`` x ``step_seconds``,
  or paced to the next save for an asynchronous class).  Format 1 configs generate the fleets they
  always did.

RetainZ learns only what the runtime tells it: the save-time hints of the rule, computed for the
planned run.  The cleanup is never announced, so a checkpoint's real death (the trace's delete
events, which only the ``oracle`` control reads) can differ from its hint.

The output is an ordinary v1 trace, validated as it is written, merged as :mod:`retainz.trace.mix`
merges jobs (names ``j<job>:<name>``, generations renumbered, hints shifted by the job's start).  The
same config and seed give the same trace, byte for byte.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import json
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TextIO

from retainz import __version__
from retainz.retention import parse_rule
from retainz.trace.format import CommitEvent, CrashEvent, DeleteEvent, Event, SaveEvent, TraceHeader
from retainz.trace.generate import check_saves, generate
from retainz.trace.io import TraceWriter
from retainz.trace.layouts import Layout, ShardSpec, get_layout
from retainz.trace.mix import shift_hint
from retainz.trace.occupancy import mean_live_bytes

__all__ = ["FLEET_VERSION", "VERSIONS", "MODELS", "DEFAULT_CONFIG", "DRIVES", "FleetConfig", "FleetJob",
           "FleetStats", "node_layout", "node_gpus", "write_bandwidth", "place_on_node", "PLACEMENTS", "offered_jobs",
           "draw_jobs", "generate_fleet", "write_fleet", "load_config"]

#: The config format version this module writes (:data:`DEFAULT_CONFIG`); it also reads version 1, whose
#: configs generate the fleets they always did (no node placement, docs/fleet.md "Versions").
FLEET_VERSION = 2
VERSIONS = (1, 2)

#: Model families -> layout builder for a job of ``gpus`` ranks (the project's layouts).
MODELS = {
    "smollm2-135m": lambda gpus: "smollm2-135m-dcp",
    "pythia-1b": lambda gpus: f"pythia-1b:dp={gpus}",
    "llama3-8b": lambda gpus: f"llama3-8b-fsdp:ranks={gpus}",
    "llama3-70b": lambda gpus: f"llama3-70b-fsdp:ranks={gpus}",
}
_ONE_RANK = {"smollm2-135m"}


@functools.lru_cache(maxsize=64)
def _layout(spec: str) -> Layout:
    """The layout of ``spec``, built once (a 70B layout over 64 ranks takes a while to build)."""
    return get_layout(spec)

CAUSES = ("finished", "failed", "preempted")

#: The default config of format 1 (docs/fleet.md gives each number's source or says it is an assumption).
_DEFAULT_V1: dict[str, Any] = {
    "fleet": 1,
    "steps": 50000,
    "concurrency": 4,
    "churn": 16,
    "interval": 500,
    "interval_factors": [[0.5, 1], [1, 2], [2, 1]],
    "length_sigma": 1.0,
    "gpus_per_node": 8,
    # Weights: each GPU-count bin's share of job presence on a node, from Helios (Hu et al., SC'21,
    # Figure 6(b): GPU time by job size) divided by the job's GPUs per node (docs/fleet.md).
    "jobs": [
        {"model": "smollm2-135m", "gpus": 1, "weight": 29.4},
        {"model": "pythia-1b", "gpus": 8, "weight": 21.0},
        {"model": "llama3-8b", "gpus": 8, "weight": 10.1},
        {"model": "llama3-8b", "gpus": 32, "weight": 30.6},
        {"model": "llama3-70b", "gpus": 64, "weight": 9.0},
    ],
    "runtimes": [
        {"rule": "torchtitan:interval={interval},keep_latest_k=5", "weight": 1},
        {"rule": "megatron:save_interval={interval},retain_interval={interval_x5}", "weight": 1},
        {"rule": "lightning:every_n_train_steps={interval},save_top_k=3,metric=plateau", "weight": 1},
        {"rule": "hf:save_steps={interval},save_total_limit=3,metric=plateau", "weight": 1},
        {"rule": "orbax:save_interval_steps={interval},latest=3", "weight": 1},
    ],
    # Weights: Helios GPU jobs by final status (Hu et al., SC'21, Figure 7(a)): completed 62.4 %,
    # failed 15.5 %, canceled 22.1 % (``preempted``: ended by a person or the scheduler).
    "end": {
        "finished": {"weight": 62.4, "linger": 10000},
        "failed": {"weight": 15.5, "linger": 2000},
        "preempted": {"weight": 22.1, "linger": 1000},
    },
    "scale": "1",
}

#: The default config (format 2): format 1's, with the node placement (``gpus_per_node`` now also
#: decides which jobs share the node) and the save bandwidth.  ``save_bandwidth``: bytes per second
#: the node-local drive writes a save at, the WD Ultrastar DC ZN540's sequential write rate (1,230 MB/s,
#: Kim et al., ZRAID, ASPLOS'25, section 2.1); ``step_seconds``: seconds one training step takes (an
#: assumption); a job's save is written at ``save_bandwidth * step_seconds`` bytes per step (docs/fleet.md).
DEFAULT_CONFIG: dict[str, Any] = {
    **{k: v for k, v in _DEFAULT_V1.items() if k != "scale"},
    "fleet": FLEET_VERSION,
    "placement": "queue",
    "save_bandwidth": 1_230_000_000,
    "step_seconds": 1.0,
    "scale": "1",
}

_DEFAULTS = {1: _DEFAULT_V1, 2: DEFAULT_CONFIG}

#: Zoned drives a fleet's node may carry (docs/fleet.md, "Devices"): zone size and capacity (bytes),
#: active and open zone limits, zones, the published write rate of the drive (``write_bandwidth``) or of
#: one zone (``zone_write_bandwidth``) in bytes per second (None: not published), and the source.
DRIVES: dict[str, dict[str, Any]] = {
    "zn540-2tb": {"zone_size": 2 << 30, "zone_capacity": 1077 << 20, "max_active": 14, "max_open": 14,
                  "zones": 1808, "write_bandwidth": 1_230_000_000, "zone_write_bandwidth": None,
                  "source": "WD Ultrastar DC ZN540: 2 GiB zones of 1077 MiB, 14 open/active; the 1 TB model has "
                            "904 zones and writes 1,230 MB/s sequentially (ZRAID, ASPLOS'25, section 2.1); "
                            "zones: 2 x 904 (the 2 TB model's capacity over the same zone capacity)"},
    "zn540-4tb": {"zone_size": 2 << 30, "zone_capacity": 1077 << 20, "max_active": 14, "max_open": 14,
                  "zones": 3616, "write_bandwidth": 1_230_000_000, "zone_write_bandwidth": None,
                  "source": "as zn540-2tb; zones: 4 x 904"},
    "pm1731a-4tb": {"zone_size": 96 << 20, "zone_capacity": 96 << 20, "max_active": 384, "max_open": 384,
                    "zones": 40704, "write_bandwidth": None, "zone_write_bandwidth": 45_000_000,
                    "source": "Samsung PM1731a (4 TB): 40,704 zones of 96 MB (taken as MiB: 40,704 x 96 MiB = "
                              "4.10e12 B, the 4 TB model), at most 384 active zones (Hwang et al., Z-LFS, USENIX "
                              "ATC'25, evaluation set-up; ZRAID, ASPLOS'25, section 2.1); about 45 MB/s a zone, "
                              "the drive's rate growing with the zones written at once (ZRAID)"},
}


def _bad(key: str, msg: str) -> ValueError:
    return ValueError(f"fleet config: key {key!r}: {msg}")


def _num(obj: dict, key: str, *, lo: float, hi: float = math.inf, integer: bool = False, lo_open: bool = False):
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)) or not math.isfinite(v):
        raise _bad(key, f"must be {'an integer' if integer else 'a number'}, got {json.dumps(v)}")
    if v < lo or (lo_open and v == lo) or v > hi:
        rng = f"{'>' if lo_open else '>='} {lo:g}" + ("" if hi == math.inf else f" and <= {hi:g}")
        raise _bad(key, f"must be {rng}, got {v}")
    return v


def _weighted(key: str, v: Any, fields: set[str], what: str, optional: set[str] = frozenset()) -> list[dict]:
    if not isinstance(v, list) or not v:
        raise _bad(key, f"must be a non-empty list of {what}")
    for i, x in enumerate(v):
        if not isinstance(x, dict):
            raise _bad(key, f"entry {i} must be an object {what}, got {json.dumps(x)}")
        extra = sorted(set(x) - fields - optional)
        if extra:
            raise _bad(key, f"entry {i}: unknown key {extra[0]!r} (valid: {', '.join(sorted(fields | optional))})")
        missing = sorted(fields - set(x))
        if missing:
            raise _bad(key, f"entry {i}: missing key {missing[0]!r}")
        w = x["weight"]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < math.inf:
            raise _bad(key, f"entry {i}: weight must be a number >= 0, got {json.dumps(w)}")
    if not sum(x["weight"] for x in v) > 0:
        raise _bad(key, "the weights sum to 0")
    return v


def _rule_of(template: str, interval: int) -> str:
    return template.format(interval=interval, interval_x5=5 * interval, interval_x10=10 * interval)


@dataclass(frozen=True)
class FleetConfig:
    """A validated fleet config (format :data:`FLEET_VERSION`; fields as in :data:`DEFAULT_CONFIG`,
    documented in docs/fleet.md).

    Attributes:
        raw: the config as a JSON object, every key present (defaults filled in).
    """

    raw: dict

    @classmethod
    def from_json(cls, obj: Any) -> FleetConfig:
        """Validate a config object; missing keys take :data:`DEFAULT_CONFIG`'s values.

        Raises:
            ValueError: one line, ``fleet config: key 'K': what is wrong``.
        """
        if not isinstance(obj, dict):
            raise ValueError(f"fleet config: must be a JSON object, got {type(obj).__name__}")
        version = obj.get("fleet", FLEET_VERSION)
        if isinstance(version, bool) or version not in VERSIONS:
            raise _bad("fleet", f"format version must be 1 or 2, got {json.dumps(version)}")
        defaults = _DEFAULTS[version]
        unknown = sorted(set(obj) - set(defaults))
        if unknown:
            later = " (a format 2 key: give \"fleet\": 2)" if version == 1 and unknown[0] in DEFAULT_CONFIG else ""
            raise _bad(unknown[0], f"unknown key{later} (valid: {', '.join(defaults)})")
        c = {**defaults, **obj, "fleet": int(version)}   # 1.0 reads as 1 (it names the jobs' random stream)
        if version >= 2:
            if c["placement"] not in PLACEMENTS:
                raise _bad("placement", f"must be one of {', '.join(PLACEMENTS)}, got {json.dumps(c['placement'])}")
            _num(c, "save_bandwidth", lo=0, hi=1e15, lo_open=True)
            _num(c, "step_seconds", lo=0, hi=1e6, lo_open=True)
        _num(c, "steps", lo=1, hi=10**9, integer=True)
        _num(c, "concurrency", lo=0, hi=1024, lo_open=True)
        _num(c, "churn", lo=0, hi=10**6, lo_open=True)
        _num(c, "interval", lo=1, hi=10**9, integer=True)
        _num(c, "length_sigma", lo=0, hi=5)
        _num(c, "gpus_per_node", lo=1, hi=64, integer=True)
        f = c["interval_factors"]
        if (not isinstance(f, list) or not f
                or not all(isinstance(x, list) and len(x) == 2 and all(type(y) in (int, float) for y in x)
                           and x[0] > 0 and x[1] >= 0 for x in f) or not sum(x[1] for x in f) > 0):
            raise _bad("interval_factors", f"must be a non-empty list of [factor > 0, weight >= 0], got {json.dumps(f)}")
        for factor, _ in f:
            if round(c["interval"] * factor) < 1:
                raise _bad("interval_factors", f"factor {factor} makes an interval below 1 step")
        optional = {"async"} if version >= 2 else set()
        for i, j in enumerate(_weighted("jobs", c["jobs"], {"model", "gpus", "weight"}, "{model, gpus, weight}",
                                        optional)):
            if type(j.get("async", False)) is not bool:
                raise _bad("jobs", f"entry {i}: async must be true or false, got {json.dumps(j['async'])}")
            if j["model"] not in MODELS:
                raise _bad("jobs", f"entry {i}: unknown model {json.dumps(j['model'])} (known: {', '.join(MODELS)})")
            g = j["gpus"]
            if type(g) is not int or g < 1:
                raise _bad("jobs", f"entry {i}: gpus must be an integer >= 1, got {json.dumps(g)}")
            if j["model"] in _ONE_RANK and g != 1:
                raise _bad("jobs", f"entry {i}: {j['model']} has a one-rank layout: gpus must be 1, got {g}")
            try:
                _layout(MODELS[j["model"]](g))
            except ValueError as e:
                raise _bad("jobs", f"entry {i}: {e}") from None
        for i, r in enumerate(_weighted("runtimes", c["runtimes"], {"rule", "weight"}, "{rule, weight}")):
            if not isinstance(r["rule"], str):
                raise _bad("runtimes", f"entry {i}: rule must be a string, got {json.dumps(r['rule'])}")
            try:
                parse_rule(_rule_of(r["rule"], c["interval"]))
            except (KeyError, IndexError, ValueError) as e:
                raise _bad("runtimes", f"entry {i}: {str(e).strip(chr(39))} (placeholders: {{interval}}, "
                                       "{interval_x5}, {interval_x10})") from None
        end = c["end"]
        if not isinstance(end, dict) or not end:
            raise _bad("end", "must be an object {cause: {weight, linger}} over finished, failed, preempted")
        for cause, e in end.items():
            if cause not in CAUSES:
                raise _bad("end", f"unknown cause {json.dumps(cause)} (known: {', '.join(CAUSES)})")
            _weighted("end", [e], {"weight", "linger"}, "{weight, linger}")
            lg = e["linger"]
            if isinstance(lg, bool) or not isinstance(lg, (int, float)) or not 0 <= lg < math.inf:
                raise _bad("end", f"{cause}: linger must be a number of steps >= 0, got {json.dumps(lg)}")
        if not sum(e["weight"] for e in end.values()) > 0:
            raise _bad("end", "the weights sum to 0")
        try:
            sc = Fraction(str(c["scale"]))
        except (ValueError, ZeroDivisionError):
            raise _bad("scale", f"must be a fraction such as \"1/1024\", got {json.dumps(c['scale'])}") from None
        if not 0 < sc <= 1:
            raise _bad("scale", f"must be in (0, 1], got {c['scale']}")
        c["scale"] = str(sc)
        return cls(c)

    def to_json(self) -> dict:
        return dict(self.raw)

    @property
    def mean_interval(self) -> float:
        """The mean checkpoint interval over the interval factors (steps)."""
        f = self.raw["interval_factors"]
        return sum(round(self.raw["interval"] * x) * w for x, w in f) / sum(w for _, w in f)

    @property
    def mean_length(self) -> float:
        """The mean planned job length: churn x the mean interval (steps)."""
        return self.raw["churn"] * self.mean_interval


def load_config(path: str) -> FleetConfig:
    """Read and validate a fleet config file (JSON).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or a bad field (one line naming the key)."""
    with open(path, encoding="utf-8") as f:
        try:
            obj = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: fleet config is not valid JSON: {e}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{path}: fleet config is not UTF-8 JSON text") from None
    try:
        return FleetConfig.from_json(obj)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


_RANK = re.compile(r"^__(\d+)_\d+\.distcp$|^zero_pp_rank_(\d+)_")


def node_layout(layout: Layout, gpus: int, gpus_per_node: int) -> Layout:
    """The files of a save that land on the job's first node (its node-local device).

    A file written by rank ``r`` (DCP ``__r_0.distcp``, DeepSpeed ``zero_pp_rank_r_...``) is on node
    ``r // gpus_per_node``; a file without a rank (``.metadata``, layer files, ``pytorch_model.bin``) is
    written by rank 0, on the first node.  A one-node job keeps every file.

    Returns:
        the layout with only the first node's files, named ``NAME@node=0/N`` (N nodes).
    """
    nodes = -(-gpus // gpus_per_node)
    if nodes <= 1:
        return layout

    def mine(s: ShardSpec) -> bool:
        m = _RANK.match(s.name)
        return m is None or int(m.group(1) or m.group(2)) < gpus_per_node

    return dataclasses.replace(layout, name=f"{layout.name}@node=0/{nodes}",
                               shards=tuple(s for s in layout.shards if mine(s)),
                               model_only=tuple(s for s in layout.model_only if mine(s)),
                               notes=layout.notes + (f"the files of node 0 of {nodes} ({gpus_per_node} ranks a node)",))


def _scaled(layout: Layout, scale: str) -> Layout:
    f = Fraction(scale)
    if f == 1:
        return layout

    def sc(files):
        return tuple(ShardSpec(s.name, max(1, s.nbytes * f.numerator // f.denominator),
                               f"{s.source} (size scaled by {f})") for s in files)

    return dataclasses.replace(layout, name=f"{layout.name}@scale={f}", shards=sc(layout.shards),
                               model_only=sc(layout.model_only))


@dataclass(frozen=True)
class FleetJob:
    """One job of a fleet.

    Attributes:
        job: index (arrival order).
        start: first step on the device (steps).
        planned: planned length, what the runtime schedules for (steps).
        end: the step it stops at (start + planned when finished); may lie past the trace.
        cause: ``finished``, ``failed`` or ``preempted``.
        cleanup: the step its remaining checkpoints are deleted (end + linger), or None past the trace.
        model, gpus, nodes: the job's class; layout: the node-local layout's name.
        rule: its retention rule spec; interval: its checkpoint interval (steps); seed: its trace seed.
        write_bandwidth: format 2: bytes per step its saves are written at (:func:`write_bandwidth`);
            None in format 1 (and left out of :meth:`to_json`, so format 1 traces keep their bytes).
        async_save: format 2: its saves are asynchronous (written in the background, paced to finish
            by its next save); None in format 1.
    """

    job: int
    start: int
    planned: int
    end: int
    cause: str
    cleanup: int | None
    model: str
    gpus: int
    nodes: int
    layout: str
    rule: str
    interval: int
    seed: int
    write_bandwidth: int | None = None
    async_save: bool | None = None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("write_bandwidth", "async_save"):
            if d[k] is None:
                del d[k]
        return d


def node_gpus(gpus: int, gpus_per_node: int) -> int:
    """The GPUs a job of ``gpus`` GPUs takes on its (first) node: all ``gpus_per_node`` of them for a job
    of at least one node (it takes whole nodes), else its own ``gpus`` (docs/fleet.md, "The node")."""
    return min(gpus, gpus_per_node)


def write_bandwidth(config: FleetConfig, save_bytes: int, interval: int, async_save: bool) -> int:
    """Bytes per step a job's saves are written at (format 2; the replay's ``write_bandwidth``).

    A synchronous save is written at the drive's rate: ``save_bandwidth`` (bytes per second) x
    ``step_seconds`` (seconds per step) x ``scale``, at least 1.  An asynchronous save is persisted in
    the background paced to end by the job's next save: ``ceil(save_bytes / interval)``, never above the
    synchronous rate (docs/fleet.md, "Save bandwidth").

    Args:
        save_bytes: one save's node-local bytes (already scaled); interval: the job's checkpoint interval
            (steps); async_save: the job's class is asynchronous.
    """
    c = config.raw
    sync = max(1, math.floor(Fraction(str(c["save_bandwidth"])) * Fraction(str(c["step_seconds"]))
                             * Fraction(c["scale"])))
    if not async_save:
        return sync
    return min(sync, max(1, -(-save_bytes // interval)))


def _pick(rng: random.Random, items: list, weights: list[float]):
    return rng.choices(items, weights=weights, k=1)[0]


def draw_jobs(config: FleetConfig, seed: int) -> list[FleetJob]:
    """The fleet's jobs for ``seed`` (module docstring), in arrival order; deterministic.  Format 2 keeps
    the jobs the node runs (:func:`place_on_node`), numbered 0.. in arrival order.

    Raises:
        ValueError: a job would plan more saves than the generator allows."""
    return _fleet_jobs(config, seed)[1]


def _fleet_jobs(config: FleetConfig, seed: int) -> tuple[list[FleetJob], list[FleetJob]]:
    """(offered jobs, the fleet's jobs): format 2 places the offered jobs on the node, format 1 keeps them."""
    offered = offered_jobs(config, seed)
    c = config.raw
    if c["fleet"] >= 2:
        return offered, place_on_node(offered, c["gpus_per_node"], c["placement"], c["steps"])[0]
    return offered, offered


def offered_jobs(config: FleetConfig, seed: int) -> list[FleetJob]:
    """Every job that arrives for the node (module docstring), in arrival order, before format 2's node
    placement; deterministic.  Format 1's fleet is exactly these jobs.

    Raises:
        ValueError: a job would plan more saves than the generator allows."""
    c = config.raw
    rng = random.Random(f"retainz-fleet-{c['fleet']}-{seed}")
    steps, sigma = c["steps"], c["length_sigma"]
    rate = c["concurrency"] / config.mean_length      # arrivals per step
    factors = [x for x, _ in c["interval_factors"]]
    fweights = [w for _, w in c["interval_factors"]]
    classes, cweights = c["jobs"], [j["weight"] for j in c["jobs"]]
    rules, rweights = c["runtimes"], [r["weight"] for r in c["runtimes"]]
    # a fixed order, not the config's key order: the same config with its keys in another order (the
    # runner stores configs as canonical JSON, keys sorted) must draw the same fleet
    causes = sorted(c["end"])
    eweights = [c["end"][k]["weight"] for k in causes]
    jobs: list[FleetJob] = []
    t = 0.0
    initial = max(1, round(c["concurrency"]))
    while True:
        interval = max(1, round(c["interval"] * _pick(rng, factors, fweights)))
        if len(jobs) < initial:
            start = rng.randrange(interval)                # the first jobs: staggered within an interval
        else:
            t += rng.expovariate(rate)
            start = math.floor(t)
        if start >= steps:
            break
        mean = c["churn"] * interval
        planned = max(1, round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)))
        cls = _pick(rng, classes, cweights)
        rule = _rule_of(_pick(rng, rules, rweights)["rule"], interval)
        cause = _pick(rng, causes, eweights)
        ran = planned if cause == "finished" else max(1, math.floor(planned * rng.random()))
        linger = round(rng.expovariate(1 / c["end"][cause]["linger"])) if c["end"][cause]["linger"] > 0 else 0
        end = start + ran
        cleanup = end + linger if end + linger <= steps else None
        gpus = cls["gpus"]
        lay = node_layout(_layout(MODELS[cls["model"]](gpus)), gpus, c["gpus_per_node"])
        check_saves(parse_rule(rule), planned)
        extra: dict[str, Any] = {}
        if c["fleet"] >= 2:
            a = cls.get("async", False)
            extra = {"async_save": a,
                     "write_bandwidth": write_bandwidth(config, _scaled(lay, c["scale"]).total_bytes, interval, a)}
        jobs.append(FleetJob(len(jobs), start, planned, end, cause, cleanup, cls["model"], gpus,
                             -(-gpus // c["gpus_per_node"]), lay.name, rule, interval,
                             rng.randrange(1 << 31), **extra))
    return jobs


PLACEMENTS = ("queue", "elsewhere")


def place_on_node(jobs: list[FleetJob], gpus_per_node: int, placement: str = "queue",
                  horizon: int | None = None) -> tuple[list[FleetJob], list[FleetJob]]:
    """The jobs the modelled node runs, and those it does not (format 2; docs/fleet.md, "The node").

    A job takes :func:`node_gpus` GPUs from its start to its end: a job of at least one node takes the
    whole node, so it runs alone on it (what earlier jobs left on the device stays until their cleanup);
    sub-node jobs share the node until their GPUs fill it.  Jobs are taken in start order (ties:
    arrival order), and a job that finds too few free GPUs is, by ``placement``:

    * ``queue``: queued.  The node starts jobs first come, first served: a job starts when the jobs
      offered before it have started and enough GPUs are free, and every job behind it waits too
      (a FIFO queue without backfill).  A waiting job starts later than it arrived; its end and
      cleanup move with it (its planned length and linger are kept).  A job that would start at or
      after ``horizon`` is not run.
    * ``elsewhere``: run on another node of the cluster; this node's device never sees it.

    Args:
        jobs: the offered jobs (:func:`offered_jobs`); gpus_per_node: the node's GPUs;
        placement: ``queue`` or ``elsewhere``; horizon: the trace's last step (``queue``; None: no end).

    Returns:
        (kept, others): the kept jobs renumbered 0.. in arrival order (moved to their start on the node),
        and the jobs not run on the node (their original numbers and steps).

    Raises:
        ValueError: an unknown ``placement``.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")
    running: list[tuple[int, int]] = []              # (end, gpus) of the jobs on the node
    used = 0
    last = 0                                         # the last start (queue: first come, first served)
    kept: dict[int, FleetJob] = {}
    for j in sorted(jobs, key=lambda j: (j.start, j.job)):
        need = node_gpus(j.gpus, gpus_per_node)
        t = j.start if placement == "elsewhere" else max(j.start, last)
        while running and running[0][0] <= t:
            used -= heapq.heappop(running)[1]
        if placement == "elsewhere":
            if used + need > gpus_per_node:
                continue
        else:
            while used + need > gpus_per_node:
                end, g = heapq.heappop(running)
                t, used = max(t, end), used - g
            if horizon is not None and t >= horizon:
                break                                # first come, first served: every later job waits too
            last = t
        delay = t - j.start
        cleanup = None if j.cleanup is None else j.cleanup + delay
        if cleanup is not None and horizon is not None and cleanup > horizon:
            cleanup = None
        kept[j.job] = dataclasses.replace(j, start=t, end=j.end + delay, cleanup=cleanup)
        heapq.heappush(running, (j.end + delay, need))
        used += need
    on_node = [dataclasses.replace(kept[j.job], job=i) for i, j in enumerate(j for j in jobs if j.job in kept)]
    return on_node, [j for j in jobs if j.job not in kept]


def _job_events(job: FleetJob, layout: Layout, horizon: int) -> Iterator[Event]:
    """The job's events on the device: the runtime's, shifted to its start, cut at its end, then the
    cleanup deletions (module docstring)."""
    _, events = generate(layout, job.rule, job.planned, seed=job.seed)
    cut = min(job.end, horizon + 1) - job.start      # keep events before the cut (relative steps)
    kept: list[Event] = []
    if job.cause == "finished" and job.end <= horizon:
        kept = list(events)
    else:
        for ev in events:
            if ev.step >= cut:
                break
            kept.append(ev)
    pending = {ev.gen for ev in kept if isinstance(ev, SaveEvent)} - {ev.gen for ev in kept if isinstance(ev, CommitEvent)}
    live: dict[int, None] = {}
    for ev in kept:
        if isinstance(ev, SaveEvent):
            if ev.gen in pending:
                continue
            live[ev.gen] = None
            yield dataclasses.replace(ev, step=ev.step + job.start, hint=shift_hint(ev.hint, job.start))
        elif isinstance(ev, (DeleteEvent, CrashEvent)):
            if ev.gen in pending:
                continue
            live.pop(ev.gen, None)
            yield dataclasses.replace(ev, step=ev.step + job.start)
        else:
            yield dataclasses.replace(ev, step=ev.step + job.start)
    if job.cleanup is not None:
        for g in live:
            yield DeleteEvent(job.cleanup, g)


def _keyed(job: FleetJob, layout: Layout, horizon: int) -> Iterator[tuple[int, int, int, Event]]:
    for i, ev in enumerate(_job_events(job, layout, horizon)):
        yield ev.step, job.job, i, ev


@dataclass(frozen=True)
class FleetStats:
    """What a fleet trace holds.

    Attributes:
        jobs: jobs drawn; causes: jobs per end cause; saves, deletes: event counts.
        bytes_saved: bytes of all saves; peak_live_bytes: the most bytes saved and not deleted at once.
        peak_jobs: the most jobs running at once; trace_bytes: size of the trace (bytes).
        mean_live_bytes: the live bytes averaged over the trace's steps (not block-rounded;
            :func:`retainz.trace.occupancy.mean_live_bytes`).
        not_on_node: format 2: jobs offered to the node that it did not run (placed elsewhere, or
            queued past the trace's end: :func:`place_on_node`); 0 in format 1.
        mean_node_gpus: the node's GPUs busy with the fleet's jobs, averaged over the trace's steps
            (format 1 counts every job's GPUs on its first node, which may exceed the node's).
    """

    jobs: int
    causes: dict
    saves: int
    deletes: int
    bytes_saved: int
    peak_live_bytes: int
    peak_jobs: int
    trace_bytes: int
    mean_live_bytes: float = 0.0
    not_on_node: int = 0
    mean_node_gpus: float = 0.0


def generate_fleet(config: FleetConfig, seed: int = 0) -> tuple[TraceHeader, list[FleetJob], Iterator[Event]]:
    """The header, the jobs and the merged events of a fleet trace (lazily).

    Args:
        config: a validated :class:`FleetConfig`.
        seed: the fleet's seed (arrivals, classes, lengths, causes, lingers, each job's trace seed).
    """
    offered, jobs = _fleet_jobs(config, seed)
    c = config.raw
    horizon = config.raw["steps"]
    layouts = {}
    for j in jobs:
        if j.layout not in layouts:
            base = _layout(MODELS[j.model](j.gpus))
            layouts[j.layout] = _scaled(node_layout(base, j.gpus, config.raw["gpus_per_node"]), config.raw["scale"])
    header = TraceHeader(
        layout={"name": f"fleet:{len(jobs)}",
                "source": f"retainz trace fleet (docs/fleet.md): {len(jobs)} jobs, concurrency "
                          f"{config.raw['concurrency']}, churn {config.raw['churn']}, seed {seed}",
                "config": config.to_json(), "jobs": [j.to_json() for j in jobs],
                **({"not_on_node": len(offered) - len(jobs)} if c["fleet"] >= 2 else {})},
        retention="fleet:" + ";".join(sorted({j.rule.split(":")[0] for j in jobs})),
        schedule={"steps": horizon, "saves": 0, "base_interval": min((j.interval for j in jobs), default=1)},
        seed=seed, crash_every=None, generator=f"retainz {__version__} (trace fleet)")

    def merged() -> Iterator[Event]:
        streams = [_keyed(j, layouts[j.layout], horizon) for j in jobs]
        renum: dict[tuple[int, int], int] = {}
        for step, job, _, ev in heapq.merge(*streams):
            if step > horizon:
                continue
            if isinstance(ev, SaveEvent):
                g = renum[(job, ev.gen)] = len(renum)
                yield dataclasses.replace(ev, gen=g, name=f"j{job}:{ev.name}")
            elif (job, ev.gen) in renum:
                yield dataclasses.replace(ev, gen=renum[(job, ev.gen)])

    events = list(merged())
    header.schedule["saves"] = sum(1 for ev in events if isinstance(ev, SaveEvent))
    return header, jobs, iter(events)


def write_fleet(target: str | TextIO, config: FleetConfig, seed: int = 0) -> FleetStats:
    """Generate a fleet trace straight to a file (validated as written) and count what it holds."""
    header, jobs, stream = generate_fleet(config, seed)
    events = list(stream)
    size: dict[int, int] = {}
    saves = deletes = live = peak = saved = 0
    with TraceWriter(target, header) as w:
        for ev in events:
            w.write(ev)
            if isinstance(ev, SaveEvent):
                saves += 1
                size[ev.gen] = ev.nbytes
                saved += ev.nbytes
                live += ev.nbytes
                peak = max(peak, live)
            elif isinstance(ev, DeleteEvent):
                deletes += 1
                live -= size.pop(ev.gen)
        nbytes = w.bytes_written
    causes = {k: sum(1 for j in jobs if j.cause == k) for k in CAUSES}
    bounds = sorted([(j.start, 1) for j in jobs] + [(j.end, -1) for j in jobs])
    running = peak_jobs = 0
    for _, d in bounds:
        running += d
        peak_jobs = max(peak_jobs, running)
    mean = float(mean_live_bytes(events, config.raw["steps"], block_size=1))
    h = config.raw["steps"]
    node_gpu_steps = sum((min(j.end, h) - min(j.start, h)) * node_gpus(j.gpus, config.raw["gpus_per_node"])
                         for j in jobs)
    return FleetStats(len(jobs), causes, saves, deletes, saved, peak, peak_jobs, nbytes, mean,
                      header.layout.get("not_on_node", 0), node_gpu_steps / config.raw["steps"])
