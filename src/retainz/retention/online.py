"""Save-time hints for a live run: a rule and the step being saved -> the hint, without a trace.

A storage plugin (the DCP writer, the ``retainz://`` file system, the mount, the retention callbacks)
knows the rule (from configuration) and the step (parsed from the checkpoint id,
:func:`~retainz.retention.steps.parse_step`), and may not know how long the run will be.
:func:`save_hint` builds the rule's save schedule far enough ahead for every condition to resolve
(or up to ``total_steps`` when given) and returns the hint the runtime could honestly give for a
save at that step: the same :class:`~retainz.hint.Hint` the driven run gives (the retention rules
are the only predictor).  It keeps no history: top-k rules (Lightning with a monitor, HF with a
metric) give an :class:`~retainz.retention.conditions.Uncertain` condition without an estimate, so
their predicted reclaim step is ``None``.

:func:`explicit_hint` is the hint of a condition the caller states for one save
(``ZonedStorageWriter.set_condition``): ``permanent``, ``at_step:N`` or ``after:N``.
"""

from __future__ import annotations

import dataclasses
import functools
from bisect import bisect_left

from retainz.hint import Hint, lifetime_class
from retainz.retention.base import Gen, Rule, Session, parse_rule
from retainz.retention.conditions import NEVER, AtStep, Permanent, PlannedSave

__all__ = ["save_hint", "rule_hint", "explicit_hint"]

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

    A save at step 0 (TorchTitan's seed checkpoint ``step-0``, which its purge counts like any
    ``step-N``) is planned as the first save of a run starting at step 0.

    Args:
        rule: a parsed rule (:func:`~retainz.retention.parse_rule`).
        step: the training step being saved (steps, >= 0).
        total_steps: the run's last step, when known (then saves that survive the run are permanent);
            ``None``: the run continues well past this save.
        cls: the save's class when the rule saves several at one step (Megatron at the end of training,
            Lightning ``topk``/``last``); default: the first planned save at that step.

    Raises:
        ValueError: ``step < 0``, or ``total_steps < step``.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if getattr(rule, "metric", None) not in (None, "none", "synthetic", "plateau"):
        rule = dataclasses.replace(rule, metric="synthetic")  # no history: the values are never used
    # plan a window of saves from a little before the step to well after it (cached per window)
    h = _horizon(rule)
    first = max(1, (step // h) * h) if step else 0
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


@functools.lru_cache(maxsize=32)
def _parsed(spec: str) -> Rule:
    return parse_rule(spec)


def rule_hint(rule: str | Rule | None, step: int | None, *, condition: str | Hint | None = None) -> Hint | None:
    """The placement hint of one save of a live run: the one hint computation every face and the node
    service use (through :mod:`retainz.jobs.life` or directly).

    A condition stated for the save wins (a :class:`~retainz.hint.Hint` as is, or the text
    :func:`explicit_hint` reads); else :func:`save_hint` for ``rule`` given as text
    (``"torchtitan:interval=500,keep_latest_k=10"``, parsed once per text) or as a :class:`Rule`;
    ``None`` without a rule, or when the checkpoint id named no step.

    Raises:
        ValueError: a malformed rule (:func:`~retainz.retention.parse_rule`'s one line) or condition,
            ``step < 0``.
    """
    if isinstance(condition, Hint):
        return condition
    if condition:
        return explicit_hint(condition, step)
    if not rule or step is None:
        return None
    return save_hint(_parsed(rule) if isinstance(rule, str) else rule, step)


#: The explicit conditions :func:`explicit_hint` reads.
EXPLICIT = ("permanent", "at_step:N", "after:N")


def explicit_hint(condition: str, step: int | None) -> Hint:
    """The hint of a condition stated for one save: ``"permanent"`` (never retired), ``"at_step:N"``
    (retired at step N) or ``"after:N"`` (retired N steps after the save).

    The condition becomes :class:`~retainz.retention.conditions.Permanent` (reason ``explicit``) or
    :class:`~retainz.retention.conditions.AtStep`; its lifetime class uses the default bounds
    (:func:`retainz.hint.lifetime_class`: no rule gives an interval); NOT_SET for ``at_step:N``
    without the save's step.

    Args:
        condition: the condition text.
        step: the save's training step (``None``: unknown; ``after:N`` then predicts nothing).

    Raises:
        ValueError: any other text (one line listing the valid forms).
    """
    c = condition.strip().lower()
    kind, _, value = c.partition(":")
    if c in ("permanent", "never"):
        cond, pred = Permanent("explicit"), NEVER
    elif kind in ("at_step", "after") and value.strip().isdigit():
        n = int(value)
        if kind == "at_step":
            cond, pred = AtStep(n), n
        elif step is None:
            return Hint()
        else:
            cond, pred = AtStep(step + n), step + n
    else:
        raise ValueError(f"retention condition {condition!r}: expected {', '.join(EXPLICIT)}")
    # without the save's step a finite prediction has no known lifetime, so no class
    life = lifetime_class(pred if step is not None or pred == NEVER else None, step or 0)
    return Hint(pred, life, cond.describe())
