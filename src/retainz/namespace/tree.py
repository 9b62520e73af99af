"""The directory tree a namespace shows, and the calls that change its shape.

What a path is now comes from four owners, joined here into one listing (:meth:`Tree.listing`,
cached until the next change): the committed view (:class:`~retainz.namespace.view.CommittedView`),
the checkpoints and files being committed (:class:`~retainz.namespace.commit.Commits`), the open
writers (:class:`~retainz.namespace.openfile.OpenFiles`), and what the tree owns itself: the
directories made in this session (until a file under them commits) and the committed files
truncated to nothing by path (they read empty until their next writer replaces them).  Parents are
implied by their children.

The calls that change the tree's shape, with POSIX's errors (docs/mount.md, "What the calls do"):

* ``mkdir``; ``unlink`` (a file being written is dropped, a file generation retired, a file of a
  committed checkpoint hidden); ``rmdir`` (a committed checkpoint emptied is retired, a refused one
  dropped); ``rm -r`` as the mount does it (:meth:`Tree.remove_tree`);
* ``rename``: a file or checkpoint directory still being written is relabelled (its generation gets
  its final id or a layout shard at its commit); a committed one is copied through the store into a
  new generation that commits before the source is retired (:meth:`Commits.copy`: the store has no
  rename); a rename that is a runtime's commit point (HF Trainer's ``tmp-checkpoint-N`` ->
  ``checkpoint-N``, DCP's ``.metadata.tmp`` -> ``.metadata``) commits the checkpoint.
"""

from __future__ import annotations

import errno
import itertools
import posixpath
import time

from retainz.namespace import names as L
from retainz.namespace.errors import NamespaceError
from retainz.namespace.openfile import OpenWrite

__all__ = ["Tree"]


class Tree:
    """The tree visible now and the calls that change its shape (see the module docstring).

    Args:
        store: the open store (bytes of committed files a rename copies).
        view: the namespace's committed view.
        commits: the namespace's commit protocol (its pending checkpoints and waiting files).
        open_files: the namespace's open files.
        slot: the namespace's store slot (a rename holds it).
        lock: the namespace's lock, held around every change.
        implicit_dirs: a new name's missing parents are implied (``retainz://``); ``False`` (the
            mount): the parent must exist (``ENOENT``).

    Attributes:
        dirs: ``{directory: mtime_ns}`` made in this session (``""``: the root).
        truncated: committed files truncated to nothing by path, not open (they read empty).
    """

    def __init__(self, store, view, commits, open_files, slot, lock, *, implicit_dirs: bool = False):
        self.store, self.view, self.commits, self.open, self.slot = store, view, commits, open_files, slot
        self._mu = lock
        self.implicit_dirs = implicit_dirs
        self.dirs: dict[str, int] = {"": time.time_ns()}
        self.truncated: set[str] = set()
        self._cache: tuple | None = None

    def listing(self) -> tuple[dict[str, int], dict[str, int]]:
        """``({file: mtime_ns}, {directory: mtime_ns})`` visible now (sizes come from :meth:`size`)."""
        if self._cache is not None:
            return self._cache
        files = self.view.files()
        dirs = dict(self.dirs)
        for pd in self.commits.pending.values():
            if pd.refused is not None:          # absent: its open files show until they are closed
                continue
            dirs[pd.root] = pd.mtime_ns
            for rel in pd.files():
                files[posixpath.join(pd.root, rel)] = pd.mtime_ns
        for h in self.open.writing():
            files.setdefault(h.path, time.time_ns())
        for p in self.commits.pending_files:
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
        self._cache = (files, dirs)
        return self._cache

    def truncate(self, p: str) -> None:
        """Committed file ``p``, not open, was truncated to nothing by path: it reads empty until its
        next writer replaces it."""
        self.truncated.add(p)
        self.changed()

    def replaced(self, p: str) -> None:
        """A new version of file ``p`` committed (it is no longer truncated)."""
        self.truncated.discard(p)

    def changed(self) -> None:
        """What the tree shows may have changed (the next :meth:`listing` is made afresh)."""
        self._cache = None

    def committed(self, path: str) -> bool:
        """True if readers of ``path`` see a committed version (it is not hidden or truncated)."""
        return self.view.shows(path) and path not in self.truncated

    def size(self, path: str, own=None) -> int:
        """Bytes of file ``path`` as a caller sees it: the writer that has it open, through its own
        open file ``own``, sees what it wrote; others see the committed version until the new one
        commits (``KeyError``: no such file)."""
        h = self.open.writer_of(path)
        if h is not None and (not self.committed(path) or (own is not None and own is h)):
            return h.size                       # others see the committed version until the new one commits
        if path in self.truncated:
            return 0
        if path in self.commits.pending_files:
            return len(self.commits.pending_files[path])
        pd = self.commits.pending_of(path)
        if pd is not None:
            size = pd.size(posixpath.relpath(path, pd.root))
            if size is not None:
                return size
        return self.view.size(path)

    def check_parent(self, p: str, files, dirs) -> None:
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

    def is_dir(self, path: str) -> bool:
        """Whether ``path`` is a directory visible now."""
        return path in self.listing()[1]

    def check_name(self, p: str, *, directory: bool = False) -> None:
        """:func:`retainz.namespace.names.check_name` of ``p`` (directories as this namespace sees them).

        Raises:
            NamespaceError: ``ENAMETOOLONG``, ``EINVAL``.
        """
        try:
            L.check_name(p, directory=directory, is_dir=self.is_dir)
        except L.NameRefused as e:
            raise NamespaceError(e.errno, e.strerror) from None

    def read_all(self, p: str) -> bytes:
        """The bytes of closed file ``p``: waiting for its checkpoint, or committed (``KeyError``: neither)."""
        if p in self.commits.pending_files:
            return self.commits.pending_files[p]
        g, shard = self.view.shard_at(p)
        return b"".join(self.store.read_shard(g.id, shard))

    def mkdir(self, p: str) -> None:
        """Make a directory (this instance's, until a file under it commits).

        Raises:
            NamespaceError: ``EEXIST``, ``ENOENT`` (no parent), a refused name.
        """
        with self._mu:
            files, dirs = self.listing()
            if p in files or p in dirs:
                raise NamespaceError(errno.EEXIST)
            if posixpath.dirname(p) not in dirs:
                raise NamespaceError(errno.ENOENT)
            self.check_name(p, directory=True)
            self.dirs[p] = time.time_ns()
            self.changed()
        return 0

    def unlink(self, p: str) -> int:
        """Remove a file: a file being written is dropped (its descriptor still takes bytes; nothing
        of it commits, as torch's cleanup of a failed save expects), a file generation is retired, a
        file of a committed checkpoint is hidden (``rmdir`` of the emptied directory retires it).

        Raises:
            NamespaceError: ``ENOENT``.
        """
        with self._mu:
            files, _ = self.listing()
            if p not in files:
                raise NamespaceError(errno.ENOENT, f"{p}: no such file")
            h = self.open.writer_of(p)
            if h is not None:
                self.drop_open(h)
            pd = self.commits.pending_of(p)
            if pd is not None:
                pd.remove(posixpath.relpath(p, pd.root))
                if self.view.in_checkpoint(p):
                    self.view.hide(p)         # not carried over into the new version either
                self.changed()
                return 0
            self.commits.drop_waiting(p)
            if self.view.shows(p):
                self._remove_committed(p)
            self.truncated.discard(p)
            self.changed()
        return 0

    def _remove_committed(self, p: str) -> None:
        """Committed file ``p`` goes: a file of its own is retired, a file of a committed checkpoint
        hidden (``rmdir`` of the emptied directory retires the checkpoint)."""
        g, _ = self.view.shard_at(p)
        if g.kind == "file":
            self.commits.retire(g.id)
        else:
            self.view.hide(p)

    def remove_tree(self, p: str) -> None:
        """``rm -r path``: every file under it unlinked, then every directory removed, deepest first,
        exactly as ``rm -r`` through the mount does (committed checkpoints are retired, pending ones
        dropped).  ``""`` empties the whole tree.

        Raises:
            NamespaceError: ``ENOENT``.
        """
        with self._mu:
            dropped = self.commits.drop_refused(p)
            files, dirs = self.listing()
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
            _, dirs = self.listing()
            for d in sorted((d for d in dirs if d and (d == p or d.startswith(prefix))), key=len, reverse=True):
                if d in self.listing()[1]:        # an implied parent goes with its last child
                    self.rmdir(d)

    def checkpoint_of(self, p: str) -> str | None:
        """The committed checkpoint directory whose file ``p`` is, or ``None`` (a file of its own, a
        file being written, no such file)."""
        with self._mu:
            if not self.view.shows(p) or self.commits.pending_of(p) is not None:
                return None
            g, _ = self.view.shard_at(p)
            return g.path if g.kind == "dir" else None

    def drop_open(self, h: OpenWrite) -> None:
        """``h`` (open for writing) is unlinked or discarded: what it wrote is dropped, its streamed shard
        aborted (the store slot released), and nothing of it commits at its close."""
        with h.lock:
            if h.drop():
                self.slot.finish()     # its stream held the store slot
            if h.pending is not None:
                h.pending.forget_open(h.rel)
            else:
                self.commits.drop_writer(h)
        self.changed()

    def rmdir(self, p: str) -> int:
        """Remove empty directory ``p``: a committed checkpoint is retired (``rm -r``), a directory
        inside one hidden, a pending one aborted; refused checkpoints at or under it are dropped first.

        Raises:
            NamespaceError: ``ENOENT``, ``ENOTDIR``, ``ENOTEMPTY``.
        """
        with self._mu:
            dropped = self.commits.drop_refused(p)
            files, dirs = self.listing()
            if dropped and p not in dirs:
                return 0
            if p not in dirs or p in files:
                raise NamespaceError(errno.ENOENT if p not in dirs else errno.ENOTDIR)
            prefix = p + "/"
            if any(q.startswith(prefix) for q in itertools.chain(files, dirs)):
                raise NamespaceError(errno.ENOTEMPTY)
            gid = self.view.at("dir", p)
            if gid is not None:                       # rm -r of a committed checkpoint: retire it
                self.commits.retire(gid)
            elif any(p.startswith(g.path + "/") for g in self.view if g.kind == "dir"):
                self.view.hide(p)                     # a directory inside a committed checkpoint
            for g in [g for g in self.view if g.kind == "dir" and g.path.startswith(prefix)]:
                self.commits.retire(g.id)
            pd = self.commits.pending.get(p)
            if pd is not None:
                self.commits.abort(pd)
            self.dirs.pop(p, None)
            self.changed()
        return 0

    def rename(self, a: str, b: str) -> int:
        """Rename ``a`` to ``b`` (see :mod:`retainz.namespace.model`, **rename**): a file still open
        for writing takes its new path; otherwise under the store slot, so the new version commits
        before the source or the old target is retired.

        Raises:
            NamespaceError: ``ENOENT``, ``EINVAL`` (into itself), ``ENOTDIR``, ``EISDIR``,
                ``ENOTEMPTY``, ``EXDEV``, ``EBUSY``, ``EPERM``, a refused name."""
        if a == b:         # rename(2): "does nothing" for one file, ENOENT for none
            with self._mu:
                files, dirs = self.listing()
                if a not in files and a not in dirs:
                    raise NamespaceError(errno.ENOENT, f"{a}: no such file or directory")
            return 0
        with self._mu:
            if self.open.writer_of(a) is not None:
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
            files, dirs = self.listing()
            if a not in files and a not in dirs:
                raise NamespaceError(errno.ENOENT)
            if b.startswith(a + "/"):
                raise NamespaceError(errno.EINVAL)
            self.check_parent(b, files, dirs)
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
            self.changed()
        return 0

    def _check_renamed(self, a: str, b: str, files, dirs) -> None:
        """:meth:`check_name` for every name a rename of ``a`` to ``b`` creates."""
        if a in dirs and a not in files:
            self.check_name(b, directory=True)
            for q in itertools.chain(files, dirs):
                if q.startswith(a + "/"):
                    self.check_name(b + q[len(a):], directory=q in dirs and q not in files)
        else:
            self.check_name(b)

    def _rename_open(self, a: str, b: str) -> int:
        """Rename a file still open for writing (a temporary file persisted before it is closed, as
        safetensors' ``serialize_file`` does through ``tempfile::persist``): the open file takes the
        new path and commits there when closed, replacing what ``b`` holds then."""
        h = self.open.writer_of(a)
        files, dirs = self.listing()
        if b in dirs:
            raise NamespaceError(errno.EISDIR)
        self.check_name(b)
        if self.open.writer_of(b) is not None:
            raise NamespaceError(errno.EBUSY, f"{b}: open for writing")
        if h.pending is not None:
            if self.commits.pending_of(b) is not h.pending:
                raise NamespaceError(errno.EXDEV, f"{a}: open for writing; it can move within its checkpoint only")
            pd = h.pending
            pd.move_open(h, posixpath.relpath(b, pd.root))
        else:
            if L.checkpoint_root(b, self.is_dir) is not None:
                raise NamespaceError(errno.EXDEV, f"{a}: open for writing; close it before moving it into a checkpoint")
            if b in files and self.view.in_checkpoint(b):
                raise NamespaceError(errno.EPERM, f"{b}: inside a committed checkpoint (append-only)")
        h.path = b
        self.truncated.discard(b)
        self.changed()
        return 0

    def _rename_dir(self, a: str, b: str) -> None:
        """Directory ``a`` becomes ``b``: pending checkpoints under it are relabelled, the session's
        directories and truncated paths move, committed generations under it are copied; a rename
        that is a checkpoint's commit point commits it last."""
        pa = a + "/"
        commits = self.commits.moved(a, b)           # HF Trainer's commit point: the rename
        for d in [d for d in self.dirs if d == a or d.startswith(pa)]:
            self.dirs[b + d[len(a):]] = self.dirs.pop(d)
        for g in [g for g in self.view if g.path == a or g.path.startswith(pa)]:
            self.commits.copy(g, b + g.path[len(a):])
        for p in [p for p in self.truncated if p.startswith(pa)]:
            self.truncated.discard(p)
            self.truncated.add(b + p[len(a):])
        for pd in commits:                           # after every move: a refusal is this call's errno
            self.commits.request_commit(pd)

    def _rename_file(self, a: str, b: str) -> None:
        """File ``a`` becomes ``b``: within one pending checkpoint it is relabelled; otherwise its
        bytes are committed at ``b`` (a new version, or a file of the checkpoint there) before ``a``
        is removed."""
        pd = self.commits.pending_of(a)
        if pd is not None and self.commits.pending_of(b) is pd:
            ra, rb = posixpath.relpath(a, pd.root), posixpath.relpath(b, pd.root)
            if ra in pd.writing:
                raise NamespaceError(errno.EBUSY, f"{a}: renamed while open for writing")
            pd.move(ra, rb)
            if posixpath.basename(rb) == ".metadata" and L.commit_point(pd.root, pd.ready) == "dcp-metadata":
                self.commits.request_commit(pd)             # DCP's commit point: .metadata.tmp -> .metadata
            return
        data = self.read_all(a) if (self.view.has_file(a) or a in self.commits.pending_files) else None
        if data is None:
            src = pd.ready.get(posixpath.relpath(a, pd.root)) if pd is not None else None
            if src is None:
                raise NamespaceError(errno.EBUSY, f"{a}: still being written; rename it after it is closed")
            data = bytes(src)
        h = OpenWrite(b, buf=bytearray(data))
        root = L.checkpoint_root(b, self.is_dir)
        if root is not None:
            if self.view.at("dir", root) is not None:
                raise NamespaceError(errno.EPERM, f"{b}: checkpoint {root} is committed and append-only")
            h.pending = self.commits.pending.get(root) or self.commits.begin_dir(root)
            h.rel = posixpath.relpath(b, root)
        self.commits.close_held(h)                 # commits the copy (the new version) first
        self._unlink_file(a)                       # then retires the source

    def _unlink_file(self, p: str) -> None:
        """The source of a rename goes: retired, hidden in its committed checkpoint, or removed from
        its pending one."""
        if self.view.has_file(p):
            self._remove_committed(p)
        pd = self.commits.pending_of(p)
        if pd is not None:
            pd.remove(posixpath.relpath(p, pd.root))
        self.commits.drop_waiting(p)
        self.changed()
