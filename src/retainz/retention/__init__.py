"""Runtime retention rules -> retirement conditions -> predicted reclaim steps.

* :mod:`~retainz.retention.conditions` - the condition family (:class:`AfterNewer`, :class:`Permanent`,
  :class:`AtStep`, :class:`Uncertain`), :class:`Hint`, the save schedule, and :func:`lifetime_class`
  (the coarse ZenFS SHORT/MEDIUM/LONG/EXTREME mapping);
* :mod:`~retainz.retention.rules` - TorchTitan, Megatron-LM, Lightning/NeMo, HF Trainer, Accelerate,
  Orbax, each driven as its runtime drives it (:func:`drive`);
* :func:`parse_rule` - ``RULE:key=value,...`` from the command line;
* :func:`parse_step` - the step named by a checkpoint id (a hint, never trusted);
* :func:`save_hint` / :func:`hint_for_save` - the hint for one save of a live run (no trace needed).
"""

from retainz.retention.base import RULES, Action, Gen, Rule, Session, drive, parse_rule, rule_keys
from retainz.retention.conditions import (
    NEVER,
    AfterNewer,
    AtStep,
    Condition,
    Hint,
    Lifetime,
    Permanent,
    PlannedSave,
    SaveSchedule,
    Timing,
    Uncertain,
    lifetime_class,
)
from retainz.retention.metrics import MetricSeries, load_metric_file, synthetic_loss
from retainz.retention.online import hint_for_save, save_hint
from retainz.retention.rules import Accelerate, HFTrainer, Lightning, Megatron, Orbax, TorchTitan
from retainz.retention.steps import committed_steps, parse_step

__all__ = [
    "NEVER", "RULES", "Accelerate", "Action", "AfterNewer", "AtStep", "Condition", "Gen", "HFTrainer",
    "Hint", "Lifetime", "Lightning", "Megatron", "MetricSeries", "Orbax", "Permanent", "PlannedSave",
    "Rule", "SaveSchedule", "Session", "Timing", "TorchTitan", "Uncertain", "committed_steps", "drive", "hint_for_save", "save_hint",
    "lifetime_class", "load_metric_file", "parse_rule", "parse_step", "rule_keys", "synthetic_loss",
]
