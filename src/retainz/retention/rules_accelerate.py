"""The Accelerate retention rule (:class:`Accelerate`; see :mod:`.rules`)."""

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

__all__ = ["Accelerate"]


# -- Accelerate ---------------------------------------------------------------------------------------

@register_rule
@dataclass(frozen=True)
class Accelerate(Rule):
    """Hugging Face Accelerate ``save_state`` with ``ProjectConfiguration(automatic_checkpoint_naming=True,
    total_limit=L)``.

    Checkpoints are ``checkpoints/checkpoint_{i}`` with i the save count (not the step).  *Before* each
    save, the oldest are deleted so that the new one makes L: checkpoint i goes before save i+L starts
    (a crash in that save leaves L-1).

    Attributes:
        save_steps: how often the training loop calls ``save_state`` (steps).
        total_limit: checkpoints kept (unset keeps all).
    """

    name = "accelerate"
    source = "HF Accelerate: ProjectConfiguration(automatic_checkpoint_naming=True, total_limit)"

    save_steps: int = field(metadata={"help": "save_state every save_steps (steps)"})
    total_limit: int | None = field(default=None, metadata={"help": "checkpoints kept; unset keeps all"})

    def __post_init__(self):
        positive(self.name, save_steps=self.save_steps, total_limit=self.total_limit)

    @property
    def base_interval(self) -> int:
        return self.save_steps

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        del seed  # Ignored by this rule.
        check_steps(total_steps, first_step)
        saves = [PlannedSave(s, "checkpoint", f"checkpoints/checkpoint_{s // self.save_steps - 1}")
                 for s in multiples(self.save_steps, first_step, total_steps)]
        return _AccelerateSession(self, total_steps, saves)


class _AccelerateSession(Session):
    rule: Accelerate

    def condition(self, save: PlannedSave, gen: Gen) -> Condition:
        if self.rule.total_limit is None:
            return Permanent("keep_all")
        return AfterNewer(self.rule.total_limit, "checkpoint", Timing.BEFORE_SAVE)

    def before_save(self, save: PlannedSave) -> list[Gen]:
        limit = self.rule.total_limit
        if limit is None:
            return []
        olds = sorted(self.live, key=lambda g: (int(g.name.rsplit("_", 1)[1]), g.gen))
        return olds[:max(0, len(olds) + 1 - limit)]
