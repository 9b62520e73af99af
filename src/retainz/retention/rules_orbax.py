"""The Orbax retention rule (:class:`Orbax`; see :mod:`.rules`)."""

from __future__ import annotations

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

__all__ = ["Orbax"]


# -- Orbax --------------------------------------------------------------------------------------------

@register_rule
@dataclass(frozen=True)
class Orbax(Rule):
    """Orbax ``CheckpointManager`` with ``AnyPreservationPolicy([LatestN(latest), EveryNSteps(every_steps)])``
    and ``save_interval_steps``.

    Step directories are named by the bare step number.  After a save finalizes, checkpoints preserved
    by no policy are removed: LatestN counts every checkpoint (those EveryNSteps keeps included).

    Attributes:
        latest: LatestN's n (unset: keep all).
        every_steps: EveryNSteps' interval (steps; unset: none).
        save_interval_steps: save when ``step % save_interval_steps == 0`` (steps; Orbax default 1).
    """

    name = "orbax"
    source = "Orbax CheckpointManager: AnyPreservationPolicy(LatestN, EveryNSteps), save_interval_steps"

    latest: int | None = field(default=None, metadata={"help": "LatestN: keep the latest n; unset keeps all"})
    every_steps: int | None = field(default=None, metadata={"help": "EveryNSteps: keep steps % N == 0 (steps)"})
    save_interval_steps: int = field(default=1, metadata={"help": "save when step % save_interval_steps == 0"})

    def __post_init__(self):
        positive(self.name, latest=self.latest, every_steps=self.every_steps,
                  save_interval_steps=self.save_interval_steps)

    @property
    def base_interval(self) -> int:
        return self.save_interval_steps

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        del seed  # Ignored by this rule.
        check_steps(total_steps, first_step)
        saves = [PlannedSave(s, "step", str(s))
                 for s in multiples(self.save_interval_steps, first_step, total_steps)]
        return _OrbaxSession(self, total_steps, saves)


class _OrbaxSession(Session):
    rule: Orbax

    def condition(self, save: PlannedSave, gen: Gen) -> Condition:
        r = self.rule
        if r.every_steps is not None and save.step % r.every_steps == 0:
            return Permanent("every_steps")
        if r.latest is None:
            return Permanent("keep_all")
        return AfterNewer(r.latest, "step", Timing.AFTER_COMMIT)

    def after_commit(self, gen: Gen) -> list[Gen]:
        r = self.rule
        if r.latest is None:
            return []
        ordered = sorted(self.live, key=lambda g: (g.step, g.gen))
        keep = set(id(g) for g in ordered[-r.latest:])
        return [g for g in ordered if id(g) not in keep
                and not (r.every_steps is not None and g.step % r.every_steps == 0)]
