"""Runtime retention rules -> retirement conditions -> predicted reclaim steps.

* :mod:`~retainz.retention.conditions` - the condition family (:class:`AfterNewer`, :class:`Permanent`,
  :class:`AtStep`, :class:`Uncertain`, :class:`UntilDurable`), its text and JSON forms (:func:`parse_condition`,
  :func:`condition_from_json`) and the save schedule;
* :mod:`~retainz.retention.rules` - TorchTitan, Megatron-LM, Lightning/NeMo, HF Trainer, Accelerate,
  Orbax, each driven as its runtime drives it (:func:`drive`);
* :func:`parse_rule` - ``RULE:key=value,...`` from the command line (:data:`RULES`: every known rule);
* :func:`until_durable` / :class:`StepRate` - the predicted reclaim step of a generation kept until its
  promotion is verified (:mod:`~retainz.retention.durable`);
* :func:`parse_step` - the step named by a checkpoint id (a hint, never trusted);
* :func:`save_hint` / :func:`rule_hint` - the :class:`~retainz.hint.Hint` for one save of a live run (no
  trace needed); :func:`explicit_hint` - the hint of a condition stated for one save.
"""

from retainz.retention.base import RULES, Action, Gen, Rule, Session, drive, parse_rule, rule_keys
from retainz.retention.conditions import (
    NEVER,
    AfterNewer,
    AtStep,
    Condition,
    Permanent,
    PlannedSave,
    SaveSchedule,
    Timing,
    Uncertain,
    UntilDurable,
    condition_from_json,
    parse_condition,
)
from retainz.retention.durable import StepRate, until_durable
from retainz.retention.metrics import MetricSeries, load_metric_file, synthetic_loss
from retainz.retention.online import explicit_hint, rule_hint, save_hint
from retainz.retention.rules import Accelerate, HFTrainer, Lightning, Megatron, Orbax, TorchTitan
from retainz.retention.steps import committed_steps, parse_step

__all__ = [
    "NEVER", "RULES", "Accelerate", "Action", "AfterNewer", "AtStep", "Condition", "Gen", "HFTrainer",
    "Lightning", "Megatron", "MetricSeries", "Orbax", "Permanent", "PlannedSave",
    "Rule", "SaveSchedule", "Session", "StepRate", "Timing", "TorchTitan", "Uncertain", "UntilDurable",
    "committed_steps", "condition_from_json",
    "drive", "explicit_hint", "load_metric_file", "parse_condition", "parse_rule", "parse_step", "rule_hint",
    "rule_keys", "save_hint", "synthetic_loss", "until_durable",
]
