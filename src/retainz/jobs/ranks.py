"""The ranks of one job: which process this is, how many there are, and the token the ranks of one
save share.

torchrun sets ``WORLD_SIZE``, ``RANK``, ``TORCHELASTIC_RUN_ID`` (and ``MASTER_ADDR``/``MASTER_PORT``) in
every rank's environment (torch ``distributed/elastic/agent/server/local_elastic_agent.py``); ranks
started otherwise (``torch.multiprocessing.spawn``, torch's own test harness) have an initialised
default process group instead (``torch.distributed.get_rank``/``get_world_size``), which is read when
the process has imported torch.distributed already (this module never imports torch).
"""

from __future__ import annotations

import os
import sys

__all__ = ["rank", "world_size", "join_token", "is_coordinator"]


def _group():
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def world_size() -> int:
    """The number of processes of this job: ``WORLD_SIZE``, else the initialised process group's, else 1."""
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    dist = _group()
    return dist.get_world_size() if dist is not None else 1


def rank() -> int:
    """This process's rank: ``RANK``, else the initialised process group's, else 0."""
    if os.environ.get("RANK"):
        return int(os.environ["RANK"])
    dist = _group()
    return dist.get_rank() if dist is not None else 0


def join_token(name: str) -> str | None:
    """The token the ranks of one job share for the checkpoint ``name`` (a DCP checkpoint id or
    directory) and no other save does: the run's id (torchrun's, or its rendezvous address) and the
    name; ``None`` for a job of one process.  With it, ranks writing one checkpoint to one served device
    join one generation (``NodeStore.begin_generation(join=...)``)."""
    if world_size() <= 1:
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID") or (f"{os.environ.get('MASTER_ADDR', '')}:"
                                                     f"{os.environ.get('MASTER_PORT', '')}")
    return f"dcp:{run}:{name}"[:1000]


def is_coordinator() -> bool:
    """True for rank 0 (:func:`rank`): the rank that commits a checkpoint several ranks joined."""
    return rank() == 0
