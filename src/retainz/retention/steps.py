"""Step numbers from checkpoint ids: the one parser every route uses (DCP, ``retainz://``, the mount,
the retention rules).

A storage plugin sees only a checkpoint id (a path).  The runtimes name their checkpoints after the
training step, so the step can be read back, but a name is a *hint*: a directory can be renamed, left
half-written by a crash, or created by hand.  :func:`parse_step` therefore accepts exactly the four
naming schemes below on the last path component and nothing else, and :func:`committed_steps` never
counts a generation that has not committed.

A file system (the ``retainz://`` file system, the mount) also sees the names runtimes give files
and staging directories; ``parse_step(name, file_names=True)`` adds those two forms:

==========================  ===========================================  =================
name                        runtime                                      step
==========================  ===========================================  =================
``tmp-checkpoint-500``      HF Trainer's staging directory (renamed to    500
                            ``checkpoint-500`` once written)
``epoch=0-step=500.ckpt``   Lightning ``ModelCheckpoint`` (``step=N``     500
                            after the start, ``-`` or ``_``)
==========================  ===========================================  =================

The four id forms:

==========================  ===========================================  =================
id (last path component)    runtime                                      step
==========================  ===========================================  =================
``step-500``                TorchTitan (``{folder}/step-{N}``)           500
``iter_0001000``            Megatron-LM (``{save}/iter_{N:07d}``)        1000
``checkpoint-500``          HF Trainer (``{output_dir}/checkpoint-{N}``)  500
``global_step500``          DeepSpeed / GPT-NeoX (``global_step{N}``)    500
==========================  ===========================================  =================
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable

__all__ = ["parse_step", "committed_steps", "MAX_STEP_DIGITS", "STEP_NAMES", "HF_STAGING", "LIGHTNING"]

#: Longer digit strings are refused (no training run has 10**18 steps; a longer number is not a step).
MAX_STEP_DIGITS = 18

# ASCII digits only: ``\d`` would also accept other scripts' digits, which no runtime writes.
#: The one set of checkpoint-name patterns: the name each runtime gives one save (matched whole; group
#: 1 is the step), by retention rule name (the id forms above; DeepSpeed under ``deepspeed``).
STEP_NAMES = {
    "torchtitan": re.compile(r"step-([0-9]+)"),
    "megatron": re.compile(r"iter_([0-9]+)"),
    "hf": re.compile(r"checkpoint-([0-9]+)"),
    "deepspeed": re.compile(r"global_step([0-9]+)"),
}
#: HF Trainer ``_save_checkpoint`` writes ``tmp-checkpoint-N`` and renames it (file names only; whole).
HF_STAGING = re.compile(r"tmp-checkpoint-([0-9]+)")
#: Lightning ``ModelCheckpoint`` file names (``{epoch}-{step}`` -> ``epoch=0-step=500.ckpt``; searched).
LIGHTNING = re.compile(r"(?:^|[-_])step=([0-9]+)")


def parse_step(checkpoint_id: str, *, file_names: bool = False) -> int | None:
    """Training step named by a checkpoint id, or ``None``.

    Only the last path component counts (one trailing ``/`` is ignored), and it must match one of
    ``step-N``, ``iter_N``, ``checkpoint-N``, ``global_stepN`` exactly: no prefix, suffix, sign,
    whitespace or non-ASCII digit (``step-10.tmp``, ``step-10-unfinished``, ``xstep-10`` are ``None``).

    Args:
        checkpoint_id: the id the runtime passed (a path string).
        file_names: also read HF's ``tmp-checkpoint-N`` and Lightning's ``…step=N…`` (names on a
            file system: the ``retainz://`` file system and the mount).

    Returns:
        The step (steps, >= 0), or ``None`` when the name is none of the forms (or has more than
        :data:`MAX_STEP_DIGITS` digits).
    """
    if not isinstance(checkpoint_id, str):
        return None
    path = checkpoint_id[:-1] if checkpoint_id.endswith("/") else checkpoint_id
    name = path.rsplit("/", 1)[-1]
    m = None
    for pattern in STEP_NAMES.values():
        m = pattern.fullmatch(name)
        if m:
            break
    if m is None and file_names:
        m = HF_STAGING.fullmatch(name) or LIGHTNING.search(name)
    if m is None:
        return None
    digits = m.group(1)
    return int(digits) if len(digits) <= MAX_STEP_DIGITS else None


def committed_steps(ids: Iterable[str], committed: Container[str]) -> list[tuple[int, str]]:
    """The committed checkpoints among ``ids`` that name a step, sorted by step then id.

    This is what a retention rule may count: a generation whose commit record does not exist (still
    writing, or abandoned by a crash) is skipped, and so is an id that names no step.

    Args:
        ids: checkpoint ids (e.g. a directory listing).
        committed: the ids whose commit is durable.

    Returns:
        ``(step, id)`` pairs, oldest first.
    """
    out = []
    for cid in ids:
        if cid not in committed:
            continue
        step = parse_step(cid)
        if step is not None:
            out.append((step, cid))
    out.sort()
    return out
