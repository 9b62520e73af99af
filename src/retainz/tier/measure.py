"""The promotion bandwidth the promoter measured: what a generation's expected promotion delay is
computed from (docs/tiers.md, "The expected promotion delay").

Each verified promotion adds ``(bytes, seconds)``: the generation's size and the wall time from the
start of its attempt to its verified manifest (the copy, the read-back and the manifest: everything
that stands between a commit and "durable").  The rate is the bytes over the seconds of the last
``window`` promotions, so a destination that slows down is followed within a few generations.
"""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["MeasuredBandwidth"]


class MeasuredBandwidth:
    """The effective promotion bandwidth over the last ``window`` verified promotions.

    Args:
        window: promotions kept (>= 1).

    Thread safety: one lock (the promoter's thread records, the writer's thread reads).

    Raises:
        ValueError: ``window < 1``.
    """

    def __init__(self, window: int = 8):
        if window < 1:
            raise ValueError(f"window must be at least 1 promotion, not {window}")
        self._lock = threading.Lock()
        self._seen: deque[tuple[int, float]] = deque(maxlen=window)

    def record(self, nbytes: int, seconds: float) -> None:
        """A promotion of ``nbytes`` bytes was verified ``seconds`` after its attempt started.  An
        empty or instantaneous one (nothing to send, or a clock that did not move) is not a measurement."""
        if nbytes > 0 and seconds > 0:
            with self._lock:
                self._seen.append((nbytes, seconds))

    def rate(self) -> float | None:
        """Bytes per second over the window, or ``None`` before the first measurement."""
        with self._lock:
            if not self._seen:
                return None
            return sum(b for b, _ in self._seen) / sum(s for _, s in self._seen)
