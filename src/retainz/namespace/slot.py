"""The store slot: one streamed shard at a time, and the store work ordered after it.

A namespace streams one file into the store at a time (a ``ShardWriter`` holds the generation's
write path until its shard closes).  Store work that must follow that stream (a small file's commit,
a retirement, an aborted writer, a rename's copy) runs at once when no shard streams, and is queued
otherwise, to run in order when the stream ends, under the namespace's lock.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["StoreSlot"]

log = logging.getLogger("retainz.namespace")


class StoreSlot:
    """One streamed shard at a time, and the store work queued behind it (see the module docstring).

    Args:
        lock: the namespace's lock, held while queued work runs.
    """

    def __init__(self, lock):
        self._mu = lock
        self._slot = threading.Lock()
        self._queued: list = []
        self._qlock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the slot (a shard starts streaming, a rename begins); whether it was taken."""
        return self._slot.acquire(blocking, timeout)

    def release(self) -> None:
        """Give the slot back without running queued work (a stream that failed to start)."""
        self._slot.release()

    def run(self, fn) -> bool:
        """Run ``fn()`` now if no shard is streaming (its errors propagate), else queue it for the end
        of the stream (its errors are logged then).  Returns whether it ran now."""
        if not self._slot.acquire(blocking=False):
            with self._qlock:
                self._queued.append(fn)
            if self._slot.acquire(blocking=False):      # the stream ended meanwhile
                self.finish()
            return False
        try:
            fn()
        finally:
            self.finish()
        return True

    def finish(self) -> None:
        """Run the queued work while holding the slot, then give it back (called by its holder)."""
        try:
            while True:
                with self._qlock:
                    if not self._queued:
                        break
                    fn = self._queued.pop(0)
                try:
                    with self._mu:
                        fn()
                except Exception as e:  # noqa: BLE001 - queued work has no caller to raise to
                    log.error("deferred store operation failed: %s", e)
        finally:
            self._slot.release()
        with self._qlock:
            more = bool(self._queued)
        if more and self._slot.acquire(blocking=False):
            self.finish()
