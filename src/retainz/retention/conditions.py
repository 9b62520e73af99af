"""Retirement conditions: what a runtime can honestly say, at save time, about a checkpoint's death.

A condition is a frozen dataclass.  Given the save schedule (the steps at which the runtime will save,
and the class of each save), :meth:`Condition.predict` turns it into a *predicted reclaim step*: the
training step at which the generation's data becomes garbage (logical time: training steps, never wall time).

* :class:`AfterNewer` - retired when the k-th newer save of a class reaches a point of its life
  (keep-latest-k style: TorchTitan ``keep_latest_k``, Megatron ``--save-retain-interval``,
  HF ``save_total_limit``, Orbax ``LatestN``...);
* :class:`Permanent` - never retired during the run (every R-th, the final step, keep-all);
* :class:`AtStep` - retired at a known step;
* :class:`Uncertain` - a probabilistic death time (top-k by a metric: it depends on future values);
* :class:`UntilDurable` - kept past the rule's retirement until its promotion to a durable tier is
  verified, expected at a step (:func:`retainz.retention.until_durable`).

Predicted reclaim steps are ``int`` steps, :data:`NEVER` (``math.inf``) for data that survives the run,
or ``None`` when unknown.

A condition's text form (:meth:`Condition.describe`) is what a :class:`~retainz.hint.Hint` carries and
the store journals; its JSON form (:meth:`Condition.to_json`) is what a trace records;
:func:`parse_condition` and :func:`condition_from_json` read them back.
"""

from __future__ import annotations

import ast
import enum
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "NEVER",
    "Timing",
    "PlannedSave",
    "SaveSchedule",
    "Condition",
    "AfterNewer",
    "Permanent",
    "AtStep",
    "Uncertain",
    "UntilDurable",
    "CONDITIONS",
    "condition_from_json",
    "parse_condition",
]

#: Predicted reclaim step of data that is never retired during the run.
NEVER = math.inf


class Timing(enum.StrEnum):
    """When, relative to the triggering save, the runtime deletes a retired generation.

    The deletion is recorded at the triggering save's step in every case; the timing fixes its *order*
    relative to that save's events:

    * ``BEFORE_SAVE`` - before the new save starts (Megatron global non-persistent, Accelerate);
    * ``AFTER_DISPATCH`` - right after the new save is dispatched, before it commits (TorchTitan async);
    * ``AFTER_COMMIT`` - once the new save is complete (TorchTitan sync, Megatron retain, HF Trainer,
      Lightning, Orbax, NVRx local).
    """

    BEFORE_SAVE = "before_save"
    AFTER_DISPATCH = "after_dispatch"
    AFTER_COMMIT = "after_commit"


@dataclass(frozen=True, slots=True)
class PlannedSave:
    """One save a runtime will make.

    Attributes:
        step: training step of the save (steps).
        cls: the save's class, e.g. ``"interval"``, ``"final"``, ``"persistent"``, ``"non_persistent"``.
        name: checkpoint id as the runtime names it (``step-500``, ``iter_0001000``, ``checkpoint-500``).
        model_only: True when the runtime saves the model weights only (TorchTitan's last step).
    """

    step: int
    cls: str
    name: str
    model_only: bool = False


@dataclass(frozen=True)
class SaveSchedule:
    """The ordered saves of a run, for predictions.

    Attributes:
        saves: the planned saves in the order the runtime makes them (steps non-decreasing).
    """

    saves: tuple[PlannedSave, ...]
    _by_class: dict[str, list[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        by_class: dict[str, list[int]] = {}
        for s in self.saves:
            by_class.setdefault(s.cls, []).append(s.step)
        object.__setattr__(self, "_by_class", by_class)

    def nth_after(self, step: int, of_class: str | Sequence[str], k: int) -> float:
        """Step of the k-th save of ``of_class`` strictly after ``step``; :data:`NEVER` if there is none.

        Args:
            step: the reference step (steps).
            of_class: a save class, or several (their saves are merged).
            k: which newer save (1 = the next one).
        """
        classes = (of_class,) if isinstance(of_class, str) else tuple(of_class)
        if len(classes) == 1:
            steps = self._by_class.get(classes[0], [])
        else:
            steps = sorted(s for c in classes for s in self._by_class.get(c, []))
        i = bisect_right(steps, step) + k - 1
        return steps[i] if i < len(steps) else NEVER

    def __len__(self) -> int:
        return len(self.saves)


def _jsonable(v):
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        if v.is_integer():
            return int(v)
    return v


class Condition:
    """Base of the retirement conditions (frozen dataclasses)."""

    kind: str = ""

    def predict(self, step: int, schedule: SaveSchedule) -> float | None:
        """Predicted reclaim step of a generation saved at ``step``.

        Args:
            step: the generation's training step (steps).
            schedule: the run's save schedule.

        Returns:
            The step at which the generation is deleted (steps), :data:`NEVER` if it survives the run,
            ``None`` if unknown.
        """
        raise NotImplementedError

    def to_json(self) -> dict:
        """The condition as a JSON object: ``{"kind": ..., <fields>}`` (trace format v1)."""
        out: dict = {"kind": self.kind}
        for name in self.__dataclass_fields__:  # type: ignore[attr-defined]
            out[name] = _jsonable(getattr(self, name))
        return out

    def describe(self) -> str:
        """A short string, e.g. ``"after_newer:k=10,of=interval,timing=after_commit"``."""
        fields = self.to_json()
        fields.pop("kind")
        return self.kind + (":" + ",".join(f"{k}={v}" for k, v in fields.items()) if fields else "")


@dataclass(frozen=True)
class AfterNewer(Condition):
    """Retired when the k-th newer save of a class reaches ``timing``.

    Attributes:
        k: how many newer saves of ``of_class`` the generation survives (>= 1).
        of_class: the class (or classes, as a tuple) whose newer saves count.
        timing: when relative to that save the deletion happens.
    """

    k: int
    of_class: str | tuple[str, ...]
    timing: Timing = Timing.AFTER_COMMIT
    kind = "after_newer"

    def predict(self, step: int, schedule: SaveSchedule) -> float | None:
        return schedule.nth_after(step, self.of_class, self.k)


@dataclass(frozen=True)
class Permanent(Condition):
    """Never retired during the run.

    Attributes:
        reason: why (``"final"``, ``"retain_interval"``, ``"keep_all"``, ``"every_steps"``...).
    """

    reason: str = ""
    kind = "permanent"

    def predict(self, step: int, schedule: SaveSchedule) -> float | None:
        del step, schedule  # Ignored by this condition.
        return NEVER


@dataclass(frozen=True)
class AtStep(Condition):
    """Retired at a known training step.

    Attributes:
        at: the step of the deletion (steps).
    """

    at: int
    kind = "at_step"

    def predict(self, step: int, schedule: SaveSchedule) -> float | None:
        del step, schedule  # Ignored by this condition.
        return self.at


@dataclass(frozen=True)
class Uncertain(Condition):
    """A probabilistic death time (top-k by a monitored metric).

    The generation can be retired no earlier than ``earliest`` (the step of the soonest save that could
    push it out of the top k); whether and when depends on future metric values.

    Attributes:
        earliest: earliest possible reclaim step (steps), :data:`NEVER` if no later save could evict it.
        probability: estimated probability that it is retired before the run ends (0..1).
        expected: estimated reclaim step given that it is retired (steps), or ``None`` without an estimate.
        basis: how the estimate was made (for records), e.g. ``"empirical:rank=2,n=14"``.
    """

    earliest: float
    probability: float
    expected: float | None = None
    basis: str = ""
    kind = "uncertain"

    def predict(self, step: int, schedule: SaveSchedule) -> float | None:
        """Predicted reclaim step: ``expected`` when the estimate says retirement is more likely than not,
        :data:`NEVER` when it says survival is, ``None`` without an estimate."""
        del step, schedule  # The estimate was made with the schedule already.
        if self.expected is None:
            return None
        return self.expected if self.probability >= 0.5 else NEVER


@dataclass(frozen=True)
class UntilDurable(Condition):
    """Kept until durable: the rule would retire it earlier (or cannot say when), but its local copy
    is deleted only once its promotion to the durable tier is verified, expected at ``at``
    (docs/tiers.md, "Keep until durable"; :func:`retainz.retention.until_durable` makes it).

    Attributes:
        at: the step the promotion is expected to be verified at (steps).
        rule: the rule's own condition, in its text form (:meth:`Condition.describe`; ``""`` if none).
    """

    at: int
    rule: str = ""
    kind = "until_durable"

    def predict(self, step: int, schedule: SaveSchedule) -> float | None:
        del step, schedule  # The expectation was made from the promoter's queue.
        return self.at


#: The condition classes by kind (the ``kind`` of :meth:`Condition.to_json`).
CONDITIONS: dict[str, type[Condition]] = {c.kind: c for c in (AfterNewer, Permanent, AtStep, Uncertain,
                                                              UntilDurable)}


def _field_value(kind: str, name: str, raw):
    """A field of a condition of ``kind`` from its JSON value (``raw``), typed as the field is."""
    if raw is None:
        return None
    if name == "timing":
        return Timing(raw)
    if name == "of_class":
        return tuple(raw) if isinstance(raw, list) else raw
    if name in ("earliest", "expected", "probability"):
        return math.inf if raw == "inf" else float(raw)
    if name in ("k", "at"):
        if type(raw) is not int:
            raise ValueError(f"condition {kind}: {name} must be an integer, got {raw!r}")
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"condition {kind}: {name} must be a string, got {raw!r}")
    return raw


def condition_from_json(obj: dict) -> Condition:
    """The condition a JSON object (:meth:`Condition.to_json`, trace format v1) stands for.

    Raises:
        ValueError: not an object, an unknown kind, a missing or unknown field, or a value of the
            wrong type (one line).
    """
    if not isinstance(obj, dict):
        raise ValueError(f"condition must be an object, got {obj!r}")
    kind = obj.get("kind")
    cls = CONDITIONS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown condition kind {kind!r}; valid: {', '.join(CONDITIONS)}")
    names = list(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    extra = sorted(set(obj) - set(names) - {"kind"})
    if extra:
        raise ValueError(f"condition {kind}: unknown field(s) {', '.join(extra)}; valid: {', '.join(names)}")
    missing = [n for n in names if n not in obj]
    if missing:
        raise ValueError(f"condition {kind}: missing {', '.join(missing)}")
    return cls(**{n: _field_value(kind, n, obj[n]) for n in names})


def _text_value(name: str, text: str):
    """The JSON value of a field as :meth:`Condition.describe` wrote it (``str`` of the JSON value)."""
    if text == "None":
        return None
    if name == "of_class" and text.startswith("["):
        return ast.literal_eval(text)
    if name in ("k", "at"):
        return int(text)
    if name in ("earliest", "expected", "probability"):
        return text if text == "inf" else float(text)
    return text


def parse_condition(text: str) -> Condition:
    """The condition whose :meth:`Condition.describe` text is ``text`` (the form a :class:`~retainz.hint.Hint`
    carries and the store journals): ``parse_condition(c.describe()) == c`` for every condition.

    Fields are read in their declared order, each value running up to the next ``,field=``; the last
    one takes the rest of the text, so a ``basis`` holding commas reads back whole.

    Raises:
        ValueError: an unknown kind, a missing field or a value of the wrong type (one line).
    """
    kind, _, rest = text.partition(":")
    cls = CONDITIONS.get(kind)
    if cls is None:
        raise ValueError(f"condition {text!r}: unknown kind {kind!r}; valid: {', '.join(CONDITIONS)}")
    names = list(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    obj: dict = {"kind": kind}
    pos = 0
    for i, name in enumerate(names):
        head = ("" if i == 0 else ",") + name + "="
        if not rest.startswith(head, pos):
            raise ValueError(f"condition {text!r}: expected {name}=")
        pos += len(head)
        end = rest.find("," + names[i + 1] + "=", pos) if i + 1 < len(names) else len(rest)
        if end < 0:
            raise ValueError(f"condition {text!r}: expected {names[i + 1]}=")
        try:
            obj[name] = _text_value(name, rest[pos:end])
        except (ValueError, SyntaxError):
            raise ValueError(f"condition {text!r}: bad {name} {rest[pos:end]!r}") from None
        pos = end
    return condition_from_json(obj)
