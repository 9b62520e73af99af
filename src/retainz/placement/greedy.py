"""``greedy``: one log; fill zones in order (a matched control; the store default is ``retainz``)."""

from __future__ import annotations

from dataclasses import dataclass

from retainz.placement.base import NO_SPACE, Allocator, Decision, ExtentRequest

__all__ = ["Greedy"]


@dataclass
class Greedy(Allocator):
    """Write everything, user data and GC copies alike, into a single log: the lowest-index open zone
    while it has room, then the lowest-index empty zone.  No separation by reclaim step."""

    name = "greedy"

    def place(self, req: ExtentRequest) -> Decision:
        r = req.hint.reclaim_step
        t = self.table
        for z in t.open:  # dict order is opening order; the log has one open zone
            return Decision(z, (), r)
        z = t.first_empty()
        return NO_SPACE if z is None else Decision(z, (), r)
