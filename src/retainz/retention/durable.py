"""Keep until durable: the predicted reclaim step of a generation that is retired only once promoted.

A rule that says "keep until durable" (docs/tiers.md, "Keep until durable") retires the local copy of a
generation it no longer keeps only after that generation's promotion to the durable tier has been
verified.  Its local reclaim step is therefore

    ``max(retirement step, promotion finished step)``

and a prediction of it is ``max(the rule's predicted reclaim step, the expected promotion finish)``:
:func:`until_durable`.  The runtime side supplies the expected finish: the promoter's expected delay
in seconds (:meth:`retainz.tier.Promoter.expected_delay`, from the bandwidth it measured, or its cap
before any measurement) turned into training steps by the run's own pace (:class:`StepRate`, measured
from the saves); trace replay supplies it in steps directly (its promotion queue,
:mod:`retainz.trace.promotion`).  The data flows runtime -> retention -> store -> placement: placement
only ever sees the resulting :class:`~retainz.hint.Hint`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

from retainz.hint import DEFAULT_MEDIUM, DEFAULT_SHORT, Hint, lifetime_class
from retainz.retention.conditions import UntilDurable

__all__ = ["until_durable", "StepRate"]


def until_durable(hint: Hint, step: int, durable_step: float | None, *, short: int = DEFAULT_SHORT,
                  medium: int = DEFAULT_MEDIUM) -> Hint:
    """The hint of a generation kept until durable: its predicted reclaim step is at least the step
    its promotion is expected to finish.

    ============================================  ===================================================
    the rule's prediction (``hint.reclaim_step``)  the result
    ============================================  ===================================================
    ``math.inf`` (permanent)                       unchanged: never retired, whenever it is promoted
    finite ``r >= durable_step``                   unchanged: promoted before the rule retires it
    finite ``r < durable_step``, or ``None``       the promotion decides: reclaim step
    (unknown)                                      ``ceil(durable_step)``, condition
                                                   :class:`~retainz.retention.conditions.UntilDurable`
                                                   (the rule's condition kept inside it), the lifetime
                                                   class of the longer life (never shorter than the rule's)
    ============================================  ===================================================

    The new condition's kind matters to placement: a top-k save (an ``uncertain`` death) whose
    expected eviction comes before its promotion is verified dies when the promotion does, a death
    the runtime can predict, so it is placed as one (RetainZ's uncertain-save rule no longer keeps
    it apart; the ``tier`` experiment measures what that rule costs under a promotion backlog,
    docs/results.md).  ``durable_step=None`` (no expectation: no bandwidth known, or the run's pace
    not measured yet) returns the hint unchanged.

    Args:
        hint: the rule's hint for the save (:func:`retainz.retention.save_hint`).
        step: the save's training step (steps).
        durable_step: the step its promotion is expected to be verified at (steps), or ``None``.
        short, medium: the lifetime class bounds of the rule's save interval
            (:func:`retainz.hint.class_bounds`).

    Returns:
        A :class:`~retainz.hint.Hint` (``hint`` itself when nothing changes).

    Raises:
        ValueError: ``durable_step`` is NaN.
    """
    if durable_step is None:
        return hint
    if isinstance(durable_step, float) and math.isnan(durable_step):
        raise ValueError("durable_step must be a step, not NaN")
    r = hint.reclaim_step
    if r is not None and (math.isinf(r) or r >= durable_step):
        return hint
    at = math.ceil(durable_step)
    cls = max(hint.lifetime, lifetime_class(at, step, short=short, medium=medium))
    return replace(hint, reclaim_step=at, lifetime=cls, condition=UntilDurable(at, hint.condition).describe())


class StepRate:
    """The run's pace in training steps per second, measured from its saves (the runtime's clock).

    :meth:`observe` each save's step with the time it started; :meth:`steps_in` turns a delay in
    seconds into steps: ``seconds * (s_last - s_first) / (t_last - t_first)`` over the last
    ``window`` saves (a run that speeds up or slows down is followed).

    Args:
        window: saves kept (>= 2).

    Raises:
        ValueError: ``window < 2``.
    """

    def __init__(self, window: int = 8):
        if window < 2:
            raise ValueError(f"window must be at least 2 saves, not {window}")
        self._seen: deque[tuple[int, float]] = deque(maxlen=window)

    def observe(self, step: int, seconds: float) -> None:
        """A save at training ``step`` started at ``seconds`` (a monotonic clock).  A step not after
        the last one seen (a resumed or repeated save) restarts the window."""
        if self._seen and step <= self._seen[-1][0]:
            self._seen.clear()
        self._seen.append((step, seconds))

    def steps_per_second(self) -> float | None:
        """Steps per second over the window, or ``None`` before two saves with time between them."""
        if len(self._seen) < 2:
            return None
        (s0, t0), (s1, t1) = self._seen[0], self._seen[-1]
        if t1 <= t0:
            return None
        return (s1 - s0) / (t1 - t0)

    def steps_in(self, seconds: float | None) -> float | None:
        """``seconds`` of wall time in training steps at the measured pace; ``None`` when either is
        unknown."""
        rate = self.steps_per_second()
        if seconds is None or rate is None:
            return None
        return seconds * rate
