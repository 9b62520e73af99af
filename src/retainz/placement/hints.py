"""What a policy is allowed to know about a generation's death: the hint views.

The matched controls differ from ``retainz`` only in the view of the hint they place by
(issue 5, "Matched controls"): exact, none, coarse (four classes), noisy (seeded error) or oracle
(the actual deletion step).  Every view is a pure function of the request, so a generation gets the
same view for every extent, and a remounted store sees the same values.

The coarse view classifies a prediction with the one lifetime rule,
:func:`retainz.hint.lifetime_class` (the ``zenfs`` baseline uses it too when a hint carries no
class); :func:`class_reclaim_step` turns a class back into a step.  The class a retention rule gave,
``Hint.lifetime``, takes precedence.
"""

from __future__ import annotations

import math
import random

from retainz.hint import DEFAULT_MEDIUM, DEFAULT_SHORT, Hint, Lifetime, lifetime_class
from retainz.placement.base import PERMANENT, ExtentRequest

__all__ = ["class_reclaim_step", "view_reclaim_step", "VIEWS"]


def class_reclaim_step(cls: int, step: int, *, short: int = DEFAULT_SHORT,
                       medium: int = DEFAULT_MEDIUM) -> float | None:
    """The reclaim step a policy can infer from a lifetime class alone (the coarse view).

    Each finite class stands for the geometric middle of its lifetime range: SHORT ``short/2``,
    MEDIUM ``sqrt(short*medium)``, LONG ``4*medium`` steps after ``step``; EXTREME is permanent;
    NOT_SET and NONE are unknown.

    Args:
        cls: a :class:`~retainz.hint.Lifetime` class.
        step: the generation's training step.
        short, medium: the class bounds of :func:`lifetime_class` (steps).

    Returns:
        The inferred reclaim step (step), ``math.inf`` or ``None``.
    """
    if cls == Lifetime.SHORT:
        return step + short / 2
    if cls == Lifetime.MEDIUM:
        return step + math.sqrt(short * medium)
    if cls == Lifetime.LONG:
        return step + 4.0 * medium
    if cls == Lifetime.EXTREME:
        return PERMANENT
    return None


def _noisy(hint: Hint, generation: str, step: int, error: float, seed: int) -> float | None:
    r = hint.reclaim_step
    if r is None or r == PERMANENT or error <= 0:
        return r
    life = max(0.0, r - step)
    # One draw per (seed, generation): every extent and every GC copy of a generation agrees.
    eps = random.Random(f"{seed}:{generation}").uniform(-error, error)
    return step + life * (1.0 + eps)


#: The hint views of the controls, by name.
VIEWS = ("exact", "none", "coarse", "noisy", "oracle")


def view_reclaim_step(req: ExtentRequest, view: str, *, error: float = 0.0, seed: int = 0,
                      short: int = DEFAULT_SHORT, medium: int = DEFAULT_MEDIUM) -> float | None:
    """The predicted reclaim step a policy sees for ``req`` under a hint view.

    Views:
        * ``exact``: ``hint.reclaim_step`` as the retention module predicted it.
        * ``none``: always ``None`` (unknown).
        * ``coarse``: the hint's class (``hint.lifetime``, as the retention rule classified it),
          or :func:`~retainz.hint.lifetime_class` of the predicted step
          when the hint carries no class, turned back into a step by :func:`class_reclaim_step`.
        * ``noisy``: ``step + L * (1 + e)`` with ``L`` the predicted lifetime and ``e`` drawn
          uniformly from ``[-error, +error]`` once per generation (seeded by ``seed`` and the
          generation id); permanent and unknown stay as they are.
        * ``oracle``: ``hint.actual_reclaim_step`` (trace replay knows it), falling back to the
          prediction when the trace does not give it (the generation outlives the run).

    Args:
        req: the extent request.
        view: one of :data:`VIEWS`.
        error: relative error size for ``noisy`` (0.5 = up to +-50 % of the lifetime).
        seed: seed for ``noisy``.
        short, medium: class bounds for ``coarse`` (steps).

    Returns:
        A reclaim step (step), ``math.inf`` for permanent, or ``None`` for unknown.
    """
    hint = req.hint
    if view == "exact":
        return hint.reclaim_step
    if view == "none":
        return None
    if view == "coarse":
        cls = (hint.lifetime if hint.lifetime else
               lifetime_class(hint.reclaim_step, req.step, short=short, medium=medium))
        return class_reclaim_step(cls, req.step, short=short, medium=medium)
    if view == "noisy":
        return _noisy(hint, req.generation, req.step, error, seed)
    if view == "oracle":
        a = hint.actual_reclaim_step
        return hint.reclaim_step if a is None else a
    raise ValueError(f"unknown hint view {view!r}; valid: {', '.join(VIEWS)}")
