"""The files of the ``retainz://`` fsspec filesystem (:mod:`retainz.integrations.fsspec_fs`): fsspec's
buffered read and write files over the namespace's open files (:class:`retainz.namespace.Namespace`:
``open_read``/``read``, ``open_write``/``write``/``close``/``release``/``discard``)."""

from __future__ import annotations

import io

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

    def read(self, length=-1):
        """Up to ``length`` bytes (all that is left for ``-1``) from the file's position.  A read of at
        least one block bypasses fsspec's read-ahead cache: the namespace's bytes are returned as they
        come (one copy of each byte), and the cache does not keep a second copy of the range (stock
        DCP's ``FileSystemReader`` reads each item in one ``read``; issue 44.7)."""
        if length is None or length < 0:
            length = self.size - self.loc
        if self.closed or length < self.blocksize or "r" not in self.mode:
            return super().read(length)
        length = min(length, self.size - self.loc)
        if length <= 0:
            return b""
        out = self._fetch_range(self.loc, self.loc + length)
        self.loc += len(out)
        return out

    def readinto(self, b):
        """Fill the writable buffer ``b`` from the file's position straight from the namespace
        (:meth:`Namespace.read_into`, no intermediate ``bytes``); returns the bytes given."""
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        out = memoryview(b).cast("B")
        n = min(len(out), max(self.size - self.loc, 0))
        if n == 0:
            return 0
        try:
            got = self._ns.read_into(self._fh, out[:n], self.loc)
        except NamespaceError as e:
            raise _os_error(e, self.path) from None
        self.loc += got
        return got

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

    def write(self, data):
        """Take ``data`` (any bytes-like object); returns its length.  A write of at least one block
        goes straight to the namespace (which copies what it keeps before returning) instead of
        through fsspec's ``BytesIO`` buffer, so a tensor's bytes are never held twice here (stock DCP's
        writers hand a whole tensor to one ``write``; issue 44.7).  Smaller writes are buffered."""
        view = memoryview(data).cast("B")
        if len(view) < self.blocksize or self.closed or self.forced or "w" not in self.mode:
            return super().write(view)
        if self.offset is None:
            self.offset = 0
            self._initiate_upload()
        if self.buffer.tell():
            with self.buffer.getbuffer() as held:
                self._send(held)
            self.offset += self.buffer.tell()
            self.buffer = io.BytesIO()
        self._send(view)
        self.offset += len(view)
        self.loc += len(view)
        return len(view)

    def _send(self, view) -> None:
        """Hand ``view`` to the namespace at the file's next offset; a refusal discards the file."""
        try:
            self._ns.write(self._fh, view, self._pos)
        except NamespaceError as e:
            self.discard()
            raise _os_error(e, self.path) from None
        self._pos += len(view)

    def _upload_chunk(self, final=False):
        if self.buffer.tell():
            with self.buffer.getbuffer() as held:     # a view of the buffer: no copy of it
                self._send(held)
        try:
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
