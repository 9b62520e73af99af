"""The runtimes' retention rules, modelled on what their sources do (see
shared/reference/retention-runtimes.md for the facts and versions read).

Each rule is a frozen dataclass of the runtime's configuration; its session knows the save schedule,
the condition it can hint for each save, and when (relative to which save, and in which order) the
runtime deletes.  Command-line names:

* ``torchtitan:interval=500,keep_latest_k=10[,async=true][,last_save_model_only=true]``
* ``megatron:save_interval=1000[,retain_interval=5000][,non_persistent_interval=100][,non_persistent=global|local]``
* ``lightning:every_n_train_steps=500[,save_top_k=1][,metric=synthetic|none|FILE][,mode=min|max][,save_last=false]``
* ``hf:save_steps=500[,save_total_limit=3][,metric=synthetic|FILE][,greater_is_better=false]``
* ``accelerate:save_steps=500[,total_limit=3]``
* ``orbax:[latest=3][,every_steps=10000][,save_interval_steps=1]``
"""

from __future__ import annotations

import heapq
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
from retainz.retention.metrics import MetricSeries, load_metric_file, synthetic_loss
from retainz.retention.steps import parse_step

__all__ = ["TorchTitan", "Megatron", "Lightning", "HFTrainer", "Accelerate", "Orbax"]


def _positive(rule: str, **values: int | None) -> None:
    for key, v in values.items():
        if v is not None and v < 1:
            raise ValueError(f"retention rule {rule}: {key} must be >= 1, got {v}")


def _check_steps(total_steps: int, first_step: int = 1) -> None:
    if total_steps < 1:
        raise ValueError(f"a run needs at least 1 training step, got {total_steps}")
    if not 1 <= first_step <= total_steps:
        raise ValueError(f"first_step must be in 1..{total_steps}, got {first_step}")


def _multiples(interval: int, first: int, last: int) -> range:
    """Multiples of ``interval`` in ``[first, last]``."""
    return range(-(-first // interval) * interval, last + 1, interval)


def _metric_series(metric: str, steps: list[int], seed: int) -> MetricSeries:
    if metric == "synthetic":
        return synthetic_loss(steps, seed)
    series = load_metric_file(metric)
    for s in steps:
        series.at(s)  # every evaluated step needs a value: fail now, naming the step
    return series


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
        _positive(self.name, interval=self.interval)
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
        _check_steps(total_steps, first_step)
        saves = [PlannedSave(s, "interval", f"step-{s}")
                 for s in _multiples(self.interval, first_step, total_steps - 1)]
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
        _positive(self.name, save_interval=self.save_interval, retain_interval=self.retain_interval,
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
        _check_steps(total_steps, first_step)
        saves = []
        npi = self.non_persistent_interval
        prefix = "non_persistent/" if self.non_persistent == "global" else "local/"
        # O(saves), not O(steps): walk the multiples of both intervals (a persistent save wins a tie)
        persistent = _multiples(self.save_interval, first_step, total_steps)
        transient = (it for it in _multiples(npi, first_step, total_steps) if it % self.save_interval) if npi else ()
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
        olds = sorted(self.live_of("non_persistent"), key=lambda g: (g.step, g.gen))
        return olds[:-1]  # keep the single newest

    def after_commit(self, gen: Gen) -> list[Gen]:
        r = self.rule
        if gen.cls == "persistent":
            prev, self.tracker = self.tracker, gen
            if (r.retain_interval is not None and prev is not None and prev in self.live
                    and prev.step != gen.step and prev.step % r.retain_interval):
                return [prev]
            return []
        if r.non_persistent == "local":
            return [g for g in self.live_of("non_persistent") if g.step < gen.step]
        return []


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
        metric: ``synthetic`` (seeded validation-loss curve), ``none`` (no monitor), or a ``STEP VALUE``
            file.
        mode: ``min`` or ``max``.
        save_last: also keep ``last.ckpt``.
    """

    name = "lightning"
    source = "Lightning ModelCheckpoint / NeMo: every_n_train_steps, save_top_k, monitor, mode, save_last"

    every_n_train_steps: int = field(metadata={"help": "callback interval (steps)"})
    save_top_k: int = field(default=1, metadata={"help": "top k kept by the metric; -1 all; 0 none"})
    metric: str = field(default="synthetic", metadata={
        "help": "monitored metric: synthetic (seeded), none (no monitor), or a 'STEP VALUE' file"})
    mode: str = field(default="min", metadata={"help": "min or max", "choices": ("min", "max")})
    save_last: bool = field(default=False, metadata={"help": "also write last.ckpt at every trigger"})

    def __post_init__(self):
        _positive(self.name, every_n_train_steps=self.every_n_train_steps)
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
        _check_steps(total_steps, first_step)
        n = self.every_n_train_steps
        triggers = list(_multiples(n, first_step, total_steps))
        series = _metric_series(self.metric, triggers, seed) if self.monitored else None
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
        metric: ``synthetic`` or a ``STEP VALUE`` file (enables keeping the best); unset: none.
        greater_is_better: the metric's direction.
    """

    name = "hf"
    source = ("HF transformers Trainer: save_steps, save_total_limit, load_best_model_at_end + "
              "metric_for_best_model, greater_is_better")

    save_steps: int = field(default=500, metadata={"help": "save interval (steps)"})
    save_total_limit: int | None = field(default=None, metadata={"help": "checkpoints kept; unset keeps all"})
    metric: str | None = field(default=None, metadata={
        "help": "metric for the best checkpoint: synthetic or a 'STEP VALUE' file; unset: no best kept"})
    greater_is_better: bool = field(default=False, metadata={"help": "metric direction"})

    def __post_init__(self):
        _positive(self.name, save_steps=self.save_steps, save_total_limit=self.save_total_limit)

    @property
    def base_interval(self) -> int:
        return self.save_steps

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        _check_steps(total_steps, first_step)
        steps = list(_multiples(self.save_steps, first_step, total_steps))
        if not steps or steps[-1] != total_steps:
            steps.append(total_steps)
        series = _metric_series(self.metric, steps, seed) if self.metric else None
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
        _positive(self.name, save_steps=self.save_steps, total_limit=self.total_limit)

    @property
    def base_interval(self) -> int:
        return self.save_steps

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        del seed  # Ignored by this rule.
        _check_steps(total_steps, first_step)
        saves = [PlannedSave(s, "checkpoint", f"checkpoints/checkpoint_{s // self.save_steps - 1}")
                 for s in _multiples(self.save_steps, first_step, total_steps)]
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
        _positive(self.name, latest=self.latest, every_steps=self.every_steps,
                  save_interval_steps=self.save_interval_steps)

    @property
    def base_interval(self) -> int:
        return self.save_interval_steps

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        del seed  # Ignored by this rule.
        _check_steps(total_steps, first_step)
        saves = [PlannedSave(s, "step", str(s))
                 for s in _multiples(self.save_interval_steps, first_step, total_steps)]
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
