"""The Megatron-LM retention rule (:class:`Megatron`; see :mod:`.rules`)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from retainz.retention.base import Gen, Rule, Session, register_rule
from retainz.retention.conditions import (
    AfterNewer,
    Condition,
    Permanent,
    PlannedSave,
    Timing,
)
from retainz.retention.rules_common import check_steps, multiples, positive

__all__ = ["Megatron", "retain_interval_retired", "non_persistent_global_retired", "non_persistent_local_retired"]


# -- the purge: Megatron-LM's deletions, modelled once ------------------------------------------------
# Every route that enacts or predicts Megatron's retention decides with these three functions: the
# driven session below (traces), retire.retired_after_commit (the DCP writer's ``retention=``) and the
# retention callbacks (retainz.integrations.retention_callbacks).  Each takes the steps of the series'
# committed checkpoints of one kind, oldest first.

def retain_interval_retired(steps: Sequence[int], retain_interval: int | None) -> list[int]:
    """The persistent iterations ``--save-retain-interval R`` deletes once the newest of ``steps`` has
    committed: every one but the newest that is not a multiple of R (none without R).

    Megatron-LM d98e8a6 ``checkpointing.py``: at finalize of the save at iteration ``it`` the tracker's
    previous iteration ``prev`` is deleted when ``prev != it`` and ``prev % R``; applied at every commit
    that leaves exactly the multiples of R and the newest, so stated over the committed iterations it is
    this (and a series saved without R before is brought to it at once)."""
    if not retain_interval or not steps:
        return []
    return [s for s in steps[:-1] if s % retain_interval]


def non_persistent_global_retired(steps: Sequence[int]) -> list[int]:
    """``--non-persistent-ckpt-type global``: before a new non-persistent save, every non-persistent
    iteration of ``steps`` but the single newest is deleted (two on disk in steady state)."""
    return list(steps[:-1])


def non_persistent_local_retired(steps: Sequence[int], step: int) -> list[int]:
    """``--non-persistent-ckpt-type local`` (NVRx ``LocalCheckpointManager``): once iteration ``step``
    has committed on every rank, every older iteration of ``steps`` is deleted."""
    return [s for s in steps if s < step]


# -- Megatron-LM ---------------------------------------------------------------------------------------

@register_rule
@dataclass(frozen=True)
class Megatron(Rule):
    """Megatron-LM checkpointing (``--save-interval``, ``--save-retain-interval``,
    ``--non-persistent-save-interval``, ``--non-persistent-ckpt-type``).

    * Persistent ``iter_{N:07d}`` when ``iteration % save_interval == 0``, and at the end of training
      if the last iteration was not one.  With ``retain_interval`` R, at finalize the tracker moves to
      the new iteration and the previous one is deleted unless it is a multiple of R: keep the latest
      plus every R-th, the old one going only after the new one commits.  Without R nothing is deleted.
    * Non-persistent saves at ``iteration % non_persistent_interval == 0`` (not on persistent
      iterations).  ``global``: before writing, keep the single newest and delete the rest, so
      checkpoint j goes at the start of the second-next non-persistent save.  ``local`` (NVRx
      LocalCheckpointManager): after the new iteration commits on every rank, all older ones go.

    Attributes:
        save_interval: persistent save interval (steps).
        retain_interval: keep every R-th persistent checkpoint (steps, multiple of save_interval).
        non_persistent_interval: non-persistent save interval (steps).
        non_persistent: ``global`` or ``local``.
    """

    name = "megatron"
    source = ("Megatron-LM: --save-interval, --save-retain-interval, --non-persistent-save-interval, "
              "--non-persistent-ckpt-type global|local")

    save_interval: int = field(metadata={"help": "persistent save when iteration % save_interval == 0 (steps)"})
    retain_interval: int | None = field(default=None, metadata={
        "help": "keep the latest plus every R-th persistent checkpoint (steps); unset keeps all"})
    non_persistent_interval: int | None = field(default=None, metadata={
        "help": "non-persistent save interval (steps)"})
    non_persistent: str | None = field(default=None, metadata={
        "help": "non-persistent checkpoint type (default global)", "choices": ("global", "local")})

    def __post_init__(self):
        positive(self.name, save_interval=self.save_interval, retain_interval=self.retain_interval,
                  non_persistent_interval=self.non_persistent_interval)
        if self.retain_interval is not None and self.retain_interval % self.save_interval:
            raise ValueError(f"retention rule megatron: retain_interval={self.retain_interval} must be a multiple "
                             f"of save_interval={self.save_interval}")
        if self.non_persistent is not None and self.non_persistent_interval is None:
            raise ValueError("retention rule megatron: non_persistent needs non_persistent_interval")
        if self.non_persistent_interval is not None and self.non_persistent is None:
            object.__setattr__(self, "non_persistent", "global")

    @property
    def base_interval(self) -> int:
        return min(self.save_interval, self.non_persistent_interval or self.save_interval)

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        del seed  # Ignored by this rule.
        check_steps(total_steps, first_step)
        saves = []
        npi = self.non_persistent_interval
        prefix = "non_persistent/" if self.non_persistent == "global" else "local/"
        # O(saves), not O(steps): walk the multiples of both intervals (a persistent save wins a tie)
        persistent = multiples(self.save_interval, first_step, total_steps)
        transient = (it for it in multiples(npi, first_step, total_steps) if it % self.save_interval) if npi else ()
        for it in heapq.merge(persistent, transient):
            if it % self.save_interval == 0:
                saves.append(PlannedSave(it, "persistent", f"iter_{it:07d}"))
            else:
                saves.append(PlannedSave(it, "non_persistent", f"{prefix}iter_{it:07d}"))
        if total_steps % self.save_interval:
            saves.append(PlannedSave(total_steps, "persistent", f"iter_{total_steps:07d}"))
        return _MegatronSession(self, total_steps, saves)


class _MegatronSession(Session):
    rule: Megatron

    def __init__(self, *args):
        super().__init__(*args)
        self.tracker: Gen | None = None  # latest_checkpointed_iteration.txt

    def condition(self, save: PlannedSave, gen: Gen) -> Condition:
        r = self.rule
        if save.cls == "persistent":
            if r.retain_interval is None:
                return Permanent("keep_all")
            if save.step % r.retain_interval == 0:
                return Permanent("retain_interval")
            return AfterNewer(1, "persistent", Timing.AFTER_COMMIT)
        if r.non_persistent == "global":
            return AfterNewer(2, "non_persistent", Timing.BEFORE_SAVE)
        return AfterNewer(1, "non_persistent", Timing.AFTER_COMMIT)

    def before_save(self, save: PlannedSave) -> list[Gen]:
        if save.cls != "non_persistent" or self.rule.non_persistent != "global":
            return []
        return _gens_at(self.live_of("non_persistent"), non_persistent_global_retired)

    def after_commit(self, gen: Gen) -> list[Gen]:
        r = self.rule
        if gen.cls == "persistent":
            self.tracker = gen
            return _gens_at([g for g in self.live_of("persistent") if g.committed],
                            lambda steps: retain_interval_retired(steps, r.retain_interval))
        if r.non_persistent == "local":
            return _gens_at(self.live_of("non_persistent"), lambda steps: non_persistent_local_retired(steps, gen.step))
        return []


def _gens_at(gens: list[Gen], retired) -> list[Gen]:
    """The generations of ``gens`` (oldest first by step, then number) whose position ``retired(steps)``
    names: the purge functions above applied to a session's live generations."""
    olds = sorted(gens, key=lambda g: (g.step, g.gen))
    doomed = retired([g.step for g in olds])
    out, i = [], 0
    for g in olds:              # steps ascending: walk both lists once, a step named once per generation at it
        while i < len(doomed) and doomed[i] < g.step:
            i += 1
        if i < len(doomed) and doomed[i] == g.step:
            out.append(g)
            i += 1
    return out
