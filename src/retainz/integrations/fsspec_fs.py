"""The ``retainz://`` fsspec filesystem: a checkpoint folder on a zoned device, for runtimes' own code.

URL: ``retainz:///path/to/device.img/checkpoints/step-500/__0_0.distcp``: the first path component that
is an existing file is the device (a FileDevice made by ``retainz device create``); the rest is a path
inside it.  The store is flat (generations of shards); the paths inside it are the namespace of
:mod:`retainz.namespace`, the same as through the mount (``retainz mount``): this module is an adapter
that translates fsspec's calls into :class:`~retainz.namespace.Namespace` calls and holds no path state.
The rules (docs/mount.md, "The namespace"), as a runtime on ``retainz://`` sees them:

* **checkpoint directories**: a directory whose name is a runtime's save (``step-N``, ``iter_N``,
  ``checkpoint-N``, ``global_stepN``...) or that holds DCP files (``*.distcp``, ``.metadata``) is one
  generation, id ``quote(D)`` (``checkpoints/step-500`` -> ``checkpoints%2Fstep-500``), committed at its
  runtime's commit point: DCP's ``.metadata`` (written directly, or ``.metadata.tmp`` renamed to it),
  HF Trainer's ``trainer_state.json``, a Megatron/DeepSpeed tracker file; for a directory with no commit
  point of its own, when a file of it is read back, the next save in the same folder starts, or the
  instance's devices are closed (:meth:`RetainZFileSystem.close_devices`, also at interpreter exit).
  Until then the directory exists only in the writing instance, so runtimes that look for ``.metadata``
  never see an uncommitted checkpoint.
* **other files** (Lightning's ``epoch=0-step=10.ckpt``): each file is its own generation, id ``@`` +
  ``quote(path)``, committed when the file is closed.
* **re-saving** into a committed checkpoint directory (DCP's writers default to ``overwrite=True``)
  writes its next version, which replaces it at its commit point (files not rewritten are carried over);
  writing a file that exists replaces it at the new file's commit (replace-on-commit: the old one stays
  readable until then, and a crash leaves exactly one of the two).  An exception inside the ``with``
  (binary or text mode), or an error of a write, abandons the new file and refuses the checkpoint
  directory it belonged to: it never commits, and more files of it raise the same error until
  ``rm -r`` of it (docs/mount.md, "A refused checkpoint never commits").
* **directories** are implied by the files under them (no empty directories, as on an object store:
  ``mkdir`` is a no-op).
* ``rm -r D`` is ``rm -r`` through the mount: every generation under ``D`` is retired.  Removing
  ``D/.metadata`` retires ``D``'s generation (invalidate-first, as OLMo-core does); any other single file
  of a committed checkpoint is refused (``PermissionError``, append-only).  Removing a file still open
  for writing drops it (torch cleans up a failed write so).
* ``mv`` is the namespace's rename (DCP's ``.metadata.tmp`` -> ``.metadata`` commits; a committed file
  is copied through the store into its new generation before the source is retired).
* names the store could not keep are refused when created (``OSError`` ``ENAMETOOLONG``/``EINVAL``).

Storage options (``fsspec.filesystem("retainz", retention=...)``, or for runtimes that call
``url_to_fs`` without options, ``fsspec.config.conf["retainz"]`` / the environment variable
``FSSPEC_RETAINZ_RETENTION``):

* ``retention``: the runtime's retention rule (``"torchtitan:interval=500,keep_latest_k=10"``), or a
  ``{folder: rule}`` dict keyed by the folder inside the device: it becomes each generation's placement
  hint (:func:`retainz.retention.rule_hint`), with the step parsed from the name
  (:func:`retainz.retention.parse_step` with ``file_names``).  Before its first save into a series (a
  checkpoint's parent folder, :mod:`retainz.ids`) an instance re-hints that series'
  committed checkpoints with its rule (a job resumed with a changed rule); it never re-hints another
  series, and it never deletes: the runtime's own purge (``rm -r``) retires checkpoints;
* ``wait``: seconds to wait for a device another process holds (default 120);
* ``promote`` (a destination URL; ``{device}`` becomes the device file's name), ``promote_policy``,
  ``promote_bandwidth`` (bytes per second), ``promote_options`` (fsspec options for the destination):
  each device this instance opens promotes what it commits there in the background, the runtime's
  purge keeps a checkpoint until its copy is verified, and a read whose local copy fails its checksum
  is served from the durable copy (:mod:`retainz.jobs.tiering`, docs/tiers.md).

A filesystem instance holds each device it touches open until :meth:`RetainZFileSystem.close_devices`
(or :meth:`RetainZFileSystem.close_all`): a device file is locked by one process at a time, and the
process holding it serves it on its socket meanwhile (:func:`retainz.jobs.stores.using`), so other
processes (the ranks it spawns, ``retainz ls``) use it as clients of that node service, or of
``retainz serve``'s (docs/node.md): the ranks of a job writing one checkpoint directory join one generation
(:func:`~retainz.jobs.ranks.join_token`); a rank other than 0 leaves it once its files there
are closed, and rank 0's ``.metadata`` commits every rank's files.  The namespace refreshes its view of
what is committed before each lookup, so other instances' and other processes' commits are seen.

Registered under the protocol ``retainz`` through the ``fsspec.specs`` entry point (pyproject.toml) and
:func:`register`.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
import threading
import weakref

from fsspec.spec import AbstractFileSystem

from retainz.ids import members, parse_generation_id, series_of
from retainz.integrations.fsspec_files import ReadFile, WriteFile
from retainz.jobs import life, ranks, stores
from retainz.namespace import Face, Namespace, NamespaceError
from retainz.namespace.hints import rule_for
from retainz.retention.online import rule_hint
from retainz.retention.steps import parse_step
from retainz.zoned import parse_device

__all__ = ["RetainZFileSystem", "register"]


class RetainZFileSystem(AbstractFileSystem):
    """fsspec filesystem over RetainZ stores on FileDevice files (see the module docstring)."""

    protocol = "retainz"
    root_marker = "/"
    cachable = True

    def __init__(self, retention: str | dict[str, str] | None = None, wait: float = 120.0, *,
                 promote: str | None = None, promote_policy: str | None = None,
                 promote_bandwidth: float | None = None, promote_options: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.retention = retention
        self.wait = float(wait)
        self.promote = promote
        self._promote_args = {"policy": promote_policy, "bandwidth": promote_bandwidth,
                              "storage_options": promote_options}
        if promote is not None and promote_policy is not None:
            from retainz.tier import parse_policy

            parse_policy(promote_policy)      # a malformed policy fails here, not at the first device
        self._lock = threading.RLock()
        self._held: dict[str, contextlib.ExitStack] = {}
        weakref.finalize(self, _release_all, self._held, self._lock)

    # -- paths -------------------------------------------------------------------------------------
    @classmethod
    def _strip_protocol(cls, path):
        path = super()._strip_protocol(path)
        return "/" + path.lstrip("/") if path else "/"

    def _split(self, path: str) -> tuple[str, str]:
        """``(device, path inside it)``: the first component that is a device file or a zoned block
        device (:func:`retainz.zoned.parse_device`); raises FileNotFoundError if there is none."""
        path = self._strip_protocol(path)
        parts = [p for p in path.split("/") if p]
        cur = "/"
        for i, part in enumerate(parts):
            cur = os.path.join(cur, part)
            if os.path.isfile(cur) or (parse_device(cur).kind == "zbd" and os.path.exists(cur) and not os.path.isdir(cur)):
                inner = "/".join(parts[i + 1:])
                if any(p in (".", "..") for p in parts[i + 1:]):
                    raise ValueError(f"{path}: '.' and '..' are not allowed inside a device")
                return cur, inner
            if not os.path.isdir(cur):
                break
        raise FileNotFoundError(f"{path}: no RetainZ device file on this path")

    def _full(self, device: str, inner: str) -> str:
        return device + ("/" + inner if inner else "")

    # -- the devices and their namespaces ---------------------------------------------------------------
    def _opened(self, device: str) -> contextlib.ExitStack:
        """``device``'s open store (``.store``) and namespace (``.ns``): opened on first use, held until
        :meth:`close_devices` (opening a store replays its journal; closing journals and flushes)."""
        with self._lock:
            stack = self._held.get(device)
            if stack is None:
                stack = contextlib.ExitStack()
                # the ranks of a job share the device: the first to open it serves the others
                store = stack.enter_context(stores.using(device, wait=self.wait, share=ranks.world_size() > 1))
                stack.store = store
                try:
                    stack.tier = None
                    if self.promote is not None:
                        from retainz.jobs.tiering import NamespaceTier

                        stack.tier = NamespaceTier.shared(store, self.promote, device, **self._promote_args)
                        stack.callback(stack.tier.close)      # before the store closes
                    stack.ns = Namespace(store, retention=self.retention, face=_RanksFace(self.retention, store),
                                         tier=stack.tier, implicit_dirs=True)
                except BaseException:
                    stack.close()
                    raise
                self._held[device] = stack
            return stack

    def tier(self, path: str):
        """The :class:`~retainz.jobs.tiering.NamespaceTier` of the device ``path`` is on (its
        ``promoter``: ``status()``, ``backlog()``, ``finish()``; ``used``), ``None`` without ``promote``."""
        return self._opened(self._split(path)[0]).tier

    def _ns(self, device: str, *, fresh: bool = True) -> Namespace:
        """``device``'s namespace, its committed view refreshed first (``fresh``)."""
        ns = self._opened(device).ns
        if fresh:
            ns.refresh()
        return ns

    @classmethod
    def close_all(cls) -> None:
        """:meth:`close_devices` on every cached instance."""
        for inst in list(cls._cache.values()):
            inst.close_devices()

    def close_devices(self) -> None:
        """Release every device this instance holds, after its namespace's end (the checkpoint
        directories with no commit point of their own whose files are all closed commit; every other
        uncommitted file is dropped): the device file's lock is per process, so another process can
        open it only after this."""
        _release_all(self._held, self._lock)

    # -- the namespace -----------------------------------------------------------------------------
    def _entry(self, device: str, inner: str) -> dict:
        try:
            e = self._ns(device).stat(inner)
        except NamespaceError:
            raise FileNotFoundError(self._full(device, inner)) from None
        return {"name": self._full(device, inner), "size": e.size, "type": "directory" if e.is_dir else "file"}

    def ls(self, path, detail=True, **kwargs):
        device, inner = self._split(path)
        ns = self._ns(device)
        entry = self._entry(device, inner)
        if entry["type"] == "file":
            entries = [entry]
        else:
            entries = [self._entry(device, posixpath.join(inner, n) if inner else n) for n in ns.listdir(inner)]
            entries.sort(key=lambda e: (e["type"] != "file", e["name"]))
        return entries if detail else [e["name"] for e in entries]

    def info(self, path, **kwargs):
        device, inner = self._split(path)
        return self._entry(device, inner)

    def exists(self, path, **kwargs):
        """Whether ``path`` is a file or directory, as fsspec's ``AbstractFileSystem.exists`` answers
        (any error of :meth:`info` is "absent"), except a device another process holds: its
        ``TimeoutError`` (``device busy``, after ``wait`` seconds) is raised, since a busy device says
        nothing of what it holds (DCP's ``FsspecWriter`` asks ``exists(.metadata)`` before its
        ``overwrite=False`` check and its writes)."""
        try:
            self.info(path, **kwargs)
            return True
        except TimeoutError:
            raise
        except Exception:
            return False

    def mkdir(self, path, create_parents=True, **kwargs):
        """No-op: directories exist through the files under them (no empty directories, as on an
        object store); a path holding a file is refused."""
        device, inner = self._split(path)
        if inner and self.isfile(path):
            raise FileExistsError(self._full(device, inner))

    def makedirs(self, path, exist_ok=False):
        self.mkdir(path)

    def rmdir(self, path):
        """No-op for a directory with nothing under it; refuses a non-empty one."""
        device, inner = self._split(path)
        if self._ns(device).walk_files(inner) and inner:
            raise OSError(errno.ENOTEMPTY, "Directory not empty", self._full(device, inner))

    # -- removal: the runtimes' purge --------------------------------------------------------------
    def rm(self, path, recursive=False, maxdepth=None):
        paths = path if isinstance(path, (list, tuple)) else [path]
        for p in paths:
            for one in (self.expand_path(p, recursive=recursive, maxdepth=maxdepth)
                        if any(c in str(p) for c in "*?[") else [p]):
                self._rm_one(one, recursive)

    def _rm_one(self, path: str, recursive: bool) -> None:
        device, inner = self._split(path)
        ns = self._ns(device)
        try:
            entry = self._entry(device, inner)
        except FileNotFoundError:
            if not recursive:
                raise
            with self._lock:      # a refused checkpoint is out of the view: rm -r ends its refusal
                try:
                    ns.remove_tree(inner)
                except NamespaceError:
                    raise FileNotFoundError(self._full(device, inner)) from None
            return
        if entry["type"] == "file":
            self._rm_file(device, inner)
            return
        if ns.listdir(inner) and not recursive:
            raise IsADirectoryError(f"{self._full(device, inner)}: a directory (use recursive=True)")
        with self._lock:
            ns.remove_tree(inner)

    def _rm_file(self, device: str, inner: str) -> None:
        ns = self._ns(device)
        root = ns.checkpoint_of(inner)
        if root is not None:
            if posixpath.basename(inner) == ".metadata" and posixpath.dirname(inner) == root:
                ns.remove_tree(root)          # invalidate-first: the checkpoint goes with its .metadata
                return
            raise PermissionError(f"{self._full(device, inner)}: append-only store: a committed checkpoint's "
                                  "files cannot be removed one by one (rm -r the directory, or rm its "
                                  ".metadata to retire it)")
        try:
            ns.unlink(inner)
        except NamespaceError as e:
            raise OSError(e.errno, e.strerror, self._full(device, inner)) from None

    def _rm(self, path):
        self._rm_one(path, recursive=False)

    def rm_file(self, path):
        self._rm_one(path, recursive=False)

    # -- writing -------------------------------------------------------------------------------------
    def open(self, path, mode="rb", block_size=None, cache_options=None, compression=None, **kwargs):
        """fsspec's ``open``; a text-mode file abandons its writes when its ``with`` raises, as a binary
        one does (fsspec's text wrapper would close, i.e. commit, a partial file)."""
        if "b" not in mode and ("w" in mode or "x" in mode):
            text = {k: kwargs.pop(k) for k in ("encoding", "errors", "newline") if k in kwargs}
            binary = self.open(path, mode.replace("t", "") + "b", block_size=block_size,
                               cache_options=cache_options, compression=compression, **kwargs)
            return _TextWriteFile(binary, **text)
        return super().open(path, mode, block_size=block_size, cache_options=cache_options,
                            compression=compression, **kwargs)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if mode == "rb":
            return ReadFile(self, path, mode, block_size=block_size or "default",
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
        return WriteFile(self, path, mode, block_size=block_size or "default", autocommit=autocommit, **kwargs)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """The namespace's rename (DCP's ``.metadata.tmp`` -> ``.metadata`` is its checkpoint's commit);
        across devices, copy + delete."""
        d1, i1 = self._split(path1)
        d2, i2 = self._split(path2)
        if d1 != d2 or not i1 or not i2:
            return super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)
        ns = self._ns(d1)
        try:
            ns.rename(i1, i2)
        except NamespaceError as e:
            raise OSError(e.errno, e.strerror, self._full(d1, i1)) from None

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


class _TextWriteFile(io.TextIOWrapper):
    """A text-mode ``retainz://`` writer: an exception inside its ``with`` abandons the file."""

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None or not isinstance(self.buffer, WriteFile):
            return super().__exit__(exc_type, exc, tb)
        self.buffer._abandon()
        with contextlib.suppress(ValueError):
            super().close()
        return False


class _RanksFace(Face):
    """``retainz://`` as its namespaces see it (parents are implied by files: ``implicit_dirs``): the
    ranks of one job on a served device join one generation per checkpoint, a rank other than the
    coordinator leaves a joined generation once its files are closed, and a series is re-hinted
    before this instance's first save into it.  It holds no reference to the filesystem instance
    (whose finalizer closes the devices)."""

    def __init__(self, retention, store):
        self.retention, self.store = retention, store

    def begin(self, store, gid: str, step: int, hint, path: str):
        return store.begin_generation(gid, step, hint=hint, join=ranks.join_token(path))

    def leaves(self, writer) -> bool:
        return writer.joined and not ranks.is_coordinator()

    def series_begins(self, series: str) -> None:
        _rehint(self.retention, self.store, series)


def _rehint(retention, store, series: str) -> list[str]:
    """Give every committed generation of ``series`` (:mod:`retainz.ids`) the hint
    ``retention`` predicts for it, where it differs from the one it was saved with (the rule changed
    on resume: ``keep_latest_k`` 10 -> 3): :func:`retainz.jobs.life.rehint`.  Returns the ids changed."""
    def hint_of(g):
        kind, path, _ = parse_generation_id(g.id)
        if kind == "file":
            return rule_hint(rule_for(retention, series_of(path)), parse_step(path, file_names=True))
        return rule_hint(rule_for(retention, path), parse_step(path))

    return life.rehint(store, [g for _, g in members(store.generations(), series)], hint_of)


def _release_all(held: dict, lock) -> None:
    with lock:
        for stack in held.values():
            ns = getattr(stack, "ns", None)
            if ns is not None:
                with contextlib.suppress(Exception):
                    ns.unmount()
            with contextlib.suppress(Exception):
                stack.close()
        held.clear()


def register(clobber: bool = True) -> None:
    """Register ``retainz`` with fsspec in this process (the entry point does it for installed
    packages; this is for source checkouts)."""
    import fsspec

    fsspec.register_implementation("retainz", RetainZFileSystem, clobber=clobber)
