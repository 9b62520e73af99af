"""Shared devices: several jobs' v1 traces merged into one v1 trace (documented in docs/trace-format.md,
"Mixed traces").

One device serving several training jobs (a checkpoint node for a cluster, experiments sharing a
host) sees every job's saves and deletions interleaved in step order.  :func:`mix` builds that trace
from one trace per job:

* job ``j``'s steps are shifted by its offset (``--offsets``; a job that starts later);
* events are merged by shifted step; at equal steps job 0's events come first, and each job's
  events keep their order (a save's deletions, commit and crash stay together, so no other job has
  a save in flight when one job's events run);
* generation numbers are renumbered in merged order (unique in the mix); names become
  ``j<job>:<name>`` (two jobs' ``step-500`` differ); classes stay the job's own (the hint's
  ``of_class`` names them);
* each save keeps its own job's hint: the condition and lifetime class as the job's runtime gave
  them, with every step in it (``predicted_reclaim_step``, ``at``, ``earliest``, ``expected``)
  shifted by the job's offset;
* the header's layout is ``{"name": "mix:<jobs>", "source": ..., "jobs": [...]}``, one entry per job
  (its layout, retention rule, schedule, seed, offset and the sha256 of its trace); ``schedule`` spans
  the whole mix (``steps`` = the last shifted step of any job, ``saves`` summed, ``base_interval``
  the smallest); ``crash_every`` is the smallest of the jobs' (replay power-cycles the shared device at
  each ``crash``).

The output is an ordinary v1 trace: replay, validation and every policy read it unchanged.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from retainz import __version__
from retainz.hint import Hint
from retainz.retention.conditions import parse_condition
from retainz.trace.format import (
    CommitEvent,
    CrashEvent,
    DeleteEvent,
    Event,
    SaveEvent,
    TraceHeader,
)
from retainz.trace.io import TraceReader, TraceWriter, sha256_file

__all__ = ["mix", "MixStats", "shift_hint"]


@dataclass(frozen=True)
class MixStats:
    """What a mixed trace holds.

    Attributes:
        jobs: number of merged traces.
        saves, deletes: event counts.
        steps: the mix's last step (steps).
        trace_bytes: size of the written trace (bytes).
    """

    jobs: int
    saves: int
    deletes: int
    steps: int
    trace_bytes: int


def _shift(v, offset: int):
    if v is None or math.isinf(v):
        return v
    return v + offset


def shift_hint(h: Hint | None, offset: int) -> Hint | None:
    """A save's hint with every step in it (the predicted reclaim step, the condition's ``at``,
    ``earliest`` and ``expected``) moved by ``offset`` steps: a job that starts ``offset`` steps into a
    shared trace.  ``None`` and infinite steps stay as they are."""
    if h is None or offset == 0:
        return h
    cond = parse_condition(h.condition)
    steps = {k: _shift(getattr(cond, k), offset) for k in ("at", "earliest", "expected") if hasattr(cond, k)}
    return replace(h, reclaim_step=_shift(h.reclaim_step, offset), condition=replace(cond, **steps).describe())


def _job_events(reader: TraceReader, job: int, offset: int) -> Iterator[tuple[int, int, int, Event]]:
    for i, ev in enumerate(reader):
        yield (ev.step + offset, job, i, ev)


def mix(paths: Sequence[str], target, *, offsets: Sequence[int] | None = None) -> MixStats:
    """Merge v1 traces, one per job, into one v1 trace (module docstring).

    Args:
        paths: the jobs' trace files (at least 2).
        target: output path or text stream.
        offsets: per job, steps added to every step of its trace (>= 0); default all 0.

    Returns:
        :class:`MixStats`.

    Raises:
        ValueError: fewer than 2 traces, or an offsets list of the wrong length or with a negative
            value.
        TraceFormatError: an input trace is malformed (file and line named).
    """
    if len(paths) < 2:
        raise ValueError(f"mixing needs at least 2 traces, got {len(paths)}")
    offsets = list(offsets) if offsets is not None else [0] * len(paths)
    if len(offsets) != len(paths):
        raise ValueError(f"{len(offsets)} offsets for {len(paths)} traces: give one offset per trace")
    if any(o < 0 for o in offsets):
        raise ValueError(f"offsets must be >= 0 steps, got {offsets}")
    readers = [TraceReader(p) for p in paths]
    try:
        headers = [r.header for r in readers]
        jobs = [{"job": j, "layout": h.layout.get("name"), "retention": h.retention, "schedule": h.schedule,
                 "seed": h.seed, "offset": offsets[j], "crash_every": h.crash_every, "sha256": sha256_file(p)}
                for j, (h, p) in enumerate(zip(headers, paths, strict=True))]
        crash = [h.crash_every for h in headers if h.crash_every is not None]
        header = TraceHeader(
            layout={"name": f"mix:{len(paths)}",
                    "source": "retainz trace mix of " + "; ".join(f"{j['layout']} / {j['retention']} +{j['offset']}"
                                                                 for j in jobs),
                    "jobs": jobs},
            retention="mix:" + ";".join(h.retention for h in headers),
            schedule={"steps": max(h.schedule["steps"] + o for h, o in zip(headers, offsets, strict=True)),
                      "saves": sum(int(h.schedule.get("saves", 0)) for h in headers),
                      "base_interval": min(int(h.schedule.get("base_interval", 1)) for h in headers)},
            seed=headers[0].seed, crash_every=min(crash) if crash else None,
            generator=f"retainz {__version__} (trace mix)")
        merged = heapq.merge(*(_job_events(r, j, offsets[j]) for j, r in enumerate(readers)))
        renum: dict[tuple[int, int], int] = {}
        saves = deletes = last = 0
        with TraceWriter(target, header) as w:
            for step, job, _, ev in merged:
                last = step
                if isinstance(ev, SaveEvent):
                    g = renum[(job, ev.gen)] = len(renum)
                    saves += 1
                    w.write(replace(ev, step=step, gen=g, name=f"j{job}:{ev.name}",
                                    hint=shift_hint(ev.hint, offsets[job])))
                elif isinstance(ev, CommitEvent):
                    w.write(CommitEvent(step, renum[(job, ev.gen)]))
                elif isinstance(ev, DeleteEvent):
                    deletes += 1
                    w.write(DeleteEvent(step, renum[(job, ev.gen)]))
                else:
                    w.write(CrashEvent(step, None if ev.gen is None else renum[(job, ev.gen)]))
            nbytes = w.bytes_written
    finally:
        for r in readers:
            r.close()
    return MixStats(len(paths), saves, deletes, max(last, header.schedule["steps"]), nbytes)
