"""The retention hint: what a runtime tells the store, at save time, about a checkpoint's death.

One :class:`Hint` travels every route unchanged: a retention rule makes it
(:func:`retainz.retention.save_hint`, or the trace generator driving the rule), the DCP writer,
the ``retainz://`` file system and the mount hand it to ``Store.begin_generation``, a trace
records it (:mod:`retainz.trace.format` encodes and decodes it), replay hands it to the store, the
store journals it with the generation, and placement reads it (``ExtentRequest.hint``).  It sits on
the lowest floor (beside :mod:`retainz.errors`, importing nothing of RetainZ) so that every one of
those layers can name it without importing another.

A hint is advice: placement uses it, correctness never depends on it.

The coarse form of a prediction is a ZenFS write-lifetime class (:class:`Lifetime`), and
:func:`lifetime_class` is the one rule that maps a predicted lifetime to a class.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

__all__ = [
    "Lifetime",
    "SHORT_MAX_INTERVALS",
    "MEDIUM_MAX_INTERVALS",
    "DEFAULT_INTERVAL",
    "DEFAULT_SHORT",
    "DEFAULT_MEDIUM",
    "class_bounds",
    "lifetime_class",
    "Hint",
]


class Lifetime(enum.IntEnum):
    """ZenFS write-lifetime hint classes: RocksDB ``Env::WriteLifeTimeHint`` (``WLTH_NOT_SET`` ..
    ``WLTH_EXTREME``, include/rocksdb/env.h), the values of Linux ``fcntl(F_SET_RW_HINT)``'s
    ``RWH_WRITE_LIFE_*``.  ZenFS keeps one per file (``ZoneFile::lifetime_``) and one per zone
    (``Zone::lifetime_``, fs/io_zenfs.cc, fs/zbd_zenfs.cc)."""

    NOT_SET = 0
    NONE = 1
    SHORT = 2
    MEDIUM = 3
    LONG = 4
    EXTREME = 5


#: Upper bounds (inclusive, in save intervals of the runtime) of the SHORT and MEDIUM classes.  Our
#: mapping, not upstream's (RocksDB gives classes by LSM level): keep-latest-2 and Megatron's global
#: non-persistent saves are SHORT, keep-latest-3..20 (TorchTitan's default ``keep_latest_k=10``
#: included) MEDIUM, longer windows LONG, every-R-th and final saves EXTREME.
SHORT_MAX_INTERVALS = 2
MEDIUM_MAX_INTERVALS = 20
#: The save interval the bounds are taken at when no rule gives one: TorchTitan's default
#: ``[checkpoint] interval`` (500 steps).
DEFAULT_INTERVAL = 500


def class_bounds(interval: int) -> tuple[int, int]:
    """The SHORT and MEDIUM upper bounds in steps of lifetime for a runtime saving every
    ``interval`` steps: ``(2 * interval, 20 * interval)``.

    Raises:
        ValueError: ``interval < 1``.
    """
    if interval < 1:
        raise ValueError(f"interval must be >= 1 step, got {interval}")
    return SHORT_MAX_INTERVALS * interval, MEDIUM_MAX_INTERVALS * interval


#: :func:`class_bounds` at :data:`DEFAULT_INTERVAL`: 1,000 and 10,000 steps.
DEFAULT_SHORT, DEFAULT_MEDIUM = class_bounds(DEFAULT_INTERVAL)


def lifetime_class(reclaim_step: float | None, step: int, *, short: int = DEFAULT_SHORT,
                   medium: int = DEFAULT_MEDIUM) -> Lifetime:
    """The write-lifetime class of data saved at ``step`` and predicted to die at ``reclaim_step``.

    With ``L = reclaim_step - step`` (steps):

    ======================  ============  ===============================================
    prediction              class         typical retirement condition
    ======================  ============  ===============================================
    unknown (``None``)      NOT_SET (0)   uncertain without an estimate, no hint
    ``L <= short``          SHORT (2)     keep-latest with small k, non-persistent saves
    ``short < L <= medium`` MEDIUM (3)    TorchTitan ``keep_latest_k=10`` at interval 500
    finite, ``L > medium``  LONG (4)      long keep-latest windows, a known far step
    ``math.inf``            EXTREME (5)   permanent (every R-th, final save, keep-all)
    ======================  ============  ===============================================

    ``NONE`` (1) is never produced.  A retention rule passes the bounds of its own save interval
    (:func:`class_bounds` of ``Rule.base_interval``); a policy classifying a hint that carries no
    class uses its parameters, by default the bounds at :data:`DEFAULT_INTERVAL`.

    Args:
        reclaim_step: predicted reclaim step (steps), ``math.inf`` for permanent, ``None`` if unknown.
        step: the generation's training step (steps).
        short: upper bound of SHORT (steps of lifetime).
        medium: upper bound of MEDIUM (steps of lifetime).
    """
    if reclaim_step is None:
        return Lifetime.NOT_SET
    if math.isinf(reclaim_step):
        return Lifetime.EXTREME
    life = reclaim_step - step
    if life <= short:
        return Lifetime.SHORT
    if life <= medium:
        return Lifetime.MEDIUM
    return Lifetime.LONG


@dataclass(frozen=True, slots=True)
class Hint:
    """What the runtime told the store about a generation's death, as recorded at save time.

    Attributes:
        reclaim_step: predicted reclaim step (the training step at which the generation's data
            becomes garbage); ``math.inf`` for data never retired during the run; ``None`` if unknown.
        lifetime: the :class:`Lifetime` class of the same prediction (:func:`lifetime_class`).
        condition: the retirement condition it was predicted from, in its text form
            (``Condition.describe()``, e.g. ``"after_newer:k=10,of_class=interval,timing=after_commit"``;
            ``retainz.retention.parse_condition`` reads it back), or the description of a rule
            inferred from the saves seen (``retainz mount --retention auto``); ``""`` when none is
            known.  For records, traces and reports; placement reads only its kind (``uncertain``).
        actual_reclaim_step: the step at which the generation is really deleted, when known in
            advance (trace replay only; the ``oracle`` control reads it, every other policy must not).
    """

    reclaim_step: float | None = None
    lifetime: Lifetime = Lifetime.NOT_SET
    condition: str = ""
    actual_reclaim_step: float | None = None

    @property
    def kind(self) -> str:
        """The condition's kind (``after_newer``, ``permanent``, ``at_step``, ``uncertain``), or ``""``."""
        return self.condition.partition(":")[0]
