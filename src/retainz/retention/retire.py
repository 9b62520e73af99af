"""Which committed checkpoints of one series a rule retires once its newest save has committed.

The runtimes' purges, as pure functions of a series' committed checkpoints (``(name, id)`` pairs from
:func:`retainz.ids.members`), for the storage plugins that enact a rule themselves
(:class:`retainz.integrations.dcp.ZonedStorageWriter` with ``retention=``, the
:class:`~retainz.integrations.retention_callbacks.KeepLatestK` callback):

================  =======================================================  ==============================
rule              source (what the runtime runs)                           retired after a commit
================  =======================================================  ==============================
``torchtitan``    TorchTitan ``CheckpointManager._purge_stale_checkpoints``  every ``step-N`` but the latest
                  (torchtitan b5bcd76 ``components/checkpointer/dcp.py``;   ``keep_latest_k`` by ``N``
                  ``components/checkpoint.py`` before): ``listdir(folder)``, (0: none)
                  run on rank 0 after ``dcp.save`` returns (sync), right
                  after dispatch (async); the last step's save returns
                  before it
                  ``re.search(r"step-(\\d+)")``, sort by ``(N, path)``,
                  delete ``[:-keep_latest_k]``
``megatron``      Megatron-LM ``checkpointing.py`` (d98e8a6, as             every ``iter_N`` but the newest
                  :mod:`.rules_megatron` models it): at finalize the        and multiples of
                  tracker's previous iteration is deleted unless it is a    ``retain_interval`` (unset: none)
                  multiple of ``--save-retain-interval``
``hf``            HF Trainer ``_rotate_checkpoints`` (transformers 4.57.6,  every ``checkpoint-N`` but the
                  as :mod:`.rules_hf` models it): sorted by ``N``, all but  latest ``save_total_limit``
                  the last ``save_total_limit`` deleted                     (unset: none)
================  =======================================================  ==============================

Names are matched whole (``step-10.tmp`` and ``xstep-10`` are not TorchTitan checkpoints, where
TorchTitan's ``re.search`` inside its own folder would count them): only what the runtime itself names
is ever retired.  Rules whose retirement depends on values the store never sees (HF with
``metric``, Lightning's top-k by a monitor) or on names that carry no step (Accelerate's
``checkpoint_{i}``, Orbax's bare step numbers) are not enacted here (:func:`check_enactable`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from retainz.retention.base import Rule
from retainz.retention.conditions import Permanent
from retainz.retention.rules_megatron import retain_interval_retired
from retainz.retention.steps import STEP_NAMES

__all__ = ["ENACTED", "check_enactable", "retired_after_commit", "pattern_of", "EXPLICIT_PERMANENT", "is_explicit"]

#: Rules :func:`retired_after_commit` enacts.
ENACTED = ("torchtitan", "megatron", "hf")
#: The condition of a save marked permanent by the caller (``ZonedStorageWriter.set_condition``):
#: outside the rule, never counted or retired by it.
EXPLICIT_PERMANENT = Permanent("explicit").describe()



def is_explicit(condition: str | None) -> bool:
    """True for the condition text of a save whose caller stated its retention
    (:func:`retainz.retention.explicit_hint`: ``permanent:reason=explicit`` or ``at_step:at=N``; no
    enacted rule states an ``at_step``): such a save is outside the rule, never counted, retired or
    re-hinted by it."""
    return bool(condition) and (condition == EXPLICIT_PERMANENT or condition.startswith("at_step:"))



def check_enactable(rule: Rule) -> None:
    """Raise ``ValueError`` (one line) unless :func:`retired_after_commit` can enact ``rule``."""
    if rule.name not in ENACTED:
        raise ValueError(f"retention rule {rule.name}: not enacted by the store (enacted: {', '.join(ENACTED)}); "
                         "pass retire=False to use it for placement hints only")
    if rule.name == "hf" and getattr(rule, "metric", None):
        raise ValueError("retention rule hf: with metric=, which checkpoint is the best depends on metric values "
                         "the store never sees; pass retire=False to use it for placement hints only")


def pattern_of(rule: Rule) -> re.Pattern:
    """The checkpoint-name pattern of ``rule`` (group 1: the step)."""
    return STEP_NAMES[rule.name]


def retired_after_commit(rule: Rule, members: Sequence[tuple[str, str]]) -> list[str]:
    """The ids ``rule`` retires once the newest of ``members`` has committed, oldest first.

    Args:
        rule: an enactable rule (:func:`check_enactable`).
        members: ``(name, generation id)`` of the series' committed checkpoints, the new one included
            (:func:`retainz.ids.members`); names the rule does not give are ignored.

    Returns:
        Generation ids, sorted by ``(step named, id)``.

    Raises:
        ValueError: ``rule`` is not enactable.
    """
    check_enactable(rule)
    pat = pattern_of(rule)
    found = sorted((int(m.group(1)), gid) for name, gid in members if (m := pat.fullmatch(name)))
    if rule.name == "torchtitan":
        k = rule.keep_latest_k
        return [gid for _, gid in found[:-k]] if k > 0 else []
    if rule.name == "megatron":
        doomed = set(retain_interval_retired([step for step, _ in found], rule.retain_interval))
        return [gid for step, gid in found[:-1] if step in doomed]
    limit = rule.save_total_limit
    return [gid for _, gid in found[:-limit]] if limit else []
