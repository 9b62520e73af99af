"""Save-time hints for a live run: a rule and the step being saved -> the hint, without a trace.

A storage plugin (the DCP writer, the fsspec file system) knows the rule (from configuration) and the
step (parsed from the checkpoint id), and may not know how long the run will be.  :func:`save_hint`
builds the rule's save schedule far enough ahead for every condition to resolve (or up to
``total_steps`` when given) and returns the hint the runtime could honestly give for a save at that
step.  It keeps no history: top-k rules (Lightning with a monitor, HF with a metric) give an
:class:`~retainz.retention.conditions.Uncertain` condition without an estimate, so their predicted
reclaim step is ``None``.
"""

from __future__ import annotations

import dataclasses
import functools
from bisect import bisect_left

from retainz.retention.base import Gen, Rule, Session
from retainz.retention.conditions import Hint, PlannedSave

__all__ = ["save_hint", "hint_for_save"]

_K_FIELDS = ("keep_latest_k", "save_total_limit", "total_limit", "latest", "save_top_k")
_INTERVAL_FIELDS = ("interval", "save_interval", "non_persistent_interval", "every_n_train_steps", "save_steps",
                    "save_interval_steps")
#: Class of a save made off the rule's schedule (TorchTitan saves off-interval only at the last step).
_OFF_SCHEDULE = {"torchtitan": "final", "megatron": "persistent"}


def _horizon(rule: Rule) -> int:
    ks = [getattr(rule, f, None) for f in _K_FIELDS]
    k = max([2] + [x for x in ks if isinstance(x, int) and x > 0])
    ivs = [getattr(rule, f, None) for f in _INTERVAL_FIELDS]
    return (k + 2) * max([1] + [x for x in ivs if isinstance(x, int) and x > 0])


@functools.lru_cache(maxsize=32)
def _session(rule: Rule, total_steps: int, first_step: int) -> Session:
    return rule.start(total_steps, first_step=first_step)


def save_hint(rule: Rule, step: int, *, total_steps: int | None = None, cls: str | None = None) -> Hint:
    """The hint for a save at ``step`` under ``rule``.

    Args:
        rule: a parsed rule (:func:`~retainz.retention.parse_rule`).
        step: the training step being saved (steps, >= 1).
        total_steps: the run's last step, when known (then saves that survive the run are permanent);
            ``None``: the run continues well past this save.
        cls: the save's class when the rule saves several at one step (Megatron at the end of training,
            Lightning ``topk``/``last``); default: the first planned save at that step.
    """
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    if getattr(rule, "metric", None) not in (None, "none", "synthetic", "plateau"):
        rule = dataclasses.replace(rule, metric="synthetic")  # no history: the values are never used
    # plan a window of saves from a little before the step to well after it (cached per window)
    h = _horizon(rule)
    first = max(1, (step // h) * h)
    if total_steps is None:
        total_steps = first + 3 * h
    elif total_steps < step:
        raise ValueError(f"step {step} is after the run's last step {total_steps}")
    session = _session(rule, total_steps, first)
    saves = session.schedule.saves
    steps = [s.step for s in saves]
    i = bisect_left(steps, step)
    planned = None
    while i < len(saves) and saves[i].step == step:
        if cls is None or saves[i].cls == cls:
            planned = saves[i]
            break
        i += 1
    if planned is None:
        fallback = cls or _OFF_SCHEDULE.get(rule.name) or (saves[0].cls if saves else "checkpoint")
        planned = PlannedSave(step, fallback, str(step))
    # the cached session never commits anything, so top-k rules see an empty history every time
    hint = session.hint(planned, Gen(-1, planned.name, step, planned.cls))
    for scratch in ("_rank", "_key"):
        getattr(session, scratch, {}).pop(-1, None)
    return hint


def hint_for_save(rule: Rule, step: int, *, total_steps: int | None = None, cls: str | None = None):
    """:func:`save_hint` as a placement ``Hint`` (``retainz.placement.base.Hint``: reclaim step, ZenFS
    lifetime value, condition string)."""
    from retainz.placement.base import Hint as PlacementHint

    h = save_hint(rule, step, total_steps=total_steps, cls=cls)
    return PlacementHint(h.predicted_reclaim_step, int(h.lifetime), h.condition.describe())
