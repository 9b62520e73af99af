"""Matched controls that change how generations share zones: ``common`` and ``dedicated``.

The hint controls (``retainz-nohint``, ``retainz-coarse``, ``retainz-noisy``, ``oracle``) live with
the RetainZ rule in :mod:`retainz.placement.retainz`; ``greedy`` (one log) in
:mod:`retainz.placement.greedy`.  Each control records the exact reclaim step it was given (for
reports) but places without it.  GC victims are the base rule (most dead bytes first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from retainz.placement.base import NO_SPACE, Allocator, Decision, ExtentRequest, ZoneSummary, ZoneTable
from retainz.zoned.model import ZoneCond

#: The save counter replay puts in front of a generation's name (``00000012-``).
_REPLAY_COUNTER = re.compile(r"^\d{8}-")

__all__ = ["Common", "Dedicated"]


@dataclass
class Common(Allocator):
    """``common``: every generation is admitted to the same set of open zones (no separation by
    reclaim step).  Up to ``width`` zones are kept open; each extent goes to the open zone with the
    most remaining capacity (ties: lowest index), so every save is spread over all of them.

    Attributes:
        width: open zones shared by all data; 0 means the active-zone budget (4 if unlimited).
    """

    name = "common"
    width: int = 0

    def __post_init__(self) -> None:
        self.check_int("width", 0)

    def place(self, req: ExtentRequest) -> Decision:
        t = self.table
        r = req.hint.reclaim_step
        width = self.width or t.max_active or 4
        if len(t.open) < width and t.can_open:
            return Decision(t.first_empty(), reclaim_step=r)
        if not t.open:
            return NO_SPACE
        s = max(t.open.values(), key=lambda s: (s.remaining, -s.index))  # O(width)
        return Decision(s.index, reclaim_step=r)


@dataclass
class Dedicated(Allocator):
    """``dedicated``: each generation gets zones of its own (no sharing, user data and GC copies
    alike).  A generation writes into its current zone until it is full, then opens the first
    empty zone; when the active budget is spent, the open zone with the least remaining capacity
    (ties: lowest index) is finished first.

    With ``by="job"`` the owner is the generation's job instead: the part of its name before ``:`` (a
    fleet trace's ``j3:step-500``, docs/fleet.md; replay's ``00000012-j3:step-500`` is job ``j3``), else its series folder (``jobs%2Fa%2Fstep-500`` ->
    ``jobs/a``): every job writes its own zones, so on an FDP namespace (one placement handle per active
    zone, docs/fdp.md) it is "a handle per job".

    Zone ownership is private state (the table does not record generations): after a remount
    earlier zones have no owner and are finished when the budget needs them.

    Attributes:
        by: "generation" (default) or "job": what owns a zone.
    """

    name = "dedicated"
    by: str = "generation"

    def __post_init__(self) -> None:
        if self.by not in ("generation", "job"):
            raise ValueError(f"dedicated: by must be generation or job, got {self.by!r}")
        self._owner: dict[int, str] = {}      # zone -> owner (generation or job)
        self._current: dict[str, int] = {}    # owner -> its open zone

    def _owner_of(self, generation: str) -> str:
        if self.by == "generation":
            return generation
        if ":" in generation:
            # a replayed save's id puts the trace's save counter in front of its name
            # (``00000012-j3:step-500``, trace/replay.py ``_gen_id``): the job is the name's part
            return _REPLAY_COUNTER.sub("", generation.partition(":")[0], count=1)
        base = unquote(generation.partition("#")[0].lstrip("@"))
        return base.rpartition("/")[0]

    def bind(self, table: ZoneTable) -> None:
        super().bind(table)
        self._owner.clear()
        self._current.clear()

    def zone_changed(self, s: ZoneSummary) -> None:
        if s.cond in (ZoneCond.EMPTY, ZoneCond.FULL) and s.index in self._owner:
            gen = self._owner.pop(s.index)
            if self._current.get(gen) == s.index:
                del self._current[gen]

    def place(self, req: ExtentRequest) -> Decision:
        t = self.table
        r = req.hint.reclaim_step
        owner = self._owner_of(req.generation)
        z = self._current.get(owner)
        if z is not None and z in t.open and self._owner.get(z) == owner:
            return Decision(z, reclaim_step=r)
        e = t.first_empty()
        if e is None:
            return NO_SPACE
        finish: tuple[int, ...] = ()
        if t.max_active and len(t.open) >= t.max_active:
            need = len(t.open) - t.max_active + 1
            finish = tuple(s.index for s in sorted(t.open.values(),
                                                   key=lambda s: (s.remaining, s.index))[:need])
        self._owner[e] = owner
        self._current[owner] = e
        return Decision(e, finish=finish, reclaim_step=r)
