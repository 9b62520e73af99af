"""Time-averaged occupancy: how full a trace keeps a device over the whole run (docs/fleet.md, "Occupancy").

Sizing by *pressure* (:meth:`retainz.trace.replay.ReplayConfig.data_zones`) divides the trace's **peak**
live bytes by the capacity, so a device sized at pressure 0.9 is 90 % full at one instant and may be far
emptier the rest of the run.  *Occupancy* is the time average instead: the live bytes at each step (every
generation saved and not yet deleted, each shard rounded up to the block size as replay rounds it),
averaged over the trace's steps, over the device's usable data capacity.  A fleet sized by occupancy is
as full as a node's drive is on average, which is what a capacity figure ("how large a device a policy
needs") compares.

Time: a generation is live from its save's step up to (not including) the step of its delete or crash;
the average runs over steps ``[0, steps)``, ``steps`` being the trace's horizon (its schedule's
``steps``).  What is live at the horizon counts up to it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

from retainz.trace.format import CrashEvent, DeleteEvent, Event, SaveEvent
from retainz.zoned.model import round_up

__all__ = ["live_byte_steps", "mean_live_bytes", "occupancy_data_zones"]


def live_byte_steps(events: Iterable[Event], steps: int, block_size: int = 4096) -> int:
    """The integral of live bytes over steps ``[0, steps)`` (byte-steps; module docstring).

    Args:
        events: a validated trace's events, in order (steps non-decreasing).
        steps: the horizon (steps, >= 1); events at or after it add nothing.
        block_size: bytes each shard is rounded up to (the replay device's block size).

    Raises:
        ValueError: ``steps`` below 1.
    """
    if steps < 1:
        raise ValueError(f"the trace's horizon must be at least 1 step, not {steps}")
    size: dict[int, int] = {}
    live = total = 0
    last = 0
    for ev in events:
        t = min(max(ev.step, 0), steps)
        total += live * (t - last)
        last = t
        if isinstance(ev, SaveEvent):
            n = sum(round_up(s.nbytes, block_size) for s in ev.shards)
            size[ev.gen] = n
            live += n
        elif isinstance(ev, (DeleteEvent, CrashEvent)) and ev.gen is not None:
            live -= size.pop(ev.gen, 0)
    return total + live * (steps - last)


def mean_live_bytes(events: Iterable[Event], steps: int, block_size: int = 4096) -> Fraction:
    """The time-averaged live bytes of a trace: :func:`live_byte_steps` / ``steps`` (bytes, exact).

    Raises:
        ValueError: ``steps`` below 1.
    """
    return Fraction(live_byte_steps(events, steps, block_size), steps)


def occupancy_data_zones(mean_live: Fraction | int, occupancy: float, zone_capacity: int) -> int:
    """Usable data zones that a trace of time-averaged live bytes ``mean_live`` fills to ``occupancy``
    on average: ``ceil(mean_live / (occupancy * zone_capacity))``, at least 1.  The counterpart of
    pressure sizing's ``ceil(peak_live / (pressure * zone_capacity))``; the achieved occupancy
    ``mean_live / (zones * zone_capacity)`` is at most the one asked for.

    Raises:
        ValueError: ``occupancy`` outside (0, 1]; a ``zone_capacity`` below 1 byte; a trace with nothing
            live (``mean_live`` 0).
    """
    if type(occupancy) not in (int, float) or not 0 < occupancy <= 1:
        raise ValueError(f"occupancy must be in (0, 1], not {occupancy!r}")
    if zone_capacity < 1:
        raise ValueError(f"zone capacity must be a positive number of bytes, not {zone_capacity}")
    if mean_live <= 0:
        raise ValueError("the trace keeps nothing live (mean live 0 bytes): no device size follows from "
                         "--occupancy; give --zones")
    return max(1, math.ceil(Fraction(mean_live) / (Fraction(occupancy) * zone_capacity)))
