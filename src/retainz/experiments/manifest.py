"""Experiment manifests: a documented JSON file that expands into a list of cases.

A manifest (``experiments/*.json``, documented in ``docs/experiments.md``)::

    {
      "manifest": "pressure",                 # name (required)
      "description": "...",                   # free text
      "format": 1,                            # manifest format version (required, 1)
      "include": ["other.json"],              # optional: every case of these manifests (paths relative
                                              #   to this file), e.g. paper.json = all the others
      "defaults": {CASE FIELDS},              # optional: for every block
      "blocks": [                             # optional (a manifest needs blocks or include)
        {"experiment": "pressure",            # tag: which analysis uses the cases
         "defaults": {CASE FIELDS},           # block defaults (over the manifest defaults)
         "axes": {"FIELD": [v1, v2, ...],     # cartesian product over these fields; an axis with
                  "NAME": [{FIELDS}, ...]},   #   another name zips fields (e.g. zone_size + capacity)
         "rows": [{CASE FIELDS}, ...]}        # explicit rows; a list value in a row expands that row
      ]
    }

A block's cases are ``rows x product(axes)`` (just the product when there are no rows, just the rows
when there are no axes).  A row is laid over the axes, which are laid over the block defaults, over the
manifest defaults, over :data:`CASE_DEFAULTS`.  Each case must then have every field of
:data:`CASE_FIELDS`; an unknown field, a bad value or a missing field is a :class:`ManifestError` that
names the manifest, the block and the key.

A case is identified by :func:`case_id`: ``<experiment>-<policy slug>-<12 hex digits of sha256 over the
canonical JSON of its tags and inputs>``, stable across runs, machines and manifest reorderings.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from retainz.runrecord import canonical_json

if TYPE_CHECKING:
    from retainz.trace.replay import ReplayConfig

__all__ = ["ManifestError", "Case", "TraceSpec", "CASE_FIELDS", "CASE_DEFAULTS", "TAG_FIELDS",
           "DEVICES", "load_manifest", "expand", "case_id", "parse_scale"]

#: Manifest format version understood here.
FORMAT = 1
#: Devices a case can name: the in-memory replay device, FileDevice with payload, the QEMU ZNS guest.
DEVICES = ("memory", "file", "guest")
#: Fields that label a case for analysis (part of the id, not passed to replay).
TAG_FIELDS = ("experiment", "label")

#: Every case field: name -> (accepted types, description).  Sizes accept ``"64MiB"``-style strings.
CASE_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "experiment": ((str,), "analysis tag: pressure, cost, hints, admission, placement, capacity"),
    "label": ((str, type(None)), "row label (placement table, figure legend), or null"),
    "layout": ((str,), "checkpoint layout, e.g. smollm2-135m-dcp, pythia-1b, llama3-8b-fsdp:ranks=8"),
    "rule": ((str,), "retention rule spec, e.g. torchtitan:interval=500,keep_latest_k=10"),
    "steps": ((int,), "training steps the trace covers"),
    "trace_seed": ((int,), "trace generator seed"),
    "scale": ((str, int), "shard-size scale factor, 1 or a fraction such as \"1/1024\""),
    "policy": ((str,), "placement policy spec, e.g. retainz, zenfs, retainz-noisy:error=0.5,seed=1"),
    "pressure": ((int, float, type(None)), "peak live bytes / usable capacity (exclusive with zones and occupancy)"),
    "occupancy": ((int, float, type(None)), "time-averaged live bytes / usable capacity (exclusive with zones and "
                  "pressure; retainz replay --occupancy); null (default): sized by pressure or zones"),
    "zones": ((int, type(None)), "number of data zones (exclusive with pressure and occupancy)"),
    "reserve_zones": ((int,), "free zones GC keeps in reserve (added on top of the pressure sizing)"),
    "zone_size": ((int, str), "zone size (LBA span), bytes or \"2GiB\""),
    "zone_capacity": ((int, str), "writable bytes per zone, <= zone_size"),
    "max_active": ((int,), "active-zone limit"),
    "max_open": ((int,), "open-zone limit"),
    "device": ((str,), "memory (default), file (FileDevice with payload), guest (QEMU ZNS guest) or "
               "fdp[:KEY=VALUE,...] (payload-less FDP namespace on the FTL model: ru_size, spare, ruh, unit, "
               "handles; docs/fdp.md)"),
    "seed": ((int,), "replay seed"),
    "verify_summaries": ((bool,), "store recomputes zone summaries on every decision (recompute mode)"),
    "zone_map": ((bool,), "ask replay for the zone-state timeline (zone-map figure)"),
    "tenants": ((list, type(None)), "jobs sharing the device, [{layout, rule, offset}, ...] (their traces "
                "mixed: retainz trace mix), or null for one job (layout, rule)"),
    "fleet": ((dict, type(None)), "a fleet of jobs arriving and leaving the device (retainz trace fleet, "
              "docs/fleet.md): fleet config keys over the default config (steps and scale are the case's), "
              "or null (default) for one job or tenants"),
    "system": ((str, type(None)), "file-system comparison in the QEMU guest (device guest): retainz (the "
                                  "store with `policy` on the raw namespace), btrfs, "
                                  "btrfs:bg_reclaim_threshold=N or f2fs; null (default) for a store replay"),
    "promote_bandwidth": ((int, str, type(None)), "promotion to a durable tier at this many bytes per step of "
                          "logical time (\"4MB\" allowed), every generation kept until durable "
                          "(retainz.trace.promotion); null (default): no promotion"),
    "promote_hint": ((bool,), "with promote_bandwidth: the hints carry the expected promotion finish (true, "
                     "default); false gives the rule's hints alone (the ablation)"),
    "write_bandwidth": ((int, str, type(None)), "replay with time: one job's save is written at this many "
                        "bytes per step (\"64MiB\" allowed), interleaved with every other save in flight "
                        "(retainz replay --write-bandwidth); \"fleet\": each job of a format-2 fleet at the rate "
                        "its trace records; null (default): serialized replay"),
    "write_unit": ((int, str), "with write_bandwidth: bytes per write of a shard (\"1MiB\" allowed; default "
                   "1 MiB)"),
    "rerun": ((int,), "an independent rerun of an otherwise identical case, 0 (default) for the first: the "
              "same trace and inputs under another id (guest file-system figures vary run to run)"),
    "guest_memory_mib": ((int,), "RAM of the QEMU guest (device guest) in MiB, 128-65536 (default 512; a node's "
                         "kernel has far more, and btrfs zoned aborts a transaction with ENOMEM in 512 MiB "
                         "under a fleet's tens of GB)"),
}
#: Fields added after format 1 that stay out of a case's inputs (and so out of its id) while they hold
#: their default, so the ids of the cases recorded before them do not change.
OPTIONAL_FIELDS = ("system", "fleet", "promote_bandwidth", "promote_hint", "rerun", "guest_memory_mib",
                   "write_bandwidth", "write_unit", "occupancy")

#: Defaults below every manifest's own defaults.
CASE_DEFAULTS: dict[str, Any] = {
    "label": None,
    "trace_seed": 0,
    "scale": 1,
    "pressure": None,
    "occupancy": None,
    "zones": None,
    "reserve_zones": 4,
    "device": "memory",
    "seed": 0,
    "verify_summaries": False,
    "zone_map": False,
    "tenants": None,
    "system": None,
    "fleet": None,
    "promote_bandwidth": None,
    "promote_hint": True,
    "write_bandwidth": None,
    "write_unit": 1 << 20,
    "rerun": 0,
    "guest_memory_mib": 512,
}


class ManifestError(ValueError):
    """A manifest that cannot be expanded; the message names the file, the block and the key."""


def parse_scale(value: str | int) -> Fraction:
    """``1``, ``"1"``, ``"1/1024"`` -> a positive :class:`~fractions.Fraction` (ValueError otherwise)."""
    try:
        f = Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"scale {value!r} is not a number or fraction like \"1/1024\"") from None
    if f <= 0 or f > 1:
        raise ValueError(f"scale {value!r} must be in (0, 1]")
    return f


@dataclass(frozen=True)
class TraceSpec:
    """What the trace generator needs; equal specs share one generated trace.

    Attributes: layout, rule, steps, seed (the trace seed) and scale (``"1"`` or ``"1/1024"``);
    tenants: ``((layout, rule, offset), ...)`` for jobs sharing the device, or ``None``: job ``j``
    trains ``steps - offset`` steps from its offset (seed ``seed + j``), and the jobs' traces are
    mixed by :func:`retainz.trace.mix.mix`, so the mix spans ``steps``; fleet: the canonical JSON of
    a whole fleet config (:mod:`retainz.trace.fleet`; ``seed`` is the fleet's seed), or ``None``.
    """

    layout: str
    rule: str
    steps: int
    seed: int
    scale: str
    tenants: tuple | None = None
    fleet: str | None = None

    def key(self) -> str:
        """16 hex digits of sha256 over the spec: the trace's cache name."""
        d = dict(self.__dict__)
        for k in ("tenants", "fleet"):
            if d[k] is None:
                del d[k]          # one job: the key it always had
        return hashlib.sha256(canonical_json(d).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Case:
    """One experiment case: tags (``experiment``, ``label``) and replay inputs.

    Attributes:
        id: stable id (:func:`case_id`).
        manifest: name of the manifest the case came from.
        tags: ``{"experiment": ..., "label": ...}``.
        inputs: every other field of :data:`CASE_FIELDS`, sizes in bytes, scale normalized.
        where: where the manifest wrote it (``paper.json > pressure.json block 0 (pressure) row 0 at
            axes ...``), for error messages; not part of the case.
    """

    id: str
    manifest: str
    tags: dict = field(hash=False)
    inputs: dict = field(hash=False)
    where: str = field(default="", hash=False, compare=False)

    @property
    def trace(self) -> TraceSpec:
        i = self.inputs
        ten = i.get("tenants")
        fleet = i.get("fleet")
        return TraceSpec(i["layout"], i["rule"], i["steps"], i["trace_seed"], i["scale"],
                         None if ten is None else tuple((t["layout"], t["rule"], t["offset"]) for t in ten),
                         None if fleet is None else canonical_json(fleet))

    def to_dict(self) -> dict:
        return {"id": self.id, "manifest": self.manifest, "tags": dict(self.tags), "inputs": dict(self.inputs)}

    def replay_config(self, device: str) -> ReplayConfig:
        """The :class:`~retainz.trace.replay.ReplayConfig` of the case's inputs (policy, zones or
        pressure, GC reserve, geometry, seed, zone map, recompute mode, promotion and write bandwidth) on
        ``device``, a replay device spec (``memory``, ``file:PATH``, ``/dev/nvme0n1`` in the guest): the
        one place a case becomes replay parameters.  Journal zones, block size and payload read-back
        are the configuration's defaults.

        Raises:
            ValueError: a value replay refuses (one line naming it).
        """
        from retainz.trace.replay import ReplayConfig

        i = self.inputs
        return ReplayConfig(policy=i["policy"], zones=i["zones"], pressure=i["pressure"],
                            reserve_zones=i["reserve_zones"], zone_size=i["zone_size"],
                            zone_capacity=i["zone_capacity"], max_active=i["max_active"], max_open=i["max_open"],
                            device=device, seed=i["seed"], zone_map=i["zone_map"],
                            verify_summaries=i["verify_summaries"], promote_bandwidth=i.get("promote_bandwidth"),
                            promote_hint=i.get("promote_hint", True), write_bandwidth=i.get("write_bandwidth"),
                            write_unit=i.get("write_unit", CASE_DEFAULTS["write_unit"]),
                            occupancy=i.get("occupancy"))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")[:40] or "case"


def case_id(tags: dict, inputs: dict) -> str:
    """The stable id of a case: ``<experiment>-<policy slug>-<sha256[:12] of tags + inputs>``."""
    digest = hashlib.sha256(canonical_json({"tags": tags, "inputs": inputs}).encode()).hexdigest()[:12]
    system = inputs.get("system")
    who = inputs["policy"] if system in (None, "retainz") else system
    return f"{_slug(tags['experiment'])}-{_slug(who)}-{digest}"


def _check_fields(where: str, d: Any, *, allow_lists: bool) -> None:
    if not isinstance(d, dict):
        raise ManifestError(f"{where}: expected an object of case fields, got {type(d).__name__}")
    for k, v in d.items():
        if k not in CASE_FIELDS:
            raise ManifestError(f"{where}: unknown key {k!r} (valid: {', '.join(CASE_FIELDS)})")
        if allow_lists and isinstance(v, list) and not _one_tenants_value(k, v):
            if not v:
                raise ManifestError(f"{where}: key {k!r} has an empty list")
            for x in v:
                _check_value(where, k, x)
        else:
            _check_value(where, k, v)


def _one_tenants_value(key: str, v: Any) -> bool:
    """A ``tenants`` list of objects is one value; a list of such lists expands a row."""
    return key == "tenants" and isinstance(v, list) and all(isinstance(x, dict) for x in v)


def _tenants(where: str, v: list) -> list[dict]:
    """Check and normalize a ``tenants`` value: each ``{layout, rule, offset (default 0)}``."""
    if len(v) < 2:
        raise ManifestError(f"{where}: key 'tenants' needs at least 2 jobs (one job: use layout and rule)")
    out = []
    for j, t in enumerate(v):
        if not isinstance(t, dict):
            raise ManifestError(f"{where}: key 'tenants' job {j} must be an object {{layout, rule, offset}}")
        extra = sorted(set(t) - {"layout", "rule", "offset"})
        if extra:
            raise ManifestError(f"{where}: key 'tenants' job {j}: unknown key {extra[0]!r} (valid: layout, rule, "
                                "offset)")
        for k in ("layout", "rule"):
            if not isinstance(t.get(k), str) or not t[k]:
                raise ManifestError(f"{where}: key 'tenants' job {j}: {k!r} must be a non-empty string")
        off = t.get("offset", 0)
        if type(off) is not int or off < 0:
            raise ManifestError(f"{where}: key 'tenants' job {j}: 'offset' must be an integer >= 0, got {off!r}")
        out.append({"layout": t["layout"], "rule": t["rule"], "offset": off})
    return out


def _check_replay(where: str, case: Case) -> None:
    """Refuse a case whose replay configuration (:meth:`Case.replay_config`, which applies the
    store's geometry rules, ``Store.check_geometry``) is refused: before anything runs, not as a
    failed record."""
    try:
        case.replay_config("memory")
    except ValueError as e:
        raise ManifestError(f"{where}: {e}") from None


def _check_value(where: str, key: str, v: Any) -> None:
    types = CASE_FIELDS[key][0]
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if not ok:
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise ManifestError(f"{where}: key {key!r} must be {names}, got {v!r}")


def _normalize(where: str, case: dict) -> dict:
    """Fill, check and normalize one fully-merged case (sizes to bytes, scale to a fraction string)."""
    from retainz.zoned.model import parse_size

    missing = [k for k in CASE_FIELDS if k not in case]
    if missing:
        raise ManifestError(f"{where}: missing key {missing[0]!r} (a case needs {', '.join(missing)})")
    c = dict(case)
    for k in ("zone_size", "zone_capacity"):
        try:
            c[k] = parse_size(c[k])
        except ValueError as e:
            raise ManifestError(f"{where}: key {k!r}: {e}") from None
    if not 0 < c["zone_capacity"] <= c["zone_size"]:
        raise ManifestError(f"{where}: key 'zone_capacity' ({c['zone_capacity']}) must be in (0, zone_size]")
    try:
        c["scale"] = str(parse_scale(c["scale"]))
    except ValueError as e:
        raise ManifestError(f"{where}: key 'scale': {e}") from None
    if sum(c[k] is not None for k in ("pressure", "zones", "occupancy")) != 1:
        raise ManifestError(f"{where}: key 'pressure'/'zones'/'occupancy': give exactly one of them "
                            f"(pressure={c['pressure']!r}, zones={c['zones']!r}, occupancy={c['occupancy']!r})")
    for k in ("pressure", "occupancy"):
        if c[k] is not None:
            if not 0 < c[k] < 1:
                raise ManifestError(f"{where}: key {k!r} must be in (0, 1), got {c[k]!r}")
            c[k] = float(c[k])
    if c["occupancy"] is not None and c.get("system") is not None:
        raise ManifestError(f"{where}: key 'occupancy': a file-system case (system) is sized by pressure or zones")
    if c["device"] not in DEVICES and not (c["device"] == "fdp" or c["device"].startswith("fdp:")):
        raise ManifestError(f"{where}: key 'device' must be one of {', '.join(DEVICES)} or fdp[:KEY=VALUE,...], "
                            f"got {c['device']!r}")
    if c["system"] is not None:
        _check_system(where, c)
    elif c["device"] == "guest" and c["zones"] is None:
        raise ManifestError(f"{where}: key 'zones': a guest case needs an explicit zone count")
    for k in ("steps", "max_active", "max_open"):
        if c[k] <= 0:
            raise ManifestError(f"{where}: key {k!r} must be positive, got {c[k]!r}")
    if c["zones"] is not None and c["zones"] < 1:
        raise ManifestError(f"{where}: key 'zones' must be >= 1, got {c['zones']!r}")
    if c["reserve_zones"] < 0:
        raise ManifestError(f"{where}: key 'reserve_zones' must be >= 0, got {c['reserve_zones']!r}")
    if c["rerun"] < 0:
        raise ManifestError(f"{where}: key 'rerun' must be >= 0, got {c['rerun']!r}")
    if not 128 <= c["guest_memory_mib"] <= 65536:
        raise ManifestError(f"{where}: key 'guest_memory_mib' must be in [128, 65536] (the guest's kernel and "
                            f"Python need 128), got {c['guest_memory_mib']!r}")
    if c["guest_memory_mib"] != CASE_DEFAULTS["guest_memory_mib"] and c["device"] != "guest":
        raise ManifestError(f"{where}: key 'guest_memory_mib' sizes the QEMU guest, but device "
                            f"{c['device']!r} runs no guest (use device 'guest' or drop the key)")
    _check_policy(where, c["policy"])
    if c["fleet"] is not None:
        _fleet(where, c)
    elif c["tenants"] is None:
        del c["tenants"]          # one job: the inputs (and so the case id) it always had
        _check_trace_spec(where, "layout", c["layout"])
        _check_trace_spec(where, "rule", c["rule"])
        _check_saves(where, c["rule"], c["steps"])
    else:
        c["tenants"] = _tenants(where, c["tenants"])
        late = [t["offset"] for t in c["tenants"] if t["offset"] >= c["steps"]]
        if late:
            raise ManifestError(f"{where}: key 'tenants': offset {late[0]} is not below steps ({c['steps']})")
        for j, t in enumerate(c["tenants"]):
            _check_trace_spec(f"{where}: key 'tenants' job {j}", "layout", t["layout"])
            _check_trace_spec(f"{where}: key 'tenants' job {j}", "rule", t["rule"])
            _check_saves(f"{where}: key 'tenants' job {j}", t["rule"], c["steps"])
        c["layout"] = "mix:" + "+".join(t["layout"] for t in c["tenants"])
        c["rule"] = "mix:" + ";".join(t["rule"] for t in c["tenants"])
    if c["max_open"] > c["max_active"]:
        raise ManifestError(f"{where}: key 'max_open' ({c['max_open']}) exceeds 'max_active' ({c['max_active']})")
    if c["promote_bandwidth"] is not None:
        try:
            c["promote_bandwidth"] = parse_size(c["promote_bandwidth"])
        except ValueError as e:
            raise ManifestError(f"{where}: key 'promote_bandwidth': {e}") from None
        if c["promote_bandwidth"] <= 0:
            raise ManifestError(f"{where}: key 'promote_bandwidth' must be a positive number of bytes per step, "
                                f"got {c['promote_bandwidth']!r}")
    elif not c["promote_hint"]:
        raise ManifestError(f"{where}: key 'promote_hint': false needs a promote_bandwidth (no promotion, no "
                            "promotion hint)")
    for key in ("write_bandwidth", "write_unit"):
        if c[key] is None or (key == "write_bandwidth" and c[key] == "fleet"):
            continue
        try:
            c[key] = parse_size(c[key])
        except ValueError as e:
            raise ManifestError(f"{where}: key '{key}': {e}") from None
        if c[key] <= 0:
            raise ManifestError(f"{where}: key '{key}' must be a positive number of bytes, got {c[key]!r}")
    if c["write_bandwidth"] == "fleet" and (c["fleet"] is None or c["fleet"].get("fleet", 1) < 2):
        raise ManifestError(f"{where}: key 'write_bandwidth': \"fleet\" takes each job's rate from a format-2 fleet "
                            "(a 'fleet' config with \"fleet\": 2); give a rate such as \"64MiB\"")
    if c["write_bandwidth"] is None and c["write_unit"] != CASE_DEFAULTS["write_unit"]:
        raise ManifestError(f"{where}: key 'write_unit' needs a write_bandwidth (a serialized replay writes "
                            "every shard whole)")
    for k in OPTIONAL_FIELDS:
        if c[k] == CASE_DEFAULTS[k]:
            del c[k]
    return c


def _fleet(where: str, c: dict) -> None:
    """A fleet case: its config validated and made whole (the case's steps and scale in it), so the
    case's inputs (and id) name every number its trace depends on."""
    from retainz.trace.fleet import FleetConfig

    if c["tenants"] is not None:
        raise ManifestError(f"{where}: key 'fleet': a fleet case has no 'tenants' (the fleet draws its jobs)")
    for k in ("steps", "scale"):
        if k in c["fleet"]:
            raise ManifestError(f"{where}: key 'fleet': give {k!r} as the case's own field, not in the fleet config")
    given = canonical_json({**c["fleet"], "steps": c["steps"], "scale": c["scale"]})
    if given not in _FLEET_CONFIGS:
        try:
            _FLEET_CONFIGS[given] = (canonical_json(FleetConfig.from_json(json.loads(given)).to_json()), None)
        except ValueError as e:
            _FLEET_CONFIGS[given] = (None, str(e))
    whole, error = _FLEET_CONFIGS[given]
    if error is not None:
        raise ManifestError(f"{where}: key 'fleet': {error}")
    c["fleet"] = raw = json.loads(whole)
    del c["tenants"]
    c["layout"] = f"fleet:concurrency={raw['concurrency']:g},churn={raw['churn']:g}"
    c["rule"] = "fleet:" + ";".join(r["rule"].split(":")[0] for r in raw["runtimes"])


#: A fleet config as given (canonical JSON) -> (the validated whole config as canonical JSON, None) or
#: (None, the refusal): a manifest repeats one fleet over many cases, and validating a config parses
#: every rule of it (tens of milliseconds).
_FLEET_CONFIGS: dict[str, tuple[str | None, str | None]] = {}


def _check_system(where: str, c: dict) -> None:
    """A file-system comparison case: a known system spec, on the guest device (retainz.experiments.fsworkload)."""
    from retainz.experiments.fsworkload import parse_system

    try:
        c["system"] = parse_system(c["system"]).spec()
    except ValueError as e:
        raise ManifestError(f"{where}: key 'system': {e}") from None
    if c["device"] != "guest":
        raise ManifestError(f"{where}: key 'system': a file-system comparison runs on device 'guest', "
                            f"not {c['device']!r}")


_TRACE_ERRORS: dict[tuple[str, str], str | None] = {}   # (key, spec) -> error (None: valid)


def _check_trace_spec(where: str, key: str, spec) -> None:
    """A layout name or a retention rule the trace generator knows (up front, as for policies)."""
    if not isinstance(spec, str):
        return                                    # the field check names the type
    if (key, spec) not in _TRACE_ERRORS:
        from retainz.retention import parse_rule
        from retainz.trace.layouts import get_layout

        try:
            (get_layout if key == "layout" else parse_rule)(spec)
            _TRACE_ERRORS[key, spec] = None
        except (ValueError, KeyError) as e:
            _TRACE_ERRORS[key, spec] = str(e).strip("'\"")
    if _TRACE_ERRORS[key, spec] is not None:
        raise ManifestError(f"{where}: key {key!r}: {_TRACE_ERRORS[key, spec]}")


def _check_saves(where: str, rule: str, steps) -> None:
    """The run plans at most ``MAX_SAVES`` saves (:func:`retainz.trace.generate.check_saves`)."""
    if not isinstance(rule, str) or type(steps) is not int:
        return                                    # the field checks name the type
    from retainz.retention import parse_rule
    from retainz.trace.generate import check_saves

    try:
        check_saves(parse_rule(rule), steps)
    except ValueError as e:
        raise ManifestError(f"{where}: key 'steps': {e}") from None


_POLICY_ERRORS: dict[str, str | None] = {}   # spec -> error (None: valid); a manifest repeats specs


def _check_policy(where: str, spec: str) -> None:
    """Build the policy once (name, parameter names, types and ranges), as the runner would."""
    if spec not in _POLICY_ERRORS:
        from retainz.placement import make_allocator

        try:
            make_allocator(spec)
            _POLICY_ERRORS[spec] = None
        except ValueError as e:
            _POLICY_ERRORS[spec] = str(e)
    if _POLICY_ERRORS[spec] is not None:
        raise ManifestError(f"{where}: key 'policy': {_POLICY_ERRORS[spec]}")


def _product(where: str, axes: dict) -> list[dict]:
    """Cartesian product of the axes.  An axis named after a case field lists values of that field; an
    axis with any other name (e.g. ``"workload"``, ``"geometry"``) lists objects of case fields that
    vary together (a zipped axis)."""
    if not isinstance(axes, dict):
        raise ManifestError(f"{where}: key 'axes' must be an object")
    levels = []
    for k, v in axes.items():
        if not isinstance(v, list) or not v:
            raise ManifestError(f"{where} axes: key {k!r} must be a non-empty list of values")
        if k in CASE_FIELDS:
            for x in v:
                _check_value(f"{where} axes", k, x)
            levels.append([{k: x} for x in v])
        else:
            for j, x in enumerate(v):
                if not isinstance(x, dict):
                    raise ManifestError(f"{where} axes: key {k!r} is not a case field, so its values must be "
                                        f"objects of case fields (a zipped axis); value {j} is {x!r}")
                _check_fields(f"{where} axes {k}[{j}]", x, allow_lists=False)
            levels.append(v)
    out = []
    for combo in itertools.product(*levels):
        d: dict = {}
        for part in combo:
            d.update(part)
        out.append(d)
    return out


def _expand_row(row: dict) -> list[dict]:
    list_keys = [k for k, v in row.items() if isinstance(v, list) and not _one_tenants_value(k, v)]
    if not list_keys:
        return [row]
    out = []
    for vals in itertools.product(*(row[k] for k in list_keys)):
        r = dict(row)
        r.update(zip(list_keys, vals, strict=True))
        out.append(r)
    return out


def load_manifest(path: str | os.PathLike, _seen: tuple = (), *, overrides: dict | None = None,
                  _name: str | None = None) -> tuple[dict, list[Case]]:
    """Read a manifest and expand it.

    Args:
        path: the manifest file.
        overrides: case fields laid over every case, rows included, before it is checked (``retainz
            run --device``); a case they make invalid is refused like one the manifest wrote.

    Returns:
        ``(manifest dict, cases)``; cases in manifest order, includes first.

    Raises:
        ManifestError: unreadable JSON, unknown or missing keys, bad values, duplicate cases,
            include cycles.  The message names the file (an included one by the chain of includes,
            ``paper.json > pressure.json``) and the key.
    """
    path = os.path.abspath(path)
    name = _name or os.path.basename(path)
    if path in _seen:
        raise ManifestError(f"{name}: key 'include': cycle through {os.path.basename(path)}")
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except json.JSONDecodeError as e:
        raise ManifestError(f"{name}: not valid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise ManifestError(f"{path}: not a JSON manifest: byte 0x{e.object[e.start]:02x} is not UTF-8 text "
                            "(a binary file?)") from None
    return m, expand(m, name=name, base_dir=os.path.dirname(path), _seen=_seen + (path,), overrides=overrides)


def expand(m: dict, *, name: str = "<manifest>", base_dir: str = ".", _seen: tuple = (),
           overrides: dict | None = None) -> list[Case]:
    """Expand a parsed manifest into cases (see the module docstring and :func:`load_manifest`'s
    ``overrides``).  Raises :class:`ManifestError`."""
    overrides = overrides or {}
    _check_fields("overrides", overrides, allow_lists=False)
    if not isinstance(m, dict):
        raise ManifestError(f"{name}: a manifest is a JSON object")
    known = {"manifest", "description", "format", "include", "defaults", "blocks", "notes"}
    for k in m:
        if k not in known:
            raise ManifestError(f"{name}: unknown top-level key {k!r} (valid: {', '.join(sorted(known))})")
    if m.get("format") != FORMAT:
        raise ManifestError(f"{name}: key 'format' must be {FORMAT}, got {m.get('format')!r}")
    if not isinstance(m.get("manifest"), str) or not m["manifest"]:
        raise ManifestError(f"{name}: key 'manifest' (the manifest's name) is required")
    if "blocks" not in m and "include" not in m:
        raise ManifestError(f"{name}: key 'blocks' or 'include' is required")
    mname = m["manifest"]
    cases: list[Case] = []
    includes = m.get("include", [])
    if not isinstance(includes, list):
        raise ManifestError(f"{name}: key 'include' must list file names, got {includes!r}")
    for inc in includes:
        if not isinstance(inc, str):
            raise ManifestError(f"{name}: key 'include' must list file names")
        inc_path = os.path.join(base_dir, inc)
        if not os.path.isfile(inc_path):
            raise ManifestError(f"{name}: key 'include': no manifest file {inc_path}")
        _, sub = load_manifest(inc_path, _seen, overrides=overrides, _name=f"{name} > {inc}")
        cases.extend(sub)
    top = m.get("defaults", {})
    _check_fields(f"{name} defaults", top, allow_lists=False)
    blocks = m.get("blocks", [])
    if not isinstance(blocks, list):
        raise ManifestError(f"{name}: key 'blocks' must be a list")
    for bi, block in enumerate(blocks):
        where = f"{name} block {bi}"
        if not isinstance(block, dict):
            raise ManifestError(f"{where}: a block is an object")
        for k in block:
            if k not in ("experiment", "defaults", "axes", "rows", "description"):
                raise ManifestError(f"{where}: unknown key {k!r} (valid: experiment, description, defaults, "
                                    "axes, rows)")
        if not isinstance(block.get("experiment"), str):
            raise ManifestError(f"{where}: key 'experiment' is required")
        where = f"{name} block {bi} ({block['experiment']})"
        bdef = block.get("defaults", {})
        _check_fields(f"{where} defaults", bdef, allow_lists=False)
        combos = _product(where, block.get("axes", {}))
        rows = block.get("rows", [{}])
        if not isinstance(rows, list) or not rows:
            raise ManifestError(f"{where}: key 'rows' must be a non-empty list")
        for ri, row in enumerate(rows):
            _check_fields(f"{where} row {ri}", row, allow_lists=True)
            for r in _expand_row(row):
                for combo in combos:
                    merged = {**CASE_DEFAULTS, **top, **bdef, "experiment": block["experiment"], **combo, **r,
                              **overrides}
                    axis = {k: v for k, v in combo.items() if k not in r}
                    at = f" at axes {', '.join(f'{k}={v!r}' for k, v in axis.items())}" if axis else ""
                    at += f" with {', '.join(f'{k}={v!r}' for k, v in overrides.items())}" if overrides else ""
                    loc = f"{where} row {ri}{at}"
                    c = _normalize(loc, merged)
                    tags = {k: c.pop(k) for k in TAG_FIELDS}
                    case = Case(case_id(tags, c), mname, tags, c, loc)
                    _check_replay(loc, case)
                    cases.append(case)
    if not cases:
        raise ManifestError(f"{name}: no cases (empty 'blocks' and no 'include')")
    seen: dict[str, Case] = {}
    for c in cases:
        if c.id in seen:
            first = seen[c.id].where
            twin = "the same axis or list value twice" if first == c.where else f"the same as {first}"
            made = (f"; {', '.join(f'{k}={v!r}' for k, v in overrides.items())} made two cases one"
                    if overrides else "")
            raise ManifestError(f"{c.where}: duplicate case {c.id}, {twin} (same experiment, label and inputs: "
                                f"policy {c.inputs['policy']!r}){made}")
        seen[c.id] = c
    return cases
