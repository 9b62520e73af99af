"""Retention rules: parameters, parsing, and driving a rule the way its runtime drives it.

A rule is a frozen dataclass whose fields are the runtime's configuration (Orbax style).  ``rule.start(
total_steps, seed=...)`` returns a :class:`Session`: one training run under that rule, with its save
schedule.  :func:`drive` walks the schedule and emits :class:`Action` records in the order the runtime
performs them:

1. deletions the runtime makes *before the save starts* (``Session.before_save``);
2. ``save`` with the :class:`~retainz.hint.Hint` the runtime can honestly give;
3. deletions made *right after dispatch*, before the save is durable (``Session.after_dispatch``);
4. ``commit`` (or ``crash`` when a crash is injected: the save never commits and is repeated);
5. deletions made *after the save commits* (``Session.after_commit``).

Every action carries the step of the save that triggered it (logical time), so a deletion's step is
the step the hint predicted for exact rules.

A rule is named ``RULE:key=value,...`` on the command line; :func:`parse_rule` builds it, and any
unknown rule, unknown key, missing key or bad value is a ``ValueError`` listing what is valid.
"""

from __future__ import annotations

import dataclasses
import statistics
import typing
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from retainz.hint import Hint, class_bounds, lifetime_class
from retainz.retention.conditions import (
    Condition,
    PlannedSave,
    SaveSchedule,
    Uncertain,
)
from retainz.spec import parse_spec

__all__ = [
    "Rule",
    "Session",
    "Gen",
    "Action",
    "drive",
    "parse_rule",
    "register_rule",
    "RULES",
    "rule_keys",
    "EmpiricalLifetimes",
]

#: name -> rule class, in registration order.
RULES: dict[str, type[Rule]] = {}


def register_rule(cls: type[Rule]) -> type[Rule]:
    """Class decorator: make ``cls`` available to :func:`parse_rule` under ``cls.name``."""
    RULES[cls.name] = cls
    return cls


@dataclass
class Gen:
    """A generation as the rule's runtime sees it.

    Attributes:
        gen: unique generation number within the run (0, 1, 2... in save order).
        name: checkpoint id as the runtime names it.
        step: training step (steps).
        cls: save class (see :class:`~retainz.retention.conditions.PlannedSave`).
        committed: whether its commit happened.
    """

    gen: int
    name: str
    step: int
    cls: str
    committed: bool = False


@dataclass(frozen=True)
class Action:
    """One event of a driven run, in runtime order.

    Attributes:
        kind: ``"save"``, ``"commit"``, ``"delete"`` or ``"crash"``.
        step: training step of the save that triggered it (steps).
        gen: the generation number concerned.
        name: its checkpoint id.
        cls: its save class.
        hint: the save-time hint (``save`` only).
        model_only: the save holds model weights only (``save`` only).
    """

    kind: str
    step: int
    gen: int
    name: str
    cls: str
    hint: Hint | None = None
    model_only: bool = False


class EmpiricalLifetimes:
    """A crude, causal estimator of uncertain lifetimes (top-k by metric).

    Generations are admitted with a key (e.g. their rank in the top-k when saved).  For a new
    generation with key ``q`` it estimates, from the generations admitted earlier with the same key:
    the probability of retirement ``(retired + 1) / (admitted + 2)`` (Laplace), and the reclaim step
    ``step + median(observed lifetimes)`` over the last :attr:`WINDOW` lifetimes observed with that key
    (a sliding window: cheap, and it follows a run whose metric changes regime).  Only the past is used.  The estimate is biased towards short
    lifetimes early in a run (long ones have not been observed yet); it says so in its ``basis``.
    """

    #: Lifetimes kept per key for the median.
    WINDOW = 256

    def __init__(self) -> None:
        self._alive: dict[int, tuple[Any, int]] = {}
        self._admitted: dict[Any, int] = {}
        self._retired: dict[Any, int] = {}
        self._lifetimes: dict[Any, deque[int]] = {}

    def estimate(self, key: Any, step: int, earliest: float) -> Uncertain:
        """Uncertain condition for a generation saved at ``step`` with ``key``, retired no earlier
        than ``earliest`` (steps)."""
        n = self._admitted.get(key, 0)
        retired = self._retired.get(key, 0)
        lives = self._lifetimes.get(key)
        if earliest == float("inf"):
            return Uncertain(earliest, 0.0, None, f"empirical:key={key},n={n},unreachable")
        p = (retired + 1) / (n + 2)
        expected = None
        if lives:
            expected = max(float(earliest), step + statistics.median_low(lives))
        return Uncertain(earliest, round(p, 6), expected, f"empirical:key={key},n={n},retired={retired}")

    def admit(self, gen: int, key: Any, step: int) -> None:
        self._alive[gen] = (key, step)
        self._admitted[key] = self._admitted.get(key, 0) + 1

    def retire(self, gen: int, step: int) -> None:
        entry = self._alive.pop(gen, None)
        if entry is not None:
            key, saved = entry
            self._retired[key] = self._retired.get(key, 0) + 1
            self._lifetimes.setdefault(key, deque(maxlen=self.WINDOW)).append(step - saved)


class Session:
    """One training run under a rule: the schedule plus the runtime's retention state.

    Subclasses implement :meth:`condition` and override the deletion hooks their runtime uses; each hook
    returns the generations to delete, oldest first, and :meth:`drive` removes them from :attr:`live`.

    Attributes:
        rule: the rule.
        total_steps: the run's last training step (steps).
        schedule: every save the run makes, in order.
        live: generations saved and neither deleted nor abandoned (the in-flight one included).
    """

    def __init__(self, rule: Rule, total_steps: int, saves: list[PlannedSave]):
        self.rule = rule
        self.total_steps = total_steps
        self.schedule = SaveSchedule(tuple(saves))
        self.live: list[Gen] = []

    # -- what the runtime knows at save time -------------------------------------------------------
    def condition(self, save: PlannedSave, gen: Gen) -> Condition:
        """The retirement condition the runtime can state for ``save``."""
        raise NotImplementedError

    def hint(self, save: PlannedSave, gen: Gen) -> Hint:
        """The hint for ``save``: the condition's predicted reclaim step, its lifetime class at the
        bounds of the rule's save interval (:func:`~retainz.hint.class_bounds`), and the condition's
        text."""
        cond = self.condition(save, gen)
        pred = cond.predict(save.step, self.schedule)
        short, medium = class_bounds(self.rule.base_interval)
        return Hint(pred, lifetime_class(pred, save.step, short=short, medium=medium), cond.describe())

    # -- deletion hooks (runtime order) -------------------------------------------------------------
    def before_save(self, save: PlannedSave) -> list[Gen]:
        """Deletions before ``save`` starts. Ignored by rules that do not delete then."""
        del save
        return []

    def after_dispatch(self, gen: Gen) -> list[Gen]:
        """Deletions right after ``gen`` is dispatched, before it commits."""
        del gen
        return []

    def after_commit(self, gen: Gen) -> list[Gen]:
        """Deletions once ``gen`` has committed."""
        del gen
        return []

    def on_deleted(self, gen: Gen, step: int) -> None:
        """Called for every deletion (estimators learn lifetimes here)."""

    def on_abandoned(self, gen: Gen) -> None:
        """Called when a crash abandons ``gen`` (it never commits and is never counted)."""

    # -- helpers ------------------------------------------------------------------------------------
    def live_of(self, *classes: str) -> list[Gen]:
        return [g for g in self.live if g.cls in classes]


@dataclass(frozen=True)
class Rule:
    """Base of retention rules: a frozen dataclass whose fields are the runtime's configuration.

    Class attributes:
        name: the rule's name on the command line.
        source: the runtime and configuration it models (for docs and ``retainz trace rules``).
    """

    name: ClassVar[str] = ""
    source: ClassVar[str] = ""

    @property
    def base_interval(self) -> int:
        """The runtime's base save interval (steps), the unit of the lifetime class bounds
        (:func:`retainz.hint.class_bounds`)."""
        raise NotImplementedError

    def start(self, total_steps: int, *, seed: int = 0, first_step: int = 1) -> Session:
        """A session for a run of steps ``first_step..total_steps``.

        Args:
            total_steps: the run's last training step (steps).
            seed: seeds synthetic metric series.
            first_step: the first step of the run (a resumed run, or a window for :func:`save_hint`);
                no save before it is planned.
        """
        raise NotImplementedError

    def spec(self) -> str:
        """The canonical ``RULE:key=value,...`` string (every key, defaults included)."""
        parts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            v = str(v).lower() if isinstance(v, bool) else v
            parts.append(f"{f.metadata.get('key', f.name)}={v}")
        return f"{self.name}:{','.join(parts)}"

    def __str__(self) -> str:
        return self.spec()


def drive(session: Session, *, crash_every: int | None = None) -> Iterator[Action]:
    """Run a session as its runtime would, yielding actions in runtime order.

    Args:
        session: from ``rule.start(...)``.
        crash_every: if set, every ``crash_every``-th save (counting first attempts only) crashes after
            dispatch and before its commit: a ``crash`` action follows, the generation is abandoned
            (never committed, never counted, never deleted by the rule), and the runtime restarts from
            its newest committed checkpoint and repeats that save under a new generation number with
            the same name.
    """
    if crash_every is not None and crash_every < 1:
        raise ValueError(f"crash_every must be >= 1 save, got {crash_every}")
    next_gen = 0
    attempts = 0

    def deleted(gens: list[Gen], step: int) -> Iterator[Action]:
        for g in gens:
            session.live.remove(g)
            session.on_deleted(g, step)
            yield Action("delete", step, g.gen, g.name, g.cls)

    for save in session.schedule.saves:
        retry = False
        while True:
            yield from deleted(session.before_save(save), save.step)
            gen = Gen(next_gen, save.name, save.step, save.cls)
            next_gen += 1
            hint = session.hint(save, gen)
            session.live.append(gen)
            yield Action("save", save.step, gen.gen, gen.name, gen.cls, hint, save.model_only)
            yield from deleted(session.after_dispatch(gen), save.step)
            if not retry:
                attempts += 1
            if crash_every and not retry and attempts % crash_every == 0:
                session.live.remove(gen)
                session.on_abandoned(gen)
                yield Action("crash", save.step, gen.gen, gen.name, gen.cls)
                retry = True
                continue
            gen.committed = True
            yield Action("commit", save.step, gen.gen, gen.name, gen.cls)
            yield from deleted(session.after_commit(gen), save.step)
            break


# -- parsing ---------------------------------------------------------------------------------------

_TYPES = {int: "int", bool: "bool", str: "str", float: "float"}


def _field_type(cls: type, f: dataclasses.Field) -> type:
    t = typing.get_type_hints(cls)[f.name]
    if t in _TYPES:
        return t
    # "int | None" etc.
    args = [a for a in getattr(t, "__args__", ()) if a is not type(None)]
    return args[0] if args else str


def rule_keys(cls: type[Rule]) -> list[dict]:
    """The keys of a rule: ``{"key", "type", "required", "default", "help", "choices"}`` each."""
    out = []
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append({
            "key": f.metadata.get("key", f.name),
            "field": f.name,
            "type": _TYPES[_field_type(cls, f)],
            "required": required,
            "default": None if required else f.default,
            "help": f.metadata.get("help", ""),
            "choices": f.metadata.get("choices"),
        })
    return out


def _describe_keys(cls: type[Rule]) -> str:
    return ", ".join(f"{k['key']} ({k['type']}{', required' if k['required'] else ''})" for k in rule_keys(cls))


def _convert(rule: str, key: str, typ: str, raw: str, choices) -> Any:
    try:
        if typ == "int":
            value: Any = int(raw)
        elif typ == "float":
            value = float(raw)
        elif typ == "bool":
            low = raw.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            value = low in ("true", "1", "yes")
        else:
            if not raw:
                raise ValueError
            value = raw
    except ValueError:
        raise ValueError(f"retention rule {rule}: key {key} expects {typ}, got {raw!r}") from None
    if choices and value not in choices:
        raise ValueError(f"retention rule {rule}: key {key} must be one of {', '.join(choices)}, got {raw!r}")
    return value


def parse_rule(spec: str) -> Rule:
    """Build a rule from ``RULE:key=value,...`` (``RULE`` alone when every key has a default; the
    grammar of :func:`retainz.spec.parse_spec`).  :data:`RULES` is the one list of known rules.

    Raises:
        ValueError: an item that is not ``key=value``, unknown rule (lists the rules), unknown key
            (lists the rule's keys and types), repeated or missing key, a value of the wrong type,
            or a configuration the runtime rejects.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty retention rule; valid rules: {', '.join(RULES)}")
    name, pairs = parse_spec(spec, "retention rule")
    cls = RULES.get(name)
    if cls is None:
        raise ValueError(f"unknown retention rule {name!r}; valid rules: {', '.join(RULES)}")
    keys = {k["key"]: k for k in rule_keys(cls)}
    kwargs: dict[str, Any] = {}
    for key, raw in pairs:          # parse_spec has refused a key given twice
        if key not in keys:
            raise ValueError(f"retention rule {name}: unknown key {key!r}; valid keys: {_describe_keys(cls)}")
        k = keys[key]
        kwargs[k["field"]] = _convert(name, key, k["type"], raw, k["choices"])
    missing = [k["key"] for k in keys.values() if k["required"] and k["field"] not in kwargs]
    if missing:
        raise ValueError(f"retention rule {name}: missing {', '.join(missing)}; valid keys: {_describe_keys(cls)}")
    return cls(**kwargs)
