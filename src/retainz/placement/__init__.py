"""Placement policies behind one interface (:mod:`retainz.placement.base`).

Policies are selected by name with optional parameters: ``NAME[:param=value,...]`` (the
``--policy`` option).  :data:`POLICIES` maps each name to ``"module:Class"``; modules are imported
on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
import math

from retainz.placement.base import (
    NO_SPACE,
    PERMANENT,
    Allocator,
    Decision,
    ExtentRequest,
    ZoneSummary,
    ZoneTable,
)
from retainz.spec import parse_spec

__all__ = ["DEFAULT_POLICY", "POLICIES", "make_allocator", "Allocator", "Decision", "ExtentRequest", "NO_SPACE",
           "PERMANENT", "ZoneSummary", "ZoneTable"]

#: The policy a store is formatted with when the user names none (``retainz mkfs``, ``Store.format``,
#: the DCP writer's and fsspec's own devices, replay): lifetime-aware placement.  A store keeps the
#: policy recorded at format (its superblock) on every later open.
DEFAULT_POLICY = "retainz"

#: Policy name -> "module:Class".
POLICIES: dict[str, str] = {
    "retainz": "retainz.placement.retainz:RetainZ",
    "retainz-nohint": "retainz.placement.retainz:RetainZNoHint",
    "retainz-coarse": "retainz.placement.retainz:RetainZCoarse",
    "retainz-noisy": "retainz.placement.retainz:RetainZNoisy",
    "retainz-inferred": "retainz.placement.retainz:RetainZInferred",
    "oracle": "retainz.placement.retainz:Oracle",
    "zenfs": "retainz.placement.zenfs:ZenFS",
    "zenfs-nohint": "retainz.placement.zenfs:ZenFSNoHint",
    "common": "retainz.placement.controls:Common",
    "dedicated": "retainz.placement.controls:Dedicated",
    "greedy": "retainz.placement.greedy:Greedy",
}


def make_allocator(spec: str) -> Allocator:
    """Build an allocator from ``NAME[:param=value,...]`` (:func:`retainz.spec.parse_spec`).

    Parameter values are converted to the type of the dataclass field's default (int, float, bool,
    str; a ``bool | None`` field that defaults to None, decided later, as a bool).

    Raises:
        ValueError: an item that is not ``param=value``, unknown policy (lists the valid ones), unknown parameter (lists the valid ones)
            or a value of the wrong type (floats must be finite); the policy's own range check
            (``__post_init__``) names the parameter, its value and the valid range.
    """
    name, pairs = parse_spec(spec, "policy")
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(sorted(POLICIES))}")
    module, _, cls_name = POLICIES[name].partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in pairs:
        if key not in fields:
            raise ValueError(f"policy {name} has no parameter {key!r}; valid: "
                             + (", ".join(fields) or "none"))
        f = fields[key]
        # a bool that defaults to None (decided later, e.g. by the device) converts as a bool
        default = False if f.default is None and str(f.type) == "bool | None" else f.default
        kwargs[key] = _convert(name, key, value, default)
    return cls(**kwargs)


def _convert(policy: str, key: str, value: str, default):
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return value.lower() in ("true", "1")
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            f = float(value)
            if not math.isfinite(f):
                raise ValueError(value)
            return f
    except ValueError:
        kind = ("a bool" if isinstance(default, bool) else "a finite number" if isinstance(default, float)
                else "an integer" if isinstance(default, int) else f"a {type(default).__name__}")
        raise ValueError(f"policy {policy}: {key}={value!r} is not {kind}") from None
    return value
