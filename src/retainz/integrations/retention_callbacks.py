"""Runtime retention callbacks over the store's delete, for runtimes whose code cannot run here.

Megatron-LM's retention lives in ``megatron/training`` (``checkpointing.py``), which no wheel ships, and
NVIDIA Resiliency Extension's local checkpoint manager needs its own stack.  These adapters reproduce
their purge as their sources do it (Megatron-LM d98e8a6 ``checkpointing.py``, nvidia-resiliency-ext
d8686d9) on top of ``store.delete``.  The training loop calls, per save::

    cb.before_save(store, step)     # deletions that happen before the new save starts
    ... write and commit the generation cb.generation_id(step) with hint=cb.hint(step) ...
    cb.after_commit(store, step)    # deletions that happen once the new save is complete

and once when training resumes, since its rule may differ from the one the survivors were saved
with (``keep_latest_k`` 10 -> 3)::

    cb.rehint(store, step)          # survivors get this rule's hints (Store.update_hint, journaled)

Every method returns the generation ids it deleted, in order.  The adapters count **committed**
generations only (the store shows nothing else): a save still in flight is never counted, so the
checkpoint a tracker names is never deleted before its successor commits.

Each callback manages one **series** (``folder=``, the job's checkpoint folder inside the device;
default the root, :mod:`retainz.ids`): its ids are ``quote(folder/name)`` (the
``retainz://`` file system's id of that directory; just ``name`` at the root), and it counts, retires
and re-hints only the generations of that series.  Jobs sharing a device each pass their own folder;
another job's checkpoints (``a2`` beside ``a``, a folder nested inside ``a``, an id that merely
contains ``step-N``) are never touched.

TorchTitan's purge runs as TorchTitan's own code through the ``retainz://`` filesystem
(:mod:`retainz.integrations.fsspec_fs`); :class:`KeepLatestK` is the same rule for users of
:class:`~retainz.integrations.dcp.ZonedStorageWriter` without TorchTitan.

No torch needed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

from retainz.errors import GenerationNotFoundError
from retainz.ids import members, series_folder, series_generation_id
from retainz.jobs import life
from retainz.retention.base import parse_rule
from retainz.retention.online import rule_hint
from retainz.retention.retire import retired_after_commit
from retainz.retention.rules_megatron import (
    non_persistent_global_retired,
    non_persistent_local_retired,
    retain_interval_retired,
)

__all__ = ["RetentionCallback", "MegatronRetainInterval", "MegatronNonPersistentGlobal",
           "MegatronNonPersistentLocal", "KeepLatestK"]


def _delete(store: Any, ids: Iterable[str], step: int, promoter: Any = None) -> list[str]:
    """Retire ``ids`` from ``store`` (:func:`retainz.jobs.life.retire`: with a :class:`retainz.tier.Promoter`,
    an id it must promote and has not verified is deferred, deleted by the promoter once durable); the
    ids deleted now."""
    done = []
    for gid in ids:
        with contextlib.suppress(GenerationNotFoundError):   # already gone (deleted by hand, or never committed)
            if life.retire(store, gid, step=step, promoter=promoter):
                done.append(gid)
    return done


class RetentionCallback:
    """Base: a naming scheme, a retention rule for hints, and the two purge points.

    Attributes:
        rule: the retention rule string the hints come from (:func:`retainz.retention.rule_hint`).
        folder: the series this callback manages (:func:`retainz.ids.series_folder`).
        promoter: a :class:`retainz.tier.Promoter` of the store (set it: ``cb.promoter = p``): the
            callback's deletions then keep a generation until its promotion is verified (deferred, not
            dropped; docs/tiers.md).  ``None``: delete at once.  :class:`MegatronNonPersistentLocal`
            (one store per rank) takes one per rank instead: ``cb.promoters``.
    """

    rule: str | None = None
    folder: str = ""
    promoter: Any = None

    def _set_folder(self, folder: str | None) -> None:
        self.folder = series_folder(folder)

    def name(self, step: int) -> str:
        """The checkpoint's name inside :attr:`folder` for the save at ``step``."""
        raise NotImplementedError

    def generation_id(self, step: int) -> str:
        """The generation id of the save at ``step``: :attr:`folder`'s id for :meth:`name`."""
        return series_generation_id(self.folder, self.name(step))

    def hint(self, step: int):
        """The hint for the save at ``step``: :attr:`rule`'s prediction (``None`` without a rule)."""
        return rule_hint(self.rule, step)

    def rehint(self, store: Any, step: int | None = None) -> list[str]:
        """Give the committed generations this callback names the hints of :attr:`rule` where they
        differ from the ones they were saved with (a rule changed on resume); journaled by
        ``Store.update_hint``.  Returns the ids changed."""
        return life.rehint(store, [store.generation(gid) for _, gid in self._mine(store)],
                           lambda g: self.hint(g.step), step=step)

    def before_save(self, store: Any, step: int) -> list[str]:
        return []

    def after_commit(self, store: Any, step: int) -> list[str]:
        return []

    def _mine(self, store: Any) -> list[tuple[int, str]]:
        """``(step, id)`` of the committed generations of :attr:`folder` this callback names, oldest
        first."""
        return sorted((g.step, g.id) for name, g in members(store.generations(), self.folder)
                      if name == self.name(g.step))


class MegatronRetainInterval(RetentionCallback):
    """Megatron-LM persistent checkpoints with ``--save-retain-interval R``.

    Directory ``{save}/iter_{N:07d}``; tracker ``latest_checkpointed_iteration.txt``.  At finalize of
    the save at iteration ``it`` (after it is complete): read ``prev`` from the tracker, write ``it`` to
    the tracker, delete ``iter_{prev}`` if ``prev != it`` and ``prev % R != 0``.  Net: the latest plus
    every R-th, which :meth:`after_commit` keeps over the series' committed iterations
    (:func:`retainz.retention.rules_megatron.retain_interval_retired`, the one model of this purge), so a
    restarted callback needs no :meth:`recover` to delete the tracker's previous.  Without ``R``
    Megatron deletes nothing.

    Args:
        save_interval: ``--save-interval`` (steps).
        retain_interval: ``--save-retain-interval`` (a multiple of ``save_interval``), or ``None``.
        folder: ``--save``, the series inside the device (default: the root).
    """

    def __init__(self, save_interval: int, retain_interval: int | None = None, *, folder: str | None = None):
        self._set_folder(folder)
        if retain_interval is not None and retain_interval % save_interval:
            raise ValueError(f"--save-retain-interval {retain_interval} must be a multiple of "
                             f"--save-interval {save_interval}")
        self.save_interval, self.retain_interval = save_interval, retain_interval
        self.rule = f"megatron:save_interval={save_interval}" + (
            f",retain_interval={retain_interval}" if retain_interval else "")
        self.tracker: int | None = None

    def name(self, step: int) -> str:
        return f"iter_{step:07d}"

    def recover(self, store: Any) -> int | None:
        """Set the tracker from the store after a restart: the newest committed ``iter_*``."""
        mine = self._mine(store)
        self.tracker = mine[-1][0] if mine else None
        return self.tracker

    def after_commit(self, store: Any, step: int) -> list[str]:
        self.tracker = step
        mine = self._mine(store)
        doomed = set(retain_interval_retired([s for s, _ in mine], self.retain_interval))
        return _delete(store, [gid for s, gid in mine[:-1] if s in doomed], step, self.promoter)


class MegatronNonPersistentGlobal(RetentionCallback):
    """Megatron-LM non-persistent checkpoints, ``--non-persistent-ckpt-type global``.

    Before writing a new non-persistent checkpoint, keep the single newest ``iter_*`` of the
    non-persistent folder and delete the rest: checkpoint ``j`` is deleted at the start of the
    second-next non-persistent save (two on disk in steady state).

    Args:
        interval: ``--non-persistent-save-interval`` (steps).
        save_interval: ``--save-interval`` (persistent saves take precedence at their steps).
        folder: the series inside the device (default: the root).
    """

    def __init__(self, interval: int, save_interval: int | None = None, *, folder: str | None = None):
        self._set_folder(folder)
        self.interval, self.save_interval = interval, save_interval
        # the rule needs a persistent interval; without one, none falls inside the hint's horizon
        self.rule = (f"megatron:save_interval={save_interval or 100 * interval},non_persistent_interval={interval},"
                     "non_persistent=global")

    def name(self, step: int) -> str:
        return f"non_persistent-iter_{step:07d}"

    def is_save_step(self, step: int) -> bool:
        """Megatron saves non-persistently at ``step`` (not a persistent save step)."""
        return step % self.interval == 0 and not (self.save_interval and step % self.save_interval == 0)

    def before_save(self, store: Any, step: int) -> list[str]:
        mine = self._mine(store)
        doomed = set(non_persistent_global_retired([s for s, _ in mine]))
        return _delete(store, [gid for s, gid in mine[:-1] if s in doomed], step, self.promoter)


class MegatronNonPersistentLocal(RetentionCallback):
    """NVIDIA Resiliency Extension ``LocalCheckpointManager`` (Megatron ``--non-persistent-ckpt-type
    local``): per-rank ``iter_{N:07d}_{rank}_local.pt`` written as ``.dirty`` then renamed; at finalize,
    after every rank confirmed the new iteration, all older iterations are unlinked on every rank.

    One store per rank (``stores[rank]``); :meth:`after_commit_all` takes them all.  Keep until durable:
    set ``cb.promoters`` to one :class:`retainz.tier.Promoter` per rank (``promoters[rank]`` of
    ``stores[rank]``; several nodes promoting to one destination: ``Promoter(..., node=..., nodes=...)``,
    docs/tiers.md): an older iteration not yet durable is deferred on that rank, not deleted.

    Args:
        interval: ``--non-persistent-save-interval`` (steps).
        ranks: number of ranks.
        folder: the series inside each rank's device (default: the root).
    """

    def __init__(self, interval: int, ranks: int, *, folder: str | None = None):
        self._set_folder(folder)
        self.interval, self.ranks = interval, ranks
        self.promoters: Sequence[Any] | None = None
        self.rule = f"megatron:save_interval={100 * interval},non_persistent_interval={interval},non_persistent=local"

    def name(self, step: int, rank: int = 0) -> str:
        return f"iter_{step:07d}_{rank}_local"

    def generation_id(self, step: int, rank: int = 0) -> str:
        return series_generation_id(self.folder, self.name(step, rank))

    def _mine_rank(self, store: Any, rank: int) -> list[tuple[int, str]]:
        return sorted((g.step, g.id) for name, g in members(store.generations(), self.folder)
                      if name == self.name(g.step, rank))

    def after_commit_all(self, stores: Sequence[Any], step: int) -> list[list[str]]:
        """Once every rank's ``iter_{step}`` is committed, delete all older iterations on every rank
        (with :attr:`promoters`: each once durable; the lists hold the ids deleted now).

        Raises:
            RuntimeError: a rank has not committed ``step`` (nothing is deleted anywhere).
        """
        for rank, store in enumerate(stores):
            try:
                store.generation(self.generation_id(step, rank))
            except GenerationNotFoundError:
                raise RuntimeError(f"rank {rank} has not committed iteration {step}: nothing is deleted") from None
        promoters = self.promoters or [None] * len(stores)
        out = []
        for rank, store in enumerate(stores):
            mine = self._mine_rank(store, rank)
            doomed = set(non_persistent_local_retired([s for s, _ in mine], step))
            out.append(_delete(store, [gid for s, gid in mine if s in doomed], step, promoters[rank]))
        return out


class KeepLatestK(RetentionCallback):
    """TorchTitan's purge (``CheckpointManager._purge_stale_checkpoints``, torchtitan b5bcd76
    ``torchtitan/components/checkpointer/dcp.py``) over the store: list the series' folder, take the
    checkpoints named ``step-N``, sort by ``(N, id)``, delete all but the last ``k``
    (:func:`retainz.retention.retire.retired_after_commit`).

    TorchTitan lists only its own ``{dump_folder}/{checkpoint.folder}``; this callback lists only
    :attr:`folder`'s committed generations, and names are matched whole (``step-N`` exactly).
    TorchTitan runs the purge once ``dcp.save`` returns (sync) or right after an async save is
    dispatched; here it runs at :meth:`after_commit`, so an in-flight save is never counted and never
    pushes a committed one out.

    Args:
        k: ``keep_latest_k`` (>= 2; 0 keeps all).
        interval: ``[checkpoint] interval`` (for the hint).
        folder: the job's checkpoint folder inside the device, its series (default: the root).

    Raises:
        ValueError: ``k`` is 1 or negative (TorchTitan's own checks), or a malformed ``folder``.
    """

    def __init__(self, k: int, interval: int = 500, *, folder: str | None = None):
        if k == 1:
            raise ValueError("keep_latest_k=1 is rejected by TorchTitan: the last checkpoint may still be saving")
        if k < 0:
            raise ValueError(f"keep_latest_k cannot be negative, got {k}")
        self._set_folder(folder)
        self.k, self.interval = k, interval
        self.rule = f"torchtitan:interval={interval},keep_latest_k={k}"
        self._parsed = parse_rule(self.rule)

    def name(self, step: int) -> str:
        return f"step-{step}"

    def after_commit(self, store: Any, step: int) -> list[str]:
        found = [(name, g.id) for name, g in members(store.generations(), self.folder)]
        return _delete(store, retired_after_commit(self._parsed, found), step, self.promoter)
