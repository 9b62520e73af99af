"""The mounted store: a FUSE file system (mfusepy ``Operations``) over one open :class:`~retainz.store.Store`.

A thin adapter over :class:`retainz.namespace.Namespace`, which owns every path and the rules over
them (what each call does is in :mod:`retainz.namespace.model`; the rules in docs/mount.md).  This
module holds what only a kernel mount has: the ``stat`` structures, libfuse's configuration (request
sizes, read-ahead, no ``auto_inval_data``), and the kernel page cache of each path
(:meth:`MountedStore.keep_cache`, :meth:`MountedStore.direct_io`).  Errors reach the program as the
namespace's errno (mfusepy turns an ``OSError`` into ``-errno``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time

from retainz.errors import RetainZError
from retainz.ids import VERSION_ROOM
from retainz.namespace import Face, Namespace, NamespaceError, errno_of

__all__ = ["MountedStore", "VERSION_ROOM", "errno_of", "READ_AHEAD", "MAX_BACKGROUND"]

#: Readahead the mount asks for (bytes): whole extents, several in flight.
READ_AHEAD = 8 << 20
#: Background requests (read-ahead) the kernel keeps in flight: two :data:`READ_AHEAD` windows of 1 MiB requests.
MAX_BACKGROUND = 2 * (READ_AHEAD >> 20)
#: Seconds a writer's open waits for readers of its path that were closed (their ``flush`` came) to be
#: released: the kernel sends ``RELEASE`` after ``close(2)`` returns (fuse_release, fs/fuse/file.c), so a
#: load closed just before a re-save is still open to the server for a moment.
RELEASE_WAIT = 0.25
#: libfuse's ``FUSE_CAP_AUTO_INVAL_DATA`` (fuse_common.h).
_FUSE_CAP_AUTO_INVAL_DATA = 1 << 12


class _KernelFace(Face):
    """The mount as its namespace sees it: the process of each FUSE request, and what the kernel's
    page cache holds of each path (told of commits, failed writes and renames)."""

    def __init__(self, caller):
        self._caller = caller
        self.lock = threading.Lock()
        self.served: dict[str, tuple[str, str]] = {}   # path -> (generation, shard) at its last read open
        self.cached_writes: set[str] = set()   # new files written through the page cache, not yet committed
        self.flushed: set[int] = set()         # read handles closed by their process, not yet released

    def caller(self) -> int | None:
        return self._caller()

    def committed(self, path: str, gid: str, shard: str) -> None:
        """``path`` committed as ``shard`` of ``gid``: when its bytes were written through the page cache
        (a new file, every write accepted), the cache holds exactly the committed bytes, so the next read
        open may keep it (:meth:`MountedStore.keep_cache`); otherwise that open drops it."""
        with self.lock:
            if path in self.cached_writes:
                self.cached_writes.discard(path)
                self.served[path] = (gid, shard)
            else:
                self.served.pop(path, None)

    def written(self, path: str) -> None:
        """A write to ``path`` failed: the kernel's pages may no longer be the file's bytes."""
        with self.lock:
            self.cached_writes.discard(path)

    def moved(self, a: str, b: str) -> None:
        """The kernel's pages follow the inode, so what is known of them follows the name."""
        with self.lock:
            for q in [q for q in (*self.cached_writes, *self.served) if q == a or q.startswith(a + "/")]:
                new = b + q[len(a):]
                if q in self.cached_writes:
                    self.cached_writes.discard(q)
                    self.cached_writes.add(new)
                if q in self.served:
                    self.served[new] = self.served.pop(q)


class MountedStore:
    """mfusepy ``Operations`` over an open store (see the module docstring).

    Args:
        store: the open :class:`~retainz.store.Store` (the caller closes it after unmount).
        retention: ``None`` (no hints), a rule string for :func:`retainz.retention.rule_hint`
            (``"hf:save_steps=500,save_total_limit=2"``), or ``"auto"`` (:class:`RetentionInference`).
        stream_threshold: bytes a file buffers in memory before it streams into the store.
        caller: ``() -> process id`` of the process making the current request (``None`` when
            unknown: the runner passes libfuse's context); a close commits only when made by the
            process that wrote last.
        tier: the durable tier the mount promotes to (``retainz.jobs.tiering.NamespaceTier``), or ``None``.

    Attributes:
        ns: the :class:`~retainz.namespace.Namespace` (every path's state).
    """

    use_ns = True

    def __init__(self, store, *, retention: str | None = None, stream_threshold: int = 4 << 20,
                 caller=lambda: None, tier=None):
        self._face = _KernelFace(caller)
        self.ns = Namespace(store, retention=retention, stream_threshold=stream_threshold, face=self._face,
                            tier=tier)

    # -- what the runner and tests read ---------------------------------------------------------------
    @property
    def store(self):
        return self.ns.store

    @property
    def inference(self):
        return self.ns.inference

    @property
    def retired_at_mount(self) -> list[str]:
        return self.ns.retired_at_mount

    @property
    def destroyed(self) -> bool:
        return self.ns.destroyed

    def inferred(self) -> dict:
        """What ``--retention auto`` has inferred so far (``RetentionInference.summary``)."""
        return self.ns.inferred()

    # -- the page cache -----------------------------------------------------------------------------
    def keep_cache(self, fh: int) -> bool:
        """Whether the open of read handle ``fh`` may keep the kernel's page cache of the file: it reads
        a committed shard, nobody writes the path, and the path held the same committed shard when it was
        last opened or when the writer that filled the cache committed it (so what the cache holds is that
        shard's bytes; committed bytes never change).  Any other open drops the cache (the kernel's
        default), so a replaced file is never served stale."""
        o = self.ns.open_state(fh)
        if o is None or o.write_mode or o.shard is None:
            return False
        with self._face.lock:
            same = self._face.served.get(o.path) == o.shard
            self._face.served[o.path] = o.shard
        return same and not o.writer

    def direct_io(self, fh: int, flags: int = os.O_RDONLY) -> bool:
        """Whether the open of ``fh`` (``open(2)`` ``flags``) bypasses the kernel's page cache, so
        readers see the committed version until the new one commits.

        A writer writes through the page cache (its pages are then the new version's, kept by the next
        read open once it commits: a re-saved file's first load is served from the cache, issue 44.8),
        except a writer of a path that has a committed version when a reader has the path open (its
        cached pages are the committed version's) or when it was opened read-write (only such a writer
        can map the file shared and writable, which would write the committed version's pages in the
        cache; a write-only descriptor cannot be mapped at all).  A reader opened while a writer of the
        path is unsettled bypasses the cache (it reads the committed version from the mount), and any
        read open of a path whose writer's pages are not committed yet means those pages are not kept
        at the commit (the kernel drops them at that open and may refill them from the old version)."""
        o = self.ns.open_state(fh)
        if o is None:
            return False
        if o.write_mode:
            if o.committed and (flags & os.O_ACCMODE != os.O_WRONLY or not self._readers_released(fh, o)):
                return True
            with self._face.lock:
                self._face.cached_writes.add(o.path)    # the page cache will hold what this writer writes
                self._face.served.pop(o.path, None)     # and no longer a committed shard's bytes
            return False
        with self._face.lock:
            self._face.cached_writes.discard(o.path)
        return o.writer_changed

    def _readers_released(self, fh: int, o) -> bool:
        """Whether no other handle reads the path of writer ``fh`` (state ``o``), waiting up to
        :data:`RELEASE_WAIT` for readers whose process closed them (``flush`` came, ``release`` not yet)."""
        deadline = time.monotonic() + RELEASE_WAIT
        while o is not None and o.readers:
            with self._face.lock:
                closed = set(o.readers) <= self._face.flushed
            if not closed or time.monotonic() > deadline:
                return False
            time.sleep(0.002)
            o = self.ns.open_state(fh)
        return True

    # -- FUSE: metadata ----------------------------------------------------------------------------
    def init_with_config(self, conn_info, config_3) -> None:
        """Large requests: ask the kernel for 1 MiB writes (one store extent) and up to
        :data:`READ_AHEAD` of readahead (the runner raises the mount's bdi ``read_ahead_kb`` to it; the
        kernel's default, 128 KiB, would cut every read into 128 KiB requests)."""
        if conn_info is not None and hasattr(conn_info, "max_write"):
            conn_info.max_write = 1 << 20
        if conn_info is not None and hasattr(conn_info, "max_readahead"):
            conn_info.max_readahead = READ_AHEAD
        # The kernel sends read-ahead as background requests, at most max_background at once, and stops
        # issuing async read-ahead past congestion_threshold (fs/fuse/file.c, fuse_readahead); libfuse's
        # defaults (12 and 9) stall READ_AHEAD's 1 MiB requests, one window in flight at a time.
        if conn_info is not None and hasattr(conn_info, "max_background"):
            conn_info.max_background = MAX_BACKGROUND
            conn_info.congestion_threshold = MAX_BACKGROUND * 3 // 4
        # No FUSE_CAP_AUTO_INVAL_DATA: the kernel would drop a file's cached pages whenever its mtime moved
        # (a commit stamps one).  The page cache is managed at open instead (keep_cache, direct_io).
        for name in ("want", "want_ext"):
            if conn_info is not None and hasattr(conn_info, name):
                setattr(conn_info, name, getattr(conn_info, name) & ~_FUSE_CAP_AUTO_INVAL_DATA)
        if config_3 is not None:
            for name in ("hard_remove", "use_ino"):
                if hasattr(config_3, name):
                    setattr(config_3, name, 1 if name == "hard_remove" else 0)
            if hasattr(config_3, "attr_timeout"):
                config_3.attr_timeout = 0.0    # a size cached by the kernel would outlive a replace's commit

    def getattr(self, path, fh=None):
        e = self.ns.stat(path, fh)
        t = e.mtime_ns
        if e.is_dir:
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_size": 0, "st_mtime": t,
                    "st_ctime": t, "st_atime": t}
        return {"st_mode": stat.S_IFREG | 0o644, "st_nlink": 1, "st_size": e.size, "st_mtime": t,
                "st_ctime": t, "st_atime": t, "st_blocks": (e.size + 511) // 512}

    def readdir(self, path, fh):
        return self.ns.readdir(path)

    def statfs(self, path):
        """Admissible space (:meth:`Namespace.space`) in blocks of the device."""
        bs, capacity, avail, gens = self.ns.space()
        return {"f_bsize": bs, "f_frsize": bs, "f_blocks": capacity // bs, "f_bfree": avail // bs,
                "f_bavail": avail // bs, "f_files": 1 << 20, "f_ffree": (1 << 20) - gens,
                "f_favail": (1 << 20) - gens, "f_namemax": 255}

    def access(self, path, amode):
        self.ns.stat(path)
        return 0

    def chmod(self, path, mode):
        self.ns.stat(path)
        return 0

    def chown(self, path, uid, gid):
        self.ns.stat(path)
        return 0

    def utimens(self, path, times=None):
        self.ns.stat(path)
        return 0

    def mkdir(self, path, mode):
        self.ns.mkdir(path)
        return 0

    def opendir(self, path):
        if not self.ns.stat(path).is_dir:
            raise NamespaceError(errno.ENOTDIR)
        return 0

    def releasedir(self, path, fh):
        return 0

    def fsyncdir(self, path, datasync, fh):
        return self.ns.fsyncdir(path)

    # -- FUSE: files ---------------------------------------------------------------------------------
    def create(self, path, mode, fi=None):
        return self.ns.open_write(path, truncate=True)

    def open(self, path, flags):
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return self.ns.open_read(path)
        return self.ns.open_write(path, truncate=bool(flags & os.O_TRUNC))

    def write(self, path, data, offset, fh):
        return self.ns.write(fh, data, offset)

    def read(self, path, size, offset, fh):
        return self.ns.read(fh, size, offset)

    def read_into(self, fh, out, offset) -> int:
        """Fill ``out`` (a FUSE request's own buffer) from ``offset``; returns the bytes given.

        A read of a committed shard that starts at an extent takes the whole extents in it straight
        from the device into ``out`` (``read_shard_into`` of the store contract: no bytes object per
        request, no copy; the kernel's read-ahead sends 1 MiB requests, one extent each, from the
        file's start); the rest of the request, and every other read, goes through
        :meth:`Namespace.read_into` (its verified-extent windows for requests across extents, its
        errors, the durable copy)."""
        n = 0
        h = self.ns.handle(fh)
        if h is not None and not h.write_mode and h.gen is not None and h.durable is None \
                and offset < h.gen.sizes[h.shard]:
            out = memoryview(out).cast("B")
            with contextlib.suppress(RetainZError):      # the namespace's path says why, as errno
                n = self.store.read_shard_into(h.gen.id, h.shard, offset, out)
            if n == len(out) or offset + n >= h.gen.sizes[h.shard]:
                return n
            out = out[n:]
        return n + self.ns.read_into(fh, out, offset + n)

    def truncate(self, path, length, fh=None):
        return self.ns.truncate(path, length, fh)

    def flush(self, path, fh):
        h = self.ns.handle(fh)
        if h is not None and not h.write_mode:
            with self._face.lock:
                self._face.flushed.add(fh)
        return self.ns.close(fh)

    def fsync(self, path, datasync, fh):
        return self.ns.fsync(fh)

    def release(self, path, fh):
        try:
            return self.ns.release(fh)
        finally:
            with self._face.lock:
                self._face.flushed.discard(fh)

    def unlink(self, path):
        return self.ns.unlink(path)

    def rmdir(self, path):
        return self.ns.rmdir(path)

    def rename(self, old, new):
        return self.ns.rename(old, new)

    def destroy(self, path):
        """Unmount (:meth:`Namespace.unmount`; it logs each checkpoint directory it dropped, and why,
        which ``retainz umount`` prints)."""
        self.ns.unmount()
