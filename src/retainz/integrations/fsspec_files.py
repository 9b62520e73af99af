"""The files of the ``retainz://`` fsspec filesystem (:mod:`retainz.integrations.fsspec_fs`): fsspec's
buffered read and write files over the namespace's open files (:class:`retainz.namespace.Namespace`:
``open_read``/``read``, ``open_write``/``write``/``close``/``release``/``discard``)."""

from __future__ import annotations

from fsspec.spec import AbstractBufferedFile

from retainz.namespace import NamespaceError

__all__ = ["ReadFile", "WriteFile"]


def _os_error(e: NamespaceError, path: str) -> OSError:
    """The namespace's errno as the ``OSError`` subclass Python gives it (``ENOENT`` ->
    ``FileNotFoundError``...), naming the ``retainz://`` path."""
    return OSError(e.errno, e.strerror, path)


class ReadFile(AbstractBufferedFile):
    DEFAULT_BLOCK_SIZE = 4 << 20

    def __init__(self, fs, path, mode, **kwargs):
        self._fh = None
        super().__init__(fs, path, mode, **kwargs)
        self._device, self._inner = fs._split(path)
        self._ns = fs._ns(self._device)
        try:
            self._fh = self._ns.open_read(self._inner)
        except NamespaceError as e:
            self.closed = True         # nothing to flush at its __del__
            raise _os_error(e, path) from None

    def _fetch_range(self, start, end):
        end = min(end, self.size)
        if end <= start:
            return b""
        try:
            return bytes(self._ns.read(self._fh, end - start, start))
        except NamespaceError as e:
            raise _os_error(e, self.path) from None

    def close(self):
        try:
            super().close()
        finally:
            if self._fh is not None:
                self._ns.release(self._fh)
                self._fh = None


class WriteFile(AbstractBufferedFile):
    DEFAULT_BLOCK_SIZE = 8 << 20

    def __init__(self, fs, path, mode, **kwargs):
        super().__init__(fs, path, mode, **kwargs)
        self._pos = 0
        self._done = True              # nothing to finish until the namespace file is open
        try:
            self._device, self._inner = fs._split(path)
            self._ns = fs._ns(self._device)     # may wait for a busy device, then raise TimeoutError
            self._fh = self._ns.open_write(self._inner, truncate=True)
        except BaseException as e:
            self.closed = True         # nothing to flush at its __del__ (fsspec's closes an open file)
            if isinstance(e, NamespaceError):
                raise _os_error(e, path) from None
            raise
        self._done = False

    def _initiate_upload(self):
        return True

    def _upload_chunk(self, final=False):
        data = self.buffer.getvalue()
        try:
            if data:
                self._ns.write(self._fh, data, self._pos)
                self._pos += len(data)
            if final and self.autocommit:
                self.commit()
        except NamespaceError as e:
            self.discard()
            raise _os_error(e, self.path) from None
        return True

    def commit(self):
        """Finish the file: ``close(2)`` in the namespace (the file commits, or joins its checkpoint
        and commits it at its commit point; an error is raised here)."""
        if self._done:
            return
        self._done = True
        try:
            self._ns.close(self._fh)
        finally:
            self._ns.release(self._fh)

    def discard(self):
        if self._done:
            return
        self._done = True
        self._ns.discard(self._fh)
        self._ns.release(self._fh)

    def close(self):
        if self.closed:
            return
        try:
            super().close()
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Drop what this file wrote (and a checkpoint directory being written that it belongs to); a
        replaced file stays as it was.  The file is closed: nothing more reaches the namespace."""
        self.discard()
        self.closed = True
        self.buffer = None

    def __exit__(self, exc_type, exc, tb):
        """An exception inside ``with fs.open(path, "wb")`` abandons the file instead of committing
        what was written so far (fsspec's default closes, i.e. commits, a partial file): a partial
        ``last.ckpt`` never replaces a whole one."""
        if exc_type is None or self.closed:
            return super().__exit__(exc_type, exc, tb)
        self._abandon()
        return False
