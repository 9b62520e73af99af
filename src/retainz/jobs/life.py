"""A checkpoint's life after its name: its hint from the job's rule, its retirement (or deferral to the
promoter), and the re-hint of its series when the rule changes.

Every face does these through this module (the DCP writer, ``retainz://`` and the mount through the
namespace's promotion, the retention callbacks):

* the hint itself is :func:`retainz.retention.rule_hint`'s (a condition stated for the save wins, else
  the rule's prediction for the step), the one computation, which the node service (below this layer)
  calls too;
* :func:`retire` - the runtime's deletion: now, or, with a promoter, kept until its durable copy is
  verified (:meth:`retainz.tier.Promoter.retire`, docs/tiers.md "Keep until durable");
* :func:`rehint` - give a series' committed checkpoints the hints a rule predicts for them where the
  journaled ones differ (a job resumed with a changed rule: ``keep_latest_k`` 10 -> 3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from retainz.hint import Hint

__all__ = ["same_hint", "retire", "rehint"]


def same_hint(a: Hint, b: Hint) -> bool:
    """Whether two hints place alike: the same predicted reclaim step and condition (what a re-hint
    compares; the lifetime class follows from them)."""
    return (a.reclaim_step, a.condition) == (b.reclaim_step, b.condition)


def retire(store: Any, gid: str, *, step: int | None = None, promoter: Any = None) -> bool:
    """Retention deletes generation ``gid``: at once, or with a :class:`retainz.tier.Promoter` kept until
    its promotion is verified when its policy selects it (the promoter deletes it then).

    Returns:
        True when deleted now, False when deferred.

    Raises:
        GenerationNotFoundError: no such committed generation (already gone).
    """
    if promoter is None:
        store.delete(gid, step=step)
        return True
    return promoter.retire(store, gid, step)


def rehint(store: Any, gens: Iterable[Any], hint_of: Callable[[Any], Hint | None], *, step: int | None = None,
           keep: Callable[[Any], bool] = lambda g: False) -> list[str]:
    """Give each of ``gens`` (committed ``GenerationInfo``, one series) the hint ``hint_of(gen)`` where it
    differs from its journaled one (:func:`same_hint`), by ``store.update_hint`` (journaled at ``step``).

    A generation ``keep(gen)`` says to leave (a save kept until durable whose expected promotion finish
    stands), one ``hint_of`` gives no hint, and a hint predicting its reclaim before the save's own step
    (a rule that does not describe it) are left as they are.

    Returns:
        The ids changed, in the order given.
    """
    changed = []
    for g in gens:
        if keep(g):
            continue
        hint = hint_of(g)
        if hint is None or same_hint(hint, g.hint):
            continue
        if hint.reclaim_step is not None and hint.reclaim_step < g.step:
            continue
        store.update_hint(g.id, hint, step=step)
        changed.append(g.id)
    return changed
