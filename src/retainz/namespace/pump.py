"""The pump of a streamed file: its chunks written into its store shard on a thread of their own.

A file streamed into the store (past the namespace's stream threshold) takes each write's bytes into
a :class:`Pump`, which pushes them into the file's ``ShardWriter`` (:mod:`retainz.store.writer`) in
order on its own thread, so the request that brought them returns while they are written and the
next request arrives meanwhile.  The first store error stops the pump and is raised by the file's
next write, ``fsync`` or close.
"""

from __future__ import annotations

import collections
import threading

__all__ = ["Pump"]


class Pump:
    """Writes a streamed file's chunks into its shard on a thread of its own, in order, so the
    request that brought them returns while they are written (the next one arrives meanwhile).

    At most :attr:`LIMIT` bytes wait; :meth:`put` blocks past it.  The first error of the shard stops
    the pump and is raised by every later :meth:`put` and by :meth:`drain`.
    """

    #: Bytes taken and not yet in the shard before :meth:`put` waits (four 1 MiB requests).
    LIMIT = 4 << 20

    def __init__(self, sink):
        self.sink = sink
        self.cv = threading.Condition()
        self.q: collections.deque = collections.deque()
        self.queued = 0                 # bytes taken, not yet written into the shard
        self.error: BaseException | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="retainz-stream", daemon=True)
        self.thread.start()

    def put(self, data) -> None:
        """Take ``data``: a copy, queued once fewer than :attr:`LIMIT` bytes wait (the request's buffer
        is reused after it returns); a chunk of :attr:`LIMIT` bytes or more (a whole tensor handed to
        one ``write`` by ``retainz://``) is written from ``data`` itself, here, after the chunks before
        it, never copied (issue 44.7: a save's peak memory).

        Raises:
            the shard's first error (``NoSpaceError``, a device error), if one happened."""
        if memoryview(data).nbytes >= self.LIMIT:
            self.drain()
            try:
                self.sink.write(data)
            except BaseException as e:
                with self.cv:
                    self.error = self.error or e
                raise
            return
        with self.cv:
            while self.queued >= self.LIMIT and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise self.error
            chunk = bytes(data)
            self.q.append(chunk)
            self.queued += len(chunk)
            self.cv.notify_all()

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.q and not self.closed:
                    self.cv.wait()
                if not self.q:
                    return
                chunk = self.q[0]
            err = None
            if self.error is None:
                try:
                    self.sink.write(chunk)
                except BaseException as e:  # noqa: BLE001 - handed to the writer's next call
                    err = e
            with self.cv:
                if self.q and self.q[0] is chunk:
                    self.q.popleft()
                    self.queued -= len(chunk)
                if err is not None and self.error is None:
                    self.error = err
                self.cv.notify_all()

    def drain(self) -> None:
        """Wait until every chunk taken is in the shard.

        Raises:
            the shard's first error."""
        with self.cv:
            while self.q and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise self.error

    def stop(self, *, discard: bool = False) -> None:
        """End the thread, after writing what waits (``discard``: dropping it)."""
        with self.cv:
            if discard:
                while len(self.q) > 1:
                    self.queued -= len(self.q.pop())
            self.closed = True
            self.cv.notify_all()
        if self.thread is not threading.current_thread():
            self.thread.join()
