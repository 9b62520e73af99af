"""Trace format v1: versioned JSON Lines (documented in docs/trace-format.md, schema in
docs/trace-v1.schema.json).

Line 1 is the header; every further line is one event, in the order the runtime performs them:

* ``save``   - a generation starts being written: gen, runtime name, step, class, shards
  ``[[name, bytes], ...]``, ``model_only``, and the save-time ``hint`` (or ``null``);
* ``commit`` - the generation is durable (its commit record exists);
* ``delete`` - the runtime deletes a committed generation;
* ``crash``  - the process dies; the generation in flight (``gen``, or ``null``) never commits.

Reading validates every line against the format *and* the event sequence; the first problem raises
:class:`TraceFormatError` naming the file, the line number and what is wrong.  Unknown versions are
refused.  Writing goes through the same validator, so a writer cannot produce a trace the reader
refuses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

from retainz.errors import RetainZError
from retainz.hint import Hint, Lifetime
from retainz.retention.conditions import condition_from_json, parse_condition

__all__ = [
    "VERSION",
    "TraceFormatError",
    "Shard",
    "hint_to_json",
    "hint_from_json",
    "TraceHeader",
    "SaveEvent",
    "CommitEvent",
    "DeleteEvent",
    "CrashEvent",
    "Event",
    "Trace",
    "TraceWriter",
    "TraceReader",
    "read_trace",
    "write_trace",
    "Validator",
    "actual_reclaim_steps",
]

#: The version this module writes and the only one it reads.
VERSION = 1

#: The lifetime class names a trace records (:class:`~retainz.hint.Lifetime`).
LIFETIMES = tuple(Lifetime.__members__)
TIMINGS = ("before_save", "after_dispatch", "after_commit")


class TraceFormatError(RetainZError, ValueError):
    """A trace line is malformed or the event sequence is impossible.

    Attributes:
        path: the trace file (or ``"<trace>"``).
        line: 1-based line number.
    """

    def __init__(self, path: str, line: int, message: str):
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line


@dataclass(frozen=True)
class Shard:
    """One file of a generation.

    Attributes:
        name: file name inside the generation (``__0_0.distcp``, ``.metadata``...).
        nbytes: its size (bytes, >= 0).
    """

    name: str
    nbytes: int


def hint_to_json(hint: Hint) -> dict:
    """A save's hint as trace format v1 records it: ``{"condition": {"kind": ..., fields},
    "predicted_reclaim_step": step | "inf" | null, "lifetime": "SHORT" ...}``.

    ``actual_reclaim_step`` is not recorded: a trace's own delete events give it (replay fills it in).

    Raises:
        ValueError: a hint without a retirement condition the retention rules know (a v1 trace
            records only those).
    """
    if not hint.condition:
        raise ValueError("a hint without a retirement condition cannot be recorded in a trace")
    p = hint.reclaim_step
    if p is not None:
        p = "inf" if math.isinf(p) else int(p) if float(p).is_integer() else p
    return {"condition": parse_condition(hint.condition).to_json(), "predicted_reclaim_step": p,
            "lifetime": Lifetime(hint.lifetime).name}


def hint_from_json(condition: dict, predicted_reclaim_step: float | None, lifetime: str) -> Hint:
    """The :class:`~retainz.hint.Hint` of a recorded hint's validated fields (the inverse of
    :func:`hint_to_json`): the condition object becomes its text (``Condition.describe()``), the
    lifetime name its class.

    Raises:
        ValueError: a condition the retention rules do not know, or a lifetime that is no class name.
    """
    if lifetime not in Lifetime.__members__:
        raise ValueError(f"lifetime must be one of {', '.join(LIFETIMES)}, got {lifetime!r}")
    return Hint(predicted_reclaim_step, Lifetime[lifetime], condition_from_json(condition).describe())


@dataclass(frozen=True)
class TraceHeader:
    """The first line of a trace.

    Attributes:
        layout: ``{"name": ..., "source": ...}`` of the checkpoint layout.
        retention: the retention rule, canonical ``RULE:key=value,...``.
        schedule: ``{"steps": total training steps, "saves": planned saves, "base_interval": steps}``.
        seed: the generator's seed.
        crash_every: a crash was injected at every N-th save (``None``: no crashes).
        generator: what wrote the trace (``"retainz 0.1.0"``).
        version: format version (1).
    """

    layout: dict
    retention: str
    schedule: dict
    seed: int
    crash_every: int | None = None
    generator: str = ""
    version: int = VERSION

    def to_json(self) -> dict:
        return {"type": "header", "version": self.version, "layout": self.layout, "retention": self.retention,
                "schedule": self.schedule, "seed": self.seed, "crash_every": self.crash_every,
                "generator": self.generator}


@dataclass(frozen=True)
class SaveEvent:
    """A generation starts being written.

    Attributes:
        step: training step (steps).
        gen: generation number, unique in the trace.
        name: checkpoint id as the runtime names it (a hint; may repeat once the previous holder is gone
            or was abandoned).
        cls: save class (``interval``, ``final``, ``persistent``...).
        shards: the files written, in order.
        hint: the save-time :class:`~retainz.hint.Hint` (``actual_reclaim_step`` unset), or ``None``.
        model_only: model weights only.
    """

    step: int
    gen: int
    name: str
    cls: str
    shards: tuple[Shard, ...]
    hint: Hint | None = None
    model_only: bool = False
    type: str = field(default="save", init=False, repr=False)

    @property
    def nbytes(self) -> int:
        """Total bytes of the shards."""
        return sum(s.nbytes for s in self.shards)

    def to_json(self) -> dict:
        return {"type": "save", "step": self.step, "gen": self.gen, "name": self.name, "class": self.cls,
                "model_only": self.model_only, "shards": [[s.name, s.nbytes] for s in self.shards],
                "hint": None if self.hint is None else hint_to_json(self.hint)}


@dataclass(frozen=True)
class CommitEvent:
    """The generation is durable."""

    step: int
    gen: int
    type: str = field(default="commit", init=False, repr=False)

    def to_json(self) -> dict:
        return {"type": "commit", "step": self.step, "gen": self.gen}


@dataclass(frozen=True)
class DeleteEvent:
    """The runtime deletes a committed generation."""

    step: int
    gen: int
    type: str = field(default="delete", init=False, repr=False)

    def to_json(self) -> dict:
        return {"type": "delete", "step": self.step, "gen": self.gen}


@dataclass(frozen=True)
class CrashEvent:
    """The process dies; ``gen`` (the save in flight, or ``None``) never commits."""

    step: int
    gen: int | None = None
    type: str = field(default="crash", init=False, repr=False)

    def to_json(self) -> dict:
        return {"type": "crash", "step": self.step, "gen": self.gen}


Event = SaveEvent | CommitEvent | DeleteEvent | CrashEvent


@dataclass
class Trace:
    """A whole trace in memory."""

    header: TraceHeader
    events: list[Event]


# -- validation ---------------------------------------------------------------------------------------

# The parsers and the Validator live in .validate, which imports the dataclasses above from this
# module: so they are imported here, after them, not at the top.
from retainz.trace.validate import (  # noqa: E402
    Validator,
    _Bad,
    _loads,
    _parse_event,
    _parse_header,
)


def actual_reclaim_steps(events) -> dict[int, float]:
    """When each generation's data really becomes garbage (what the ``oracle`` control may know).

    Args:
        events: the events of a trace, in order.

    Returns:
        gen -> the step of its ``delete`` (steps), of the ``crash`` that abandoned it, or ``math.inf``
        if it survives the trace.
    """
    out: dict[int, float] = {}
    for ev in events:
        if isinstance(ev, SaveEvent):
            out[ev.gen] = math.inf
        elif isinstance(ev, (DeleteEvent, CrashEvent)) and ev.gen is not None:
            out[ev.gen] = ev.step
    return out


# -- reading ------------------------------------------------------------------------------------------

class TraceReader:
    """Stream a trace: the header is read and checked on open; iterating yields validated events.

    Example::

        with TraceReader("run.jsonl") as r:
            print(r.header.retention)
            for ev in r:
                ...
    """

    def __init__(self, source: str | TextIO, *, name: str | None = None):
        if isinstance(source, str):
            self._f: TextIO = open(source, encoding="utf-8")
            self.path = source
            self._own = True
        else:
            self._f = source
            self.path = name or getattr(source, "name", "<trace>")
            self._own = False
        self.line = 0
        self.validator = Validator()
        first = self._next_line()
        if first is None:
            self._fail(1, "empty trace: no header")
        try:
            self.header = _parse_header(_loads(first))
        except _Bad as e:
            self._fail(1, str(e))

    def _fail(self, line: int, msg: str):
        self.close()
        raise TraceFormatError(self.path, line, msg)

    def _next_line(self) -> str | None:
        try:
            raw = self._f.readline()
        except UnicodeDecodeError as e:
            self._fail(self.line + 1, f"not a trace: byte 0x{e.object[e.start]:02x} is not UTF-8 text (a binary "
                                      "file? a trace is JSON lines, docs/trace-format.md)")
        if not raw:
            return None
        self.line += 1
        return raw

    def __iter__(self) -> Iterator[Event]:
        while True:
            raw = self._next_line()
            if raw is None:
                return
            if not raw.strip():
                self._fail(self.line, "empty line")
            try:
                ev = _parse_event(_loads(raw))
                self.validator.check(ev)
            except _Bad as e:
                cut = "" if raw.endswith("\n") else " (the file ends mid-line: a truncated trace?)"
                self._fail(self.line, f"{e}{cut}")
            yield ev

    def close(self) -> None:
        if self._own:
            self._f.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_trace(path: str) -> Trace:
    """Read and validate a whole trace.

    Raises:
        TraceFormatError: the first malformed line (file, line number, what is wrong).
        FileNotFoundError: no such file.
    """
    with TraceReader(path) as r:
        return Trace(r.header, list(r))


# -- writing ------------------------------------------------------------------------------------------

class TraceWriter:
    """Write a trace line by line, validating as the reader will.

    Example::

        with TraceWriter("run.jsonl", header) as w:
            w.write(SaveEvent(...))
    """

    def __init__(self, target: str | TextIO, header: TraceHeader):
        if isinstance(target, str):
            self._f: TextIO = open(target, "w", encoding="utf-8")
            self._own = True
            self.path = target
        else:
            self._f = target
            self._own = False
            self.path = getattr(target, "name", "<trace>")
        self.validator = Validator()
        self.line = 1
        self.bytes_written = 0
        self._put(header.to_json())

    def _put(self, obj: dict) -> None:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"
        self._f.write(text)
        self.bytes_written += len(text)

    def write(self, ev: Event) -> None:
        self.line += 1
        try:
            self.validator.check(ev)
        except _Bad as e:
            raise TraceFormatError(self.path, self.line, str(e)) from None
        self._put(ev.to_json())

    def close(self) -> None:
        if self._own:
            self._f.close()
        else:
            self._f.flush()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_trace(path: str, trace: Trace) -> None:
    """Write a whole trace (validated as it is written)."""
    with TraceWriter(path, trace.header) as w:
        for ev in trace.events:
            w.write(ev)
