"""The Lightning / NeMo retention rule (:class:`Lightning`; see :mod:`.rules`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from retainz.retention.base import EmpiricalLifetimes, Gen, Rule, Session, register_rule
from retainz.retention.conditions import (
    NEVER,
    AfterNewer,
    Condition,
    Permanent,
    PlannedSave,
    Timing,
)
from retainz.retention.metrics import MetricSeries
from retainz.retention.rules_common import check_steps, metric_series, multiples, positive

__all__ = ["Lightning"]


# -- Lightning / NeMo --------------------------------------------------------------------------------

class _TopK:
    """Lightning ``ModelCheckpoint`` top-k bookkeeping (``best_k_models``, ``kth_best_model_path``)."""

    def __init__(self, k: int, mode: str):
        self.k = k
        self.mode = mode
        self.best: dict[int, float] = {}  # gen -> value, insertion order

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def kth(self) -> int:
        # max() / min() return the first of equal values, in insertion order, as Lightning's do
        pick = max if self.mode == "min" else min
        return pick(self.best, key=self.best.get)

    def accepts(self, value: float) -> bool:
        """``check_monitor_top_k``: room left, or strictly better than the k-th best."""
        if self.k == -1 or len(self.best) < self.k:
            return True
        return self._better(value, self.best[self.kth()])

    def rank(self, value: float) -> int:
        """1-based rank the value would take (after equal values already kept)."""
        return 1 + sum(1 for v in self.best.values() if not self._better(value, v))

    def insert(self, gen: int, value: float) -> int | None:
        """Insert; returns the evicted generation, if any (computed before insertion, as Lightning)."""
        evict = self.kth() if self.k > 0 and len(self.best) == self.k else None
        if evict is not None:
            del self.best[evict]
        self.best[gen] = value
        return evict


@register_rule
@dataclass(frozen=True)
class Lightning(Rule):
    """Lightning ``ModelCheckpoint`` (every_n_train_steps, save_top_k, monitor, mode, save_last); NeMo uses
    the same callback (monitor val_loss, save_top_k=3, save_last=True).

    * Every n training steps the callback runs.  With a monitor, the checkpoint is written only if it
      enters the top k (strictly better than the k-th best, or fewer than k kept); the k-th best is
      deleted *after* the new file is saved.  Retirement depends on future metric values: the hint is
      :class:`~retainz.retention.conditions.Uncertain` with the earliest possible step and an empirical
      estimate.
    * Without a monitor (``metric=none``) ``save_top_k`` must be -1, 0 or 1 (Lightning rejects more);
      with 1 the previous file is deleted after each new save.
    * ``save_last``: ``last.ckpt`` rewritten at every trigger (atomically: the previous one is gone once
      the new one is in place).

    Attributes:
        every_n_train_steps: callback interval (steps).
        save_top_k: k (-1 keeps all, 0 none).
        metric: ``synthetic`` or ``plateau`` (seeded validation-loss curves), ``none`` (no monitor), or a ``STEP VALUE``
            file.
        mode: ``min`` or ``max``.
        save_last: also keep ``last.ckpt``.
    """

    name = "lightning"
    source = "Lightning ModelCheckpoint / NeMo: every_n_train_steps, save_top_k, monitor, mode, save_last"

    every_n_train_steps: int = field(metadata={"help": "callback interval (steps)"})
    save_top_k: int = field(default=1, metadata={"help": "top k kept by the metric; -1 all; 0 none"})
    metric: str = field(default="synthetic", metadata={
        "help": "monitored metric: synthetic or plateau (seeded), none (no monitor), or a 'STEP VALUE' file"})
    mode: str = field(default="min", metadata={"help": "min or max", "choices": ("min", "max")})
    save_last: bool = field(default=False, metadata={"help": "also write last.ckpt at every trigger"})

    def __post_init__(self):
        positive(self.name, every_n_train_steps=self.every_n_train_steps)
        if self.save_top_k < -1:
            raise ValueError(f"retention rule lightning: save_top_k must be >= -1, got {self.save_top_k}")
        if self.metric == "none" and self.save_top_k not in (-1, 0, 1):
            raise ValueError(f"retention rule lightning: save_top_k={self.save_top_k} needs a monitored metric "
                             "(Lightning rejects save_top_k > 1 with monitor=None); use metric=synthetic or "
                             "metric=FILE")

    @property
    def monitored(self) -> bool:
        return self.metric != "none"

    @property
    def base_interval(self) -> int:
        return self.every_n_train_steps

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        check_steps(total_steps, first_step)
        n = self.every_n_train_steps
        triggers = list(multiples(n, first_step, total_steps))
        series = metric_series(self.metric, triggers, seed) if self.monitored else None
        saves = []
        topk = _TopK(self.save_top_k, self.mode)
        for i, s in enumerate(triggers):
            if self.save_top_k != 0:
                if series is None:
                    saves.append(PlannedSave(s, "topk", f"epoch=0-step={s}.ckpt"))
                elif topk.accepts(series.at(s)):
                    topk.insert(i, series.at(s))
                    saves.append(PlannedSave(s, "topk", f"epoch=0-step={s}.ckpt"))
            if self.save_last:
                saves.append(PlannedSave(s, "last", "last.ckpt"))
        return _LightningSession(self, total_steps, saves, series)


class _LightningSession(Session):
    rule: Lightning

    def __init__(self, rule, total_steps, saves, series: MetricSeries | None):
        super().__init__(rule, total_steps, saves)
        self.series = series
        self.topk = _TopK(rule.save_top_k, rule.mode)
        self.estimator = EmpiricalLifetimes()
        self._rank: dict[int, int] = {}

    def condition(self, save: PlannedSave, gen: Gen) -> Condition:
        r = self.rule
        if save.cls == "last":
            return AfterNewer(1, "last", Timing.AFTER_COMMIT)
        if r.save_top_k == -1:
            return Permanent("keep_all")
        if self.series is None:  # no monitor, k == 1
            return AfterNewer(1, "topk", Timing.AFTER_COMMIT)
        rank = self.topk.rank(self.series.at(save.step))
        self._rank[gen.gen] = rank
        # k - rank + 1 strictly better saves are needed to push it out; at most one per trigger
        earliest = save.step + (r.save_top_k - rank + 1) * r.every_n_train_steps
        return self.estimator.estimate(rank, save.step, earliest if earliest <= self.total_steps else NEVER)

    def after_commit(self, gen: Gen) -> list[Gen]:
        r = self.rule
        if gen.cls == "last":
            return [g for g in self.live_of("last") if g is not gen]
        if r.save_top_k == -1:
            return []
        if self.series is None:
            return [g for g in self.live_of("topk") if g is not gen]
        self.estimator.admit(gen.gen, self._rank.pop(gen.gen), gen.step)
        evict = self.topk.insert(gen.gen, self.series.at(gen.step))
        return [g for g in self.live if g.gen == evict]

    def on_deleted(self, gen: Gen, step: int) -> None:
        self.estimator.retire(gen.gen, step)

    def on_abandoned(self, gen: Gen) -> None:
        self._rank.pop(gen.gen, None)
