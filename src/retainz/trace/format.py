"""Trace format v1: versioned JSON Lines (documented in docs/trace-format.md, schema in
docs/trace-v1.schema.json).  This module holds what a trace *is*: the header and event dataclasses,
their JSON forms (``to_json``) and :class:`TraceFormatError`.

Line 1 is the header; every further line is one event, in the order the runtime performs them:

* ``save``   - a generation starts being written: gen, runtime name, step, class, shards
  ``[[name, bytes], ...]``, ``model_only``, and the save-time ``hint`` (or ``null``);
* ``commit`` - the generation is durable (its commit record exists);
* ``delete`` - the runtime deletes a committed generation;
* ``crash``  - the process dies; the generation in flight (``gen``, or ``null``) never commits.

What a line and the event sequence must satisfy (the parsers and the :class:`Validator`) is
:mod:`retainz.trace.validate`; reading and writing trace files through it is :mod:`retainz.trace.io`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
