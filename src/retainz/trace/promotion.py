"""Replay's promotion delay: a FIFO promotion queue at a bandwidth, and retirements kept until durable.

With ``ReplayConfig(promote_bandwidth=B)`` (bytes per step of logical time) replay models the
promoter of docs/tiers.md with policy ``all`` and a rule that keeps until durable:

* **The queue.**  Every generation is promoted, one at a time, in commit order (the promoter takes
  the lowest step first, which is commit order for one job), at ``B`` bytes per step: a generation of
  ``n`` bytes committed at step ``c`` is verified at ``f = max(c, f_prev) + n / B``
  (:func:`promotion_finish`).  ``f`` is a real number of steps; nothing is copied (replay's device
  may hold no payload), only the time a copy takes is modelled.
* **The deferral.**  A trace's ``delete`` of a generation at step ``d < f`` happens at step
  ``ceil(f)`` instead, before the events of that step (the promoter deletes the moment the copy is
  verified): :func:`defer_retirements`.  A deletion deferred past the trace's last event does not
  happen within the run (the generation outlives it).
* **Who sees what.**  Both run through the real store: the deferred deletions are the events replay
  feeds it, so every policy sees the same deletions and the oracle's actual reclaim step is the
  deferred one (:func:`retainz.trace.format.actual_reclaim_steps` of the deferred events).  The
  practical policies' hint is the trace's, with the expected promotion finish ``f`` added by
  :func:`retainz.retention.until_durable` (what a live writer computes from its promoter's backlog
  and bandwidth, :meth:`retainz.integrations.dcp.ZonedStorageWriter.store_hint`); in replay the
  queue is deterministic, so the expectation is the queue's own finish.

Choosing ``B``: a bandwidth of ``R`` bytes per second for a run making ``S`` steps per second is
``R / S`` bytes per step.  The queue keeps up when ``B`` is at least the bytes saved per step
(a save's size over the save interval); below that the backlog grows for the whole run.
Crash events do not touch the queue (a restarted promoter finds the same generations to copy).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

from retainz.trace.format import CommitEvent, DeleteEvent, Event, SaveEvent

__all__ = ["promotion_finish", "defer_retirements", "PromotionStats"]


def promotion_finish(events: list[Event], bandwidth: int) -> dict[int, float]:
    """When each committed generation's promotion is verified, for a FIFO queue at ``bandwidth``.

    Args:
        events: a validated trace's events, in order.
        bandwidth: bytes per step of logical time (> 0).

    Returns:
        gen -> the step its promotion finishes (a real number of steps); generations that never
        commit are absent.

    Raises:
        ValueError: ``bandwidth`` not a positive integer.
    """
    if type(bandwidth) is not int or bandwidth <= 0:
        raise ValueError(f"promote_bandwidth must be a positive integer of bytes per step, not {bandwidth!r}")
    size: dict[int, int] = {}
    free = -math.inf
    out: dict[int, float] = {}
    for ev in events:
        if isinstance(ev, SaveEvent):
            size[ev.gen] = ev.nbytes
        elif isinstance(ev, CommitEvent):
            free = max(float(ev.step), free) + size.get(ev.gen, 0) / bandwidth
            out[ev.gen] = free
    return out


@dataclass(frozen=True)
class PromotionStats:
    """What the queue did to a trace's deletions (replay's ``promotion`` result).

    Attributes:
        bandwidth: bytes per step.
        deferred: deletions moved later because the promotion was not verified yet.
        dropped: deferred deletions past the trace's last event (not made in the run).
        max_delay_steps, mean_delay_steps: steps the deferred deletions were moved by (0 when none).
        max_lag_steps: the longest time from a commit to its verified promotion (steps).
    """

    bandwidth: int
    deferred: int
    dropped: int
    max_delay_steps: float
    mean_delay_steps: float
    max_lag_steps: float

    def to_json(self) -> dict:
        return {"bandwidth": self.bandwidth, "deferred": self.deferred, "dropped": self.dropped,
                "max_delay_steps": self.max_delay_steps, "mean_delay_steps": self.mean_delay_steps,
                "max_lag_steps": self.max_lag_steps}


def defer_retirements(events: list[Event], finish: dict[int, float],
                      bandwidth: int = 0) -> tuple[list[Event], PromotionStats]:
    """The trace's events with each deletion of a generation not yet promoted moved to the step its
    promotion is verified (``ceil(finish)``), placed before that step's first event.

    Args:
        events: a validated trace's events, in order (steps non-decreasing).
        finish: :func:`promotion_finish`'s result.
        bandwidth: recorded in the stats (bytes per step).

    Returns:
        ``(events, stats)``: the events in order (steps still non-decreasing; a deletion deferred past
        the last event is left out) and :class:`PromotionStats`.
    """
    kept: list[Event] = []
    moved: list[tuple[int, int, DeleteEvent]] = []       # (new step, original position, event)
    delays: list[float] = []
    commit_step: dict[int, int] = {}
    lag = 0.0
    for i, ev in enumerate(events):
        if isinstance(ev, CommitEvent):
            commit_step[ev.gen] = ev.step
            if ev.gen in finish:
                lag = max(lag, finish[ev.gen] - ev.step)
        if isinstance(ev, DeleteEvent) and finish.get(ev.gen, -math.inf) > ev.step:
            new = math.ceil(finish[ev.gen])
            moved.append((new, i, replace(ev, step=new)))
            delays.append(new - ev.step)
            continue
        kept.append(ev)
    last = events[-1].step if events else 0
    dropped = sum(1 for new, _, _ in moved if new > last)
    moved = sorted(m for m in moved if m[0] <= last)
    out: list[Event] = []
    steps = [ev.step for ev in kept]
    j = 0
    for new, _, ev in moved:
        k = bisect.bisect_left(steps, new)
        out.extend(kept[j:k])
        j = max(j, k)
        out.append(ev)
    out.extend(kept[j:])
    stats = PromotionStats(bandwidth, len(delays), dropped, float(max(delays, default=0.0)),
                           float(sum(delays) / len(delays)) if delays else 0.0, float(lag))
    return out, stats
