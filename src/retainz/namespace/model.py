"""The namespace model: a directory tree over one open store, the same for every face.

:class:`Namespace` makes the POSIX-like calls below over parts that each own their state: the
committed view (:class:`~retainz.namespace.view.CommittedView`: path -> generation and shard, hidden
paths), the commit protocol (:class:`~retainz.namespace.commit.Commits`: the checkpoint directories
being written, the files waiting for one, the ids in flight, and how each commits or is abandoned),
the tree (:class:`~retainz.namespace.tree.Tree`: what is visible now, the directories made in this
session, truncated paths, and the calls that change the tree's shape: ``mkdir``, ``unlink``,
``rmdir``, ``rm -r``, ``rename``), the open files (:mod:`retainz.namespace.openfile`), admission and
the store slot.  The FUSE mount (:mod:`retainz.mount.fs`) and
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

import errno
import itertools
import logging
import posixpath
import threading
import time
from dataclasses import dataclass

from retainz.errors import RetainZError
from retainz.namespace import names as L
from retainz.namespace.admission import Admission
from retainz.namespace.commit import Commits
from retainz.namespace.errors import NamespaceError, errno_of
from retainz.namespace.hints import Hints
from retainz.namespace.hooks import DurableTier, Face
from retainz.namespace.openfile import Life, OpenFiles, OpenRead, OpenWrite
from retainz.namespace.slot import StoreSlot
from retainz.namespace.tree import Tree
from retainz.namespace.view import CommittedView
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
        readers: the other open handles that read ``path``.
    """

    path: str
    write_mode: bool
    shard: tuple[str, str] | None
    committed: bool
    writer: bool
    writer_changed: bool
    readers: tuple[int, ...]




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
        view, commits, tree, open: its parts (:class:`CommittedView`, :class:`Commits`,
            :class:`Tree`, :class:`OpenFiles`), built here and sharing its lock.
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
        self.open = OpenFiles()
        self.view = CommittedView(store)
        self.commits = Commits(store, self.view, face=self.face, tier=tier, hints=self.hints,
                               admission=self.admission, slot=self.slot, lock=self._mu,
                               stream_threshold=stream_threshold,
                               changed=lambda: self.tree.changed(),       # the tree lists what commits
                               file_committed=lambda p: self.tree.replaced(p))
        self.tree = Tree(store, self.view, self.commits, self.open, self.slot, self._mu,
                         implicit_dirs=implicit_dirs)
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
            if self.view.sync(self.store.generations(), skip=self.commits.taken, retiring=retiring):
                self.tree.changed()

    def _load(self) -> None:
        shown, stale = self.view.load(self.store.generations())
        for g in stale:
            log.info("retiring %s: an older version of %s (a replace was interrupted)", g.id, self.view.resolve(g)[1])
            self.store.delete(g.id)
            self.retired_at_mount.append(g.id)
        for c, _ in shown:
            self.hints.found(c.path, c.id, parse_step(c.path, file_names=True))

    # -- the tree visible now ----------------------------------------------------------------------
    @staticmethod
    def _p(path: str | None) -> str:
        return (path or "/").strip("/")

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
            files, dirs = self.tree.listing()
            if p in dirs and p not in files:
                return Entry(True, 0, dirs[p])
            if p in files:
                return Entry(False, self.tree.size(p, self.open.get(fh)), files[p])
        if any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX for part in p.split("/")):
            raise NamespaceError(errno.ENAMETOOLONG)
        raise NamespaceError(errno.ENOENT, f"{p}: no such file or directory")

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file or directory visible now."""
        p = self._p(path)
        with self._mu:
            files, dirs = self.tree.listing()
            return p in files or p in dirs

    def listdir(self, path: str) -> list[str]:
        """The names in directory ``path``, sorted.

        Raises:
            NamespaceError: ``ENOENT`` (no such directory), ``ENOTDIR``.
        """
        p = self._p(path)
        with self._mu:
            files, dirs = self.tree.listing()
            if p in files:
                raise NamespaceError(errno.ENOTDIR, f"{p}: not a directory")
        return [n for n in self.readdir(p) if n not in (".", "..")]

    def walk_files(self, path: str) -> dict[str, int]:
        """``{file: size}`` of every file at or under ``path`` visible now (``""``: the whole tree)."""
        p = self._p(path)
        with self._mu:
            files, _ = self.tree.listing()
            prefix = p + "/" if p else ""
            return {f: self.tree.size(f) for f in files if f == p or f.startswith(prefix)}

    def readdir(self, path, fh=None):
        p = self._p(path)
        with self._mu:
            files, dirs = self.tree.listing()
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
        layout record (:meth:`Commits.reserve`), so a file of exactly that size is written whole."""
        with self._mu:
            writers = self.commits.writers()
            writers += self.open.writers()
        return self.admission.space(writers)

    def mkdir(self, path: str) -> None:
        """Make a directory (this instance's, until a file under it commits).

        Raises:
            NamespaceError: ``EEXIST``, ``ENOENT`` (no parent), a refused name.
        """
        p = self._p(path)
        self._writable(p)
        return self.tree.mkdir(p)

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
        return self.open.get(fh)

    def writer_of(self, path: str) -> OpenWrite | None:
        """The open, unreleased writer of ``path``, if any."""
        return self.open.writer_of(self._p(path))

    def open_state(self, fh: int) -> OpenState | None:
        """The state of open file ``fh`` and of its path, taken at one instant (``None`` once released)."""
        with self._mu:
            h = self.open.get(fh)
            if h is None:
                return None
            w = self.open.writer_of(h.path)
            read = not h.write_mode and h.gen is not None
            return OpenState(h.path, h.write_mode, (h.gen.id, h.shard) if read else None,
                             self.tree.committed(h.path), w is not None, w is not None and w.unsettled,
                             self.open.readers_of(h.path, but=fh))

    def committed(self, path: str) -> bool:
        """Whether readers of ``path`` see a committed version."""
        return self.tree.committed(self._p(path))

    def _open_read(self, p: str) -> int:
        self._settled(p)
        deadline = time.monotonic() + 30
        while True:
            with self._mu:
                pd = self.commits.pending_of(p)
                if (self.open.writer_of(p) is None and pd is not None and not pd.writing and pd.refused is None
                        and posixpath.relpath(p, pd.root) not in pd.ready
                        and (pd.commit_requested or pd.commit_point() == "closed")):
                    self.commits.request_commit(pd)     # a save with no commit point of its own, read back: it is done
                    if self.commits.pending_of(p) is not pd:
                        return self._open_read_locked(p)
                else:
                    return self._open_read_locked(p)
            if time.monotonic() > deadline:      # its commit is queued behind a stream that goes on
                break
            time.sleep(0.01)
        with self._mu:
            return self._open_read_locked(p)

    def _open_read_locked(self, p: str) -> int:
        files, _ = self.tree.listing()
        if p not in files:
            raise NamespaceError(errno.ENOENT)
        w = self.open.writer_of(p)
        pd = self.commits.pending_of(p)
        if w is not None and not w.streaming and not self.tree.committed(p):
            h = OpenRead(p, buf=w.buf, source=w)     # reads what is written so far
        elif p in self.tree.truncated:
            h = OpenRead(p, buf=bytearray())
        elif p in self.commits.pending_files:
            h = OpenRead(p, buf=bytearray(self.commits.pending_files[p]))
        elif pd is not None and posixpath.relpath(p, pd.root) in pd.ready:
            h = OpenRead(p, buf=bytearray(pd.ready[posixpath.relpath(p, pd.root)]))
        elif self.view.has_file(p):
            g, shard = self.view.shard_at(p)
            h = OpenRead(p, gen=g, shard=shard)
        else:
            raise NamespaceError(errno.EBUSY, f"{p}: being written into the store and not committed yet; "
                                      "it can be read after its checkpoint commits")
        fh = self.open.add(h)
        return fh

    def _open_write(self, p: str, truncate: bool) -> int:
        self._settled(p)
        with self._mu:
            files, dirs = self.tree.listing()
            if p in dirs:
                raise NamespaceError(errno.EISDIR)
            self.tree.check_parent(p, files, dirs)
            if self.open.writer_of(p) is not None:
                raise NamespaceError(errno.EBUSY, f"{p}: already open for writing")
            if p not in files:
                self.tree.check_name(p)
            root = L.checkpoint_root(p, self.tree.is_dir)
            buf = bytearray()
            if root is not None:
                if self.view.at("dir", root) is not None and p in files and not truncate and root not in self.commits.pending:
                    raise NamespaceError(errno.EPERM, f"{p}: checkpoint {root} is committed: its files can be "
                                              "replaced whole (O_TRUNC), not changed in place")
                # a file written into a committed checkpoint starts its next version, which replaces it
                # at its commit point (the files it does not rewrite are carried over)
                pd = self.commits.pending.get(root)
                if pd is not None and pd.refused is not None:
                    if pd.writing or self.face.caller() in pd.refused_by:
                        raise self.commits.refusal(pd, p)
                    self.commits.abort(pd)               # another process saves it again (a restarted job)
                    pd = None
                pd = pd or self.commits.begin_dir(root)
                rel = posixpath.relpath(p, root)
                if pd.is_streamed(rel):
                    raise NamespaceError(errno.EPERM, f"{p}: already streamed into checkpoint {root} (append-only)")
                held = pd.take_back(rel)
                if held is not None and not truncate:
                    buf = held
                h = OpenWrite(p, buf=buf, pending=pd, rel=rel)
                try:
                    self.commits.reserve(h)          # admitted (journal room) here: ENOSPC at open, not later
                except NamespaceError as e:
                    self.commits.refuse(pd, e, self.face.caller())    # a file of it could not be created
                    raise
                pd.open(rel, h)
            else:
                if p in files and not truncate and p not in self.tree.truncated:
                    size = self.tree.size(p)
                    if size > self.stream_threshold:
                        raise NamespaceError(errno.EPERM, f"{p}: a committed file over {self.stream_threshold} bytes "
                                                  "can only be replaced whole (open it with O_TRUNC)")
                    buf = bytearray(self.tree.read_all(p))
                h = OpenWrite(p, buf=buf, changed=truncate and self.tree.committed(p))   # O_TRUNC: it is empty now
                try:
                    self.commits.reserve(h)
                except NamespaceError:
                    self.commits.drop_writer(h)      # begun, then refused: nothing of it stays admitted
                    raise
            fh = self.open.add(h)
            self.tree.changed()
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
            h = self.open.get(fh)
            if h is not None:
                self.face.written(h.path)   # a cache's pages may no longer be the file's bytes
                if h.write_mode:
                    self.commits.refused(h, e)
            raise

    def _write(self, data, offset, fh) -> int:
        h = self.open.get(fh)
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
                self.commits.start_stream(h)      # a large write streams from its own buffer, not copied (issue 44.7)
            if h.streaming:
                if offset != h.put:
                    raise NamespaceError(errno.EIO, f"{h.path}: write at byte {offset} of a file streamed "
                                            f"sequentially into the store ({h.put} bytes so far)")
                self.commits.reserve(h, end)
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
            self.commits.reserve(h, max(end, h.size))
            h.change()
            if offset > len(h.buf):                # into the length an ftruncate set ahead: held from here
                h.skip_ahead()
                h.buf.extend(bytes(offset - len(h.buf)))
            h.buf[offset:end] = data
            h.size = max(h.size, len(h.buf))
            if h.may_stream(self.stream_threshold, end):
                self.commits.start_stream(h)
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

    def _reopen(self, h: OpenWrite) -> None:
        """More bytes after a close of a duplicate descriptor committed the file: they make a new
        version (a file) or take the file back from its checkpoint (buffered files only)."""
        with self._mu:
            if h.pending is None:
                if not h.buf and h.size:
                    h.buf = bytearray(self.tree.read_all(h.path))     # it had streamed: copy it
                h.reopen()
                return
            pd = h.pending
            if self.commits.pending.get(pd.root) is not pd:
                raise NamespaceError(errno.EPERM, f"{h.path}: its checkpoint {pd.root} has committed (append-only)")
            if h.rel not in pd.ready:
                raise NamespaceError(errno.EPERM, f"{h.path}: already streamed into checkpoint {pd.root} (append-only)")
            h.buf = pd.take_back(h.rel)
            pd.open(h.rel, h)
            h.reopen()
            self.tree.changed()

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        p = self._p(path)
        self._writable(p)
        h = self.open.get(fh) if fh else None
        if h is None:
            with self._mu:
                h = self.open.writer_of(p)
        if h is not None and h.write_mode:
            try:
                return self._truncate_open(h, p, length)
            except NamespaceError as e:
                self.commits.refused(h, e)
                raise
        with self._mu:
            files, _ = self.tree.listing()
            if p not in files:
                raise NamespaceError(errno.ENOENT)
            if length == 0 and L.checkpoint_root(p, self.tree.is_dir) is None:
                self.tree.truncate(p)      # the next writer replaces it; it reads empty meanwhile
                return 0
            if length == self.tree.size(p):
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
                self.commits.reserve(h, length)
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
        h = self.open.get(fh)
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
                w = self.open.writer_of(p)
            if w is None or not w.flushed or time.monotonic() > deadline:
                return
            w.done.wait(0.5)

    def fsync(self, fh: int) -> int:
        """``fsync(2)``: a file outside checkpoint directories commits now (as at close); a file of
        a checkpoint reports any error so far (its bytes are reserved in the store and become
        durable at the checkpoint's commit point)."""
        h = self.open.get(fh)
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
            self.commits.refused(h, failed)
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
            pd = self.commits.pending.get(p)
            if pd is not None:
                self.commits.request_commit(pd)
                if pd.writing:
                    raise NamespaceError(errno.EBUSY, f"{p}: {len(pd.writing)} of its files are still open; "
                                              "it commits when they are closed")
        return 0

    def release(self, fh: int) -> int:
        h = self.open.get(fh)
        try:
            if h is not None and h.write_mode:
                try:
                    self._finish(h, report=False)
                finally:
                    with self._mu:
                        h.release()            # until now the path's open writer is this handle
                        self.tree.changed()
        finally:
            with self._mu:
                self.open.pop(fh)
                self.tree.changed()
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
            if h.life is Life.OPENED and h.pending is None and self.tree.committed(h.path):
                self.commits.drop_writer(h)       # opened for writing, nothing changed: no new version
                h.settle()
                return
            try:
                self.commits.close(h)
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
                    self.tree.changed()

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
        h = self.open.get(fh)
        if h is None:
            raise NamespaceError(errno.EBADF)
        return h.pieces(size, offset, self.store, self.tier)

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
        return self.tree.unlink(p)

    def remove_tree(self, path: str) -> None:
        """``rm -r path``: every file under it unlinked, then every directory removed, deepest first,
        exactly as ``rm -r`` through the mount does (committed checkpoints are retired, pending ones
        dropped).  ``""`` empties the whole tree.

        Raises:
            NamespaceError: ``ENOENT``.
        """
        p = self._p(path)
        self._writable(p)
        self.tree.remove_tree(p)

    def checkpoint_of(self, path: str) -> str | None:
        """The committed checkpoint directory whose file ``path`` is, or ``None`` (a file of its own, a
        file being written, no such file)."""
        return self.tree.checkpoint_of(self._p(path))

    def discard(self, fh: int) -> None:
        """Abandon open file ``fh`` (its writer raised): nothing of it commits; a file of a checkpoint
        being written drops that checkpoint (the save failed, as a write error does); a committed
        version of the path stays as it was."""
        with self._mu:
            h = self.open.get(fh)
            if h is None or not h.write_mode or h.life is Life.DROPPED:
                return
            pd = h.pending
            why = h.error or NamespaceError(errno.EIO, f"{h.path}: its writer raised: abandoned")
            self.tree.drop_open(h)
            if pd is not None:
                self.commits.refuse(pd, why, self.face.caller())
            self.tree.changed()

    def rmdir(self, path: str) -> int:
        p = self._p(path)
        self._writable(p)
        return self.tree.rmdir(p)

    # -- rename ------------------------------------------------------------------------------------
    def rename(self, old: str, new: str) -> int:
        """Rename a file or directory (see the module docstring); over an existing file it is an atomic
        replace, over an existing empty directory it replaces it, over a non-empty one ``ENOTEMPTY``."""
        a, b = self._p(old), self._p(new)
        self._writable(a)
        ret = self.tree.rename(a, b)
        with self._mu:
            self.face.moved(a, b)
        return ret

    # -- lifetime ----------------------------------------------------------------------------------
    def unmount(self) -> list[str]:
        """Unmount: settle every checkpoint directory still pending (:meth:`Commits.unmount`).  Returns
        one line per directory that did not commit, saying why (``retainz umount`` prints them)."""
        self.destroyed = True
        return self.commits.unmount()

    def inferred(self) -> dict:
        """What ``--retention auto`` has inferred so far (``RetentionInference.summary``)."""
        return self.hints.summary()

