"""The the Hugging Face Trainer retention rule (:class:`HFTrainer`; see :mod:`.rules`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from retainz.retention.base import EmpiricalLifetimes, Gen, Rule, Session, register_rule
from retainz.retention.conditions import (
    AfterNewer,
    Condition,
    Permanent,
    PlannedSave,
    Timing,
)
from retainz.retention.metrics import MetricSeries
from retainz.retention.rules_common import check_steps, metric_series, multiples, positive
from retainz.retention.steps import parse_step

__all__ = ["HFTrainer"]


# -- HF Trainer ---------------------------------------------------------------------------------------

@register_rule
@dataclass(frozen=True)
class HFTrainer(Rule):
    """Hugging Face ``Trainer`` (``TrainingArguments.save_steps``, ``save_total_limit``,
    ``load_best_model_at_end`` + ``metric_for_best_model``, ``greater_is_better``).

    * Saves ``checkpoint-{N}`` every ``save_steps`` and at the end of training (save_strategy steps).
    * Rotation after the new checkpoint is written: checkpoints sorted by step, the best one (when a
      metric is tracked) moved to the second-newest place, all but the last ``save_total_limit`` deleted
      (2 when the limit is 1 and the best is not the newest): effectively L-1 recent plus the best.
    * Without a metric a checkpoint goes when the L-th newer save commits (exact); with one, whether the
      best pins it depends on future values (uncertain).

    Attributes:
        save_steps: save interval (steps).
        save_total_limit: checkpoints kept (unset keeps all).
        metric: ``synthetic`` or ``plateau`` (seeded curves, :mod:`retainz.retention.metrics`) or a ``STEP VALUE`` file (enables keeping the best); unset: none.
        greater_is_better: the metric's direction.
    """

    name = "hf"
    source = ("HF transformers Trainer: save_steps, save_total_limit, load_best_model_at_end + "
              "metric_for_best_model, greater_is_better")

    save_steps: int = field(default=500, metadata={"help": "save interval (steps)"})
    save_total_limit: int | None = field(default=None, metadata={"help": "checkpoints kept; unset keeps all"})
    metric: str | None = field(default=None, metadata={
        "help": "metric for the best checkpoint: synthetic or plateau (seeded curves) or a 'STEP VALUE' file; unset: no best kept"})
    greater_is_better: bool = field(default=False, metadata={"help": "metric direction"})

    def __post_init__(self):
        positive(self.name, save_steps=self.save_steps, save_total_limit=self.save_total_limit)

    @property
    def base_interval(self) -> int:
        return self.save_steps

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        check_steps(total_steps, first_step)
        steps = list(multiples(self.save_steps, first_step, total_steps))
        if not steps or steps[-1] != total_steps:
            steps.append(total_steps)
        series = metric_series(self.metric, steps, seed) if self.metric else None
        saves = [PlannedSave(s, "checkpoint", f"checkpoint-{s}") for s in steps]
        return _HFSession(self, total_steps, saves, series)


class _HFSession(Session):
    rule: HFTrainer

    def __init__(self, rule, total_steps, saves, series: MetricSeries | None):
        super().__init__(rule, total_steps, saves)
        self.series = series
        self.best: Gen | None = None
        self.best_value: float | None = None
        self.estimator = EmpiricalLifetimes()
        self._key: dict[int, str] = {}

    def _is_better(self, value: float) -> bool:
        if self.best_value is None:
            return True
        return value > self.best_value if self.rule.greater_is_better else value < self.best_value

    def condition(self, save: PlannedSave, gen: Gen) -> Condition:
        limit = self.rule.save_total_limit
        if limit is None:
            return Permanent("keep_all")
        if self.series is None:
            return AfterNewer(limit, "checkpoint", Timing.AFTER_COMMIT)
        key = "best" if self._is_better(self.series.at(save.step)) else "not_best"
        self._key[gen.gen] = key
        earliest = self.schedule.nth_after(save.step, "checkpoint", max(limit - 1, 1))
        return self.estimator.estimate(key, save.step, earliest)

    def after_commit(self, gen: Gen) -> list[Gen]:
        limit = self.rule.save_total_limit
        if self.series is not None:
            value = self.series.at(gen.step)
            if self._is_better(value):
                self.best, self.best_value = gen, value
            self.estimator.admit(gen.gen, self._key.pop(gen.gen), gen.step)
        if limit is None:
            return []
        ordered = sorted(self.live, key=lambda g: (parse_step(g.name) or 0, g.gen))
        if self.best is not None and self.best in ordered:
            i = ordered.index(self.best)
            for j in range(i, len(ordered) - 2):  # the best moves to the second-newest place
                ordered[j], ordered[j + 1] = ordered[j + 1], ordered[j]
        if self.best is not None and limit == 1 and ordered[-1] is not self.best:
            limit = 2
        return ordered[:max(0, len(ordered) - limit)]

    def on_deleted(self, gen: Gen, step: int) -> None:
        self.estimator.retire(gen.gen, step)

    def on_abandoned(self, gen: Gen) -> None:
        self._key.pop(gen.gen, None)
