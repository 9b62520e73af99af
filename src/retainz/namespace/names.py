"""The namespace's rules: paths -> generation ids and shard names, the names the store can keep,
and each runtime's commit point.  One set of rules for both faces (the FUSE mount and ``retainz://``).

The store is flat (generations of shards, no rename); the namespace lays a directory tree over it,
so a checkpoint written through either face is the same generation:

* a **checkpoint directory** ``D`` is one generation, id ``encode_path(D)``
  (``run/checkpoint-500`` -> ``run%2Fcheckpoint-500``), and every file under it is a shard named by
  its path relative to ``D`` (:func:`retainz.ids.shard_name`: ``/`` and ``%`` escaped, so Megatron's
  ``iter_0000100/mp_rank_00/model_optim_rng.pt`` is shard ``mp_rank_00%2Fmodel_optim_rng.pt``).  A
  directory is a checkpoint directory when its name is one the runtimes give their saves
  (:func:`retainz.retention.parse_step` with ``file_names``): ``step-N`` (TorchTitan), ``iter_NNNNNNN`` (Megatron-LM),
  ``checkpoint-N`` and ``tmp-checkpoint-N`` (HF Trainer), ``global_stepN`` (DeepSpeed), a
  ``…step=N….ckpt`` directory (Lightning's sharded strategies); or, as in the fsspec filesystem, when
  it holds DCP files (``*.distcp``, ``.metadata``).  The outermost such directory on a path wins (an HF
  ``checkpoint-N`` holding DeepSpeed's ``global_stepN`` is one generation).
* any **other file** is a generation of its own, id ``@`` + ``encode_path(path)``, one shard ``file``.
* a later **version** of a path (an atomic replace, a rewritten tracker file) gets ``#N`` appended to
  its id; the newest commit (``commit_seq``) of a path is the one visible, older ones are retired
  (:func:`newest_versions`).
* a generation renamed while it was being written carries one more shard, :data:`LAYOUT_SHARD`
  (JSON ``{"path": ..., "names": {shard: relative path}}``), which overrides what its id says.
"""

from __future__ import annotations

import errno
import json
import posixpath
import re

from retainz.errors import InvalidIdError
from retainz.ids import VERSION_ROOM, dir_generation_id, file_generation_id, shard_name
from retainz.retention.steps import HF_STAGING, LIGHTNING, parse_step
from retainz.store.format import check_id

__all__ = [
    "FILE_SHARD", "LAYOUT_SHARD", "is_checkpoint_dir_name", "checkpoint_root",
    "generation_for", "commit_point", "COMMIT_POINTS", "TRACKER_FILES", "tracked_names", "newest_versions", "layout_blob",
    "read_layout", "is_dcp_name", "NameRefused", "check_name", "errno_of_id",
]

_DCP_NAME = re.compile(r"(.*\.distcp|(__\d+)?\.metadata(\.tmp)?)")



def is_dcp_name(name: str) -> bool:
    """True for DCP's file names (``*.distcp``, ``.metadata``, ``.metadata.tmp``, ``__N.metadata``):
    their directory is a checkpoint directory whatever its name."""
    return bool(_DCP_NAME.fullmatch(name))

#: The shard of a single-file generation (the fsspec filesystem's name for it).
FILE_SHARD = "file"
#: The shard of a generation renamed while being written; no escaped path can produce this name.
LAYOUT_SHARD = "%layout"


#: Tracker files: the runtime's last write of a save, naming the checkpoint it completes.
#: ``latest_checkpointed_iteration.txt``: Megatron-LM ``megatron/training/checkpointing.py``
#: ``save_checkpoint`` writes ``str(iteration)`` to ``get_checkpoint_tracker_filename(save_dir)`` on
#: rank 0 after every rank has saved its ``iter_NNNNNNN/mp_rank_XX/model_optim_rng.pt``.
#: ``latest``: DeepSpeed ``deepspeed/runtime/engine.py`` ``DeepSpeedEngine.save_checkpoint`` writes
#: the tag (``global_stepN``) to ``save_dir/latest`` on rank 0 after the checkpoint files
#: (``save_latest=True``, the default).
TRACKER_FILES = ("latest_checkpointed_iteration.txt", "latest")

#: Commit point of each kind of checkpoint directory (:func:`commit_point`), for docs and logs.
COMMIT_POINTS = {
    "megatron-tracker": "Megatron-LM writes latest_checkpointed_iteration.txt naming the iteration",
    "deepspeed-latest": "DeepSpeed writes `latest` naming the tag",
    "hf-trainer-state": "HF Trainer closes trainer_state.json, the last file _save_checkpoint writes",
    "hf-rename": "HF Trainer renames tmp-checkpoint-N to checkpoint-N",
    "dcp-metadata": "DCP closes (or renames .metadata.tmp to) .metadata, written after every data file",
    "closed": "every file is closed and the next save starts, a file of it is read back, the directory "
              "is fsync'ed, or the mount is unmounted cleanly",
}


def is_checkpoint_dir_name(name: str) -> bool:
    """True for a directory name a runtime gives one save (one that names a step,
    :func:`retainz.retention.parse_step` with ``file_names``); a Lightning file
    ``epoch=0-step=10.ckpt`` counts only as a directory (its sharded strategies)."""
    if name.endswith(".ckpt"):
        return LIGHTNING.search(name) is not None
    return parse_step(name, file_names=True) is not None


def checkpoint_root(path: str, is_dir: callable = lambda p: False) -> str | None:
    """The checkpoint directory a file path belongs to, or ``None`` (the file is its own generation).

    Args:
        path: a file's path inside the mount, no leading ``/`` (``run/checkpoint-5/config.json``).
        is_dir: tells whether a ``*.ckpt`` ancestor is a directory (Lightning's names are files too).

    The outermost ancestor with a checkpoint name wins; otherwise a DCP file name (fsspec rule)
    makes its parent directory the generation.
    """
    parts = path.split("/")
    for i in range(len(parts) - 1):
        name = parts[i]
        if is_checkpoint_dir_name(name) and (not name.endswith(".ckpt") or is_dir("/".join(parts[:i + 1]))):
            return "/".join(parts[:i + 1])
    if len(parts) > 1 and is_dcp_name(parts[-1]):
        return "/".join(parts[:-1])
    return None


def generation_for(path: str, is_dir: callable = lambda p: False) -> tuple[str, str, bool]:
    """``(generation id, shard name, is_directory_generation)`` of a new file at ``path`` (no version):
    the shard of its checkpoint directory's generation (:func:`checkpoint_root`), or a generation of
    its own (shard :data:`FILE_SHARD`).

    Raises:
        ValueError: a DCP file at the top of the device (it needs a checkpoint directory).
    """
    root = checkpoint_root(path, is_dir)
    if root is not None:
        return dir_generation_id(root), shard_name(posixpath.relpath(path, root)), True
    if is_dcp_name(path):
        raise ValueError(f"{path}: DCP files must be inside a checkpoint directory")
    return file_generation_id(path), FILE_SHARD, False


class NameRefused(OSError):
    """A name the store could not keep, refused where it is created: ``errno`` is ``ENAMETOOLONG``
    (an id or shard name over 255 bytes) or ``EINVAL`` (not UTF-8, another id rule)."""


def errno_of_id(e: InvalidIdError) -> int:
    """``ENAMETOOLONG`` for an id over the store's 255 bytes, ``EINVAL`` for any other id rule."""
    return errno.ENAMETOOLONG if "longer than" in str(e) else errno.EINVAL


def check_name(path: str, *, directory: bool = False, is_dir: callable = lambda p: False) -> None:
    """Refuse a name the store could not keep, at the call that creates it: the generation id (with
    :data:`VERSION_ROOM`) and shard name ``path`` maps to must pass the store's id rules
    (:func:`retainz.store.format.check_id`: at most 255 bytes of UTF-8, no control characters), and
    the name must be UTF-8.  A directory is refused when its own id fails: every id under it is
    longer.  Both faces call this (the mount turns it into the errno, ``retainz://`` raises it).

    Raises:
        NameRefused: ``ENAMETOOLONG`` or ``EINVAL``, the message naming the rule.
    """
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise NameRefused(errno.EINVAL, f"{path!r}: the name is not UTF-8 (the store keeps UTF-8 names)") from None
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise NameRefused(errno.EINVAL, f"{path!r}: empty, '.' and '..' components are not names")
    root = None if directory else checkpoint_root(path, is_dir)
    if directory or root is not None:
        checks = [(dir_generation_id(root or path) + VERSION_ROOM, "generation id")]
        if root is not None:
            checks.append((shard_name(posixpath.relpath(path, root)), "shard name"))
    else:
        if is_dcp_name(path):
            raise NameRefused(errno.EINVAL, f"{path}: DCP files must be inside a checkpoint directory")
        checks = [(file_generation_id(path) + VERSION_ROOM, "generation id")]
    for value, what in checks:
        try:
            check_id(value, what)
        except InvalidIdError as e:
            raise NameRefused(errno_of_id(e), f"{path}: the store cannot keep this name ({e})") from None


def commit_point(directory: str, files: set[str] | dict) -> str:
    """The commit point of a checkpoint directory (a key of :data:`COMMIT_POINTS`), from its name
    and the relative paths written into it so far.

    Sources (each runtime's last write of a save):

    * ``iter_NNNNNNN``: Megatron-LM ``save_checkpoint`` -> tracker file (``megatron-tracker``), also
      for its ``torch_dist`` format, whose ``metadata.json`` follows DCP's ``.metadata``;
    * ``global_stepN``: DeepSpeed ``save_checkpoint`` -> ``latest`` (``deepspeed-latest``);
    * ``checkpoint-N``: HF Trainer ``Trainer._save_checkpoint`` (transformers 5.x) saves the model,
      optimizer, scheduler, RNG state, then ``self.state.save_to_json(.../trainer_state.json)``, then
      ``rotate_checkpoints`` (``hf-trainer-state``);
    * ``tmp-checkpoint-N``: HF Trainer 4.3x ``_save_checkpoint`` wrote there and ``os.rename``\\ d it to
      ``checkpoint-N`` last (``hf-rename``);
    * DCP files: ``FileSystemWriter.finish`` writes ``.metadata.tmp`` and renames it to ``.metadata``
      after every ``*.distcp`` (``dcp-metadata``; TorchTitan ``step-N``);
    * anything else (``torch.save`` into ``step-N/``): ``closed``.
    """
    name = posixpath.basename(directory)
    if name.startswith("iter_"):
        return "megatron-tracker"
    if name.startswith("global_step"):
        return "deepspeed-latest"
    if HF_STAGING.fullmatch(name):
        return "hf-rename"
    if name.startswith("checkpoint-"):
        return "hf-trainer-state"
    if any(is_dcp_name(posixpath.basename(f)) for f in files):
        return "dcp-metadata"
    return "closed"


def tracked_names(tracker: str, content: bytes) -> list[str]:
    """The checkpoint directory names a tracker file's content names (in the tracker's directory).

    ``latest_checkpointed_iteration.txt`` holds an iteration number (Megatron names the directory
    ``iter_{:07d}``; ``release`` names none here); ``latest`` holds DeepSpeed's tag.
    """
    text = content.decode("utf-8", "replace").strip()
    if tracker == "latest_checkpointed_iteration.txt":
        return [f"iter_{int(text):07d}"] if text.isdigit() else []
    if tracker == "latest":
        return [text] if text and "/" not in text else []
    return []


def newest_versions(generations) -> tuple[dict[tuple[str, str], object], list]:
    """Group committed generations by ``(kind, path)``; the newest commit of each is visible.

    Args:
        generations: ``GenerationInfo`` objects with a resolved ``path`` (``(gen, kind, path)``
            triples).

    Returns:
        ``({(kind, path): newest gen}, [older gens to retire])``: the recovery rule of an atomic
        replace (the new version commits before the old one is deleted, so after a crash both may be
        committed, and the newer one wins).
    """
    best: dict[tuple[str, str], object] = {}
    stale = []
    for g, kind, path in generations:
        key = (kind, path)
        cur = best.get(key)
        if cur is None:
            best[key] = g
        elif g.commit_seq > cur.commit_seq:
            stale.append(cur)
            best[key] = g
        else:
            stale.append(g)
    return best, stale


def layout_blob(path: str, names: dict[str, str]) -> bytes:
    """The :data:`LAYOUT_SHARD` of a generation renamed while being written."""
    return json.dumps({"path": path, "names": names}, sort_keys=True).encode()


def read_layout(blob: bytes) -> tuple[str, dict[str, str]]:
    """``(path, {shard: relative path})`` from a :data:`LAYOUT_SHARD`."""
    d = json.loads(blob)
    return str(d["path"]), {str(k): str(v) for k, v in d.get("names", {}).items()}
