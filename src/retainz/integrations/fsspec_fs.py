"""The ``retainz://`` fsspec filesystem: a checkpoint folder on a zoned device, for runtimes' own code.

URL: ``retainz:///path/to/device.img/checkpoints/step-500/__0_0.distcp``: the first path component that
is an existing file is the device (a FileDevice made by ``retainz device create``); the rest is a path
inside it.  The store is flat (generations of shards); this filesystem maps paths onto it:

* **checkpoint directories** (DCP): the DCP files (``*.distcp``, ``.metadata``, ``.metadata.tmp``,
  ``__N.metadata``) of directory ``D`` are the shards of one generation, id ``quote(D)``
  (``checkpoints/step-500`` -> ``checkpoints%2Fstep-500``).  Data files stream into the store as they are
  written.  ``.metadata`` (written directly, or DCP's ``.metadata.tmp`` renamed to it) is written last and
  **commits** the generation: the commit point.  Until then the directory exists only in the writing
  filesystem instance, and ``D/.metadata`` does not exist, so runtimes that look for ``.metadata``
  (TorchTitan's load discovery, DCP) never see an uncommitted checkpoint.
* **checkpoint files** (any other name, e.g. Lightning's ``epoch=0-step=10.ckpt``): each file is its
  own generation, id ``@`` + ``quote(path)``, committed when the file is closed (or when an fsspec
  transaction commits).
* **directories** are implied by the files under them (no empty directories, as on an object store:
  ``mkdir`` is a no-op).
* ``rm -r D`` retires every generation under ``D`` (``store.delete``): the runtimes' purge.  Removing
  ``D/.metadata`` retires ``D``'s generation (invalidate-first, as OLMo-core does).

Append-only: a committed file cannot be changed or partly removed (``PermissionError``); writing a
checkpoint file that exists replaces it at the new file's commit (replace-on-commit: the old one stays
readable until then, and a crash leaves exactly one of the two; an exception inside the ``with``
abandons the new file); ``mv`` other than ``X.tmp`` -> ``X`` inside an uncommitted directory is copy +
delete.

Storage options (``fsspec.filesystem("retainz", retention=...)``, or for runtimes that call
``url_to_fs`` without options, ``fsspec.config.conf["retainz"]`` / the environment variable
``FSSPEC_RETAINZ_RETENTION``):

* ``retention``: the runtime's retention rule (``"torchtitan:interval=500,keep_latest_k=10"``), or a
  ``{folder: rule}`` dict keyed by the folder inside the device: it becomes each generation's placement
  hint (:func:`retainz.retention.rule_hint`), with the step parsed from the name
  (:func:`retainz.retention.parse_step` with ``file_names``: ``step-N``, ``iter_N``, ``checkpoint-N``,
  ``global_stepN``, ``tmp-checkpoint-N``, Lightning's ``step=N``).  Before its first save into a
  series (a checkpoint's parent folder, :mod:`retainz.retention.series`) an instance re-hints that
  series' committed checkpoints with its rule (a job resumed with a changed rule); it never re-hints
  another series, and it never deletes: the runtime's own purge (``rm -r``) retires checkpoints;
* ``wait``: seconds to wait for a device another process holds (default 120).

A filesystem instance holds each device it touches open until :meth:`RetainZFileSystem.close_devices`
(or :meth:`RetainZFileSystem.close_all`): a device file is locked by one process at a time, so a
``retainz://`` device is used by one process, unless a node service serves it (``retainz serve``,
docs/node.md): then the ranks of a torchrun job writing one checkpoint directory join one generation
(:func:`~retainz.integrations._stores.join_token`); a rank other than 0 leaves it once its data files
are closed, and rank 0's ``.metadata`` commits every rank's files.

Registered under the protocol ``retainz`` through the ``fsspec.specs`` entry point (pyproject.toml) and
:func:`register`.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import threading
import weakref
from urllib.parse import unquote

from fsspec.spec import AbstractFileSystem

from retainz.errors import GenerationNotFoundError
from retainz.integrations import _stores
from retainz.integrations.fsspec_files import (
    _FILE_SHARD,
    _Pending,
    _ReadFile,
    _WriteFile,
    generation_for,
    is_dcp_name,
)
from retainz.node import NodeStore
from retainz.retention.online import rule_hint
from retainz.retention.series import generation_path, members, series_of
from retainz.retention.steps import parse_step

__all__ = ["RetainZFileSystem", "register", "generation_for", "is_dcp_name"]

class RetainZFileSystem(AbstractFileSystem):
    """fsspec filesystem over RetainZ stores on FileDevice files (see the module docstring)."""

    protocol = "retainz"
    root_marker = "/"
    cachable = True

    def __init__(self, retention: str | dict[str, str] | None = None, wait: float = 120.0, **kwargs):
        super().__init__(**kwargs)
        self.retention = retention
        self.wait = float(wait)
        self._lock = threading.RLock()
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._held: dict[str, contextlib.ExitStack] = {}
        self._entered: set[tuple[str, str]] = set()      # (device, series) re-hinted by this instance
        weakref.finalize(self, _release_all, self._held, self._lock)

    # -- paths -------------------------------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path):
        path = super()._strip_protocol(path)
        return "/" + path.lstrip("/") if path else "/"

    def _split(self, path: str) -> tuple[str, str]:
        """``(device file, path inside it)``; raises FileNotFoundError if no component is a file."""
        path = self._strip_protocol(path)
        parts = [p for p in path.split("/") if p]
        cur = "/"
        for i, part in enumerate(parts):
            cur = os.path.join(cur, part)
            if os.path.isfile(cur):
                inner = "/".join(parts[i + 1:])
                if any(p in (".", "..") for p in parts[i + 1:]):
                    raise ValueError(f"{path}: '.' and '..' are not allowed inside a device")
                return cur, inner
            if not os.path.isdir(cur):
                break
        raise FileNotFoundError(f"{path}: no RetainZ device file on this path")

    def _full(self, device: str, inner: str) -> str:
        return device + ("/" + inner if inner else "")

    def _rule(self, inner: str) -> str | None:
        if isinstance(self.retention, dict):
            best = None
            for folder, rule in self.retention.items():
                f = folder.strip("/")
                if (not f or inner == f or inner.startswith(f + "/")) and (best is None or len(f) > len(best[0])):
                    best = (f, rule)
            return best[1] if best else None
        return self.retention

    def _hint(self, inner: str, step: int | None):
        """The hint for a generation at ``step`` under folder ``inner`` (``None`` without a rule)."""
        rule = self._rule(inner)
        return rule_hint(rule, step) if rule else None

    def _store(self, device: str):
        """The open store of ``device``: opened on first use and held by this instance until
        :meth:`close_devices` (opening a store replays its journal; closing journals and flushes)."""
        with self._lock:
            stack = self._held.get(device)
            if stack is None:
                stack = contextlib.ExitStack()
                store = stack.enter_context(_stores.using(device, wait=self.wait))
                stack.store = store
                self._held[device] = stack
                self._entered = {k for k in self._entered if k[0] != device}
            return contextlib.nullcontext(stack.store)

    def _enter_series(self, device: str, store, series: str) -> None:
        """Before this instance's first save into ``series`` of ``device``: :meth:`_rehint` that
        series (a job resumed with a changed rule re-hints its own checkpoints, never another job's)."""
        if not self.retention:
            return
        with self._lock:
            if (device, series) in self._entered:
                return
            self._rehint(store, series)
            self._entered.add((device, series))

    def _rehint(self, store, series: str) -> list[str]:
        """Give every committed generation of ``series`` (:mod:`retainz.retention.series`) the hint
        this instance's retention rule predicts for it, where it differs from the one it was saved
        with (the rule changed on resume: ``keep_latest_k`` 10 -> 3): journaled by
        ``Store.update_hint``.  Returns the ids changed."""
        changed = []
        for _, g in members(store.generations(), series):
            path = generation_path(g.id)
            if g.id.startswith("@"):
                hint = self._hint(series_of(path), parse_step(path, file_names=True))
            else:
                hint = self._hint(path, parse_step(path))
            if hint is None or (hint.reclaim_step, hint.condition) == (g.hint.reclaim_step, g.hint.condition):
                continue
            if hint.reclaim_step is not None and hint.reclaim_step < g.step:
                continue
            store.update_hint(g.id, hint)
            changed.append(g.id)
        return changed

    @classmethod
    def close_all(cls) -> None:
        """:meth:`close_devices` on every cached instance."""
        for inst in list(cls._cache.values()):
            inst.close_devices()

    def close_devices(self) -> None:
        """Abort this instance's uncommitted generations and release every device it holds (the
        device file's lock is per process: another process can open it only after this)."""
        with self._lock:
            for key in list(self._pending):
                self._abort(key)
        _release_all(self._held, self._lock)

    # -- the namespace -----------------------------------------------------------------------------
    def _catalog(self, device: str) -> tuple[dict[str, int], set[str]]:
        """``({file: size}, {directories})`` inside ``device``: committed generations plus this
        instance's uncommitted ones and made directories."""
        files: dict[str, int] = {}
        with self._store(device) as store:
            gens = store.generations()
        for g in gens:
            if g.id.startswith("@"):
                if _FILE_SHARD in g.shards:
                    files[unquote(g.id[1:])] = g.shards[_FILE_SHARD].size
            else:
                d = unquote(g.id)
                for name, s in g.shards.items():
                    files[f"{d}/{name}"] = s.size
        dirs = {""}
        with self._lock:
            for (dev, _), p in self._pending.items():
                if dev == device:
                    dirs.add(p.directory)
                    for name, size in p.files.items():
                        files[f"{p.directory}/{name}"] = size or 0
                    for name, blob in p.tmp.items():
                        files[f"{p.directory}/{name}"] = len(blob)
        for f in list(files) + list(dirs):
            parent = posixpath.dirname(f)
            while parent:
                dirs.add(parent)
                parent = posixpath.dirname(parent)
        return files, dirs

    def ls(self, path, detail=True, **kwargs):
        device, inner = self._split(path)
        files, dirs = self._catalog(device)
        if inner in files:
            entries = [{"name": self._full(device, inner), "size": files[inner], "type": "file"}]
        elif inner in dirs:
            prefix = inner + "/" if inner else ""
            entries = []
            for f, size in sorted(files.items()):
                if f.startswith(prefix) and "/" not in f[len(prefix):]:
                    entries.append({"name": self._full(device, f), "size": size, "type": "file"})
            for d in sorted(dirs):
                if d and d.startswith(prefix) and "/" not in d[len(prefix):]:
                    entries.append({"name": self._full(device, d), "size": 0, "type": "directory"})
        else:
            raise FileNotFoundError(self._full(device, inner))
        return entries if detail else [e["name"] for e in entries]

    def info(self, path, **kwargs):
        device, inner = self._split(path)
        files, dirs = self._catalog(device)
        if inner in files:
            return {"name": self._full(device, inner), "size": files[inner], "type": "file"}
        if inner in dirs:
            return {"name": self._full(device, inner), "size": 0, "type": "directory"}
        raise FileNotFoundError(self._full(device, inner))

    def mkdir(self, path, create_parents=True, **kwargs):
        """No-op: directories exist through the files under them (no empty directories, as on an
        object store); a path holding a file is refused."""
        device, inner = self._split(path)
        if inner and self._catalog(device)[0].get(inner) is not None:
            raise FileExistsError(self._full(device, inner))

    def makedirs(self, path, exist_ok=False):
        self.mkdir(path)

    def rmdir(self, path):
        """No-op for a directory with nothing under it; refuses a non-empty one."""
        device, inner = self._split(path)
        files, dirs = self._catalog(device)
        prefix = inner + "/"
        if any(f.startswith(prefix) for f in files):
            raise OSError(39, "Directory not empty", self._full(device, inner))

    # -- removal: the runtimes' purge --------------------------------------------------------------
    def rm(self, path, recursive=False, maxdepth=None):
        paths = path if isinstance(path, (list, tuple)) else [path]
        for p in paths:
            for one in (self.expand_path(p, recursive=recursive, maxdepth=maxdepth)
                        if any(c in str(p) for c in "*?[") else [p]):
                self._rm_one(one, recursive)

    def _rm_one(self, path: str, recursive: bool) -> None:
        device, inner = self._split(path)
        files, dirs = self._catalog(device)
        if inner in files:
            self._rm_file(device, inner)
            return
        if inner not in dirs:
            raise FileNotFoundError(self._full(device, inner))
        prefix = inner + "/" if inner else ""
        has_children = any(f.startswith(prefix) for f in files) or any(d != inner and d.startswith(prefix)
                                                                      for d in dirs)
        if has_children and not recursive:
            raise IsADirectoryError(f"{self._full(device, inner)}: a directory (use recursive=True)")
        with self._store(device) as store:
            for g in store.generations():
                gpath = unquote(g.id[1:] if g.id.startswith("@") else g.id)
                if not inner or gpath == inner or gpath.startswith(prefix):
                    with contextlib.suppress(GenerationNotFoundError):
                        store.delete(g.id)
            with self._lock:
                for key, p in list(self._pending.items()):
                    if key[0] == device and (not inner or p.directory == inner or p.directory.startswith(prefix)):
                        self._abort(key)

    def _rm_file(self, device: str, inner: str) -> None:
        gen, name, is_dir = generation_for(inner)
        with self._lock:
            pending = self._pending.get((device, gen))
            if pending is not None:
                if name in pending.tmp:
                    del pending.tmp[name]
                else:                       # a partly written data file: the save failed
                    self._abort((device, gen))
                return
        with self._store(device) as store:
            if is_dir and name not in (".metadata",):
                raise PermissionError(f"{self._full(device, inner)}: append-only store: a committed checkpoint's "
                                      "files cannot be removed one by one (rm -r the directory, or rm its "
                                      ".metadata to retire it)")
            store.delete(gen)

    def _rm(self, path):
        self._rm_one(path, recursive=False)

    def rm_file(self, path):
        self._rm_one(path, recursive=False)

    def _leave(self, key) -> None:
        """A rank other than 0 is done with a joined directory generation once none of its files there
        is open: it leaves it to rank 0, whose ``.metadata`` commits it."""
        with self._lock:
            p = self._pending.get(key)
            if p is None or None in p.files.values() or p.tmp:
                return
            del self._pending[key]
        try:
            p.writer.leave()
        finally:
            p.release()

    def _abort(self, key) -> None:
        p = self._pending.pop(key, None)
        if p is not None:
            with contextlib.suppress(Exception):
                p.writer.abort()
            p.release()

    # -- writing -------------------------------------------------------------------------------------
    def _pending_for(self, device: str, inner: str) -> _Pending:
        gen, _, _ = generation_for(inner)
        key = (device, gen)
        with self._lock:
            p = self._pending.get(key)
            if p is not None:
                return p
            directory = posixpath.dirname(inner)
            stack = contextlib.ExitStack()
            store = stack.enter_context(self._store(device))
            try:
                try:
                    store.generation(gen)
                    raise FileExistsError(f"{self._full(device, directory)}: checkpoint already committed "
                                          "(append-only: rm -r it before writing it again)")
                except GenerationNotFoundError:
                    pass
                step = parse_step(directory, file_names=True)
                self._enter_series(device, store, series_of(directory))
                token = _stores.join_token(self._full(device, directory)) if isinstance(store, NodeStore) else None
                if token:      # the ranks of one job on one served device write one generation
                    writer = store.begin_generation(gen, step or 0, hint=self._hint(directory, step), join=token)
                else:
                    writer = store.begin_generation(gen, step or 0, hint=self._hint(directory, step))
            except BaseException:
                stack.close()
                raise
            p = self._pending[key] = _Pending(writer, directory)
            p.release = stack.close
            return p

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if mode == "rb":
            return _ReadFile(self, path, mode, block_size=block_size or "default",
                             cache_options=cache_options, **kwargs)
        if mode not in ("wb", "xb"):
            if "a" in mode or "+" in mode:
                raise PermissionError(f"mode {mode!r}: a committed checkpoint file cannot be appended to or "
                                      "updated in place (the store is append-only: rb, wb, xb)")
            raise ValueError(f"mode {mode!r} is not supported; valid: rb, wb, xb")
        device, inner = self._split(path)
        if not inner:
            raise IsADirectoryError(path)
        if mode == "xb" and self.exists(path):
            raise FileExistsError(path)
        return _WriteFile(self, path, mode, block_size=block_size or "default", autocommit=autocommit, **kwargs)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """``X.tmp`` -> ``X`` in an uncommitted checkpoint directory (DCP's commit of ``.metadata``)
        is the commit; anything else is copy + delete."""
        d1, i1 = self._split(path1)
        d2, i2 = self._split(path2)
        g1, n1, dir1 = generation_for(i1) if i1 else ("", "", False)
        g2, n2, dir2 = generation_for(i2) if i2 else ("", "", False)
        with self._lock:
            p = self._pending.get((d1, g1))
            if d1 == d2 and dir1 and dir2 and g1 == g2 and p is not None and n1 in p.tmp:
                blob = p.tmp.pop(n1)
                self._write_small(d1, i2, blob)
                return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def _write_small(self, device: str, inner: str, blob: bytes) -> None:
        with self.open(self._full(device, inner), "wb") as f:
            f.write(blob)

    def cp_file(self, path1, path2, **kwargs):
        """Copy by streaming the bytes through (the store has no server-side copy)."""
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        with self.open(path1, "rb") as src, self.open(path2, "wb") as dst:
            while block := src.read(8 << 20):
                dst.write(block)

    def created(self, path):
        raise NotImplementedError("the store keeps no wall-clock times (logical time only)")

    def modified(self, path):
        raise NotImplementedError("the store keeps no wall-clock times (logical time only)")

    # -- reading -------------------------------------------------------------------------------------
    def _read_range(self, device: str, inner: str, start: int, end: int, window: dict) -> bytes:
        """Bytes ``[start, end)`` of a committed file, through the store's verified extent reads
        (``Store.read_shard_extent``); ``window`` caches the last extent read."""
        gen, name, _ = generation_for(inner)
        out = bytearray()
        with self._store(device) as store:
            size = store.generation(gen).shards[name].size
            pos = start
            while pos < min(end, size):
                w = window.get("data")
                if w is None or not window["start"] <= pos < window["start"] + len(w):
                    window["start"], data = store.read_shard_extent(gen, name, pos)
                    w = window["data"] = memoryview(data)
                take = w[pos - window["start"]:end - window["start"]]
                out += take
                pos += len(take)
        return bytes(out)


def _release_all(held: dict, lock) -> None:
    with lock:
        for stack in held.values():
            with contextlib.suppress(Exception):
                stack.close()
        held.clear()


def register(clobber: bool = True) -> None:
    """Register ``retainz`` with fsspec in this process (the entry point does it for installed
    packages; this is for source checkouts)."""
    import fsspec

    fsspec.register_implementation("retainz", RetainZFileSystem, clobber=clobber)

