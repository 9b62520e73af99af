"""The bandwidth cap of promotion: a token bucket over bytes sent (docs/tiers.md, "Bandwidth").

``RateLimit(rate)`` lets ``rate`` bytes per second through on average, with a burst of at most one
second's worth (or one chunk, if larger).  The clock and the sleep are parameters, so the cap is
tested without timing anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["RateLimit"]


class RateLimit:
    """A token bucket: :meth:`take` blocks until ``n`` more bytes may be sent.

    Args:
        rate: bytes per second (> 0), or ``None`` for no cap.
        clock: seconds, monotonic (default ``time.monotonic``).
        sleep: blocks for a number of seconds (default ``time.sleep``).

    Thread safety: one lock; concurrent takers share the rate.

    Raises:
        ValueError: ``rate`` not a positive number.
    """

    def __init__(self, rate: float | None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if rate is not None and not (isinstance(rate, int | float) and rate > 0):
            raise ValueError(f"bandwidth must be a positive number of bytes per second, not {rate!r}")
        self.rate = rate
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._tokens = float(rate or 0)
        self._at = clock()
        #: seconds spent waiting in :meth:`take` (the cap's cost)
        self.waited = 0.0

    def take(self, n: int) -> None:
        """Account ``n`` bytes about to be sent, first sleeping as long as the cap requires."""
        if self.rate is None or n <= 0:
            return
        with self._lock:
            now = self._clock()
            self._tokens = min(self._tokens + (now - self._at) * self.rate, max(self.rate, n))
            self._at = now
            self._tokens -= n
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
            if wait > 0:
                self.waited += wait
                self._sleep(wait)
                self._at = self._clock()
                self._tokens = 0.0
