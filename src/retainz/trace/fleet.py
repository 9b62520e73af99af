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

__all__ = ["FLEET_VERSION", "MODELS", "DEFAULT_CONFIG", "FleetConfig", "FleetJob", "FleetStats", "node_layout",
           "draw_jobs", "generate_fleet", "write_fleet", "load_config"]

#: The config format version this module reads and writes.
FLEET_VERSION = 1

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

#: The default config (docs/fleet.md gives each number's source or says it is an assumption).
DEFAULT_CONFIG: dict[str, Any] = {
    "fleet": FLEET_VERSION,
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

_KEYS = tuple(DEFAULT_CONFIG)


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


def _weighted(key: str, v: Any, fields: set[str], what: str) -> list[dict]:
    if not isinstance(v, list) or not v:
        raise _bad(key, f"must be a non-empty list of {what}")
    for i, x in enumerate(v):
        if not isinstance(x, dict):
            raise _bad(key, f"entry {i} must be an object {what}, got {json.dumps(x)}")
        extra = sorted(set(x) - fields)
        if extra:
            raise _bad(key, f"entry {i}: unknown key {extra[0]!r} (valid: {', '.join(sorted(fields))})")
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
        unknown = sorted(set(obj) - set(_KEYS))
        if unknown:
            raise _bad(unknown[0], f"unknown key (valid: {', '.join(_KEYS)})")
        c = {**DEFAULT_CONFIG, **obj}
        if c["fleet"] != FLEET_VERSION or isinstance(c["fleet"], bool):
            raise _bad("fleet", f"format version must be {FLEET_VERSION}, got {json.dumps(c['fleet'])}")
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
        for i, j in enumerate(_weighted("jobs", c["jobs"], {"model", "gpus", "weight"}, "{model, gpus, weight}")):
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

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _pick(rng: random.Random, items: list, weights: list[float]):
    return rng.choices(items, weights=weights, k=1)[0]


def draw_jobs(config: FleetConfig, seed: int) -> list[FleetJob]:
    """The fleet's jobs for ``seed`` (module docstring), in arrival order; deterministic.

    Raises:
        ValueError: a job would plan more saves than the generator allows."""
    c = config.raw
    rng = random.Random(f"retainz-fleet-{FLEET_VERSION}-{seed}")
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
        jobs.append(FleetJob(len(jobs), start, planned, end, cause, cleanup, cls["model"], gpus,
                             -(-gpus // c["gpus_per_node"]), lay.name, rule, interval,
                             rng.randrange(1 << 31)))
    return jobs


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
    """

    jobs: int
    causes: dict
    saves: int
    deletes: int
    bytes_saved: int
    peak_live_bytes: int
    peak_jobs: int
    trace_bytes: int


def generate_fleet(config: FleetConfig, seed: int = 0) -> tuple[TraceHeader, list[FleetJob], Iterator[Event]]:
    """The header, the jobs and the merged events of a fleet trace (lazily).

    Args:
        config: a validated :class:`FleetConfig`.
        seed: the fleet's seed (arrivals, classes, lengths, causes, lingers, each job's trace seed).
    """
    jobs = draw_jobs(config, seed)
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
                "config": config.to_json(), "jobs": [j.to_json() for j in jobs]},
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
    header, jobs, events = generate_fleet(config, seed)
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
    return FleetStats(len(jobs), causes, saves, deletes, saved, peak, peak_jobs, nbytes)
