"""The TorchTitan retention rule (:class:`TorchTitan`; see :mod:`.rules`)."""

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
from retainz.retention.steps import parse_step

__all__ = ["TorchTitan"]


# -- TorchTitan ---------------------------------------------------------------------------------------

@register_rule
@dataclass(frozen=True)
class TorchTitan(Rule):
    """TorchTitan ``CheckpointManager`` (``[checkpoint]`` interval, keep_latest_k, async_mode,
    last_save_model_only).

    * Saves ``step-{N}`` when ``step % interval == 0`` and always at the last step; the last step is
      saved synchronously (model only by default) and never purged: permanent.
    * Purge (``keep_latest_k > 0``): list ``step-*``, sort by the *parsed* step number, delete all but
      the latest K.  Sync: the purge runs after the save completes, so step s goes when the save at
      ``s + K*interval`` has committed.  Async: it runs right after the new save is dispatched, before
      it is durable; the in-flight directory is listed and counts as one of the K (the case TorchTitan's
      "keep_latest_k=1 is rejected" guards against), so step s goes at the same save but before its
      commit.
    * ``keep_latest_k=0`` keeps everything; ``1`` is rejected as TorchTitan rejects it.

    Attributes:
        interval: save interval (steps).
        keep_latest_k: checkpoints kept (0 keeps all).
        async_mode: ``async``/``async_with_pinned_mem`` (True) or ``disabled`` (False).
        last_save_model_only: the last step's save holds the model weights only.
    """

    name = "torchtitan"
    source = "TorchTitan CheckpointManager: checkpoint.interval, keep_latest_k, async_mode, last_save_model_only"

    interval: int = field(default=500, metadata={"help": "save when step % interval == 0 (steps)"})
    keep_latest_k: int = field(default=10, metadata={"help": "checkpoints kept; 0 keeps all; 1 rejected"})
    async_mode: bool = field(default=False, metadata={"key": "async", "help": "async save (purge at dispatch)"})
    last_save_model_only: bool = field(default=True, metadata={"help": "last step saves model weights only"})

    def __post_init__(self):
        positive(self.name, interval=self.interval)
        if self.keep_latest_k < 0:
            raise ValueError("retention rule torchtitan: keep_latest_k cannot be negative")
        if self.keep_latest_k == 1:
            raise ValueError("retention rule torchtitan: keep_latest_k=1 is rejected (TorchTitan keeps at least 2 "
                             "checkpoints, as the last one may be in the process of being saved)")

    @property
    def base_interval(self) -> int:
        return self.interval

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        del seed  # Ignored by this rule.
        check_steps(total_steps, first_step)
        saves = [PlannedSave(s, "interval", f"step-{s}")
                 for s in multiples(self.interval, first_step, total_steps - 1)]
        saves.append(PlannedSave(total_steps, "final", f"step-{total_steps}", self.last_save_model_only))
        return _TorchTitanSession(self, total_steps, saves)


class _TorchTitanSession(Session):
    rule: TorchTitan

    def condition(self, save: PlannedSave, gen: Gen) -> Condition:
        if save.cls == "final":
            return Permanent("final")
        if self.rule.keep_latest_k == 0:
            return Permanent("keep_all")
        timing = Timing.AFTER_DISPATCH if self.rule.async_mode else Timing.AFTER_COMMIT
        return AfterNewer(self.rule.keep_latest_k, "interval", timing)

    def _purge(self, gen: Gen) -> list[Gen]:
        k = self.rule.keep_latest_k
        if gen.cls != "interval" or k == 0:
            return []  # the last step returns before the purge
        listed = sorted((g for g in self.live if parse_step(g.name) is not None),
                        key=lambda g: (parse_step(g.name), g.gen))
        return listed[:-k]

    def after_dispatch(self, gen: Gen) -> list[Gen]:
        return self._purge(gen) if self.rule.async_mode else []

    def after_commit(self, gen: Gen) -> list[Gen]:
        return [] if self.rule.async_mode else self._purge(gen)
