"""Generation ids: the one scheme of paths <-> generation ids, series and versions every face uses.

The store is flat (generations of shards); every face names a checkpoint by a path inside the device,
and this module is the one translation (the FUSE mount and ``retainz://`` through
:mod:`retainz.namespace`, the DCP plugin, the retention callbacks, the node service's job scopes):

* a checkpoint **directory** ``D`` is the generation ``encode_path(D)`` (``jobs%2Fa%2Fstep-500``,
  :func:`dir_generation_id`); a **single-file** checkpoint ``F`` is ``@`` + ``encode_path(F)``
  (``@l%2Fepoch=0-step=10.ckpt``, :func:`file_generation_id`); a later **version** of a path appends
  ``#N``; :func:`parse_generation_id` and :func:`generation_path` read them back.  Ids written before
  the minimal encoding (``epoch%3D0``) decode the same.  A file under a checkpoint directory is the
  shard :func:`shard_name` of its relative path.
* A **series** is the folder a job saves its checkpoints into, as a path inside the device with no
  leading or trailing ``/`` (``""`` is the device's root).  A checkpoint belongs to the series of its
  **parent directory**, exactly: ``jobs/a/step-500`` is in ``jobs/a``; ``jobs/a2/step-500`` (a job
  whose name starts like another's), ``jobs/a/sub/step-500`` (a nested folder) and ``step-1/step-5``
  (a step-like name inside another job's path) are each in their own series.  This is how the
  runtimes scope their own purges: TorchTitan lists ``{dump_folder}/{checkpoint.folder}``
  (``CheckpointManager._purge_stale_checkpoints``), HF Trainer globs ``{output_dir}/checkpoint-*``
  (``Trainer._sorted_checkpoints``), Megatron-LM deletes ``{save}/iter_N``.  Every retention path
  decides membership with :func:`members` and nothing else.
* A runtime that names a checkpoint by a path or URL (a DCP checkpoint id) gives its last component
  (:func:`checkpoint_name`); in a series its id is :func:`series_generation_id` (``jobs%2Fa%2Fstep-500``,
  the ``retainz://`` id of ``jobs/a/step-500``); without one (the root series) the name itself
  (``step-500``).

Which names are checkpoints and which step they name is :mod:`retainz.retention.steps`.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote

from retainz.errors import InvalidIdError

__all__ = ["ROOT", "ID_SAFE", "FILE_PREFIX", "VERSION_SEP", "VERSION_ROOM", "encode_path", "series_folder",
           "series_of", "generation_path", "parse_generation_id", "dir_generation_id", "file_generation_id",
           "series_generation_id", "checkpoint_name", "member_name", "members", "shard_name", "shard_path"]

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

#: Prefix of a single-file generation's id.
FILE_PREFIX = "@"
#: Separator of a later version's number in a generation id (``run%2Fstep-5#2``).
VERSION_SEP = "#"
#: Kept free in every generation id when a name is created, for the ``#N`` of a later version
#: (:func:`file_generation_id`): a name is refused unless its id plus these bytes passes
#: :func:`retainz.store.format.check_id` (:func:`retainz.namespace.names.check_name`).
VERSION_ROOM = "#99"

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
    return parse_generation_id(gid)[1]


def parse_generation_id(gid: str) -> tuple[str, str, int]:
    """``(kind, path, version)`` of a generation id: kind ``"file"`` (``@`` ids) or ``"dir"``; version 0
    without a ``#N``."""
    base, _, ver = gid.partition(VERSION_SEP)
    version = int(ver) if ver.isdigit() else 0
    if base.startswith(FILE_PREFIX):
        return "file", unquote(base[len(FILE_PREFIX):]), version
    return "dir", unquote(base), version


def dir_generation_id(directory: str, version: int = 0) -> str:
    """:func:`encode_path` of checkpoint directory ``directory`` (``run/step-5`` -> ``run%2Fstep-5``),
    ``#version`` appended for a later version."""
    gid = encode_path(directory)
    return gid if not version else f"{gid}{VERSION_SEP}{version}"


def file_generation_id(path: str, version: int = 0) -> str:
    """``@`` + :func:`encode_path` of a single-file checkpoint ``path`` (``l/epoch=0-step=10.ckpt`` ->
    ``@l%2Fepoch=0-step=10.ckpt``), ``#version`` appended for a later version."""
    gid = FILE_PREFIX + encode_path(path)
    return gid if not version else f"{gid}{VERSION_SEP}{version}"


def checkpoint_name(checkpoint_id: str | os.PathLike) -> str:
    """The name of a checkpoint a runtime names by a path or URL (a DCP checkpoint id): its last path
    component (``/ckpt/run/step-500`` -> ``step-500``; ``retainz:///d.img/ckpt/step-500/`` likewise); the
    generation id is :func:`series_generation_id` of it.

    Raises:
        InvalidIdError: no usable last component (``""``, ``.``, ``..``).
    """
    text = os.fspath(checkpoint_id).rstrip("/")
    name = text.rsplit("/", 1)[-1]
    if not name or name in (".", ".."):
        raise InvalidIdError(f"checkpoint id {os.fspath(checkpoint_id)!r} has no last path component to "
                             "use as a generation id")
    return name


def shard_name(rel: str) -> str:
    """The shard name of a file at ``rel`` (relative to its checkpoint directory): ``%`` and ``/``
    escaped (a DCP file name is itself, as in the fsspec filesystem); ``.`` encoded too where the text
    would hold ``..`` (the store refuses it)."""
    text = rel.replace("%", "%25").replace("/", "%2F")
    return text.replace(".", "%2E") if ".." in text else text


def shard_path(name: str) -> str:
    """Inverse of :func:`shard_name`."""
    return unquote(name)


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
    return dir_generation_id(f"{s}/{name}")


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
