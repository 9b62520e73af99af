"""Retention without configuration: infer a runtime's retention rule from its saves and deletions.

A runtime that writes through ``retainz mount --retention auto`` (or a trace replayed with the
``retainz-inferred`` policy) never names its rule; what the store sees is a series of saves (a new
checkpoint in a folder, with the step its name gives) and deletions.  :class:`RetentionInference`
watches those events per folder (a *series*) and, once the evidence is consistent, predicts each new
save's reclaim step as the rule it recognised would:

==================  ==========================================================  =====================
inferred rule       evidence                                                    predicted reclaim step
==================  ==========================================================  =====================
``keep_latest``     every deletion retires the oldest live save, and the same   ``step + k * I``
                    ``k`` saves are live after each one (HF ``save_total_limit``,
                    TorchTitan ``keep_latest_k``, Lightning without a monitor)
``retain_interval`` as ``keep_latest``, but older saves at multiples of ``R``    ``NEVER`` on
                    are skipped and never retired (Megatron                     multiples of ``R``,
                    ``--save-retain-interval``)                                 else ``step + k * I``
``top_k_like``      deletions out of save order (a top-k by a metric: HF        ``step + L``, ``L``
                    ``metric_for_best_model``, Lightning ``monitor``)           the median observed
                                                                                lifetime
``keep_all``        at least :attr:`RetentionInference.keep_all_after` saves     ``NEVER``
                    and no deletion
==================  ==========================================================  =====================

``I`` is the median step interval between saves.  Before :attr:`RetentionInference.min_deletions`
consistent deletions have been seen, the hint is ``None`` (the placement's "unknown").  Every hint's
``condition`` names the inferred rule (``inferred:keep_latest:k=2,interval=500``): it is journaled
with the generation's commit, so what was inferred is recorded with the data.

Only placement uses the prediction; a wrong inference costs write amplification, never data.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from retainz.hint import Hint, lifetime_class
from retainz.retention.conditions import NEVER

__all__ = ["RetentionInference", "InferredRule"]


@dataclass
class InferredRule:
    """What :class:`RetentionInference` believes about one series.

    Attributes:
        name: ``keep_latest``, ``retain_interval``, ``top_k_like`` or ``keep_all``.
        interval: median steps between saves.
        k: saves kept live (keep_latest, retain_interval).
        retain: ``R`` of retain_interval (steps).
        lifetime: median observed lifetime in steps (top_k_like).
        evidence: deletions (or saves, for keep_all) the inference rests on.
    """

    name: str
    interval: int
    k: int = 0
    retain: int = 0
    lifetime: int = 0
    evidence: int = 0

    def describe(self) -> str:
        """``inferred:NAME:key=value,...`` (the hint's condition string)."""
        params = {"keep_latest": f"k={self.k},interval={self.interval}",
                  "retain_interval": f"k={self.k},interval={self.interval},retain={self.retain}",
                  "top_k_like": f"lifetime={self.lifetime}",
                  "keep_all": f"interval={self.interval}"}[self.name]
        return f"inferred:{self.name}:{params}"

    def reclaim_step(self, step: int) -> float:
        """Predicted reclaim step of a save at ``step`` (``NEVER`` = never)."""
        if self.name == "keep_all" or (self.name == "retain_interval" and step % self.retain == 0):
            return NEVER
        if self.name == "top_k_like":
            return step + self.lifetime
        return step + self.k * self.interval


@dataclass
class _Series:
    saves: list[tuple[int, str]] = field(default_factory=list)     # (step, key) in save order
    live: dict[str, int] = field(default_factory=dict)              # key -> step
    deletions: list[tuple[int, int, tuple[str, ...]]] = field(default_factory=list)
    # (younger saves still live, lifetime in steps, keys older than it still live)
    deleted: set[str] = field(default_factory=set)
    last_step: int = 0
    rule: InferredRule | None = None


class RetentionInference:
    """Online inference of retention rules, one per series (folder).

    Call :meth:`observe_save` when a save begins, :meth:`observe_delete` when one is retired,
    :meth:`observe_abort` when one is abandoned (no evidence), and :meth:`hint` for a new save's
    placement hint.

    Attributes:
        min_deletions: consistent deletions needed before a keep-latest or retain-interval rule is
            trusted (top-k-like needs this many too).
        keep_all_after: saves without any deletion after which the series is taken to keep all
            (well above the runtimes' keep-latest windows: TorchTitan's default ``keep_latest_k`` is
            10, and a window mistaken for keep-all would mark every save permanent).
    """

    def __init__(self, min_deletions: int = 3, keep_all_after: int = 32):
        self.min_deletions = min_deletions
        self.keep_all_after = keep_all_after
        self._series: dict[str, _Series] = {}
        self._where: dict[str, str] = {}

    # -- events ------------------------------------------------------------------------------------
    def observe_save(self, series: str, key: str, step: int) -> None:
        """A save ``key`` at ``step`` (steps) began in ``series``."""
        s = self._series.setdefault(series, _Series())
        if key in s.live:
            return
        s.saves.append((step, key))
        s.live[key] = step
        s.last_step = max(s.last_step, step)
        self._where[key] = series
        s.rule = self._infer(s)

    def observe_delete(self, key: str, step: int | None = None) -> None:
        """Save ``key`` was retired (at ``step``, default: the series' latest save step)."""
        series = self._where.pop(key, None)
        if series is None:
            return
        s = self._series[series]
        born = s.live.pop(key, None)
        if born is None:
            return
        older = tuple(sorted((k for k, st in s.live.items() if st < born), key=lambda k: s.live[k]))
        at = s.last_step if step is None else step
        s.deletions.append((len(s.live) - len(older), max(0, at - born), older))
        s.deleted.add(key)
        s.rule = self._infer(s)

    def observe_abort(self, key: str) -> None:
        """Save ``key`` never committed (a crash): forget it without counting a deletion."""
        series = self._where.pop(key, None)
        if series is not None:
            s = self._series[series]
            if s.live.pop(key, None) is not None:
                s.saves = [(st, k) for st, k in s.saves if k != key]

    # -- inference ---------------------------------------------------------------------------------
    def _infer(self, s: _Series) -> InferredRule | None:
        steps = sorted({st for st, _ in s.saves})
        gaps = [b - a for a, b in zip(steps, steps[1:], strict=False) if b > a]
        interval = int(statistics.median(gaps)) if gaps else 0
        dels = s.deletions
        if not dels:
            if len(s.saves) >= self.keep_all_after and interval:
                return InferredRule("keep_all", interval, evidence=len(s.saves))
            return None
        if len(dels) < self.min_deletions or not interval:
            return None
        skipped = {k for *_, older in dels for k in older}
        ks = {younger for younger, _, _ in dels[-self.min_deletions:]}
        if not (skipped & s.deleted) and len(ks) == 1:   # oldest first, skipped saves never retired
            k = max(1, ks.pop())
            if not skipped:
                return InferredRule("keep_latest", interval, k=k, evidence=len(dels))
            retain = 0
            for st in (s.live[k_] for k_ in skipped if k_ in s.live):
                retain = math.gcd(retain, st)
            if retain >= interval and retain % interval == 0:
                return InferredRule("retain_interval", interval, k=k, retain=retain, evidence=len(dels))
        lifetime = int(statistics.median(life for _, life, _ in dels))
        return InferredRule("top_k_like", interval, lifetime=max(lifetime, interval), evidence=len(dels))

    def rule(self, series: str) -> InferredRule | None:
        """The rule inferred for ``series`` so far (``None``: not confident yet)."""
        s = self._series.get(series)
        return s.rule if s is not None else None

    def hint(self, series: str, step: int | None) -> Hint | None:
        """The hint for a new save at ``step`` in ``series`` (its condition is the inferred rule's
        description, e.g. ``keep_latest:k=3,interval=500``), or ``None`` while nothing is inferred (or
        the save names no step)."""
        r = self.rule(series)
        if r is None or step is None:
            return None
        reclaim = r.reclaim_step(step)
        return Hint(reclaim, lifetime_class(reclaim, step), r.describe())

    def summary(self) -> dict:
        """``{series: {"rule": condition string or None, "saves": n, "deletions": n}}`` (JSON-able)."""
        return {name: {"rule": s.rule.describe() if s.rule else None, "saves": len(s.saves),
                       "deletions": len(s.deletions)} for name, s in sorted(self._series.items())}
