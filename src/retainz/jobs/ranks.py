"""The ranks of one job: which process this is, and the token the ranks of one save share.

torchrun sets ``WORLD_SIZE``, ``RANK``, ``TORCHELASTIC_RUN_ID`` (and ``MASTER_ADDR``/``MASTER_PORT``) in
every rank's environment (torch ``distributed/elastic/agent/server/local_elastic_agent.py``); a
process group started otherwise passes its world to the face (the DCP writer asks ``torch.distributed``).
"""

from __future__ import annotations

import os

__all__ = ["join_token", "is_coordinator"]


def join_token(name: str) -> str | None:
    """The token the ranks of one torchrun job share for the checkpoint ``name`` (a DCP checkpoint id or
    directory) and no other save does: the run's id (or its rendezvous address) and the name; ``None``
    outside a multi-rank torchrun job (``WORLD_SIZE`` unset or 1).  With it, ranks writing one
    checkpoint to one served device join one generation (``NodeStore.begin_generation(join=...)``)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID") or (f"{os.environ.get('MASTER_ADDR', '')}:"
                                                     f"{os.environ.get('MASTER_PORT', '')}")
    return f"dcp:{run}:{name}"[:1000]


def is_coordinator() -> bool:
    """True unless this process is a torchrun rank other than 0 (``RANK``): the rank that commits a
    checkpoint several ranks joined."""
    return int(os.environ.get("RANK", "0") or 0) == 0
