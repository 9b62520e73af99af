"""``retainz``: place each extent where it costs the least space-time.

The cost model
--------------
Every cost is a space-time product in byte-steps (bytes x training steps).  For an extent of a
generation whose (viewed) reclaim step is ``r``, with ``E = nbytes + pending`` bytes of its group
still to come, at step ``now``, the options are:

* **join** an open zone ``z`` (capacity ``C``, ``W`` bytes written, ``rem`` remaining, reclaim step
  ``R``), which takes ``f = min(E, rem)`` bytes of the group:

  - ``r <= R`` (the zone outlives us): *delayed reclamation* of our bytes, dead from ``r`` until
    the zone can be reset at ``R``: ``f * (R - r)``.
  - ``r > R`` (we outlive the zone): the zone's ``W`` written bytes (live ones die by ``R``, dead
    ones are already dead: all of them are garbage at ``R``) are held until ``r``, and so is the
    capacity we leave unfilled: ``(W + rem - f) * (r - R) = (C - f) * (r - R)``.  Against that,
    the ``f`` bytes we write use capacity that would otherwise stay *unused* until ``R``: a zone
    whose group is older than ours (``R < r``) and no longer being written gets no more data of its
    own, so we credit ``f * (R - now)``.  No credit while another group in flight is writing into
    the zone (see "Saves in flight"): its free capacity is that group's next bytes.

* **open** the first empty zone (capacity ``C``).  For a death the hint view knows
  (:meth:`RetainZ.viewed_reclaim`): nothing.  The part of the zone our group will not fill is not
  lost: it stays writable while the zone is open (the store's admission counts it as free space,
  ``ZoneBook.free``) and a later group that writes into it pays the join cost above, whereas dead
  bytes held in a zone come back only with its reset or a GC copy.  For an estimated death (no
  hint step, a survivor re-estimated, an uncertain condition's expected step): *unused capacity*
  ``max(0, C - E) * (r - now)``, since later joins are priced on estimates too.  Permanent data
  pays nothing: later permanent saves top the zone up.  ``open_unused=true`` charges known deaths
  the unused capacity as well (the rule before issue 40; docs/placement.md, "The open charge": it
  made the oracle lose to a zone per job).  On an FDP namespace (device kind ``fdp``, ``fdp-nvme``)
  the charge stays for known deaths too, unless ``open_unused=false`` is given: a zone reset while
  partly written leaves its placement handle's reclaim unit part-filled, and the next zone through
  that handle ends off the RU boundary, so the RUH Update at its end pads the rest
  (``retainz.zoned.fdp``): unfilled capacity costs media writes there (docs/fdp.md).

* **finish** ``X`` **then open**, only when the active-zone budget is spent: the open cost plus
  ``rem_X * (R_X - now)``, the capacity finishing wastes until ``X`` is reset, unless ``X`` is
  already orphaned (``R_X < r`` and no group in flight writing into it: its capacity was going to
  be left unused anyway, and the join credit above counts the same thing).

Saves in flight
---------------
Several saves are written at once on a real node (the ranks of a job, jobs saving when they like,
asynchronous checkpointing).  The zone table knows the groups in flight and the open zones each
has written into (``ZoneTable.writing``/``filling``: from admission until every declared byte is
written and its shards closed, or its commit or abort).  A zone another group in flight is filling
(``ZoneTable.filled_by_others``) is that group's, not left-over capacity:

* joining it earns no credit, and is priced as a plan (:meth:`RetainZ.share_cost`): from now on
  both groups write side by side, so ``min(E, X)`` bytes (``X``: what the others still have to
  write, from their latest requests; a group not heard from yet is taken to fill the zone's free
  capacity, never to have stopped) of whichever dies first are held ``|r - R|`` steps, and the two
  tails become one (their unfilled capacity priced as the open option prices it);
* a zone whose in-flight group dies at our reclaim step is shared like any option: sharing holds
  nothing dead.  Same-step saves of jobs with the same rule (a node's jobs saving at once, the
  ranks of one job) thus fill zones together, as the one log does, instead of each taking zones of
  its own and running the active-zone budget into finishes (``tests/placement/test_placement_bound.py``:
  at 4 active zones RetainZ 1.51 and the oracle 1.59 before, both 1.000 now, the one log 1.000);
* a zone whose in-flight group dies at another step ranks after every other option: a group joins
  it only when nothing else is possible, i.e. at the active-zone limit (NVMe ZNS Max Active
  Resources) with more groups in flight than active zones.  There the least share cost decides
  which in-flight groups share, so the groups whose reclaim steps are nearest share a zone;
  finishing a zone a group in flight is filling ranks after that too (it wastes what that group
  is about to write, and sends it to another zone);
* at the limit, finishes take idle zones (no group in flight writing into them) first, by cost;
* a group keeps the zone it has begun to fill while that zone has room (upstream: a file keeps its
  zone until it is full).  The store asks again in the middle of a group (a save written unit by
  unit, another shard); the choice was priced when the group entered the zone, and re-pricing
  each unit would move a group between zones as its remaining bytes shrink;
* the zones priced are the ``neighbors`` nearest idle zones on each side of ``r``, and the busy
  zones met on the way.

This is ZenFS's rule with its busy zones made explicit: upstream ``GetBestOpenZoneMatch``,
``AllocateEmptyZone`` and ``FinishCheapestIOZone`` (fs/zbd_zenfs.cc) skip every zone they cannot
``Acquire`` (a zone held by another writer), and ``AllocateIOZone`` waits for an open token
(``WaitForOpenIOZoneToken``) when writers outnumber the open budget, then finishes the cheapest
idle zone until ``GetActiveIOZoneTokenIfAvailable`` succeeds.  Its lifetime match
(``GetLifeTimeDiff``) also lets equal classes share only at the limit (``LIFETIME_DIFF_COULD_BE_WORSE``
is accepted only when no active token is free); RetainZ shares equal reclaim steps freely, since
their bytes die together.  A store cannot make a save wait for another to finish, so beyond the
limit RetainZ shares by reclaim step where ZenFS would block.
GC copies (``TakeMigrateZone`` upstream, also a busy-skipping scan) follow the same rule: they do not
join a zone a save in flight is filling while another zone can take them.  The oracle and the
hint controls are this class with another view of the reclaim step, so they follow it too.

Steps before ``now`` count as ``now``.  A cost is a pair ``(bytes held forever, byte-steps)``
compared lexicographically, so permanent data (``r = inf``) never shares with finite data while any
finite-cost option exists: permanent packs with permanent (join cost 0).  An unknown reclaim step
(``None``) is estimated as ``step + unknown_lifetime`` (age order), for the extent and for a zone
whose recorded reclaim step is unknown (``opened_step + unknown_lifetime``); the estimate is what
the decision records.  Ties go to joining (nearest reclaim step, then lowest zone), then opening,
then finishing.  GC migration uses the same rule: migrated bytes keep their generation's reclaim
step.

Worked example (TorchTitan ``keep_latest_k=10``, a save every 500 steps, zone capacity 100 MiB, 250
MiB per save; generation ``g`` saved at step 1000 dies at ``r_g = 6000``)::

    g writes zones A, B (full) and Z (W = 50 MiB, R = 6000).
    g+1 at now = 1500, r = 6500, E = 250 MiB:
      join Z:   (100 - 50) * (6500 - 6000) - 50 * (6000 - 1500) = 25,000 - 225,000
                = -200,000 MiB-steps
      open new: max(0, 100 - 250) * (6500 - 1500) = 0
    -> g+1's first 50 MiB fill Z: g's 50 MiB are held dead 500 steps (25,000 MiB-steps) instead of
       Z's free 50 MiB lying unused for 4,500 steps.
    The final save (40 MiB, permanent) next to open zone Y (R = 6500):
      join Y:   (100 - 40) MiB held forever          -> (60 MiB, ...)
      open new: 0 (permanent)                        -> chosen; later permanent data joins it at 0.

Uncertain deaths (top-k by a metric: Lightning ``save_top_k``, HF ``load_best_model_at_end``)
-----------------------------------------------------------------------------------------------
A hint whose condition is ``uncertain`` carries an estimate, not a fact: the generation dies at
``expected`` with some probability, or survives for an unknown time.  Three rules:

* **No sharing.** A save with an uncertain condition joins only zones of its own group (opened at
  its step, with its reclaim step), and the zones it opens are marked (:data:`UNCERTAIN_ZONE`, the
  zone's recorded lifetime) so that no save with a known death joins them either: sharing a zone
  couples two deaths the runtime cannot predict, and a wrong guess leaves dead bytes beside live
  ones that only copying can free.  Its last zone
  stays partly written until its own death resets it (the cost the open option already prices).
  Without an empty zone the rule yields (the save shares, by the plain cost model): free capacity
  left in open zones is never a reason to stop.  ``uncertain_saves=false`` turns the rule off.
* **Survivors are re-estimated.** Data still live after its predicted reclaim step outlived the
  prediction: its reclaim step becomes :func:`survivor_reclaim` (``now + age``), for placing its
  GC copies (survivors of similar age are regrouped together, apart from data about to die) and
  for ranking its zone as a GC victim.
* **Overdue zones are not waited on.** The GC rule below skips zones about to reset themselves;
  a zone whose reclaim step has passed with live data left is not about to, and is ranked by its
  re-estimated step.  When the store forces GC (admission or a placement found no space), no zone
  is skipped: the space is needed before the zone's own reset (a top-k eviction happens after the
  new save commits, so the new save cannot wait for it).

Complexity: open zones are indexed by reclaim step (a sorted list kept current by
:meth:`zone_changed`); a decision bisects to ``r`` and prices only the ``neighbors`` nearest zones
on each side, plus the first empty zone (``O(log zones)``); when the active budget is spent it also
prices finishing each open zone (at most ``max_active``, a device constant).  ``recompute=True``
rebuilds the index from the table before every decision (the equivalence mode: decisions must be
identical).

GC victims (:meth:`RetainZ.gc_victims`): cost-benefit.  Collecting a full zone now frees its
``C - live`` bytes ``R - now`` steps earlier than waiting for its data to die, at the price of
copying ``live`` bytes: zones are ranked by ``(C - live) * (R - now) / live``, so data that will
not die soon and zones with much garbage go first.  A zone whose reclaim step is near (``R - now
<= max(wait_steps, wait_frac * (now - opened_step))``) is not picked while an empty zone is left
to wait on and GC is not forced: it will reset itself for free.  A zone whose reclaim step has
passed with live data left is ranked by :func:`survivor_reclaim` instead.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from retainz.hint import DEFAULT_MEDIUM, DEFAULT_SHORT, Lifetime
from retainz.placement.base import (
    NO_SPACE,
    PERMANENT,
    Allocator,
    Decision,
    ExtentRequest,
    ZoneSummary,
    ZoneTable,
)
from retainz.placement.hints import view_reclaim_step
from retainz.zoned.model import DeviceInfo, ZoneCond

_EMPTY, _FULL = ZoneCond.EMPTY, ZoneCond.FULL
#: The lifetime RetainZ records for a zone opened by a save with an uncertain condition: ZenFS's
#: ``WLTH_NONE`` (1), which the retention mapping never produces, so the mark is journaled with the
#: zone and survives a remount (``ZoneSummary.lifetime``; RetainZ reads no other use of it).
UNCERTAIN_ZONE = Lifetime.NONE
#: Hint views that see the retirement condition (no-hint sees nothing, the oracle sees the outcome).
_HINTED = ("exact", "coarse", "noisy")

__all__ = ["RetainZ", "RetainZNoHint", "RetainZCoarse", "RetainZNoisy", "Oracle", "Cost", "survivor_reclaim"]

#: A cost: (bytes held forever, byte-steps).  Compared lexicographically.
Cost = tuple[int, float]
_ZERO: Cost = (0, 0.0)


def held(nbytes: int, start: float, end: float) -> Cost:
    """Cost of ``nbytes`` held (dead or unusable) from step ``start`` to ``end`` (may be inf)."""
    if nbytes <= 0 or end <= start:
        return _ZERO
    if end == PERMANENT:
        return (nbytes, 0.0)
    return (0, nbytes * (end - start))


def survivor_reclaim(step: int, now: int) -> int:
    """Re-estimated reclaim step of data still live past its predicted reclaim step.

    A prediction that has passed with the data still live was wrong (an uncertain condition, e.g.
    top-k by a metric, whose eviction did not come).  Data that has survived ``a = now - step``
    steps is given as much again: ``now + max(a, 1)`` (the expected remaining life of a survivor
    grows with its age; each missed prediction doubles the estimate).

    Args:
        step: the data's training step (a zone: its opening step), in steps.
        now: the current training step.

    Returns:
        A reclaim step later than ``now`` (steps).
    """
    return now + max(now - step, 1)


@dataclass
class RetainZ(Allocator):
    """Least space-time cost placement (module docstring).

    Attributes:
        unknown_lifetime: steps assumed between a save and its deletion when the reclaim step is
            unknown.
        neighbors: open zones priced on each side of the extent's reclaim step.
        wait_frac: GC skips a zone whose remaining life is at most this fraction of its age.
        wait_steps: GC skips a zone whose reclaim step is at most this many steps away.
        recompute: rebuild the reclaim-step index before every decision (equivalence mode).
        uncertain_saves: a save with an uncertain condition joins only zones of its own group
            (module docstring, "Uncertain deaths").
        open_unused: charge the open option (and the share plan of a zone in flight) for the
            capacity a group leaves unfilled also when the hint view knows the death (module
            docstring, "open"); ``False`` charges it for estimated deaths only; ``None`` (the
            default): by the device (:meth:`use_device`), ``True`` on an FDP namespace, else
            ``False``.
    """

    name = "retainz"
    view = "exact"  # the hint view (retainz.placement.hints.VIEWS); the controls change only this

    unknown_lifetime: int = 5000
    neighbors: int = 2
    wait_frac: float = 0.1
    wait_steps: int = 0
    recompute: bool = False
    uncertain_saves: bool = True
    open_unused: bool | None = None

    def __post_init__(self) -> None:
        self.check_int("unknown_lifetime", 1)
        self.check_int("neighbors", 1)
        self.check_finite("wait_frac", 0.0)
        self.check_int("wait_steps", 0)
        self._index: list[tuple[float, int]] = []   # (zone reclaim step, zone) of open zones
        self._key: dict[int, tuple[float, int]] = {}
        self._inflight: dict[str, tuple[int]] = {}  # group in flight -> (bytes still to come,)
        self._charge_open = bool(self.open_unused)   # open_unused, resolved by use_device when None

    def use_device(self, info: DeviceInfo) -> None:
        """Resolve ``open_unused=None`` by the device kind: charged on an FDP namespace (``fdp``,
        ``fdp-nvme``: unfilled capacity of a zone reset part-written is padded later; module
        docstring, "open"), free on a zoned device."""
        if self.open_unused is None:
            self._charge_open = info.kind.startswith("fdp")

    # -- the hint view ------------------------------------------------------------------------------
    def _view_kwargs(self) -> dict:
        return {}

    def reclaim_of(self, req: ExtentRequest) -> float:
        """The reclaim step this policy places ``req`` by (and records), in steps."""
        return self.viewed_reclaim(req)[0]

    def viewed_reclaim(self, req: ExtentRequest) -> tuple[float, bool]:
        """``(reclaim step, known)``: the step this policy places ``req`` by, and whether it is the
        hint view's own step for a certain condition (``False`` when it is an estimate: an unknown
        step estimated by age, ``step + unknown_lifetime``; a passed one re-estimated by
        :func:`survivor_reclaim`; or the expected step of an ``uncertain`` condition, top-k by a
        metric, under a view that sees the condition: the oracle's actual step is known)."""
        if self.view == "exact":       # the common case, without building the view's kwargs
            r = req.hint.reclaim_step
        else:
            r = view_reclaim_step(req, self.view, **self._view_kwargs())
        if r is None:
            return req.step + self.unknown_lifetime, False
        if r < req.now:
            return survivor_reclaim(req.step, req.now), False
        return r, not (self.view in _HINTED and req.hint.kind == "uncertain")

    def reclaim_step_of(self, req: ExtentRequest) -> float | None:
        """:meth:`reclaim_of`: the reclaim step this policy places and records by."""
        return self.reclaim_of(req)

    def zone_reclaim(self, s: ZoneSummary) -> float:
        """A zone's reclaim step, or its estimate when unknown."""
        return s.opened_step + self.unknown_lifetime if s.reclaim_step is None else s.reclaim_step

    # -- the index ----------------------------------------------------------------------------------
    def bind(self, table: ZoneTable) -> None:
        super().bind(table)
        self._inflight.clear()
        self._rebuild()

    def _rebuild(self) -> None:
        self._key = {z: (self.zone_reclaim(s), z) for z, s in self.table.open.items()}
        self._index = sorted(self._key.values())

    def zone_changed(self, s: ZoneSummary) -> None:
        if self.recompute:
            return
        z = s.index
        is_open = s.cond is not _EMPTY and s.cond is not _FULL
        old = self._key.get(z)
        if is_open:
            key = (self.zone_reclaim(s), z)
            if key == old:
                return                 # still open, same reclaim step: the index is current
        if old is not None:
            del self._key[z]
            del self._index[bisect.bisect_left(self._index, old)]
        if is_open:
            bisect.insort(self._index, key)
            self._key[z] = key

    def index_keys(self) -> list[tuple[float, int]]:
        """The reclaim-step index, ascending (for tests)."""
        return list(self._index)

    # -- costs --------------------------------------------------------------------------------------
    def join_cost(self, s: ZoneSummary, r: float, group: int, now: int, filled: bool = False) -> Cost:
        """Cost of writing the group's next bytes (``group`` bytes to come, reclaim step ``r``)
        into open zone ``s``; ``filled``: another group in flight is writing into ``s``
        (``ZoneTable.filled_by_others``), so the capacity we take is not left over: no credit."""
        big_r, rn = max(self.zone_reclaim(s), now), max(r, now)
        f = min(group, s.remaining)
        if rn <= big_r:
            return held(f, rn, big_r)
        forever, steps = held(s.capacity - f, big_r, rn)
        if filled:
            return (forever, steps)
        return (forever, steps - f * (big_r - now))

    def share_cost(self, s: ZoneSummary, r: float, group: int, now: int, generation: str,
                   free: bool = False) -> Cost:
        """Cost of sharing open zone ``s`` with the other group(s) in flight filling it (module
        docstring, "Saves in flight"), as a plan: from now on both write side by side, through
        ``s`` and then fresh zones, until the smaller is done.

        With ``X`` bytes still to come from the others (their last requests; ``rem`` for a
        group not heard from yet), reclaim step
        ``R`` (the zone's), ``rem`` free in ``s`` and ``u(n)`` the capacity the last zone is left
        with when ``n`` bytes fill ``rem`` and then fresh zones: ``min(group, X)`` bytes of the
        group that dies first are held from its reclaim step to the other's, and the two tails
        become one: ``min(group, X) * |r - R| + u(group + X) * (max(r, R) - now) - u(X) * (R -
        now)`` (the others' plan alone is subtracted, so the cost compares with the open
        option's ``u(group) * (r - now)``).  Equal reclaim steps share at no more than that;
        groups dying far apart stay apart.  ``free`` (:meth:`open_cost`): the unfilled capacity
        is not charged, only ``min(group, X) * |r - R|``.

        Returns:
            A :data:`Cost` (bytes held forever, byte-steps): sharing finite data with permanent
            data holds ``min(group, X)`` bytes forever.
        """
        big_r, rn = max(self.zone_reclaim(s), now), max(r, now)
        others = self._inflight
        rem, cap = s.remaining, s.capacity
        # a group in flight is never assumed to have stopped writing: one this policy has not
        # heard from yet is taken to fill at least the zone's free capacity
        x = sum(others[g][0] if g in others else rem
                for g in self.table.filling.get(s.index, ()) if g != generation)

        def unused(n: int) -> int:
            if n <= rem:
                return rem - n
            tail = (n - rem) % cap
            return cap - tail if tail else 0

        forever, steps = held(min(group, x), min(rn, big_r), max(rn, big_r))
        end = max(rn, big_r)
        if not free and end != PERMANENT:
            steps += unused(group + x) * (end - now) - unused(x) * (big_r - now)
        return (forever, steps)

    @staticmethod
    def open_cost(capacity: int, r: float, group: int, now: int, free: bool = False) -> Cost:
        """Cost of opening an empty zone of ``capacity`` bytes for the group (``group`` bytes
        to come, reclaim step ``r``) at step ``now``: the capacity it leaves unfilled,
        ``max(0, capacity - group) x (r - now)`` byte-steps (0 for permanent data: later
        permanent saves top the zone up).  ``free``: nothing (``open_unused=false`` and a death the
        hint view knows; module docstring, "open")."""
        if free or r == PERMANENT:
            return _ZERO
        return held(capacity - group, now, max(r, now))

    def finish_cost(self, s: ZoneSummary, r: float, now: int, filled: bool = False) -> Cost:
        """Cost of finishing open zone ``s`` to make room for data with reclaim step ``r``;
        ``filled``: a group in flight is still writing into ``s`` (never orphaned)."""
        big_r = max(self.zone_reclaim(s), now)
        if big_r < max(r, now) and not filled:
            return _ZERO  # orphaned: its free capacity was going unused until big_r anyway
        return held(s.remaining, now, big_r)

    # -- decisions ----------------------------------------------------------------------------------
    def candidates(self, r: float, generation: str | None = None) -> list[ZoneSummary]:
        """The open zones priced for reclaim step ``r``: the ``neighbors`` nearest on each side,
        not counting zones another group in flight is filling (``ZoneTable.filled_by_others`` for
        ``generation``), which are priced too when met on the way."""
        i = bisect.bisect_left(self._index, (r, -1))
        k = self.neighbors
        t = self.table
        zones = t.zones
        index = self._index
        w = t.writing
        if generation is None or not t.filling or (len(w) == 1 and generation in w):
            return [zones[z] for _, z in index[max(0, i - k):i + k]]   # no other group in flight
        out = []
        for rng in (range(i - 1, -1, -1), range(i, len(index))):
            idle = 0
            for j in rng:
                z = index[j][1]
                out.append(zones[z])
                if not t.filled_by_others(z, generation):
                    idle += 1
                    if idle == k:
                        break
        return out

    def place(self, req: ExtentRequest) -> Decision:
        """The least-cost option (module docstring).  Options are ranked first by whether they
        take capacity another group in flight is filling (joining its zone, or finishing it):
        such an option is taken only when every other one is impossible, e.g. at the active-zone
        limit with every open zone being filled ("Saves in flight")."""
        t = self.table
        if self.recompute:
            self._rebuild()
        now = req.now
        r, known = self.viewed_reclaim(req)
        free = known and not self._charge_open
        group = req.nbytes + req.pending
        gen = req.generation
        self._remember(gen, group, req.gc)
        mine = t.writing.get(gen)
        if mine and not req.gc:
            # the group keeps the zone it has begun to fill while it has room (ZenFS: a file keeps
            # its zone until it is full): the choice was priced when the group entered the zone
            stay = min(((t.zones[z].remaining, z) for z in mine if t.zones[z].remaining > 0), default=None)
            if stay is not None:
                return Decision(stay[1], (), r)
        best: tuple | None = None
        rule = self.uncertain_saves and not req.gc and self.view in _HINTED and t.n_empty > 0
        own = rule and req.hint.kind == "uncertain"
        e = t.first_empty()
        cap = t.zones[e].capacity if e is not None else 0
        for s in self.candidates(r, gen):
            if own and (s.opened_step != req.step or self.zone_reclaim(s) != r):
                continue  # an uncertain death: share zones with no other group (see the docstring)
            if rule and not own and s.lifetime == UNCERTAIN_ZONE:
                continue  # nor does a known death join an uncertain group's zone
            zr = self.zone_reclaim(s)
            busy = t.filled_by_others(s.index, gen)
            if busy:
                cost = self.share_cost(s, r, group, now, gen, free)
                # a group in flight that dies at another step is joined only when nothing else is
                # possible (at the active-zone limit); one that dies at ours shares for free
                last = int(max(zr, now) != max(r, now))
                key = (last, cost, 0, 0.0 if zr == r else abs(zr - r), s.index)
                if best is None or key < best[0]:
                    best = (key, Decision(s.index, (), r))
                continue
            cost = self.join_cost(s, r, group, now)
            key = (0, cost, 0, 0.0 if zr == r else abs(zr - r), s.index)
            if best is None or key < best[0]:
                best = (key, Decision(s.index, (), r))
        if e is not None:
            cost = self.open_cost(cap, r, group, now, free)
            mark = UNCERTAIN_ZONE if own else None
            if not t.max_active or len(t.open) < t.max_active:
                key = (0, cost, 1, 0.0, e)
                decision = Decision(e, (), r, mark)
            else:
                need = len(t.open) - t.max_active + 1
                # idle zones first: finishing a zone a group in flight is filling wastes capacity
                # that group was about to use and sends it to another zone (ZenFS never finishes a
                # busy zone: FinishCheapestIOZone skips zones it cannot Acquire, fs/zbd_zenfs.cc)
                priced = sorted((busy, self.finish_cost(s, r, now, busy), s.remaining, s.index)
                                for s in t.open.values()
                                for busy in (t.filled_by_others(s.index, gen),))[:need]
                for _, c, _, _ in priced:
                    cost = (cost[0] + c[0], cost[1] + c[1])
                # finishing a zone a group in flight is filling ranks after everything else,
                # joining such a zone included
                key = (2 if any(b for b, *_ in priced) else 0, cost, 2, 0.0, e)
                decision = Decision(e, finish=tuple(z for *_, z in priced), reclaim_step=r, lifetime=mark)
            if best is None or key < best[0]:
                best = (key, decision)
        return NO_SPACE if best is None else best[1]

    def _remember(self, generation: str, group: int, gc: bool) -> None:
        """Keep the bytes each group in flight still has to write (its latest request's
        ``nbytes + pending``), for :meth:`share_cost`; groups no longer in flight are dropped.
        Not journaled, like ``ZoneTable.writing``: a remount aborts every writer in flight."""
        inflight, writing = self._inflight, self.table.writing
        if not gc and generation in writing:
            inflight[generation] = (group,)
        if len(inflight) > len(writing):
            for g in [g for g in inflight if g not in writing]:
                del inflight[g]

    # -- GC -----------------------------------------------------------------------------------------
    def gc_victims(self, reserve_zones: int) -> list[int]:
        """Cost-benefit victims (module docstring), until the reserve would be restored.

        Args:
            reserve_zones: empty zones the store wants to keep.

        Returns:
            Full zones with reclaimable space (dead or unused bytes) and live data, best first;
            empty when at least ``reserve_zones`` zones are empty.  Scans every zone (GC is rare).
        """
        t = self.table
        if t.n_empty >= reserve_zones:
            return []
        now = t.now
        # forced (the store asks with every data zone as the reserve: admission or a placement
        # found no space): space is needed now, so no zone is left to reset itself later
        forced = reserve_zones >= len(t)
        ranked = []
        for s in t:
            if s.cond != ZoneCond.FULL or s.live == 0 or s.live >= s.capacity:
                continue
            big_r = self.zone_reclaim(s)
            if big_r < now:
                # live data past its zone's reclaim step outlived its prediction (an uncertain
                # condition that did not fire): re-estimate instead of waiting on a reset that
                # is not coming
                big_r = survivor_reclaim(s.opened_step, now)
            else:
                near = max(self.wait_steps, self.wait_frac * (now - s.opened_step))
                if t.n_empty > 0 and not forced and big_r - now <= near:
                    continue  # it resets itself soon: waiting is free while the reserve lasts
            forever, steps = held(s.capacity - s.live, now, big_r)
            ranked.append((-forever / s.live, -steps / s.live, s.index, s))
        ranked.sort(key=lambda x: x[:3])
        victims, gain, need = [], 0.0, reserve_zones - t.n_empty
        for *_, s in ranked:
            if gain >= need:
                break
            victims.append(s.index)
            gain += (s.capacity - s.live) / s.capacity
        return victims


@dataclass
class RetainZNoHint(RetainZ):
    """``retainz-nohint``: every reclaim step unknown (``step + unknown_lifetime``: age order)."""

    name = "retainz-nohint"
    view = "none"


@dataclass
class RetainZCoarse(RetainZ):
    """``retainz-coarse``: reclaim steps quantized to the four ZenFS lifetime classes
    (:func:`retainz.hint.lifetime_class`), each class standing for one lifetime.

    Attributes:
        short, medium: class bounds in steps of lifetime.
    """

    name = "retainz-coarse"
    view = "coarse"
    short: int = DEFAULT_SHORT
    medium: int = DEFAULT_MEDIUM

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_int("short", 1)
        self.check_int("medium", self.short)

    def _view_kwargs(self) -> dict:
        return {"short": self.short, "medium": self.medium}


@dataclass
class RetainZNoisy(RetainZ):
    """``retainz-noisy``: predicted lifetimes scaled by ``1 + e``, ``e`` uniform in
    ``[-error, +error]``, one seeded draw per generation.

    Attributes:
        error: relative error size (0.5 = up to +-50 % of the predicted lifetime).
        seed: random seed.
    """

    name = "retainz-noisy"
    view = "noisy"
    error: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        # error > 1 would scale some lifetimes by a negative factor (a reclaim step in the past).
        self.check_finite("error", 0.0, 1.0)

    def _view_kwargs(self) -> dict:
        return {"error": self.error, "seed": self.seed}


@dataclass
class Oracle(RetainZ):
    """``oracle``: the RetainZ rule on the actual deletion step of every generation (the bound)."""

    name = "oracle"
    view = "oracle"


@dataclass
class RetainZInferred(RetainZ):
    """``retainz-inferred``: places by the hints ``retainz mount --retention auto`` would give, i.e.
    the retention rule inferred online from the saves and deletions seen so far
    (:class:`retainz.retention.inference.RetentionInference`), not the runtime's own rule.

    The policy itself is ``retainz`` with the exact view; what differs is the hint it is given.  A
    driver that sees ``hint_source == "inferred"`` (trace replay) replaces each save's hint by the
    inferred one (``None`` until the inference is confident, which this policy prices as unknown)."""

    name = "retainz-inferred"
    hint_source = "inferred"
