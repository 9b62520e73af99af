"""Trace generation: a checkpoint layout + a retention rule + a number of steps -> a v1 trace.

The rule is driven as its runtime drives it (:func:`retainz.retention.drive`); every save writes the
layout's files (the model-only files when the runtime saves weights only).  The output depends only on
the arguments: the same seed gives the same trace, byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

from retainz import __version__
from retainz.retention import Rule, drive, parse_rule
from retainz.trace.format import (
    CommitEvent,
    CrashEvent,
    DeleteEvent,
    Event,
    SaveEvent,
    Shard,
    Trace,
    TraceHeader,
)
from retainz.trace.io import TraceWriter
from retainz.trace.layouts import Layout, get_layout

__all__ = ["generate", "generate_trace", "write_generated", "GenerateStats"]


@dataclass(frozen=True)
class GenerateStats:
    """What a generated trace holds.

    Attributes:
        saves, commits, deletes, crashes: event counts.
        bytes_saved: bytes of all saves (bytes).
        peak_live_bytes: largest total of saved-and-not-deleted, not-abandoned bytes (bytes).
        trace_bytes: size of the written trace (bytes).
    """

    saves: int
    commits: int
    deletes: int
    crashes: int
    bytes_saved: int
    peak_live_bytes: int
    trace_bytes: int = 0


def _resolve(layout: str | Layout, retention: str | Rule) -> tuple[Layout, Rule]:
    return (get_layout(layout) if isinstance(layout, str) else layout,
            parse_rule(retention) if isinstance(retention, str) else retention)


#: The most saves one generated trace plans (a run of 10 million checkpoints; a typo such as
#: ``--steps 100000000000`` would otherwise build its schedule until memory runs out).
MAX_SAVES = 10_000_000


def check_saves(rule: Rule, steps: int) -> None:
    """Refuse a run that would plan more than :data:`MAX_SAVES` saves (before planning any).

    Raises:
        ValueError: one line with the count.
    """
    saves = steps // max(rule.base_interval or 1, 1)
    if saves > MAX_SAVES:
        raise ValueError(f"{steps} steps at one save every {rule.base_interval} steps would plan {saves:,} saves; "
                         f"at most {MAX_SAVES:,}")


def generate(layout: str | Layout, retention: str | Rule, steps: int, *, seed: int = 0,
             crash_every: int | None = None) -> tuple[TraceHeader, Iterator[Event]]:
    """The header and the events of a trace, lazily.

    Args:
        layout: a layout name (``llama3-8b-fsdp:ranks=8``) or a :class:`Layout`.
        retention: a rule (``torchtitan:interval=500,keep_latest_k=10``) or a :class:`Rule`.
        steps: training steps of the run (steps, >= 1).
        seed: seeds synthetic metric series (top-k rules); recorded in the header.
        crash_every: crash during every N-th save (see :func:`retainz.retention.drive`); ``None``: never.

    Raises:
        ValueError: an unknown layout or rule, or more than :data:`MAX_SAVES` saves.
    """
    lay, rule = _resolve(layout, retention)
    check_saves(rule, steps)
    session = rule.start(steps, seed=seed)
    header = TraceHeader(
        layout={"name": lay.name, "source": lay.source},
        retention=rule.spec(),
        schedule={"steps": steps, "saves": len(session.schedule), "base_interval": rule.base_interval},
        seed=seed, crash_every=crash_every, generator=f"retainz {__version__}")
    files = {mo: tuple(Shard(s.name, s.nbytes) for s in lay.files(mo)) for mo in (False, True)}

    def events() -> Iterator[Event]:
        for a in drive(session, crash_every=crash_every):
            if a.kind == "save":
                yield SaveEvent(a.step, a.gen, a.name, a.cls, files[a.model_only], a.hint, a.model_only)
            elif a.kind == "commit":
                yield CommitEvent(a.step, a.gen)
            elif a.kind == "delete":
                yield DeleteEvent(a.step, a.gen)
            else:
                yield CrashEvent(a.step, a.gen)

    return header, events()


def generate_trace(layout: str | Layout, retention: str | Rule, steps: int, *, seed: int = 0,
                   crash_every: int | None = None) -> Trace:
    """The whole trace in memory (see :func:`generate`)."""
    header, events = generate(layout, retention, steps, seed=seed, crash_every=crash_every)
    return Trace(header, list(events))


def write_generated(target: str | TextIO, layout: str | Layout, retention: str | Rule, steps: int, *,
                    seed: int = 0, crash_every: int | None = None) -> GenerateStats:
    """Generate a trace straight to a file (validated as written) and count what it holds."""
    header, events = generate(layout, retention, steps, seed=seed, crash_every=crash_every)
    counts = {"save": 0, "commit": 0, "delete": 0, "crash": 0}
    size: dict[int, int] = {}
    live = peak = saved = 0
    with TraceWriter(target, header) as w:
        for ev in events:
            w.write(ev)
            counts[ev.type] += 1
            if isinstance(ev, SaveEvent):
                size[ev.gen] = ev.nbytes
                saved += ev.nbytes
                live += ev.nbytes
                peak = max(peak, live)
            elif isinstance(ev, (DeleteEvent, CrashEvent)) and ev.gen is not None:
                live -= size.pop(ev.gen)
        nbytes = w.bytes_written
    return GenerateStats(counts["save"], counts["commit"], counts["delete"], counts["crash"], saved, peak, nbytes)
