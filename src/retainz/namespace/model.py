"""The namespace model: a directory tree over one open store, the same for every face.

:class:`Namespace` owns the path state (the committed view: path -> generation and shard; pending
checkpoint directories and files; open files; directories made in this session; hidden and
truncated paths; ids in flight) and every rule over it.  The FUSE mount (:mod:`retainz.mount.fs`) and
``retainz://`` (:mod:`retainz.integrations.fsspec_fs`) are adapters: they translate their calls into
the POSIX-like calls below (paths inside the device, no leading ``/``; errors are
:class:`NamespaceError`, an ``OSError`` with the errno) and hold no path state of their own.

Paths map onto generations as :mod:`retainz.namespace.names` says.  What the calls do:

* **write**: a file's bytes are buffered in memory up to :attr:`Namespace.stream_threshold`
  (small files may be written at any offset, truncated, re-opened); past it they stream into the
  store as a shard (``GenerationWriter.open_shard``: each write is pushed into 1 MiB extents), which
  needs sequential writes (``torch.save``, safetensors and DCP write sequentially; an out-of-order
  write to a streamed file is ``EIO`` with a log line).  A streamed file's chunks are written by a
  thread of its own (:class:`~retainz.namespace.pump.Pump`) while the next write arrives; a store error on them is the
  errno of the file's next write, fsync or close.  A file written past its end (a hole:
  ``numpy.memmap`` ``w+``) never streams; it stays in memory, taking writes in any order, up to
  :attr:`Namespace.hole_limit` (``EFBIG`` past it).  An ``ftruncate`` up to at most ``hole_limit``
  is held the same way; a larger one only sets the length (safetensors sets it first, then writes
  in order): its zeros are not held, writes in order stream past the threshold, the unwritten rest
  commits as zeros; a write skipping ahead into it holds the file until its writes reach the end.  One shard streams at a time
  (:attr:`Namespace.slot`); other files keep buffering meanwhile, and store work ordered after the
  stream (a small file's commit) is queued and run when it ends.
* **admission**: ``open`` admits the generation, every ``write`` grows its reservation in the store
  (``Store.admit``) to the bytes accepted and not yet placed: a full device refuses the ``write``
  (``ENOSPC``), never a later commit.
* **commit**: a checkpoint directory commits at its runtime's commit point
  (:func:`retainz.namespace.names.commit_point`), in the call that reaches it (whose errno it returns);
  a file outside checkpoint directories commits at ``close(2)`` (FUSE flush) or ``fsync`` by the
  process that wrote it last, and the error is that call's.  Before that it is visible in this mount
  only and lost by a crash.
* **refusal**: a checkpoint directory any of whose files got an error from ``open``, ``write``,
  ``ftruncate``, ``fsync`` or ``close`` (``ENOSPC`` from admission, a device's ``EIO``, ``EFBIG``, an
  out-of-order write to a streamed file, a writer that raised on ``retainz://``) is *refused*: it never
  commits.  Its files leave the view, its store writer is aborted once none of them is open (the space
  returns), every later call on its open files returns the same errno, and the call that reaches its
  commit point returns it too.  New files in it are refused with that errno for the processes that got
  the error (a program that ignored one cannot commit the rest as the checkpoint) until it is removed
  (``rm -r``, ``rmdir``), the next save in its folder begins, or the namespace is unmounted; another
  process (a restarted job) begins it afresh.  A file outside checkpoint directories that got such an
  error does not commit at its close, which returns the errno; its previous version stays.
* **names**: a name the store could not keep is refused where it is created (:func:`retainz.namespace.names.check_name`).
* **replace**: writing a file that exists (``O_TRUNC``, a rewritten tracker file) or renaming over it
  commits the new version as a new generation (``#N`` id) first and retires the old one after: a
  crash in between leaves both committed and the next mount keeps the newest (``commit_seq``) and
  retires the other (:func:`retainz.namespace.names.newest_versions`).  Readers see the old version until
  the new one's commit is durable.
* **rename**: a file or checkpoint directory still being written is relabelled (the generation gets
  a layout shard at its commit); a committed one is copied through the store into a new generation
  that commits before the source is retired (the store has no rename).
* **delete**: ``unlink`` of a file generation retires it; inside a committed checkpoint directory it
  hides the file, and ``rmdir`` of the emptied directory retires the generation (``rm -r``).
* **read**: committed shards through ``Store.read_shard_extent`` (every extent's crc32c verified;
  a mismatch is ``EIO``), so random and ``mmap`` reads work.
* **statfs**: blocks of the data zones; available = what admission can reach after GC (data
  capacity less live bytes, the open writers' reservations and the GC reserve).

Times: a commit made in this session shows its wall-clock time; one made before shows its
``commit_seq`` as seconds since the epoch (the store keeps logical time only), so time order is
commit order, which HF Trainer's ``sort_checkpoints(use_mtime=True)`` relies on.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import posixpath
import threading
import time
from dataclasses import dataclass

from retainz import ids
from retainz.errors import (
    GenerationNotFoundError,
    RetainZError,
    ShardExistsError,
)
from retainz.ids import series_of
from retainz.namespace import names as L
from retainz.namespace.admission import Admission
from retainz.namespace.errors import NamespaceError, errno_of
from retainz.namespace.hints import Hints
from retainz.namespace.hooks import DurableTier, Face
from retainz.namespace.openfile import Keeping, Life, OpenRead, OpenWrite
from retainz.namespace.pending import PendingCheckpoint
from retainz.namespace.slot import StoreSlot
from retainz.namespace.view import CommittedGeneration, CommittedView
from retainz.retention.steps import parse_step

__all__ = ["Namespace", "Entry", "OpenState"]

log = logging.getLogger("retainz.namespace")

#: The longest path component POSIX file systems take, in bytes (``NAME_MAX``, limits.h).
NAME_MAX = 255


@dataclass(frozen=True)
class Entry:
    """What :meth:`Namespace.stat` reports of a path: a directory or a file, its size in bytes (0 for
    a directory) and its time in ns since the epoch (see :meth:`Namespace.stat`)."""

    is_dir: bool
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class OpenState:
    """What :meth:`Namespace.open_state` reports of an open file, at one instant (the mount decides
    its page cache from it).

    Attributes:
        path: the file's path now.
        write_mode: opened for writing.
        shard: ``(generation id, shard)`` a reader reads from the store; ``None`` for a writer or a
            reader of bytes not committed yet.
        committed: readers of ``path`` see a committed version.
        writer: ``path`` has an open, unreleased writer.
        writer_changed: that writer changed the file since it last committed.
    """

    path: str
    write_mode: bool
    shard: tuple[str, str] | None
    committed: bool
    writer: bool
    writer_changed: bool




class Namespace:
    """The namespace over an open store (see the module docstring); one per face instance.

    Args:
        store: the open :class:`~retainz.store.Store` (or a store with the same contract); the caller
            closes it after :meth:`unmount`.
        retention: ``None`` (no hints), a rule string for :func:`retainz.retention.rule_hint`
            (``"hf:save_steps=500,save_total_limit=2"``), a ``{folder: rule}`` dict (the longest
            folder holding a checkpoint wins), or ``"auto"`` (:class:`RetentionInference`).
        stream_threshold: bytes a file buffers in memory before it streams into the store.
        hole_limit: the largest file extended past its end (a hole) that is held in memory until it
            commits (larger: ``EFBIG``); such a file never streams.

        face: the :class:`~retainz.namespace.hooks.Face` over this namespace (the caller's process,
            how a generation is begun, page-cache bookkeeping); default: a face with none of these needs.
        tier: the :class:`~retainz.namespace.hooks.DurableTier` this face promotes to (commits handed
            to it, deletions kept until durable, reads from the durable copy), or ``None``.
        implicit_dirs: a new file's missing parents are implied by it (``retainz://``, as on an object
            store); ``False`` (the mount): the parent must exist (``ENOENT``).

    Attributes:
        inference: the :class:`~retainz.retention.inference.RetentionInference` of ``"auto"``.
        retired_at_mount: ids of older versions retired when the namespace was loaded (recovery of a
            replace).
    """

    def __init__(self, store, *, retention: str | None = None, stream_threshold: int = 4 << 20,
                 hole_limit: int = 256 << 20, face: Face | None = None, tier: DurableTier | None = None,
                 implicit_dirs: bool = False):
        self.store = store
        self.retention = retention
        self.face = face if face is not None else Face()
        self.tier = tier
        self.implicit_dirs = implicit_dirs
        self.hints = Hints(retention, self.face)
        self.inference = self.hints.inference
        self.stream_threshold = stream_threshold
        self.hole_limit = hole_limit
        self._mu = threading.RLock()
        self.slot = StoreSlot(self._mu)
        self.admission = Admission(store)
        self._fh = itertools.count(1)
        self.handles: dict[int, OpenWrite | OpenRead] = {}
        self.view = CommittedView(store)
        self.pending: dict[str, PendingCheckpoint] = {}
        self.dirs: dict[str, int] = {"": time.time_ns()}  # directories made in this session
        self.truncated: set[str] = set()
        self._taken: set[str] = set()                    # ids in flight (writers, deletions queued)
        self.pending_files: dict[str, bytes] = {}        # closed files whose commit is queued
        self._ns_cache: tuple | None = None
        self.retired_at_mount: list[str] = []
        self.destroyed = False                           # unmount ran
        self._load()

    # -- the committed view (view.py) and retirement -----------------------------------------------
    def refresh(self) -> None:
        """Bring the committed view up to date with the store, for a face whose store others write too
        (other ``retainz://`` instances, other processes through a node service): generations committed
        elsewhere appear, deleted ones go; the newest version of a path is the one seen.  What this
        namespace is writing is kept.  Cheap when nothing changed (one ``generations()`` call).

        Safe from any thread (the mount calls it from its node service's client threads after a
        client's commit or delete): the store is listed under the namespace lock, so a commit this
        namespace makes meanwhile is either in the listing or not yet published here.  Generations a
        durable tier keeps only until their copy is verified (``DurableTier.retiring``) stay out of the view."""
        with self._mu:
            retiring = frozenset(self.tier.retiring()) if self.tier is not None else frozenset()
            if self.view.sync(self.store.generations(), skip=self._taken, retiring=retiring):
                self._changed()

    def _load(self) -> None:
        shown, stale = self.view.load(self.store.generations())
        for g in stale:
            log.info("retiring %s: an older version of %s (a replace was interrupted)", g.id, self.view.resolve(g)[1])
            self.store.delete(g.id)
            self.retired_at_mount.append(g.id)
        for c, _ in shown:
            self.hints.found(c.path, c.id, parse_step(c.path, file_names=True))

    def _add(self, info, kind: str, path: str, names: dict[str, str], mtime_ns: int) -> CommittedGeneration:
        g = self.view.add(info, kind, path, names, mtime_ns)
        self._changed()
        return g

    def _forget(self, gid: str) -> CommittedGeneration | None:
        g = self.view.forget(gid)
        self._changed()
        return g

    def _retire(self, gid: str) -> None:
        """Drop a committed generation from the view and delete it from the store (journaled,
        flushed; queued behind a streaming shard if one is being written)."""
        self._taken.add(gid)
        self.hints.deleted(gid, self.view.get(gid).path if gid in self.view else None)
        self._forget(gid)

        def delete():
            deleted = True
            with contextlib.suppress(GenerationNotFoundError):
                if self.tier is None:
                    self.store.delete(gid)
                else:
                    deleted = self.tier.retire(gid)
            if deleted:         # a deferred one stays taken: out of the view until it is deleted
                self._taken.discard(gid)
        self.slot.run(delete)

    def _free_id(self, make, path: str) -> str:
        for v in itertools.count():
            gid = make(path, v)
            if gid not in self.view and gid not in self._taken:
                return gid
        raise AssertionError("unreachable")

    # -- the tree visible now ----------------------------------------------------------------------
    def _namespace(self) -> tuple[dict[str, int], dict[str, int]]:
        """``({file: mtime_ns}, {directory: mtime_ns})`` visible now (sizes come from :meth:`_size`)."""
        if self._ns_cache is not None:
            return self._ns_cache
        files = self.view.files()
        dirs = dict(self.dirs)
        for pd in self.pending.values():
            if pd.refused is not None:          # absent: its open files show until they are closed
                continue
            dirs[pd.root] = pd.mtime_ns
            for rel in pd.files():
                files[posixpath.join(pd.root, rel)] = pd.mtime_ns
        for h in self.handles.values():
            if h.write_mode and h.live:
                files.setdefault(h.path, time.time_ns())
        for p in self.pending_files:
            files.setdefault(p, time.time_ns())
        for d, mtime in self.view.directories().items():
            dirs.setdefault(d, mtime)
        for f in list(files) + list(dirs):
            parent = posixpath.dirname(f)
            while True:
                if parent not in dirs:
                    dirs[parent] = files.get(f, dirs.get(f, 0))
                if not parent:
                    break
                parent = posixpath.dirname(parent)
        self._ns_cache = (files, dirs)
        return self._ns_cache

    def _changed(self) -> None:
        self._ns_cache = None

    def _writer_of(self, path: str) -> OpenWrite | None:
        for h in self.handles.values():
            if h.write_mode and h.live and h.path == path:
                return h
        return None

    def _committed(self, path: str) -> bool:
        """True if readers of ``path`` see a committed version (it is not hidden or truncated)."""
        return self.view.shows(path) and path not in self.truncated

    def _size(self, path: str, fh=None) -> int:
        h = self._writer_of(path)
        if h is not None and (not self._committed(path) or (fh is not None and self.handles.get(fh) is h)):
            return h.size                       # others see the committed version until the new one commits
        if path in self.truncated:
            return 0
        if path in self.pending_files:
            return len(self.pending_files[path])
        pd = self._pending_of(path)
        if pd is not None:
            size = pd.size(posixpath.relpath(path, pd.root))
            if size is not None:
                return size
        return self.view.size(path)

    def _pending_of(self, path: str) -> PendingCheckpoint | None:
        for root, pd in self.pending.items():
            if path.startswith(root + "/"):
                return pd
        return None

    def _check_parent(self, p: str, files, dirs) -> None:
        """A new name's parent must be a directory; with :attr:`implicit_dirs` missing parents are
        implied (no ancestor may be a file)."""
        parent = posixpath.dirname(p)
        if parent in dirs and parent not in files:
            return
        if not self.implicit_dirs:
            raise NamespaceError(errno.ENOENT, f"{p}: no directory {parent or '/'}")
        while parent:
            if parent in files:
                raise NamespaceError(errno.ENOTDIR, f"{p}: {parent} is a file")
            parent = posixpath.dirname(parent)

    def _is_dir(self, path: str) -> bool:
        return path in self._namespace()[1]

    @staticmethod
    def _p(path: str | None) -> str:
        return (path or "/").strip("/")

    def _check_name(self, p: str, *, directory: bool = False) -> None:
        """:func:`retainz.namespace.names.check_name` of ``p`` (directories as this namespace sees them).

        Raises:
            NamespaceError: ``ENAMETOOLONG``, ``EINVAL``.
        """
        try:
            L.check_name(p, directory=directory, is_dir=self._is_dir)
        except L.NameRefused as e:
            raise NamespaceError(e.errno, e.strerror) from None

    # -- metadata ----------------------------------------------------------------------------------
    def _writable(self, p: str) -> None:
        """Refuse a change to the tree of a store opened read-only (``Store.open(readonly=True)``) with
        ``EROFS`` before anything changes, as a read-only file system does (``rename(2)``, ``open(2)``:
        "EROFS pathname refers to a file on a read-only filesystem")."""
        if self.store.readonly:
            raise NamespaceError(errno.EROFS, f"{p}: the store is open read-only")

    def stat(self, path: str, fh: int | None = None) -> Entry:
        """The directory or file at ``path``.  Its time: a commit made by this instance shows its
        wall-clock time; one made before shows its ``commit_seq`` as seconds since the epoch (the store
        keeps logical time only), so time order is commit order.  The size a writer sees through its
        own handle ``fh`` is what it wrote; others see the committed version until the new one commits.

        Raises:
            NamespaceError: ``ENOENT``; ``ENAMETOOLONG`` for a missing path with a component over
                ``NAME_MAX`` (255 bytes), as a local file system's lookup answers.
        """
        p = self._p(path)
        with self._mu:
            files, dirs = self._namespace()
            if p in dirs and p not in files:
                return Entry(True, 0, dirs[p])
            if p in files:
                return Entry(False, self._size(p, fh), files[p])
        if any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX for part in p.split("/")):
            raise NamespaceError(errno.ENAMETOOLONG)
        raise NamespaceError(errno.ENOENT, f"{p}: no such file or directory")

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file or directory visible now."""
        p = self._p(path)
        with self._mu:
            files, dirs = self._namespace()
            return p in files or p in dirs

    def listdir(self, path: str) -> list[str]:
        """The names in directory ``path``, sorted.

        Raises:
            NamespaceError: ``ENOENT`` (no such directory), ``ENOTDIR``.
        """
        p = self._p(path)
        with self._mu:
            files, dirs = self._namespace()
            if p in files:
                raise NamespaceError(errno.ENOTDIR, f"{p}: not a directory")
        return [n for n in self.readdir(p) if n not in (".", "..")]

    def walk_files(self, path: str) -> dict[str, int]:
        """``{file: size}`` of every file at or under ``path`` visible now (``""``: the whole tree)."""
        p = self._p(path)
        with self._mu:
            files, _ = self._namespace()
            prefix = p + "/" if p else ""
            return {f: self._size(f) for f in files if f == p or f.startswith(prefix)}

    def readdir(self, path, fh=None):
        p = self._p(path)
        with self._mu:
            files, dirs = self._namespace()
            if p not in dirs:
                raise NamespaceError(errno.ENOENT)
            prefix = p + "/" if p else ""
            names = {q[len(prefix):].split("/", 1)[0] for q in itertools.chain(files, dirs)
                     if q.startswith(prefix) and q != p}
        return [".", ".."] + sorted(n for n in names if n)

    def space(self) -> tuple[int, int, int, int]:
        """``(block size, capacity, available, generations)`` in bytes: available is what a new file
        can take, admission's reach after GC (data capacity less live bytes, the open writers'
        reservations and the GC reserve) less the one block every new generation keeps for its
        layout record (:meth:`_reserve`), so a file of exactly that size is written whole."""
        with self._mu:
            writers = [pd.writer for pd in self.pending.values() if pd.writer is not None]
            writers += [h.writer for h in self.handles.values() if h.write_mode and h.writer is not None]
        return self.admission.space(writers)

    def mkdir(self, path: str) -> None:
        """Make a directory (this instance's, until a file under it commits).

        Raises:
            NamespaceError: ``EEXIST``, ``ENOENT`` (no parent), a refused name.
        """
        p = self._p(path)
        self._writable(p)
        with self._mu:
            files, dirs = self._namespace()
            if p in files or p in dirs:
                raise NamespaceError(errno.EEXIST)
            if posixpath.dirname(p) not in dirs:
                raise NamespaceError(errno.ENOENT)
            self._check_name(p, directory=True)
            self.dirs[p] = time.time_ns()
            self._changed()
        return 0

    # -- opening -----------------------------------------------------------------------------------
    def open_write(self, path: str, *, truncate: bool = True) -> int:
        """Open ``path`` for writing (created if new; ``truncate``: start empty) and return its handle.

        Raises:
            NamespaceError: ``EISDIR``, ``ENOENT`` (no parent), ``EBUSY`` (open for writing already),
                ``EPERM`` (a streamed file of a checkpoint being written, opened again), ``ENOSPC``,
                a refused name, ``EROFS`` (a store opened read-only).
        """
        self._writable(self._p(path))
        return self._open_write(self._p(path), truncate=truncate)

    def open_read(self, path: str) -> int:
        """Open ``path`` for reading and return its handle (see :meth:`read`).

        Raises:
            NamespaceError: ``ENOENT``, ``EBUSY`` (streamed into the store and not committed yet).
        """
        return self._open_read(self._p(path))

    def handle(self, fh: int) -> OpenWrite | OpenRead | None:
        """The open file of handle ``fh`` (``None`` once released)."""
        return self.handles.get(fh)

    def writer_of(self, path: str) -> OpenWrite | None:
        """The open, unreleased writer of ``path``, if any."""
        return self._writer_of(self._p(path))

    def open_state(self, fh: int) -> OpenState | None:
        """The state of open file ``fh`` and of its path, taken at one instant (``None`` once released)."""
        with self._mu:
            h = self.handles.get(fh)
            if h is None:
                return None
            w = self._writer_of(h.path)
            read = not h.write_mode and h.gen is not None
            return OpenState(h.path, h.write_mode, (h.gen.id, h.shard) if read else None,
                             self._committed(h.path), w is not None, w is not None and w.unsettled)

    def committed(self, path: str) -> bool:
        """Whether readers of ``path`` see a committed version."""
        return self._committed(self._p(path))

    def _open_read(self, p: str) -> int:
        self._settled(p)
        deadline = time.monotonic() + 30
        while True:
            with self._mu:
                pd = self._pending_of(p)
                if (self._writer_of(p) is None and pd is not None and not pd.writing and pd.refused is None
                        and posixpath.relpath(p, pd.root) not in pd.ready
                        and (pd.commit_requested or pd.commit_point() == "closed")):
                    self._request_commit(pd)     # a save with no commit point of its own, read back: it is done
                    if self._pending_of(p) is not pd:
                        return self._open_read_locked(p)
                else:
                    return self._open_read_locked(p)
            if time.monotonic() > deadline:      # its commit is queued behind a stream that goes on
                break
            time.sleep(0.01)
        with self._mu:
            return self._open_read_locked(p)

    def _open_read_locked(self, p: str) -> int:
        files, _ = self._namespace()
        if p not in files:
            raise NamespaceError(errno.ENOENT)
        w = self._writer_of(p)
        pd = self._pending_of(p)
        if w is not None and not w.streaming and not self._committed(p):
            h = OpenRead(p, buf=w.buf, source=w)     # reads what is written so far
        elif p in self.truncated:
            h = OpenRead(p, buf=bytearray())
        elif p in self.pending_files:
            h = OpenRead(p, buf=bytearray(self.pending_files[p]))
        elif pd is not None and posixpath.relpath(p, pd.root) in pd.ready:
            h = OpenRead(p, buf=bytearray(pd.ready[posixpath.relpath(p, pd.root)]))
        elif self.view.has_file(p):
            g, shard = self.view.shard_at(p)
            h = OpenRead(p, gen=g, shard=shard)
        else:
            raise NamespaceError(errno.EBUSY, f"{p}: being written into the store and not committed yet; "
                                      "it can be read after its checkpoint commits")
        fh = next(self._fh)
        self.handles[fh] = h
        return fh

    def _open_write(self, p: str, truncate: bool) -> int:
        self._settled(p)
        with self._mu:
            files, dirs = self._namespace()
            if p in dirs:
                raise NamespaceError(errno.EISDIR)
            self._check_parent(p, files, dirs)
            if self._writer_of(p) is not None:
                raise NamespaceError(errno.EBUSY, f"{p}: already open for writing")
            if p not in files:
                self._check_name(p)
            root = L.checkpoint_root(p, self._is_dir)
            buf = bytearray()
            if root is not None:
                if self.view.at("dir", root) is not None and p in files and not truncate and root not in self.pending:
                    raise NamespaceError(errno.EPERM, f"{p}: checkpoint {root} is committed: its files can be "
                                              "replaced whole (O_TRUNC), not changed in place")
                # a file written into a committed checkpoint starts its next version, which replaces it
                # at its commit point (the files it does not rewrite are carried over)
                pd = self.pending.get(root)
                if pd is not None and pd.refused is not None:
                    if pd.writing or self.face.caller() in pd.refused_by:
                        raise self._refusal(pd, p)
                    self._abort(pd)               # another process saves it again (a restarted job)
                    pd = None
                pd = pd or self._begin_dir(root)
                rel = posixpath.relpath(p, root)
                if pd.is_streamed(rel):
                    raise NamespaceError(errno.EPERM, f"{p}: already streamed into checkpoint {root} (append-only)")
                held = pd.take_back(rel)
                if held is not None and not truncate:
                    buf = held
                h = OpenWrite(p, buf=buf, pending=pd, rel=rel)
                try:
                    self._reserve(h)          # admitted (journal room) here: ENOSPC at open, not later
                except NamespaceError as e:
                    self._refuse(pd, e, self.face.caller())    # a file of it could not be created
                    raise
                pd.open(rel, h)
            else:
                if p in files and not truncate and p not in self.truncated:
                    size = self._size(p)
                    if size > self.stream_threshold:
                        raise NamespaceError(errno.EPERM, f"{p}: a committed file over {self.stream_threshold} bytes "
                                                  "can only be replaced whole (open it with O_TRUNC)")
                    buf = bytearray(self._read_all(p))
                h = OpenWrite(p, buf=buf, changed=truncate and self._committed(p))   # O_TRUNC: it is empty now
                try:
                    self._reserve(h)
                except NamespaceError:
                    self._drop_writer(h)      # begun, then refused: nothing of it stays admitted
                    raise
            fh = next(self._fh)
            self.handles[fh] = h
            self._changed()
            return fh

    # -- writing, with admission (admission.py) ----------------------------------------------------
    def write(self, fh: int, data, offset: int) -> int:
        """Take bytes: buffered in memory (small files) or streamed into the store (past
        :attr:`stream_threshold`).  Admission is checked here: the generation's reservation in the
        store grows to cover every byte accepted and not yet placed (``Store.admit``), so a device
        too full for them refuses the write (``ENOSPC``) instead of a later commit."""
        try:
            return self._write(data, offset, fh)
        except BaseException as e:
            h = self.handles.get(fh)
            if h is not None:
                self.face.written(h.path)   # a cache's pages may no longer be the file's bytes
                if h.write_mode:
                    self._refused(h, e)
            raise

    def _write(self, data, offset, fh) -> int:
        h = self.handles.get(fh)
        if h is None or not h.write_mode:
            raise NamespaceError(errno.EBADF)
        with h.lock:
            if h.life is Life.DROPPED:
                return len(data)           # POSIX: the descriptor of an unlinked file still takes bytes
            if h.error is not None:
                raise NamespaceError(errno_of(h.error), f"{h.path}: an earlier call failed ({h.error})")
            if h.life is Life.SETTLED:
                self._reopen(h)
            h.wrote_by(self.face.caller())
            end = offset + len(data)
            if h.streams_from_caller(self.stream_threshold, offset, len(data)):
                self._try_stream(h)      # a large write streams from its own buffer, not copied (issue 44.7)
            if h.streaming:
                if offset != h.put:
                    raise NamespaceError(errno.EIO, f"{h.path}: write at byte {offset} of a file streamed "
                                            f"sequentially into the store ({h.put} bytes so far)")
                self._reserve(h, end)
                h.change()
                try:
                    h.pump.put(data)
                except BaseException as e:
                    h.fail(e)
                    raise NamespaceError(errno_of(e), f"{h.path}: {e}") from e
                h.put = end
                h.size = max(h.size, end)
                return len(data)
            if offset > h.size:
                self._hole(h, end)
            self._reserve(h, max(end, h.size))
            h.change()
            if offset > len(h.buf):                # into the length an ftruncate set ahead: held from here
                h.skip_ahead()
                h.buf.extend(bytes(offset - len(h.buf)))
            h.buf[offset:end] = data
            h.size = max(h.size, len(h.buf))
            if h.may_stream(self.stream_threshold, end):
                self._try_stream(h)
            return len(data)

    def _hole(self, h: OpenWrite, size: int) -> None:
        """``h`` is extended past its bytes to ``size`` by a write past its end: the
        hole will be written later and out of order (``numpy.memmap`` mode ``w+`` writes the last byte,
        then its pages through a shared mapping), which a streamed shard cannot take.  The file stays
        in memory until it commits, up to :attr:`hole_limit` bytes.

        Raises:
            NamespaceError: ``EFBIG`` past :attr:`hole_limit` (nothing of the call is taken)."""
        if size > self.hole_limit:
            raise NamespaceError(errno.EFBIG, f"{h.path}: a file extended past its end (a hole, as numpy.memmap "
                                              f"'w+' makes) is held in memory until it commits, up to "
                                              f"{self.hole_limit} bytes; {size} asked: write it in order")
        h.hold()

    def _reserve(self, h: OpenWrite, size: int | None = None) -> None:
        """Grow the reservation of ``h``'s generation to every byte it holds unplaced, ``h`` at
        ``size`` bytes, plus one block (a layout shard); the generation is admitted first if it has
        no writer yet.

        Raises:
            NamespaceError: ``ENOSPC`` (the store's admission or journal refused; nothing changed).
        """
        try:
            with self._mu, self.admission.lock:
                if h.pending is not None:
                    w = self._writer(h.pending)
                    need = self.admission.checkpoint_need(h.pending, h, size)
                else:
                    w = h.writer if h.writer is not None else self._begin_file(h)
                    need = self.admission.file_need(h, size)
                self.admission.admit(w, need)
        except RetainZError as e:
            raise NamespaceError(errno_of(e), f"{h.path}: {e}") from e

    def _begin_file(self, h: OpenWrite):
        """Admit the generation of a file outside checkpoint directories (its first byte arrives)."""
        gid = self._free_id(ids.file_generation_id, h.path)
        step = parse_step(h.path, file_names=True)
        hint = self.hints.hint(series_of(h.path), gid, step)
        h.writer = self.face.begin(self.store, gid, step or 0, hint, h.path)
        self._taken.add(gid)
        return h.writer

    def _reopen(self, h: OpenWrite) -> None:
        """More bytes after a close of a duplicate descriptor committed the file: they make a new
        version (a file) or take the file back from its checkpoint (buffered files only)."""
        with self._mu:
            if h.pending is None:
                if not h.buf and h.size:
                    h.buf = bytearray(self._read_all(h.path))     # it had streamed: copy it
                h.reopen()
                return
            pd = h.pending
            if self.pending.get(pd.root) is not pd:
                raise NamespaceError(errno.EPERM, f"{h.path}: its checkpoint {pd.root} has committed (append-only)")
            if h.rel not in pd.ready:
                raise NamespaceError(errno.EPERM, f"{h.path}: already streamed into checkpoint {pd.root} (append-only)")
            h.buf = pd.take_back(h.rel)
            pd.open(h.rel, h)
            h.reopen()
            self._changed()

    def _try_stream(self, h: OpenWrite) -> None:
        """Start streaming a large file's buffer into the store, if the slot is free (under ``h.lock``)."""
        if not self.slot.acquire(blocking=False):
            return
        try:
            with self._mu, self.admission.lock:
                if h.pending is not None:
                    pd = h.pending
                    name = pd.shard_name(h.rel, pd.streamed)
                    writer = self._writer(pd)
                else:
                    writer = h.writer if h.writer is not None else self._begin_file(h)
                    name = L.FILE_SHARD
            h.start_stream(writer.open_shard(name), name)
        except BaseException as e:
            self.slot.release()
            h.fail(e)
            raise NamespaceError(errno_of(e), f"{h.path}: {e}") from e

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        p = self._p(path)
        self._writable(p)
        h = self.handles.get(fh) if fh else None
        if h is None:
            with self._mu:
                h = self._writer_of(p)
        if h is not None and h.write_mode:
            try:
                return self._truncate_open(h, p, length)
            except NamespaceError as e:
                self._refused(h, e)
                raise
        with self._mu:
            files, _ = self._namespace()
            if p not in files:
                raise NamespaceError(errno.ENOENT)
            if length == 0 and L.checkpoint_root(p, self._is_dir) is None:
                self.truncated.add(p)      # the next writer replaces it; it reads empty meanwhile
                return 0
            if length == self._size(p):
                return 0
        raise NamespaceError(errno.EPERM, f"{p}: a committed file is not changed in place, not even by an append (replace it whole)")

    def _truncate_open(self, h: OpenWrite, p: str, length: int) -> int:
        """``ftruncate`` of a file open for writing (:meth:`truncate`)."""
        with h.lock:
            if h.error is not None:
                raise NamespaceError(errno_of(h.error), f"{p}: an earlier call failed ({h.error})")
            if h.streaming:
                if length != h.size:
                    raise NamespaceError(errno.EPERM, f"{p}: cannot truncate a file streamed into the store")
                return 0
            if length != h.size and h.life is Life.SETTLED:
                self._reopen(h)
            if length != h.size and h.life is not Life.DROPPED:
                h.change()
            if length > h.size:
                self._reserve(h, length)
            del h.buf[length:]
            if length > len(h.buf) and length <= self.hole_limit:
                # an extension a shared mapping may write in any order: held in memory
                h.hold()
                h.buf.extend(bytes(length - len(h.buf)))
            # a larger one (safetensors sets the final length before writing in order) is set
            # ahead: its zeros are not held, and its writes stream as they arrive in order
            h.size = length
        return 0

    # -- the close/commit protocol: a file commits or joins its checkpoint; a checkpoint commits or is refused
    def close(self, fh: int) -> int:
        """``close(2)`` of one descriptor: the file is finished here, so its error reaches the
        program's ``close``: a file outside checkpoint directories commits (its new version replaces
        the old), a file of a checkpoint joins it and, if it is the checkpoint's commit point
        (``trainer_state.json``, ``.metadata``, a tracker file), the checkpoint commits.  More writes
        through a duplicate descriptor make the file dirty again (a new version at the next close)."""
        h = self.handles.get(fh)
        if h is not None and h.write_mode:
            if h.to_finish and self.face.caller() == h.writer_process:
                self._finish(h, report=True)      # not at a close by a process that never wrote
            h.flushed = True
        return 0

    def _settled(self, p: str) -> None:
        """Wait (up to 30 s, without the namespace lock) until a writer of ``p`` that was closed has
        been released, so the next open sees the finished file (a runtime reads or rewrites what it
        has just closed)."""
        deadline = time.monotonic() + 30
        while True:
            with self._mu:
                w = self._writer_of(p)
            if w is None or not w.flushed or time.monotonic() > deadline:
                return
            w.done.wait(0.5)

    def fsync(self, fh: int) -> int:
        """``fsync(2)``: a file outside checkpoint directories commits now (as at close); a file of
        a checkpoint reports any error so far (its bytes are reserved in the store and become
        durable at the checkpoint's commit point)."""
        h = self.handles.get(fh)
        if h is None or not h.write_mode:
            return 0
        with h.lock:
            if h.pump is not None:
                try:
                    h.pump.drain()
                except BaseException as e:  # noqa: BLE001 - reported as this call's errno
                    h.fail(e)
            failed = h.error
        if failed is not None:
            self._refused(h, failed)
            raise NamespaceError(errno_of(failed), f"{h.path}: an earlier call failed ({failed})")
        if h.pending is None and h.life is Life.CHANGED:
            self._finish(h, report=True)
        return 0

    def fsyncdir(self, path: str) -> int:
        """``fsync`` of a directory: a checkpoint directory being written commits now (once its files
        are closed; its error is this call's); any other directory has nothing unwritten (each file
        commits at its close)."""
        p = self._p(path)
        with self._mu:
            pd = self.pending.get(p)
            if pd is not None:
                self._request_commit(pd)
                if pd.writing:
                    raise NamespaceError(errno.EBUSY, f"{p}: {len(pd.writing)} of its files are still open; "
                                              "it commits when they are closed")
        return 0

    def release(self, fh: int) -> int:
        h = self.handles.get(fh)
        try:
            if h is not None and h.write_mode:
                try:
                    self._finish(h, report=False)
                finally:
                    with self._mu:
                        h.release()            # until now the path's open writer is this handle
                        self._changed()
        finally:
            with self._mu:
                self.handles.pop(fh, None)
                self._changed()
            if h is not None and not h.write_mode:
                h.close()
        return 0

    def _finish(self, h: OpenWrite, *, report: bool) -> None:
        """Commit or join ``h`` unless it is clean.  ``report``: raise the error as an errno (a
        close or fsync); at release nothing can report it (logged; only reached if no close came)."""
        with h.lock:
            if h.life is Life.DROPPED:
                return
            if h.life in (Life.SETTLED, Life.REPORTED, Life.RELEASED):
                if h.error is not None and report:
                    raise NamespaceError(errno_of(h.error), f"{h.path}: {h.error}")
                return
            if h.life is Life.OPENED and h.pending is None and self._committed(h.path):
                self._drop_writer(h)       # opened for writing, nothing changed: no new version
                h.settle()
                return
            try:
                self._close_writer(h)
                h.settle()
            except NamespaceError:
                h.settle()
                if report:
                    raise
            except RetainZError as e:
                h.fail(e)
                h.settle()
                if report:
                    raise NamespaceError(errno_of(e), f"{h.path}: {e}") from e
                log.error("%s: not committed: %s", h.path, e)
            finally:
                with self._mu:
                    self._changed()

    def _close_writer(self, h: OpenWrite) -> None:
        info = None
        if not h.streaming and h.size > len(h.buf) and h.error is None:
            # a length set ahead (ftruncate up) and not all written: stream it with its zeros, or hold them
            if h.size >= self.stream_threshold and h.keeping is Keeping.BUFFERED:
                with contextlib.suppress(NamespaceError):
                    self._try_stream(h)
            if not h.streaming and h.error is None:
                h.buf.extend(bytes(h.size - len(h.buf)))
        streamed = h.streaming            # then this handle holds the store slot
        err = h.error
        if h.streaming and err is not None:    # refused: nothing of the shard is kept
            h.abort_stream()
        if h.streaming:
            try:
                info = h.close_stream()
            except BaseException as e:
                h.fail(e)
                err = e
        try:
            with self._mu:
                self._changed()
                if h.pending is not None:
                    pd = h.pending
                    if err is not None:
                        pd.forget_open(h.rel)
                        self._refuse(pd, err, h.writer_process)
                        raise NamespaceError(errno_of(err), f"{h.path}: {err} (checkpoint {pd.root} refused: "
                                                            "it will not commit)")
                    if info is not None:
                        pd.close(h.rel, shard=h.shard_name, size=info.size)
                    else:
                        pd.close(h.rel, data=h.buf)
                    name = posixpath.basename(h.rel)
                    point = pd.commit_point()
                    if pd.root in self.pending and ((name == ".metadata" and point == "dcp-metadata")
                                                    or (name == "trainer_state.json" and point == "hf-trainer-state"
                                                        and "/" not in h.rel)):
                        self._request_commit(pd)
                    elif pd.commit_requested and not pd.writing:
                        self._request_commit(pd)
                    if self.pending.get(pd.root) is pd and pd.writer is not None and self.face.leaves(pd.writer):
                        w = self.detach(pd.root)     # another rank commits it
                        if w is not None:
                            w.leave()
                else:
                    if err is not None:
                        self._drop_writer(h)
                        raise NamespaceError(errno_of(err), f"{h.path}: {err}")
                    self._close_file(h, info)
        finally:
            if streamed:
                self.slot.finish()

    def _drop_writer(self, h: OpenWrite) -> None:
        if h.writer is not None:
            with contextlib.suppress(Exception):
                h.writer.abort()
            self._taken.discard(h.writer.id)
            h.writer = None

    def _close_file(self, h: OpenWrite, info) -> None:
        """A file generation's descriptor closed: commit its new version now (the old one is
        retired after); a store error is raised (the caller turns it into the close's errno), and
        the old version, if any, stays."""
        p = h.path
        name = posixpath.basename(p)
        waiting = None
        if name in L.TRACKER_FILES and not h.streaming and info is None:
            wanted = set(L.tracked_names(name, bytes(h.buf)))
            for pd in list(self.pending.values()):
                if posixpath.dirname(pd.root) == posixpath.dirname(p) and posixpath.basename(pd.root) in wanted:
                    try:
                        self._request_commit(pd)  # the checkpoint commits before its tracker
                    except BaseException:
                        self._drop_writer(h)      # a tracker naming a refused checkpoint never commits
                        raise
                    if pd.writing:                # a file of it is still open
                        waiting = pd
        try:
            if info is not None:              # streamed: the shard is closed, the slot still ours
                w = h.writer
                if ids.parse_generation_id(w.id)[1] != p and not self._rename_writer(w, ids.file_generation_id, p):
                    w.write_shard(L.LAYOUT_SHARD, [L.layout_blob(p, {L.FILE_SHARD: ""})])   # renamed while open
            else:
                data = bytes(h.buf)
                w = h.writer
                if w is not None and ids.parse_generation_id(w.id)[1] != p:
                    self._drop_writer(h)      # renamed while open, nothing placed: admit it under its path
                    w = None
                if w is None:
                    self._reserve(h)
                    w = h.writer
                if waiting is not None:       # commits after the checkpoint it names
                    gen_w = w
                    h.writer = None

                    def later(committed: bool):
                        if not committed:     # the checkpoint it names was refused: neither commits
                            with contextlib.suppress(Exception):
                                gen_w.abort()
                            self._taken.discard(gen_w.id)
                            self.pending_files.pop(p, None)
                            log.error("%s: not committed: the checkpoint it names did not commit", p)
                            return
                        gen_w.write_shard(L.FILE_SHARD, [data])
                        self._taken.discard(gen_w.id)
                        self._publish_file(p, gen_w.commit())
                    waiting.then.append(later)
                    self.pending_files[p] = data
                    self._changed()
                    return
                w.write_shard(L.FILE_SHARD, [data])
            gen = w.commit()
        except BaseException:
            self._drop_writer(h)
            raise
        h.writer = None
        self._taken.discard(gen.id)
        self._publish_file(p, gen)

    def _publish_file(self, p: str, gen) -> None:
        self._cache_committed(p, gen.id, L.FILE_SHARD)
        old = self.view.at("file", p)
        self._add(gen, "file", p, {L.FILE_SHARD: ""}, time.time_ns())
        self._promote(gen.id)
        self.truncated.discard(p)
        self.pending_files.pop(p, None)
        if old is not None and old != gen.id:
            with contextlib.suppress(GenerationNotFoundError):
                self.store.delete(old)          # the new version's commit is durable: retire the old
            self._forget(old)

    def _promote(self, gid: str) -> None:
        """Hand a generation this namespace committed to the durable tier, if any."""
        if self.tier is not None:
            self.tier.committed(gid)

    def _cache_committed(self, p: str, gid: str, shard: str) -> None:
        self.face.committed(p, gid, shard)

    def _begin_dir(self, root: str) -> PendingCheckpoint:
        """Admit the generation of a new checkpoint directory (its first file is being created)."""
        parent = posixpath.dirname(root)
        for other in list(self.pending.values()):   # the runtime moved on: its earlier save is done
            if posixpath.dirname(other.root) == parent and not other.writing and other.refused is not None:
                self._abort(other)                  # refused, and its error was reported already
            elif (posixpath.dirname(other.root) == parent and not other.writing
                    and other.commit_point() == "closed"):
                self._request_commit(other)
        step = parse_step(root, file_names=True)
        gid = self._free_id(ids.dir_generation_id, root)
        hint = self.hints.hint(series_of(root), gid, step)
        self._taken.add(gid)
        pd = self.pending[root] = PendingCheckpoint(root, gid, step or 0, hint, mtime_ns=time.time_ns())
        self._changed()
        return pd

    def _writer(self, pd: PendingCheckpoint):
        """The pending directory's ``GenerationWriter`` (admitted on first need; the caller holds the
        store slot)."""
        if pd.writer is None:
            pd.writer = self.face.begin(self.store, pd.gid, pd.step, pd.hint, pd.root)
        return pd.writer

    def _request_commit(self, pd: PendingCheckpoint) -> None:
        """Commit a checkpoint directory at its commit point, now (when its last file closes if
        some are still open).  A refused commit drops the checkpoint (none of its files stays) and
        raises the errno for the call that reached the commit point."""
        pd.commit_requested = True
        if self.pending.get(pd.root) is not pd:
            return
        if pd.refused is not None:        # the error a call on one of its files returned decides it
            err = self._refusal(pd, pd.root)
            if not pd.writing:
                self._abort(pd)
            raise err
        if pd.writing:
            return
        try:
            self._commit_dir(pd)
        except BaseException as e:
            log.error("%s: commit refused, the checkpoint is dropped: %s", pd.root, e)
            self._abort(pd)
            raise NamespaceError(errno_of(e), f"{pd.root}: commit refused: {e}") from e

    def _commit_dir(self, pd: PendingCheckpoint) -> None:
        if self.pending.get(pd.root) is not pd:
            return
        if pd.refused is not None:
            raise self._refusal(pd, pd.root)
        if not pd.streamed and ids.parse_generation_id(pd.gid)[1] != pd.root:
            self._readmit(pd)          # renamed before anything was placed: its id names its path
        names = dict(pd.streamed)
        for rel, data in pd.ready.items():
            name = pd.shard_name(rel, names)
            self._writer(pd).write_shard(name, [bytes(data)])
            names[name] = rel
        old = self.view.at("dir", pd.root)
        if old is not None and old != pd.gid:           # a new version: the files it did not rewrite stay
            written = set(names.values())
            for s, rel in self.view.get(old).names.items():
                if rel in written or self.view.hidden(posixpath.join(pd.root, rel)):
                    continue
                name = pd.shard_name(rel, names)
                try:
                    self._writer(pd).write_shard(name, self.store.read_shard(old, s))
                except ShardExistsError:
                    if not pd.writer.joined:
                        raise
                    continue       # another rank of the joined generation rewrote it: its version stays
                names[name] = rel
        moved = pd.gid != ids.dir_generation_id(pd.root, _version(pd.gid))    # renamed while streaming
        if moved and self._rename_writer(self._writer(pd), ids.dir_generation_id, pd.root, pd):
            moved = False                                  # it commits under its final name
        relabelled = pd.relabelled or moved or any(ids.shard_name(rel) != s for s, rel in names.items())
        if relabelled:
            self._writer(pd).write_shard(L.LAYOUT_SHARD, [L.layout_blob(pd.root, names)])
        gen = self._writer(pd).commit()
        for name in gen.shards:                  # shards other writers joined in (ranks of a served device)
            if name not in names and name != L.LAYOUT_SHARD:
                names[name] = ids.shard_path(name)
        for name, rel in names.items():
            self._cache_committed(posixpath.join(pd.root, rel), gen.id, name)
        del self.pending[pd.root]
        self._taken.discard(pd.gid)
        old = self.view.at("dir", pd.root)
        self._add(gen, "dir", pd.root, names, time.time_ns())
        self._promote(gen.id)
        if old is not None and old != gen.id:
            self._retire(old)
        log.info("committed %s (%d files, %d bytes)", pd.root, len(names), gen.size)
        then, pd.then = pd.then, []
        for fn in then:
            fn(True)

    def _rename_writer(self, w, make, path: str, pd: PendingCheckpoint | None = None) -> bool:
        """Give an uncommitted generation renamed while it was written the id of its final ``path``
        (``GenerationWriter.rename``), so the store lists it under the user's name, not a temporary
        one; ``False`` where the store refuses (a generation other ranks joined: a layout shard says the
        path)."""
        old = w.id
        gid = self._free_id(make, path)
        try:
            w.rename(gid)
        except RetainZError as e:
            log.info("%s: keeps its id %s (%s)", path, old, e)
            return False
        self._taken.discard(old)
        self._taken.add(gid)
        if pd is not None:
            pd.gid = gid
        return True

    def _readmit(self, pd: PendingCheckpoint) -> None:
        """Admit a renamed checkpoint directory again under the id of its new path (nothing of it
        is placed yet), so the store lists it by the path the runtime gave it."""
        gid = self._free_id(ids.dir_generation_id, pd.root)
        need = sum(self.admission.pad(len(b)) for b in pd.ready.values()) + self.admission.pad(1)
        old = pd.writer
        if old is not None:
            old.abort()
        self._taken.discard(pd.gid)
        pd.gid, pd.writer = gid, None
        self._taken.add(gid)
        self.admission.admit(self._writer(pd), need)

    def _refused(self, h: OpenWrite, e: BaseException) -> None:
        """A call on write handle ``h`` returned the error ``e`` to the program: the file never
        commits (its close returns the errno) and its checkpoint directory is refused
        (:meth:`_refuse`).  Not for a file unlinked or discarded meanwhile (nothing of it commits)."""
        if not h.live:
            return
        h.fail(e)
        if h.pending is not None:
            with self._mu:
                self._refuse(h.pending, h.error, self.face.caller())

    def _refuse(self, pd: PendingCheckpoint, e: BaseException, who=None) -> None:
        """Refuse pending checkpoint ``pd`` (see the module docstring, **refusal**): it never commits.
        Its files leave the view, every file of it still open fails its next call with ``e``'s errno,
        and once none is open its store writer is aborted (what it placed and reserved is returned);
        ``pd`` stays in :attr:`pending` so that new files of it are refused for the process ``who``
        (:meth:`_open_write`) until it is removed, the next save in its folder begins, or unmount."""
        if self.pending.get(pd.root) is not pd:
            return
        if pd.refuse(e, who):
            log.warning("%s: refused (%s): the checkpoint will not commit", pd.root, e)
        if not pd.writing:
            self._abort(pd, keep=True)
        self._changed()

    def _refusal(self, pd: PendingCheckpoint, p: str) -> NamespaceError:
        """The error a call on refused checkpoint ``pd`` returns (its first error's errno)."""
        return NamespaceError(errno_of(pd.refused), f"{p}: checkpoint {pd.root} was refused ({pd.refused}): "
                                                    f"it will not commit; remove it (rm -r) to save it again")

    def _abort(self, pd: PendingCheckpoint, *, keep: bool = False) -> None:
        """Drop pending checkpoint ``pd``: its store writer aborted (queued behind a streaming shard),
        the work queued after its commit run.  ``keep``: it stays in :attr:`pending` (refused: new
        files of it are refused, :meth:`_refuse`)."""
        if not keep and self.pending.get(pd.root) is pd:
            del self.pending[pd.root]
        if pd.aborted:
            self._changed()
            return
        pd.aborted = True
        if pd.writer is not None:
            def abort(w=pd.writer, gid=pd.gid):
                with contextlib.suppress(Exception):
                    w.abort()
                self._taken.discard(gid)
            pd.writer = None
            self.slot.run(abort)
        else:
            self._taken.discard(pd.gid)
        self.hints.aborted(pd.gid)
        self._changed()
        then, pd.then = pd.then, []
        for fn in then:
            fn(False)

    def detach(self, root: str):
        """Hand the writer of pending checkpoint ``root`` back without committing it: its buffered files
        are written as shards first (a rank of a joined generation leaves it to the rank that commits).
        Returns the writer (``None`` if nothing is pending there)."""
        with self._mu:
            pd = self.pending.get(self._p(root))
            if pd is None or pd.writing or pd.refused is not None:
                return None
            w = self._writer(pd)
            for rel, data in pd.ready.items():
                w.write_shard(ids.shard_name(rel), [bytes(data)])
            del self.pending[pd.root]
            self._taken.discard(pd.gid)
            self._changed()
            return w

    # -- reading -----------------------------------------------------------------------------------
    def read(self, fh: int, size: int, offset: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` of open file ``fh`` (committed shards through verified
        extent reads).

        Raises:
            NamespaceError: ``EBADF``, ``EIO`` (a checksum mismatch), ``ESTALE`` (retired meanwhile).
        """
        pieces = list(self._pieces(fh, size, offset))
        return bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)

    def read_into(self, fh: int, out, offset: int) -> int:
        """:meth:`read` into the writable buffer ``out`` (``len(out)`` bytes asked; a FUSE request's
        own buffer), one copy per byte; returns the bytes given (fewer at the end of the file).

        Raises:
            as :meth:`read`.
        """
        out = memoryview(out).cast("B")
        n = 0
        for piece in self._pieces(fh, len(out), offset):
            out[n:n + len(piece)] = piece
            n += len(piece)
        return n

    def _pieces(self, fh: int, size: int, offset: int):
        """The bytes at ``offset`` (up to ``size``) of ``fh``, as views of what is held, in order."""
        h = self.handles.get(fh)
        if h is None:
            raise NamespaceError(errno.EBADF)
        return h.pieces(size, offset, self.store, self.tier)

    def _read_all(self, p: str) -> bytes:
        if p in self.pending_files:
            return self.pending_files[p]
        g, shard = self.view.shard_at(p)
        return b"".join(self.store.read_shard(g.id, shard))

    # -- removal -----------------------------------------------------------------------------------
    def unlink(self, path: str) -> int:
        """Remove a file: a file being written is dropped (its descriptor still takes bytes; nothing
        of it commits, as torch's cleanup of a failed save expects), a file generation is retired, a
        file of a committed checkpoint is hidden (``rmdir`` of the emptied directory retires it).

        Raises:
            NamespaceError: ``ENOENT``.
        """
        p = self._p(path)
        self._writable(p)
        with self._mu:
            files, _ = self._namespace()
            if p not in files:
                raise NamespaceError(errno.ENOENT, f"{p}: no such file")
            h = self._writer_of(p)
            if h is not None:
                self._drop_open(h)
            pd = self._pending_of(p)
            if pd is not None:
                pd.remove(posixpath.relpath(p, pd.root))
                if self.view.in_checkpoint(p):
                    self.view.hide(p)         # not carried over into the new version either
                self._changed()
                return 0
            self.pending_files.pop(p, None)
            if self.view.shows(p):
                g, _ = self.view.shard_at(p)
                if g.kind == "file":
                    self._retire(g.id)
                else:
                    self.view.hide(p)
            self.truncated.discard(p)
            self._changed()
        return 0

    def remove_tree(self, path: str) -> None:
        """``rm -r path``: every file under it unlinked, then every directory removed, deepest first,
        exactly as ``rm -r`` through the mount does (committed checkpoints are retired, pending ones
        dropped).  ``""`` empties the whole tree.

        Raises:
            NamespaceError: ``ENOENT``.
        """
        p = self._p(path)
        self._writable(p)
        with self._mu:
            dropped = self._drop_refused(p)
            files, dirs = self._namespace()
            if p in files:
                self.unlink(p)
                return
            if p not in dirs:
                if dropped:
                    return
                raise NamespaceError(errno.ENOENT, f"{p}: no such file or directory")
            prefix = p + "/" if p else ""
            for f in sorted((f for f in files if f.startswith(prefix)), reverse=True):
                self.unlink(f)
            _, dirs = self._namespace()
            for d in sorted((d for d in dirs if d and (d == p or d.startswith(prefix))), key=len, reverse=True):
                if d in self._namespace()[1]:        # an implied parent goes with its last child
                    self.rmdir(d)

    def checkpoint_of(self, path: str) -> str | None:
        """The committed checkpoint directory whose file ``path`` is, or ``None`` (a file of its own, a
        file being written, no such file)."""
        p = self._p(path)
        with self._mu:
            if not self.view.shows(p) or self._pending_of(p) is not None:
                return None
            g, _ = self.view.shard_at(p)
            return g.path if g.kind == "dir" else None

    def _drop_open(self, h: OpenWrite) -> None:
        """``h`` (open for writing) is unlinked or discarded: what it wrote is dropped, its streamed shard
        aborted (the store slot released), and nothing of it commits at its close."""
        with h.lock:
            if h.drop():
                self.slot.finish()     # its stream held the store slot
            if h.pending is not None:
                h.pending.forget_open(h.rel)
            else:
                self._drop_writer(h)
        self._changed()

    def discard(self, fh: int) -> None:
        """Abandon open file ``fh`` (its writer raised): nothing of it commits; a file of a checkpoint
        being written drops that checkpoint (the save failed, as a write error does); a committed
        version of the path stays as it was."""
        with self._mu:
            h = self.handles.get(fh)
            if h is None or not h.write_mode or h.life is Life.DROPPED:
                return
            pd = h.pending
            why = h.error or NamespaceError(errno.EIO, f"{h.path}: its writer raised: abandoned")
            self._drop_open(h)
            if pd is not None:
                self._refuse(pd, why, self.face.caller())
            self._changed()

    def _drop_refused(self, p: str) -> bool:
        """Drop the refused checkpoints at or under ``p`` none of whose files is open (``rm -r``,
        ``rmdir``: the program may save them again); whether any was."""
        doomed = [pd for root, pd in self.pending.items() if pd.refused is not None and not pd.writing
                  and (not p or root == p or root.startswith(p + "/"))]
        for pd in doomed:
            self._abort(pd)
        return bool(doomed)

    def rmdir(self, path: str) -> int:
        p = self._p(path)
        self._writable(p)
        with self._mu:
            dropped = self._drop_refused(p)
            files, dirs = self._namespace()
            if dropped and p not in dirs:
                return 0
            if p not in dirs or p in files:
                raise NamespaceError(errno.ENOENT if p not in dirs else errno.ENOTDIR)
            prefix = p + "/"
            if any(q.startswith(prefix) for q in itertools.chain(files, dirs)):
                raise NamespaceError(errno.ENOTEMPTY)
            gid = self.view.at("dir", p)
            if gid is not None:                       # rm -r of a committed checkpoint: retire it
                self._retire(gid)
            elif any(p.startswith(g.path + "/") for g in self.view if g.kind == "dir"):
                self.view.hide(p)                     # a directory inside a committed checkpoint
            for g in [g for g in self.view if g.kind == "dir" and g.path.startswith(prefix)]:
                self._retire(g.id)
            pd = self.pending.get(p)
            if pd is not None:
                self._abort(pd)
            self.dirs.pop(p, None)
            self._changed()
        return 0

    # -- rename ------------------------------------------------------------------------------------
    def rename(self, old: str, new: str) -> int:
        """Rename a file or directory (see the module docstring); over an existing file it is an atomic
        replace, over an existing empty directory it replaces it, over a non-empty one ``ENOTEMPTY``."""
        self._writable(self._p(old))
        ret = self._rename_path(old, new)
        with self._mu:
            self.face.moved(self._p(old), self._p(new))
        return ret

    def _rename_path(self, old, new):
        a, b = self._p(old), self._p(new)
        if a == b:
            return 0
        with self._mu:
            if self._writer_of(a) is not None:
                return self._rename_open(a, b)
        if not self.slot.acquire(timeout=60):
            raise NamespaceError(errno.EBUSY, f"{a}: a file has been streaming for 60 s; rename after it is closed")
        try:
            return self._rename(a, b)
        finally:
            self.slot.finish()

    def _rename(self, a: str, b: str) -> int:
        """Rename, holding the store slot: store work queued meanwhile runs, in order, before the
        slot is released (the new version commits before the source or the old target is retired)."""
        with self._mu:
            files, dirs = self._namespace()
            if a not in files and a not in dirs:
                raise NamespaceError(errno.ENOENT)
            if b.startswith(a + "/"):
                raise NamespaceError(errno.EINVAL)
            self._check_parent(b, files, dirs)
            self._check_renamed(a, b, files, dirs)
            if a in dirs:
                if b in files:
                    raise NamespaceError(errno.ENOTDIR)
                if any(q.startswith(b + "/") for q in itertools.chain(files, dirs)):
                    raise NamespaceError(errno.ENOTEMPTY)
                self._rename_dir(a, b)
            else:
                if b in dirs:
                    raise NamespaceError(errno.EISDIR)
                self._rename_file(a, b)
            self._changed()
        return 0

    def _check_renamed(self, a: str, b: str, files, dirs) -> None:
        """:meth:`_check_name` for every name a rename of ``a`` to ``b`` creates."""
        if a in dirs and a not in files:
            self._check_name(b, directory=True)
            for q in itertools.chain(files, dirs):
                if q.startswith(a + "/"):
                    self._check_name(b + q[len(a):], directory=q in dirs and q not in files)
        else:
            self._check_name(b)

    def _rename_open(self, a: str, b: str) -> int:
        """Rename a file still open for writing (a temporary file persisted before it is closed, as
        safetensors' ``serialize_file`` does through ``tempfile::persist``): the open file takes the
        new path and commits there when closed, replacing what ``b`` holds then."""
        h = self._writer_of(a)
        files, dirs = self._namespace()
        if b in dirs:
            raise NamespaceError(errno.EISDIR)
        self._check_name(b)
        if self._writer_of(b) is not None:
            raise NamespaceError(errno.EBUSY, f"{b}: open for writing")
        if h.pending is not None:
            if self._pending_of(b) is not h.pending:
                raise NamespaceError(errno.EXDEV, f"{a}: open for writing; it can move within its checkpoint only")
            pd = h.pending
            pd.move_open(h, posixpath.relpath(b, pd.root))
        else:
            if L.checkpoint_root(b, self._is_dir) is not None:
                raise NamespaceError(errno.EXDEV, f"{a}: open for writing; close it before moving it into a checkpoint")
            if b in files and self.view.in_checkpoint(b):
                raise NamespaceError(errno.EPERM, f"{b}: inside a committed checkpoint (append-only)")
        h.path = b
        self.truncated.discard(b)
        self._changed()
        return 0

    def _rename_dir(self, a: str, b: str) -> None:
        pa = a + "/"
        commits = []
        for root in [r for r in self.pending if r == a or r.startswith(pa)]:
            pd = self.pending.pop(root)
            was = posixpath.basename(pd.root)
            pd.root = b + pd.root[len(a):]      # its id follows at the commit (_commit_dir)
            self.pending[pd.root] = pd
            if L.commit_point(was, ()) == "hf-rename" and L.is_checkpoint_dir_name(posixpath.basename(pd.root)):
                commits.append(pd)                   # HF Trainer's commit point: the rename
        for d in [d for d in self.dirs if d == a or d.startswith(pa)]:
            self.dirs[b + d[len(a):]] = self.dirs.pop(d)
        for g in [g for g in self.view if g.path == a or g.path.startswith(pa)]:
            self._copy_gen(g, b + g.path[len(a):])
        for p in [p for p in self.truncated if p.startswith(pa)]:
            self.truncated.discard(p)
            self.truncated.add(b + p[len(a):])
        for pd in commits:                           # after every move: a refusal is this call's errno
            self._request_commit(pd)

    def _rename_file(self, a: str, b: str) -> None:
        pd = self._pending_of(a)
        if pd is not None and self._pending_of(b) is pd:
            ra, rb = posixpath.relpath(a, pd.root), posixpath.relpath(b, pd.root)
            if ra in pd.writing:
                raise NamespaceError(errno.EBUSY, f"{a}: renamed while open for writing")
            pd.move(ra, rb)
            if posixpath.basename(rb) == ".metadata" and L.commit_point(pd.root, pd.ready) == "dcp-metadata":
                self._request_commit(pd)             # DCP's commit point: .metadata.tmp -> .metadata
            return
        data = self._read_all(a) if (self.view.has_file(a) or a in self.pending_files) else None
        if data is None:
            src = pd.ready.get(posixpath.relpath(a, pd.root)) if pd is not None else None
            if src is None:
                raise NamespaceError(errno.EBUSY, f"{a}: still being written; rename it after it is closed")
            data = bytes(src)
        h = OpenWrite(b, buf=bytearray(data))
        root = L.checkpoint_root(b, self._is_dir)
        if root is not None:
            if self.view.at("dir", root) is not None:
                raise NamespaceError(errno.EPERM, f"{b}: checkpoint {root} is committed and append-only")
            h.pending = self.pending.get(root) or self._begin_dir(root)
            h.rel = posixpath.relpath(b, root)
        self._close_writer_locked(h)                 # commits the copy (the new version) first
        self._unlink_locked(a)                       # then retires the source

    def _close_writer_locked(self, h: OpenWrite) -> None:
        if h.pending is not None:
            h.pending.close(h.rel, data=h.buf)
            self._changed()
            return
        self._close_file(h, None)

    def _unlink_locked(self, p: str) -> None:
        if self.view.has_file(p):
            g, _ = self.view.shard_at(p)
            if g.kind == "file":
                self._retire(g.id)
            else:
                self.view.hide(p)
        pd = self._pending_of(p)
        if pd is not None:
            pd.remove(posixpath.relpath(p, pd.root))
        self.pending_files.pop(p, None)
        self._changed()

    def _copy_gen(self, g: CommittedGeneration, path: str) -> None:
        """Rename a committed generation: copy its shards into a new generation at ``path``, commit,
        then retire the source (the store has no rename)."""
        def work():
            make = ids.dir_generation_id if g.kind == "dir" else ids.file_generation_id
            gid = self._free_id(make, path)
            info = self.store.generation(g.id)
            w = self.store.begin_generation(gid, info.step, hint=info.hint, declared_size=info.size)
            names = {}
            try:
                for s, rel in g.names.items():
                    w.write_shard(s, self.store.read_shard(g.id, s))
                    names[s] = rel
                if g.kind == "dir" or path != ids.parse_generation_id(gid)[1]:
                    if gid != make(path, _version(gid)) or g.kind == "dir" and any(
                            ids.shard_name(r) != s for s, r in names.items()):
                        w.write_shard(L.LAYOUT_SHARD, [L.layout_blob(path, names)])
                gen = w.commit()
            except BaseException:
                w.abort()
                raise
            old = self.view.at(g.kind, path)
            self._forget(g.id)
            self._add(gen, g.kind, path, names, g.mtime_ns)
            self._promote(gen.id)
            if old is not None and old != gen.id:
                self._retire(old)
            with contextlib.suppress(GenerationNotFoundError):
                self.store.delete(g.id)
        self.slot.run(work)

    # -- lifetime ----------------------------------------------------------------------------------
    def unmount(self) -> list[str]:
        """Unmount: settle every checkpoint directory still pending.  Returns one line per directory
        that did not commit, saying why (each also logged at WARNING, prefixed ``unmount:``), so the
        caller can say what was dropped (``retainz umount`` prints them).

        * **at its commit point** ("closed" directories, whose last chance this is, or a point that came
          while files were open), every file closed: committed;
        * **refused** (a call on one of its files returned an error): dropped (issue 41 item 4: a
          checkpoint any of whose writes failed never commits);
        * **a file still open for writing** (a server stopped by a signal while a runtime wrote): dropped;
        * **its runtime's completion marker never came** (HF Trainer's ``trainer_state.json``, DCP's
          ``.metadata``, a Megatron or DeepSpeed tracker file naming it): dropped, as after a crash of
          the server, so that what is committed does not depend on how the mount ended: the runtime
          did not finish that save, and its loaders would not take it as a checkpoint (TorchTitan and
          DCP need ``.metadata``, Megatron and DeepSpeed load what the tracker names).  A re-save of
          a committed checkpoint that never finished leaves the committed version as it was.  A
          program that writes such a folder without the marker commits it with ``fsync`` of the
          directory (:meth:`fsyncdir`), as it would make it durable on a local file system.
        """
        self.destroyed = True
        lines: list[str] = []

        def drop(pd: PendingCheckpoint, why: str) -> None:
            files = pd.files()
            line = f"dropped {pd.root}/ ({len(files)} file{'s' * (len(files) != 1)}): {why}"
            log.warning("unmount: %s", line)
            lines.append(line)
            self._abort(pd)

        with self._mu:
            for pd in list(self.pending.values()):
                point = pd.commit_point()
                if pd.refused is not None:
                    drop(pd, f"a call on one of its files failed ({pd.refused}); a checkpoint any of whose "
                             "writes failed never commits")
                elif pd.writing:
                    drop(pd, f"{', '.join(sorted(pd.writing))} still open for writing at unmount")
                elif point == "closed" or pd.commit_requested:
                    try:
                        self.slot.run(lambda pd=pd: self._commit_dir(pd))
                    except Exception as e:  # noqa: BLE001 - unmount goes on
                        drop(pd, f"its commit at unmount failed: {e}")
                else:
                    again = self.view.at("dir", pd.root) is not None
                    drop(pd, f"its commit point never came ({L.COMMIT_POINTS[point]}): an unfinished save, "
                             "absent as after a crash" + ("; its committed version stays" if again else "")
                             + "; fsync of the directory commits a folder written without that marker")
        return lines

    def inferred(self) -> dict:
        """What ``--retention auto`` has inferred so far (``RetentionInference.summary``)."""
        return self.hints.summary()


def _version(gid: str) -> int:
    return ids.parse_generation_id(gid)[2]
