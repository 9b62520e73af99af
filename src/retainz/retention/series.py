"""Series: the checkpoints of one job, the only generations a retention path may count or retire.

A *series* is the folder a job saves its checkpoints into, as a path inside the device with no
leading or trailing ``/`` (``""`` is the device's root).  A checkpoint belongs to the series of its
**parent directory**, exactly: ``jobs/a/step-500`` is in ``jobs/a``; ``jobs/a2/step-500`` (a job
whose name starts like another's), ``jobs/a/sub/step-500`` (a nested folder) and ``step-1/step-5``
(a step-like name inside another job's path) are each in their own series.  This is how the runtimes
scope their own purges: TorchTitan lists ``{dump_folder}/{checkpoint.folder}``
(``CheckpointManager._purge_stale_checkpoints``), HF Trainer globs ``{output_dir}/checkpoint-*``
(``Trainer._sorted_checkpoints``), Megatron-LM deletes ``{save}/iter_N``.

Every retention path uses these functions and nothing else to decide membership: the retention
callbacks (:mod:`retainz.integrations.retention_callbacks`), the DCP writer's retirement
(:class:`retainz.integrations.dcp.ZonedStorageWriter`), the ``retainz://`` file system's re-hinting,
and the mount's inference (:class:`retainz.retention.inference.RetentionInference` per series).

Generation ids and paths (the id scheme the ``retainz://`` file system and the mount share): a
checkpoint directory ``D`` is the generation ``encode_path(D)`` (``jobs%2Fa%2Fstep-500``), a single-file
checkpoint ``F`` is ``@`` + ``encode_path(F)`` (``@l%2Fepoch=0-step=10.ckpt``), and a later version of a
path appends ``#N``.  Ids written before the minimal encoding (``epoch%3D0``) decode the same.  A DCP id
written without a series (``ZonedStorageWriter`` without ``series=``) is its last component only
(``step-500``): a checkpoint of the root series.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote

__all__ = ["ROOT", "series_folder", "series_of", "generation_path", "series_generation_id", "member_name",
           "members", "encode_path", "ID_SAFE"]

#: Characters a generation id keeps as written (besides letters, digits and ``_.-~``, which
#: ``urllib.parse.quote`` always keeps): the punctuation of ordinary checkpoint names
#: (``epoch=0-step=10.ckpt``, ``lr:3e-4``).  Everything else is percent-encoded: ``/`` (the store
#: refuses it in ids), ``%`` (the escape), ``#`` (the version suffix), ``@`` (the file-generation
#: prefix), spaces, shell metacharacters and non-ASCII bytes.
ID_SAFE = "=+,:;!()[]{}^"


def encode_path(path: str) -> str:
    """A path inside the device as the store can keep it in an id: percent-encoded except for the
    characters of :data:`ID_SAFE`, and with ``.`` encoded too when the text would hold ``..`` (the store
    refuses it).  :func:`generation_path` decodes it (and the older, fully encoded ids)."""
    text = quote(path, safe=ID_SAFE)
    return text.replace(".", "%2E") if ".." in text else text

#: The device's root folder as a series.
ROOT = ""


def series_folder(folder: str | None) -> str:
    """The series named by ``folder``: surrounding ``/`` dropped (``"/jobs/a/"`` -> ``"jobs/a"``),
    ``None`` or ``""`` -> :data:`ROOT`.

    Raises:
        ValueError: an empty, ``.`` or ``..`` component inside (``"a//b"``, ``"a/../b"``), or a
            component holding ``#`` (the version separator of generation ids).
    """
    if folder is None:
        return ROOT
    if not isinstance(folder, str):
        raise ValueError(f"series {folder!r}: expected a folder path (str)")
    text = folder.strip("/")
    if not text:
        return ROOT
    for part in text.split("/"):
        if part in ("", ".", "..") or "#" in part:
            raise ValueError(f"series {folder!r}: components cannot be empty, '.', '..' or hold '#'")
    return text


def series_of(path: str) -> str:
    """The series of a checkpoint at ``path`` (a path inside the device): its parent directory
    (``"jobs/a/step-500"`` -> ``"jobs/a"``, ``"step-500"`` -> ``""``; surrounding ``/`` ignored)."""
    return posixpath.dirname(path.strip("/"))


def generation_path(gid: str) -> str:
    """The path inside the device a generation id stands for (see the module docstring):
    ``"jobs%2Fa%2Fstep-500"`` -> ``"jobs/a/step-500"``, ``"@run%2Flast.ckpt#2"`` -> ``"run/last.ckpt"``,
    ``"step-500"`` -> ``"step-500"``."""
    base = gid.partition("#")[0]
    return unquote(base[1:] if base.startswith("@") else base)


def series_generation_id(series: str | None, name: str) -> str:
    """The generation id of checkpoint directory ``name`` in ``series``: ``name`` itself in the root
    series (the DCP writer's historical ids), else ``encode_path(series/name)``, the ``retainz://`` file
    system's id for that directory (so ``ls`` through either shows ``series/name``).

    Raises:
        ValueError: a malformed series (:func:`series_folder`), or a ``name`` that is empty or holds
            ``/``.
    """
    s = series_folder(series)
    if not name or "/" in name:
        raise ValueError(f"checkpoint name {name!r}: expected one path component")
    if not s:
        return name
    return encode_path(f"{s}/{name}")


def member_name(gid: str, series: str | None) -> str | None:
    """The checkpoint's name inside ``series`` (the last path component) when generation ``gid``
    belongs to ``series``, else ``None``."""
    path = generation_path(gid)
    if series_of(path) != series_folder(series):
        return None
    return posixpath.basename(path.strip("/")) or None


def members(generations: Iterable[Any], series: str | None) -> list[tuple[str, Any]]:
    """``(name, generation)`` for each of ``generations`` (objects with an ``id``: the store's
    ``GenerationInfo``) that belongs to ``series``, in the order given.  Pass the store's committed
    generations: nothing uncommitted is ever counted."""
    s = series_folder(series)
    out = []
    for g in generations:
        name = member_name(g.id, s)
        if name is not None:
            out.append((name, g))
    return out
