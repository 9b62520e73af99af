"""Retention hints for the integrations: a runtime's retention rule + a step -> a placement ``Hint``.

A storage plugin sees only a checkpoint id; the step comes from the id (``parse_step``: ``step-N``,
``iter_N``, ``checkpoint-N``, ``global_stepN``) and the death time from the runtime's retention rule,
given as a rule string (``"torchtitan:interval=500,keep_latest_k=10"``) or an explicit condition per
save.  All of it is a *hint*: placement uses it, correctness never depends on it.

:func:`retention_hint` is the one switch point between ``retainz.retention`` (the project's retention
rules: ``parse_rule`` + ``hint_for_save``, used for every rule it knows: torchtitan, megatron,
lightning, hf, accelerate, orbax) and this module's small built-in predictor, used for rule names the
project's module does not know (``megatron-nonpersistent``, ``keep_all``) and for step 0.

Built-in predictions (steps; ``PERMANENT`` = never retired during the run):

* ``torchtitan:interval=I,keep_latest_k=K`` (TorchTitan ``[checkpoint]`` config): retired when the save
  ``K`` intervals later completes: ``step + K*I``; ``K=0`` keeps all (permanent).
* ``megatron:save_interval=S,retain_interval=R`` (Megatron ``--save-interval``,
  ``--save-retain-interval``): every ``R``-th step is permanent, any other save dies when the next
  persistent save commits: ``step + S``.  Without ``retain_interval`` Megatron keeps everything.
* ``megatron-nonpersistent:interval=N`` (``--non-persistent-save-interval``, global type): deleted at
  the start of the second-next non-persistent save: ``step + 2*N``.
* ``lightning:every_n_train_steps=N,save_top_k=K`` (``ModelCheckpoint`` without a monitor): the previous
  file is deleted after each new save: ``step + K*N``; ``K=-1`` keeps all.
* ``keep_all`` / ``permanent``: permanent.

Explicit conditions: ``"permanent"``, ``"at_step:N"``, ``"after:N"`` (``N`` steps after the save).
"""

from __future__ import annotations

import importlib

from retainz.placement.base import PERMANENT, Hint

__all__ = ["retention_hint", "parse_rule_string", "step_of"]

# ZenFS write-lifetime classes (WLTH_*), as placement.base.Hint documents them.
_SHORT, _MEDIUM, _LONG, _EXTREME = 2, 3, 4, 5


def step_of(checkpoint_id: str) -> int | None:
    """Training step named by a checkpoint id (``retainz.retention.steps.parse_step``), or ``None``."""
    from retainz.retention.steps import parse_step

    return parse_step(str(checkpoint_id))


def parse_rule_string(rule: str) -> tuple[str, dict[str, int]]:
    """Split ``"name:key=value,..."`` into ``(name, {key: int})``.

    Raises:
        ValueError: malformed text (the message quotes it).
    """
    name, _, rest = rule.strip().partition(":")
    params: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"retention rule {rule!r}: expected key=value, got {part!r}")
        try:
            params[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"retention rule {rule!r}: {key.strip()} must be an integer, got {value!r}") from None
    if not name:
        raise ValueError(f"retention rule {rule!r}: no runtime name")
    return name.strip().lower(), params


def _lifetime(step: int, reclaim: float | None, interval: int) -> int:
    if reclaim is None:
        return 0
    if reclaim == PERMANENT:
        return _EXTREME
    saves = (reclaim - step) / max(interval, 1)
    return _SHORT if saves <= 2 else _MEDIUM if saves <= 10 else _LONG


def _builtin(rule: str, step: int) -> Hint:
    name, p = parse_rule_string(rule)
    if name in ("keep_all", "permanent"):
        return Hint(PERMANENT, _EXTREME, "permanent")
    if name == "torchtitan":
        interval, k = p.get("interval", 500), p.get("keep_latest_k", 10)
        if k == 0:
            return Hint(PERMANENT, _EXTREME, "permanent:keep_latest_k=0")
        reclaim = step + k * interval
        return Hint(reclaim, _lifetime(step, reclaim, interval), f"after_newer:k={k}")
    if name == "megatron":
        s, r = p.get("save_interval", 1000), p.get("retain_interval", 0)
        if not r or step % r == 0:
            return Hint(PERMANENT, _EXTREME, "permanent" + (f":every_{r}" if r else ""))
        return Hint(step + s, _lifetime(step, step + s, s), "after_newer:k=1")
    if name in ("megatron-nonpersistent", "megatron_nonpersistent"):
        n = p.get("interval", 100)
        return Hint(step + 2 * n, _SHORT, "after_newer:k=2:before_save")
    if name == "lightning":
        n, k = p.get("every_n_train_steps", 1), p.get("save_top_k", 1)
        if k < 0:
            return Hint(PERMANENT, _EXTREME, "permanent:save_top_k=-1")
        reclaim = step + k * n
        return Hint(reclaim, _lifetime(step, reclaim, n), f"after_newer:k={k}")
    raise ValueError(f"retention rule {rule!r}: unknown runtime {name!r} (known: torchtitan, megatron, "
                     "megatron-nonpersistent, lightning, keep_all)")


def _condition_hint(condition: str, step: int) -> Hint:
    c = condition.strip().lower()
    if c in ("permanent", "never"):
        return Hint(PERMANENT, _EXTREME, "permanent")
    kind, _, value = c.partition(":")
    if kind in ("at_step", "after") and value.strip().isdigit():
        reclaim = int(value) if kind == "at_step" else step + int(value)
        return Hint(reclaim, _lifetime(step, reclaim, max(reclaim - step, 1) // 2 or 1), c)
    raise ValueError(f"retention condition {condition!r}: expected 'permanent', 'at_step:N' or 'after:N'")


def retention_hint(step: int | None, *, rule: str | None = None, condition: str | Hint | None = None) -> Hint | None:
    """The placement hint for a save at ``step``.

    Args:
        step: the save's training step (from the checkpoint id; ``None`` if it names none).
        rule: the runtime's retention rule string, e.g. ``"torchtitan:interval=500,keep_latest_k=10"``.
        condition: an explicit condition for this save (wins over ``rule``): a :class:`Hint`, or
            ``"permanent"``, ``"at_step:N"``, ``"after:N"``.

    Returns:
        A :class:`~retainz.placement.base.Hint`, or ``None`` when nothing is known (no rule, no
        condition, or no step).

    Raises:
        ValueError: a malformed rule or condition.
    """
    if isinstance(condition, Hint):
        return condition
    if step is None:
        return Hint(None, 0, condition or rule or "") if (condition or rule) else None
    if condition:
        return _condition_hint(condition, step)
    if not rule:
        return None
    retention = importlib.import_module("retainz.retention")
    parse_rule = getattr(retention, "parse_rule", None)
    hint_fn = getattr(retention, "hint_for_save", None)
    if parse_rule is not None and hint_fn is not None and step >= 1:   # the project's retention rules
        try:
            parsed = parse_rule(rule)
        except ValueError as e:
            if not str(e).startswith("unknown retention rule"):
                raise
        else:
            return hint_fn(parsed, step)
    return _builtin(rule, step)
