"""The commit protocol: how what a namespace writes becomes committed, or is abandoned.

Every generation a namespace writes goes through one :class:`Commits`: it is begun (its id free
in the view and among the ids in flight, its retention hint from :class:`~retainz.namespace.hints.Hints`,
admitted through :class:`~retainz.namespace.admission.Admission`), its bytes reserved as they
arrive, then either committed (published into the
:class:`~retainz.namespace.view.CommittedView`, handed to the durable tier, the version it replaces
retired) or abandoned (aborted, its reservation returned).  Two kinds:

* **a file of its own** commits at the ``close(2)``/``fsync`` of the process that wrote it last
  (:meth:`Commits.close`); a tracker file (``latest``, ``latest_checkpointed_iteration.txt``) first
  commits the checkpoints it names, and waits for one whose files are still open (its bytes are
  held in :attr:`Commits.pending_files` meanwhile); it never commits if that checkpoint does not.
* **a checkpoint directory being written** is a
  :class:`~retainz.namespace.pending.PendingCheckpoint` in :attr:`Commits.pending` (one per root,
  begun with its first file, :meth:`Commits.begin_dir`).  It commits at its runtime's commit point
  (:func:`retainz.namespace.names.commit_point`, :meth:`Commits.request_commit`), when its last
  file closes if some are still open; a new version of a committed checkpoint carries over the
  files it does not rewrite.  A **refused** one (a call on one of its files returned an error,
  :meth:`Commits.refuse`) never commits (docs/mount.md, "refusal"): its writer is aborted once
  none of its files is open, and it stays in the table, refusing new files for the processes that
  got the error, until it is removed (:meth:`Commits.drop_refused`), the next save in its folder
  begins, or :meth:`Commits.unmount`.  At unmount, a checkpoint whose commit point is "closed" (or
  was requested) and whose files are all closed commits; the rest are aborted.

Store work ordered after a streaming shard (a commit of a small file, a retirement, an abort, a
rename's copy) goes through the :class:`~retainz.namespace.slot.StoreSlot`.  A rename of a
committed generation copies it into a new generation (:meth:`Commits.copy`: the store has no
rename); one renamed while written takes its final id at its commit (``GenerationWriter.rename``)
or carries a layout shard.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import posixpath
import time

from retainz import ids
from retainz.errors import GenerationNotFoundError, RetainZError, ShardExistsError
from retainz.ids import series_of
from retainz.namespace import names as L
from retainz.namespace.errors import NamespaceError, errno_of
from retainz.namespace.openfile import Keeping, OpenWrite
from retainz.namespace.pending import PendingCheckpoint
from retainz.namespace.view import CommittedGeneration
from retainz.retention.steps import parse_step

__all__ = ["Commits"]

log = logging.getLogger("retainz.namespace")


class Commits:
    """The generations one namespace writes, from begun to committed or abandoned (see the module
    docstring).

    Args:
        store: the open store (the store contract: ``begin_generation`` through ``face``,
            ``generation``, ``read_shard``, ``delete``).
        view: the namespace's :class:`~retainz.namespace.view.CommittedView`, where commits are
            published and from which retired generations go.
        face: the namespace's :class:`~retainz.namespace.hooks.Face` (the calling process, how a
            generation is begun, leaving a joined generation, page-cache bookkeeping of commits).
        tier: the :class:`~retainz.namespace.hooks.DurableTier` commits are promoted to and
            retirements deferred by, or ``None``.
        hints: the namespace's :class:`~retainz.namespace.hints.Hints` (a new generation's hint; what
            was aborted or deleted).
        admission: the namespace's :class:`~retainz.namespace.admission.Admission`.
        slot: the namespace's :class:`~retainz.namespace.slot.StoreSlot`.
        lock: the namespace's lock (an ``RLock``), held around every change of the tables below.
        stream_threshold: bytes a file buffers before it streams (a length set ahead past it streams
            at its close).
        changed: called after every change of what the tree shows.
        file_committed: ``fn(path)`` called when a file's new version committed at ``path``.

    Attributes:
        pending: ``{root: PendingCheckpoint}`` of the checkpoint directories being written (and the
            refused ones kept to refuse new files).
        pending_files: ``{path: bytes}`` of closed files whose commit waits for a checkpoint they name.
        taken: ids in flight (writers begun, deletions queued or deferred): not shown by the view and
            never given to a new generation.
    """

    def __init__(self, store, view, *, face, tier, hints, admission, slot, lock, stream_threshold: int,
                 changed, file_committed):
        self.store, self.view, self.face, self.tier = store, view, face, tier
        self.hints, self.admission, self.slot = hints, admission, slot
        self._mu = lock
        self.stream_threshold = stream_threshold
        self._changed = changed
        self._file_committed = file_committed
        self.pending: dict[str, PendingCheckpoint] = {}
        self.pending_files: dict[str, bytes] = {}
        self._waiting: dict[str, set[object]] = {}   # path -> tokens of its queued commits still wanted
        self.taken: set[str] = set()

    # -- ids and the view --------------------------------------------------------------------------
    def free_id(self, make, path: str) -> str:
        """The first id ``make(path, version)`` (``ids.file_generation_id``, ``ids.dir_generation_id``)
        neither shown nor in flight."""
        for v in itertools.count():
            gid = make(path, v)
            if gid not in self.view and gid not in self.taken:
                return gid
        raise AssertionError("unreachable")

    def pending_of(self, path: str) -> PendingCheckpoint | None:
        """The pending checkpoint ``path`` is a file of, or ``None``."""
        for root, pd in self.pending.items():
            if path.startswith(root + "/"):
                return pd
        return None

    def drop_waiting(self, path: str) -> None:
        """The closed file ``path`` waiting for a checkpoint was removed (``unlink``, a rename's
        source): its bytes are no longer shown, and its queued commit is withdrawn (it never commits,
        as ``rm`` of a file whose writer has not closed)."""
        self.pending_files.pop(path, None)
        self._waiting.pop(path, None)

    def writers(self) -> list:
        """The ``GenerationWriter`` of every pending checkpoint that has one."""
        return [pd.writer for pd in self.pending.values() if pd.writer is not None]

    def _add(self, info, kind: str, path: str, names: dict[str, str], mtime_ns: int) -> CommittedGeneration:
        g = self.view.add(info, kind, path, names, mtime_ns)
        self._changed()
        return g

    def _forget(self, gid: str) -> CommittedGeneration | None:
        g = self.view.forget(gid)
        self._changed()
        return g

    def retire(self, gid: str) -> None:
        """Drop committed generation ``gid`` from the view and delete it from the store (journaled,
        flushed; queued behind a streaming shard if one is being written), or hand it to the durable
        tier, which may defer the deletion until its copy is durable (it stays in flight meanwhile)."""
        self.taken.add(gid)
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
                self.taken.discard(gid)
        self.slot.run(delete)

    def _promote(self, gid: str) -> None:
        """Hand a generation this namespace committed to the durable tier, if any."""
        if self.tier is not None:
            self.tier.committed(gid)

    # -- beginning and admission -------------------------------------------------------------------
    def _begin_file(self, h: OpenWrite):
        """Admit the generation of a file outside checkpoint directories (its first byte arrives)."""
        gid = self.free_id(ids.file_generation_id, h.path)
        step = parse_step(h.path, file_names=True)
        hint = self.hints.hint(series_of(h.path), gid, step)
        h.writer = self.face.begin(self.store, gid, step or 0, hint, h.path)
        self.taken.add(gid)
        return h.writer

    def begin_dir(self, root: str) -> PendingCheckpoint:
        """Begin checkpoint directory ``root`` (its first file is being created): the runtime moved
        on, so the earlier saves in its folder that are done commit (commit point "closed") or, if
        refused, are dropped."""
        parent = posixpath.dirname(root)
        for other in list(self.pending.values()):   # the runtime moved on: its earlier save is done
            if posixpath.dirname(other.root) == parent and not other.writing and other.refused is not None:
                self.abort(other)                   # refused, and its error was reported already
            elif (posixpath.dirname(other.root) == parent and not other.writing
                    and other.commit_point() == "closed"):
                self.request_commit(other)
        step = parse_step(root, file_names=True)
        gid = self.free_id(ids.dir_generation_id, root)
        hint = self.hints.hint(series_of(root), gid, step)
        self.taken.add(gid)
        pd = self.pending[root] = PendingCheckpoint(root, gid, step or 0, hint, mtime_ns=time.time_ns())
        self._changed()
        return pd

    def writer(self, pd: PendingCheckpoint):
        """The pending directory's ``GenerationWriter`` (admitted on first need; the caller holds the
        store slot)."""
        if pd.writer is None:
            pd.writer = self.face.begin(self.store, pd.gid, pd.step, pd.hint, pd.root)
        return pd.writer

    def reserve(self, h: OpenWrite, size: int | None = None) -> None:
        """Grow the reservation of ``h``'s generation to every byte it holds unplaced, ``h`` at
        ``size`` bytes, plus one block (a layout shard); the generation is admitted first if it has
        no writer yet.

        Raises:
            NamespaceError: ``ENOSPC`` (the store's admission or journal refused; nothing changed).
        """
        try:
            with self._mu, self.admission.lock:
                if h.pending is not None:
                    w = self.writer(h.pending)
                    need = self.admission.checkpoint_need(h.pending, h, size)
                else:
                    w = h.writer if h.writer is not None else self._begin_file(h)
                    need = self.admission.file_need(h, size)
                self.admission.admit(w, need)
        except RetainZError as e:
            raise NamespaceError(errno_of(e), f"{h.path}: {e}") from e

    def start_stream(self, h: OpenWrite) -> None:
        """Start streaming a large file's buffer into the store as a shard of its generation, if the
        store slot is free (the caller holds ``h.lock``).

        Raises:
            NamespaceError: the errno of the store's refusal (``h`` has failed)."""
        if not self.slot.acquire(blocking=False):
            return
        try:
            with self._mu, self.admission.lock:
                if h.pending is not None:
                    pd = h.pending
                    name = pd.shard_name(h.rel, pd.streamed)
                    writer = self.writer(pd)
                else:
                    writer = h.writer if h.writer is not None else self._begin_file(h)
                    name = L.FILE_SHARD
            h.start_stream(writer.open_shard(name), name)
        except BaseException as e:
            self.slot.release()
            h.fail(e)
            raise NamespaceError(errno_of(e), f"{h.path}: {e}") from e

    # -- a file closed: it commits, or joins its checkpoint ------------------------------------------
    def close(self, h: OpenWrite) -> None:
        """Open file ``h`` is finished (its close or fsync): a file of its own commits; a file of a
        checkpoint joins it and commits it if it is the checkpoint's commit point (or the last file
        of one whose commit was requested); a file that failed refuses its checkpoint.

        Raises:
            NamespaceError: the file's error, or its checkpoint's refusal; ``RetainZError`` of a
                commit (the caller reports it)."""
        info = None
        if not h.streaming and h.size > len(h.buf) and h.error is None:
            # a length set ahead (ftruncate up) and not all written: stream it with its zeros, or hold them
            if h.size >= self.stream_threshold and h.keeping is Keeping.BUFFERED:
                with contextlib.suppress(NamespaceError):
                    self.start_stream(h)
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
                    self._join(h, info, err)
                else:
                    if err is not None:
                        self.drop_writer(h)
                        raise NamespaceError(errno_of(err), f"{h.path}: {err}")
                    self._close_file(h, info)
        finally:
            if streamed:
                self.slot.finish()

    def _join(self, h: OpenWrite, info, err) -> None:
        """File ``h`` of a pending checkpoint closed (streamed: ``info`` of its shard; ``err``: it failed)."""
        pd = h.pending
        if err is not None:
            pd.forget_open(h.rel)
            self.refuse(pd, err, h.writer_process)
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
            self.request_commit(pd)
        elif pd.commit_requested and not pd.writing:
            self.request_commit(pd)
        if self.pending.get(pd.root) is pd and pd.writer is not None and self.face.leaves(pd.writer):
            w = self.detach(pd.root)     # another rank commits it
            if w is not None:
                w.leave()

    def close_held(self, h: OpenWrite) -> None:
        """Commit (or join its checkpoint) ``h``, whose bytes are all held in memory (a rename's
        copy of a committed file)."""
        if h.pending is not None:
            h.pending.close(h.rel, data=h.buf)
            self._changed()
            return
        self._close_file(h, None)

    def drop_writer(self, h: OpenWrite) -> None:
        """Abort the generation writer of ``h`` (a file of its own), if it has one: nothing of it commits."""
        if h.writer is not None:
            with contextlib.suppress(Exception):
                h.writer.abort()
            self.taken.discard(h.writer.id)
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
                        self.request_commit(pd)   # the checkpoint commits before its tracker
                    except BaseException:
                        self.drop_writer(h)       # a tracker naming a refused checkpoint never commits
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
                    self.drop_writer(h)       # renamed while open, nothing placed: admit it under its path
                    w = None
                if w is None:
                    self.reserve(h)
                    w = h.writer
                if waiting is not None:       # commits after the checkpoint it names
                    self._after(waiting, h, p, data)
                    return
                w.write_shard(L.FILE_SHARD, [data])
            gen = w.commit()
        except BaseException:
            self.drop_writer(h)
            raise
        h.writer = None
        self.taken.discard(gen.id)
        self._publish_file(p, gen)

    def _after(self, pd: PendingCheckpoint, h: OpenWrite, p: str, data: bytes) -> None:
        """Tracker file ``h`` at ``p`` (bytes ``data``) commits after checkpoint ``pd`` it names, or
        never if ``pd`` does not commit or ``p`` is removed before it does (:meth:`drop_waiting`)."""
        gen_w = h.writer
        h.writer = None
        token = object()
        self._waiting.setdefault(p, set()).add(token)

        def later(committed: bool):
            queued = self._waiting.get(p, set())
            wanted = token in queued
            queued.discard(token)
            if not queued:
                self._waiting.pop(p, None)
            if not committed or not wanted:   # its checkpoint refused, or the file removed meanwhile
                with contextlib.suppress(Exception):
                    gen_w.abort()
                self.taken.discard(gen_w.id)
                if not committed:
                    self.pending_files.pop(p, None)
                    log.error("%s: not committed: the checkpoint it names did not commit", p)
                return
            gen_w.write_shard(L.FILE_SHARD, [data])
            self.taken.discard(gen_w.id)
            self._publish_file(p, gen_w.commit())
        pd.then.append(later)
        self.pending_files[p] = data
        self._changed()

    def _publish_file(self, p: str, gen) -> None:
        self.face.committed(p, gen.id, L.FILE_SHARD)
        old = self.view.at("file", p)
        self._add(gen, "file", p, {L.FILE_SHARD: ""}, time.time_ns())
        self._promote(gen.id)
        self._file_committed(p)
        self.pending_files.pop(p, None)
        if old is not None and old != gen.id:
            with contextlib.suppress(GenerationNotFoundError):
                self.store.delete(old)          # the new version's commit is durable: retire the old
            self._forget(old)

    # -- a checkpoint commits ----------------------------------------------------------------------
    def request_commit(self, pd: PendingCheckpoint) -> None:
        """Commit a checkpoint directory at its commit point, now (when its last file closes if
        some are still open).  A refused commit drops the checkpoint (none of its files stays) and
        raises the errno for the call that reached the commit point.

        Raises:
            NamespaceError: its refusal's errno, or the errno of the store's refusal of the commit."""
        pd.commit_requested = True
        if self.pending.get(pd.root) is not pd:
            return
        if pd.refused is not None:        # the error a call on one of its files returned decides it
            err = self.refusal(pd, pd.root)
            if not pd.writing:
                self.abort(pd)
            raise err
        if pd.writing:
            return
        try:
            self._commit(pd)
        except BaseException as e:
            log.error("%s: commit refused, the checkpoint is dropped: %s", pd.root, e)
            self.abort(pd)
            raise NamespaceError(errno_of(e), f"{pd.root}: commit refused: {e}") from e

    def _commit(self, pd: PendingCheckpoint) -> None:
        if self.pending.get(pd.root) is not pd:
            return
        if pd.refused is not None:
            raise self.refusal(pd, pd.root)
        if not pd.streamed and ids.parse_generation_id(pd.gid)[1] != pd.root:
            self._readmit(pd)          # renamed before anything was placed: its id names its path
        names = dict(pd.streamed)
        for rel, data in pd.ready.items():
            name = pd.shard_name(rel, names)
            self.writer(pd).write_shard(name, [bytes(data)])
            names[name] = rel
        old = self.view.at("dir", pd.root)
        if old is not None and old != pd.gid:           # a new version: the files it did not rewrite stay
            written = set(names.values())
            for s, rel in self.view.get(old).names.items():
                if rel in written or self.view.hidden(posixpath.join(pd.root, rel)):
                    continue
                name = pd.shard_name(rel, names)
                try:
                    self.writer(pd).write_shard(name, self.store.read_shard(old, s))
                except ShardExistsError:
                    if not pd.writer.joined:
                        raise
                    continue       # another rank of the joined generation rewrote it: its version stays
                names[name] = rel
        moved = pd.gid != ids.dir_generation_id(pd.root, _version(pd.gid))    # renamed while streaming
        if moved and self._rename_writer(self.writer(pd), ids.dir_generation_id, pd.root, pd):
            moved = False                                  # it commits under its final name
        relabelled = pd.relabelled or moved or any(ids.shard_name(rel) != s for s, rel in names.items())
        if relabelled:
            self.writer(pd).write_shard(L.LAYOUT_SHARD, [L.layout_blob(pd.root, names)])
        gen = self.writer(pd).commit()
        for name in gen.shards:                  # shards other writers joined in (ranks of a served device)
            if name not in names and name != L.LAYOUT_SHARD:
                names[name] = ids.shard_path(name)
        for name, rel in names.items():
            self.face.committed(posixpath.join(pd.root, rel), gen.id, name)
        del self.pending[pd.root]
        self.taken.discard(pd.gid)
        old = self.view.at("dir", pd.root)
        self._add(gen, "dir", pd.root, names, time.time_ns())
        self._promote(gen.id)
        if old is not None and old != gen.id:
            self.retire(old)
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
        gid = self.free_id(make, path)
        try:
            w.rename(gid)
        except RetainZError as e:
            log.info("%s: keeps its id %s (%s)", path, old, e)
            return False
        self.taken.discard(old)
        self.taken.add(gid)
        if pd is not None:
            pd.gid = gid
        return True

    def _readmit(self, pd: PendingCheckpoint) -> None:
        """Admit a renamed checkpoint directory again under the id of its new path (nothing of it
        is placed yet), so the store lists it by the path the runtime gave it."""
        gid = self.free_id(ids.dir_generation_id, pd.root)
        need = sum(self.admission.pad(len(b)) for b in pd.ready.values()) + self.admission.pad(1)
        old = pd.writer
        if old is not None:
            old.abort()
        self.taken.discard(pd.gid)
        pd.gid, pd.writer = gid, None
        self.taken.add(gid)
        self.admission.admit(self.writer(pd), need)

    def moved(self, a: str, b: str) -> list[PendingCheckpoint]:
        """Directory ``a`` was renamed to ``b``: the pending checkpoints at or under it take their new
        roots (their ids follow at the commit).  Returns those whose commit point the rename is
        (HF Trainer's ``tmp-checkpoint-N`` -> ``checkpoint-N``); the caller requests their commit
        once everything has moved."""
        pa = a + "/"
        commits = []
        for root in [r for r in self.pending if r == a or r.startswith(pa)]:
            pd = self.pending.pop(root)
            was = posixpath.basename(pd.root)
            pd.root = b + pd.root[len(a):]
            self.pending[pd.root] = pd
            if L.commit_point(was, ()) == "hf-rename" and L.is_checkpoint_dir_name(posixpath.basename(pd.root)):
                commits.append(pd)
        return commits

    # -- refusal and abandonment -------------------------------------------------------------------
    def refused(self, h: OpenWrite, e: BaseException) -> None:
        """A call on write handle ``h`` returned the error ``e`` to the program: the file never
        commits (its close returns the errno) and its checkpoint directory is refused
        (:meth:`refuse`).  Not for a file unlinked or discarded meanwhile (nothing of it commits)."""
        if not h.live:
            return
        h.fail(e)
        if h.pending is not None:
            with self._mu:
                self.refuse(h.pending, h.error, self.face.caller())

    def refuse(self, pd: PendingCheckpoint, e: BaseException, who=None) -> None:
        """Refuse pending checkpoint ``pd`` (see the module docstring): it never commits.  Its files
        leave the view, every file of it still open fails its next call with ``e``'s errno, and once
        none is open its store writer is aborted (what it placed and reserved is returned); ``pd``
        stays in :attr:`pending` so that new files of it are refused for the process ``who`` until it
        is removed, the next save in its folder begins, or unmount."""
        if self.pending.get(pd.root) is not pd:
            return
        if pd.refuse(e, who):
            log.warning("%s: refused (%s): the checkpoint will not commit", pd.root, e)
        if not pd.writing:
            self.abort(pd, keep=True)
        self._changed()

    @staticmethod
    def refusal(pd: PendingCheckpoint, p: str) -> NamespaceError:
        """The error a call on ``p`` of refused checkpoint ``pd`` returns (its first error's errno)."""
        return NamespaceError(errno_of(pd.refused), f"{p}: checkpoint {pd.root} was refused ({pd.refused}): "
                                                    f"it will not commit; remove it (rm -r) to save it again")

    def abort(self, pd: PendingCheckpoint, *, keep: bool = False) -> None:
        """Drop pending checkpoint ``pd``: its store writer aborted (queued behind a streaming shard),
        the work queued after its commit run.  ``keep``: it stays in :attr:`pending` (refused: new
        files of it are refused, :meth:`refuse`)."""
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
                self.taken.discard(gid)
            pd.writer = None
            self.slot.run(abort)
        else:
            self.taken.discard(pd.gid)
        self.hints.aborted(pd.gid)
        self._changed()
        then, pd.then = pd.then, []
        for fn in then:
            fn(False)

    def drop_refused(self, p: str) -> bool:
        """Drop the refused checkpoints at or under ``p`` none of whose files is open (``rm -r``,
        ``rmdir``: the program may save them again); whether any was."""
        doomed = [pd for root, pd in self.pending.items() if pd.refused is not None and not pd.writing
                  and (not p or root == p or root.startswith(p + "/"))]
        for pd in doomed:
            self.abort(pd)
        return bool(doomed)

    def detach(self, root: str):
        """Hand the writer of pending checkpoint ``root`` back without committing it: its buffered files
        are written as shards first (a rank of a joined generation leaves it to the rank that commits).
        Returns the writer (``None`` if nothing is pending there)."""
        with self._mu:
            pd = self.pending.get(root)
            if pd is None or pd.writing or pd.refused is not None:
                return None
            w = self.writer(pd)
            for rel, data in pd.ready.items():
                w.write_shard(ids.shard_name(rel), [bytes(data)])
            del self.pending[pd.root]
            self.taken.discard(pd.gid)
            self._changed()
            return w

    def unmount(self) -> list[str]:
        """Settle every pending checkpoint directory at unmount.  Returns one line per directory that
        did not commit, saying why (each also logged at WARNING, prefixed ``unmount:``), so the caller
        can say what was dropped (``retainz umount`` prints them).

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
          directory (``Namespace.fsyncdir``), as it would make it durable on a local file system.
        """
        lines: list[str] = []

        def drop(pd: PendingCheckpoint, why: str) -> None:
            files = pd.files()
            line = f"dropped {pd.root}/ ({len(files)} file{'s' * (len(files) != 1)}): {why}"
            log.warning("unmount: %s", line)
            lines.append(line)
            self.abort(pd)

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
                        self.slot.run(lambda pd=pd: self._commit(pd))
                    except Exception as e:  # noqa: BLE001 - unmount goes on
                        drop(pd, f"its commit at unmount failed: {e}")
                else:
                    again = self.view.at("dir", pd.root) is not None
                    drop(pd, f"its commit point never came ({L.COMMIT_POINTS[point]}): an unfinished save, "
                             "absent as after a crash" + ("; its committed version stays" if again else "")
                             + "; fsync of the directory commits a folder written without that marker")
        return lines

    # -- a committed generation renamed --------------------------------------------------------------
    def copy(self, g: CommittedGeneration, path: str) -> None:
        """Rename committed generation ``g`` to ``path``: copy its shards into a new generation there,
        commit it, then retire the source and what ``path`` held (the store has no rename; queued
        behind a streaming shard)."""
        def work():
            make = ids.dir_generation_id if g.kind == "dir" else ids.file_generation_id
            gid = self.free_id(make, path)
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
                self.retire(old)
            with contextlib.suppress(GenerationNotFoundError):
                self.store.delete(g.id)
        self.slot.run(work)


def _version(gid: str) -> int:
    return ids.parse_generation_id(gid)[2]

