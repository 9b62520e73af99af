"""Validation of trace format v1: the per-line parsers (JSON, header, events, hints, shards) and
the event-sequence :class:`Validator`.  Problems raise :class:`LineProblem`, which the reader and writer
(:mod:`retainz.trace.io`) turn into :class:`~retainz.trace.format.TraceFormatError` with the line number.
"""

from __future__ import annotations

import json
import math
from typing import Any

from retainz.hint import Hint
from retainz.trace.format import (
    LIFETIMES,
    TIMINGS,
    VERSION,
    CommitEvent,
    CrashEvent,
    DeleteEvent,
    Event,
    SaveEvent,
    Shard,
    TraceHeader,
    hint_from_json,
)

__all__ = ["Validator", "LineProblem", "load_line", "parse_header", "parse_event"]


class LineProblem(Exception):
    """A problem on the current line; the reader and writer (:mod:`retainz.trace.io`) turn it into a
    :class:`~retainz.trace.format.TraceFormatError` with the line number."""


def _is_int(v: Any) -> bool:
    return type(v) is int


def _need(obj: dict, key: str, what: str) -> Any:
    if key not in obj:
        raise LineProblem(f"{what}: missing field {key!r}")
    return obj[key]


def _only(obj: dict, allowed: set[str], what: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise LineProblem(f"{what}: unknown field(s) {', '.join(map(repr, extra))} (allowed: {', '.join(sorted(allowed))})")


def _int(obj: dict, key: str, what: str, *, minimum: int = 0, nullable: bool = False) -> int | None:
    v = _need(obj, key, what)
    if v is None and nullable:
        return None
    if not _is_int(v):
        raise LineProblem(f"{what}: {key} must be an integer, got {json.dumps(v)}")
    if v < minimum:
        raise LineProblem(f"{what}: {key} must be >= {minimum}, got {v}")
    return v


def _str(obj: dict, key: str, what: str) -> str:
    v = _need(obj, key, what)
    if not isinstance(v, str) or not v:
        raise LineProblem(f"{what}: {key} must be a non-empty string, got {json.dumps(v)}")
    return v


def _step_value(v: Any, what: str, key: str, *, nullable: bool) -> float | None:
    if v is None and nullable:
        return None
    if v == "inf":
        return math.inf
    if _is_int(v) or (type(v) is float and math.isfinite(v)):
        if v < 0:
            raise LineProblem(f"{what}: {key} must be >= 0, got {v}")
        return v
    raise LineProblem(f"{what}: {key} must be a step number, \"inf\"{' or null' if nullable else ''}, got {json.dumps(v)}")


_CONDITION_FIELDS = {
    "after_newer": {"k", "of_class", "timing"},
    "permanent": {"reason"},
    "at_step": {"at"},
    "uncertain": {"earliest", "probability", "expected", "basis"},
}


def _parse_condition(c: Any) -> dict:
    what = "hint.condition"
    if not isinstance(c, dict):
        raise LineProblem(f"{what} must be an object, got {json.dumps(c)}")
    kind = _need(c, "kind", what)
    if kind not in _CONDITION_FIELDS:
        raise LineProblem(f"{what}: unknown kind {json.dumps(kind)} (known: {', '.join(_CONDITION_FIELDS)})")
    what = f"{what} {kind}"
    _only(c, _CONDITION_FIELDS[kind] | {"kind"}, what)
    if kind == "after_newer":
        _int(c, "k", what, minimum=1)
        oc = _need(c, "of_class", what)
        if not (isinstance(oc, str) and oc) and not (isinstance(oc, list) and oc and all(isinstance(x, str) for x in oc)):
            raise LineProblem(f"{what}: of_class must be a string or a list of strings, got {json.dumps(oc)}")
        if _need(c, "timing", what) not in TIMINGS:
            raise LineProblem(f"{what}: timing must be one of {', '.join(TIMINGS)}, got {json.dumps(c['timing'])}")
    elif kind == "permanent":
        if not isinstance(_need(c, "reason", what), str):
            raise LineProblem(f"{what}: reason must be a string")
    elif kind == "at_step":
        _int(c, "at", what)
    else:
        _step_value(_need(c, "earliest", what), what, "earliest", nullable=False)
        p = _need(c, "probability", what)
        if type(p) not in (int, float) or not 0 <= p <= 1:
            raise LineProblem(f"{what}: probability must be a number in [0, 1], got {json.dumps(p)}")
        _step_value(_need(c, "expected", what), what, "expected", nullable=True)
        if not isinstance(_need(c, "basis", what), str):
            raise LineProblem(f"{what}: basis must be a string")
    return c


def _parse_hint(h: Any) -> Hint | None:
    if h is None:
        return None
    if not isinstance(h, dict):
        raise LineProblem(f"save: hint must be an object or null, got {json.dumps(h)}")
    _only(h, {"condition", "predicted_reclaim_step", "lifetime"}, "hint")
    cond = _parse_condition(_need(h, "condition", "hint"))
    pred = _step_value(_need(h, "predicted_reclaim_step", "hint"), "hint", "predicted_reclaim_step", nullable=True)
    life = _need(h, "lifetime", "hint")
    if life not in LIFETIMES:
        raise LineProblem(f"hint: lifetime must be one of {', '.join(LIFETIMES)}, got {json.dumps(life)}")
    return hint_from_json(cond, pred, life)


def _parse_shards(v: Any) -> tuple[Shard, ...]:
    if not isinstance(v, list) or not v:
        raise LineProblem(f"save: shards must be a non-empty list of [name, bytes], got {json.dumps(v)[:80]}")
    out = []
    names = set()
    for i, s in enumerate(v):
        if not isinstance(s, list) or len(s) != 2 or not isinstance(s[0], str) or not s[0]:
            raise LineProblem(f"save: shard {i} must be [name, bytes], got {json.dumps(s)}")
        if not _is_int(s[1]):
            raise LineProblem(f"save: shard {i} ({s[0]}) size must be an integer, got {json.dumps(s[1])}")
        if s[1] < 0:
            raise LineProblem(f"save: shard {i} ({s[0]}) has a negative size {s[1]}")
        if s[0] in names:
            raise LineProblem(f"save: shard name {s[0]!r} appears twice")
        names.add(s[0])
        out.append(Shard(s[0], s[1]))
    return tuple(out)


def parse_header(obj: dict) -> TraceHeader:
    """The trace's header line (a parsed JSON object, :func:`load_line`) as a :class:`TraceHeader`.

    Raises:
        LineProblem: not a header, another format version, a field missing, unknown or malformed."""
    if obj.get("type") != "header":
        raise LineProblem(f"line 1 must be the header (type \"header\"), got type {json.dumps(obj.get('type'))}")
    version = _need(obj, "version", "header")
    if version != VERSION:
        raise LineProblem(f"unsupported trace version {json.dumps(version)} (this reader knows version {VERSION})")
    _only(obj, {"type", "version", "layout", "retention", "schedule", "seed", "crash_every", "generator"}, "header")
    layout = _need(obj, "layout", "header")
    if not isinstance(layout, dict) or not isinstance(layout.get("name"), str) or not layout["name"]:
        raise LineProblem("header: layout must be an object with a non-empty name")
    retention = _str(obj, "retention", "header")
    schedule = _need(obj, "schedule", "header")
    if not isinstance(schedule, dict):
        raise LineProblem("header: schedule must be an object")
    _int(schedule, "steps", "header.schedule", minimum=1)
    seed = _int(obj, "seed", "header", minimum=-(2**63))
    crash_every = _int(obj, "crash_every", "header", minimum=1, nullable=True) if "crash_every" in obj else None
    gen = obj.get("generator", "")
    if not isinstance(gen, str):
        raise LineProblem("header: generator must be a string")
    return TraceHeader(layout, retention, schedule, seed, crash_every, gen, version)


def parse_event(obj: dict) -> Event:
    """One event line (a parsed JSON object, :func:`load_line`): save, commit, delete or crash.

    Raises:
        LineProblem: an unknown type, a field missing, unknown or malformed."""
    kind = obj.get("type")
    if kind == "save":
        _only(obj, {"type", "step", "gen", "name", "class", "model_only", "shards", "hint"}, "save")
        mo = obj.get("model_only", False)
        if not isinstance(mo, bool):
            raise LineProblem(f"save: model_only must be true or false, got {json.dumps(mo)}")
        return SaveEvent(_int(obj, "step", "save"), _int(obj, "gen", "save"), _str(obj, "name", "save"),
                         _str(obj, "class", "save"), _parse_shards(_need(obj, "shards", "save")),
                         _parse_hint(_need(obj, "hint", "save")), mo)
    if kind in ("commit", "delete"):
        _only(obj, {"type", "step", "gen"}, kind)
        cls = CommitEvent if kind == "commit" else DeleteEvent
        return cls(_int(obj, "step", kind), _int(obj, "gen", kind))
    if kind == "crash":
        _only(obj, {"type", "step", "gen"}, kind)
        return CrashEvent(_int(obj, "step", kind), _int(obj, "gen", kind, nullable=True) if "gen" in obj else None)
    if kind == "header":
        raise LineProblem("a second header")
    raise LineProblem(f"unknown event type {json.dumps(kind)} (known: save, commit, delete, crash)")


def _no_duplicate_keys(pairs):
    out = dict(pairs)          # C speed; the loop below only runs to name a duplicate
    if len(out) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise LineProblem(f"duplicate key {k!r}")
            seen.add(k)
    return out


def _no_constants(name):
    raise LineProblem(f"{name} is not valid JSON")


#: One decoder for every line (``json.loads`` with hooks builds a new one per call).
_decode = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants).decode


def load_line(line: str) -> dict:
    """One line of a trace as a JSON object.

    Raises:
        LineProblem: not JSON (the decoder's reason, where), or not an object."""
    try:
        # without its line end: a string left open at the end of the line is "unterminated", not an
        # "invalid control character"
        obj = _decode(line.rstrip("\n"))
    except json.JSONDecodeError as e:
        what = e.msg[:-3] + " there" if e.msg.endswith(" at") else e.msg   # "Unterminated string starting at"
        raise LineProblem(f"not valid JSON at column {e.colno}: {what}") from None
    except RecursionError:
        raise LineProblem("JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise LineProblem(f"a line must be a JSON object, got {type(obj).__name__}")
    return obj


class Validator:
    """The event-sequence rules of v1, fed one event at a time.

    * steps never decrease; generation numbers are unique;
    * a commit, delete or crash names a generation that was saved before it;
    * a generation commits at most once, never after a crash abandoned it; only committed generations
      are deleted, once; a crash names a generation in flight (saved, not committed).
    """

    def __init__(self) -> None:
        self.state: dict[int, str] = {}  # gen -> writing | committed | deleted | abandoned
        self.last_step = 0

    def check(self, ev: Event) -> None:
        """Raise ``LineProblem`` if ``ev`` cannot follow the events seen so far."""
        if ev.step < self.last_step:
            raise LineProblem(f"{ev.type}: step {ev.step} goes back (previous event at step {self.last_step})")
        st = self.state.get(ev.gen) if ev.gen is not None else None
        if isinstance(ev, SaveEvent):
            if st is not None:
                raise LineProblem(f"save: duplicate generation {ev.gen}")
            self.state[ev.gen] = "writing"
        elif isinstance(ev, CommitEvent):
            if st is None:
                raise LineProblem(f"commit of generation {ev.gen} before any save of it")
            if st != "writing":
                raise LineProblem(f"commit of generation {ev.gen}, which is {st}")
            self.state[ev.gen] = "committed"
        elif isinstance(ev, DeleteEvent):
            if st is None:
                raise LineProblem(f"delete of unknown generation {ev.gen}")
            if st != "committed":
                raise LineProblem(f"delete of generation {ev.gen}, which is {st} (only committed generations are deleted)")
            self.state[ev.gen] = "deleted"
        else:
            if ev.gen is not None:
                if st is None:
                    raise LineProblem(f"crash names unknown generation {ev.gen}")
                if st != "writing":
                    raise LineProblem(f"crash names generation {ev.gen}, which is {st}, not in flight")
                self.state[ev.gen] = "abandoned"
        self.last_step = ev.step
