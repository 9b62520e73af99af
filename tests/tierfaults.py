"""Fault-injecting fsspec file systems for the tier tests, over a real directory tree
(:class:`FaultyLocal`) or a real S3 endpoint (:class:`FaultyS3`, s3fs to moto's server): ``gate``
blocks every upload until set (a slow or stalled destination), ``fail_after`` raises mid-upload after
that many bytes of an object, ``full`` raises ENOSPC as a full file system does, ``down`` makes every
call fail as an unreachable destination's would, ``flip_writes`` stores each object with its first byte
flipped and reports success (only a read-back sees it)."""

from __future__ import annotations

import errno
import threading

from fsspec.implementations.local import LocalFileSystem


class _Writer:
    def __init__(self, fs, f, path):
        self.fs, self.f, self.n, self.path = fs, f, 0, path

    def write(self, data):
        fs = self.fs
        if fs.gate is not None:
            fs.waiting.set()
            fs.gate.wait()
        if fs.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        if (fs.fail_after is not None and self.n + len(data) > fs.fail_after
                and (fs.fail_only is None or fs.fail_only in self.path)):
            self.f.write(data[: max(fs.fail_after - self.n, 0)])
            fs.failures += 1
            raise ConnectionResetError(errno.ECONNRESET, "connection reset mid-upload")
        if fs.flip_writes and self.n == 0 and data:      # a destination that stores other bytes, silently
            data = bytes([data[0] ^ 1]) + bytes(data[1:])
        self.n += len(data)
        fs.written += len(data)
        return self.f.write(data)

    def close(self):
        return self.f.close()

    @property
    def closed(self):
        return self.f.closed

    @closed.setter
    def closed(self, value):
        self.f.closed = value

    def discard(self):
        """An upload given up: a local file stays as far as it got (what a failed write leaves); an S3
        object is never committed (s3fs aborts the multipart upload, or never sends the single PUT)."""
        if isinstance(self.fs, LocalFileSystem):
            return self.f.close()
        return self.f.discard()


class _Faults:
    """The fault switches (set them at any time) and the upload wrapper, for either file system."""

    cachable = False

    def __init__(self, **kw):
        super().__init__(**kw)
        self.gate: threading.Event | None = None
        self.waiting = threading.Event()
        self.fail_after: int | None = None
        self.full = False
        self.down = False
        self.flip_writes = False
        self.fail_only: str | None = None     # fail_after applies only to paths containing this
        self.written = 0                      # bytes stored, all objects
        self.failures = 0

    def _check(self):
        if self.down:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    def _open(self, path, mode="rb", **kw):
        self._check()
        f = super()._open(path, mode, **kw)
        return _Writer(self, f, path) if "w" in mode else f


class FaultyLocal(_Faults, LocalFileSystem):
    """A local file system whose uploads fail as the attributes say."""

    def info(self, path, **kw):
        self._check()
        return super().info(path, **kw)

    def ls(self, path, detail=False, **kw):
        self._check()
        return super().ls(path, detail=detail, **kw)

    def makedirs(self, path, exist_ok=False):
        self._check()
        return super().makedirs(path, exist_ok=exist_ok)


def faulty_s3(**options):
    """An s3fs file system (``options``: s3fs's) whose uploads fail as the attributes say.  The checks
    sit in the sync calls, in the caller's thread (as :class:`FaultyLocal`'s), which then run s3fs's
    coroutine on its I/O loop."""
    import s3fs
    from fsspec.asyn import sync

    class FaultyS3(_Faults, s3fs.S3FileSystem):
        def info(self, path, **kw):
            self._check()
            return sync(self.loop, self._info, path, **kw)

        def ls(self, path, detail=False, **kw):
            self._check()
            return sync(self.loop, self._ls, path, detail=detail, **kw)

        def makedirs(self, path, exist_ok=False):
            self._check()
            return sync(self.loop, self._makedirs, path, exist_ok=exist_ok)

    return FaultyS3(**options)
