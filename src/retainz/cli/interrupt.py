"""SIGINT and SIGTERM for the ``retainz`` command: one line, exit 130 / 143, nothing lost.

The rule (docs/cli.md, "Interrupts"):

* A command that only reads the store (``ls``, ``get``, ``fsck``, ``df``) stops at once: the
  signal raises :class:`Interrupted` wherever the command is; ``get`` removes the file it was
  writing (an output file is complete or absent, never half).
* A command that writes the store (``put``, ``rm``, ``gc``, ``mkfs``) runs its store calls inside
  :func:`deferred`: the signal is remembered and raised at the next *safe point* (:func:`checkpoint`,
  which ``put`` calls between 1 MiB input chunks) or when the deferred region ends, so the store
  always sees an ordinary exception at a boundary it handles (an aborted generation, a finished GC
  pass), never one in the middle of a journal append.  A second signal while one is pending stops
  the process at once (:func:`_hard_exit`): that is a crash, and the store's recovery (tested by the
  power-cut and black-box kill campaigns) makes it equivalent to the first signal's outcome.

A signal that lands while the garbage collector runs a finalizer (``__del__``, where Python would
print the exception and drop it) is handled again 1 ms later, once the finalizer has returned.

Either way the command prints one line (``retainz: interrupted`` or ``retainz: terminated``) and
exits with ``128 + signal number``, as shells report a process a signal ended: 130 for SIGINT, 143
for SIGTERM.  A signal that arrives before the interpreter has loaded this module ends the process
by the signal's default action; nothing has touched a device by then.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

__all__ = ["Interrupted", "install", "restore", "ignore", "deferred", "checkpoint", "exit_status", "message",
           "LineTrackingStream"]

#: Signals the command turns into :class:`Interrupted`.
SIGNALS = (signal.SIGINT, signal.SIGTERM)

_depth = 0                    # nesting of deferred() regions
_pending: int | None = None   # a signal received inside a deferred region, not yet raised
_received: int | None = None  # the first signal received inside the outermost deferred region
_dropped: int | None = None   # a signal that landed in a finalizer, handled again by _redeliver


class Interrupted(KeyboardInterrupt):
    """The command was interrupted by signal ``signum`` (SIGINT or SIGTERM).

    A ``KeyboardInterrupt`` so that every ``except Exception`` in the product lets it through
    and every ``except BaseException`` cleanup (abort a writer, remove a partial file) runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def exit_status(signum: int) -> int:
    """The exit status for a command ended by ``signum``: ``128 + signum`` (130 SIGINT, 143 SIGTERM)."""
    return 128 + int(signum)


def message(signum: int) -> str:
    """The one line printed for ``signum``: ``retainz: interrupted`` (SIGINT), ``retainz: terminated``."""
    return "retainz: interrupted" if signum == signal.SIGINT else "retainz: terminated"


class LineTrackingStream:
    """A text stream (``sys.stderr``) that knows whether its output ends a line.

    ``print(text)`` writes ``text`` and its newline in two calls, so a signal between them leaves
    a line open; the interrupt's one line then starts with :meth:`line_break` so it stands on a line
    of its own.  A write ending in ``\r`` leaves the cursor at the start of a line too: a progress
    bar's close blanks its line and returns there (:mod:`retainz.cli.progress`), and the line is
    reused rather than left empty above the message.  Everything but ``write`` is the wrapped
    stream's (``isatty``, ``fileno`` for tqdm)."""

    def __init__(self, stream):
        self.stream = stream
        self.at_line_start = True

    def write(self, text: str) -> int:
        if text:      # before the write: a signal between the two leaves at most an extra newline
            self.at_line_start = text.endswith(("\n", "\r"))
        return self.stream.write(text)

    def line_break(self) -> str:
        """``"\\n"`` when the last write left a line open (a bar drawn, a print cut short), else ``""``."""
        return "" if self.at_line_start else "\n"

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _hard_exit(signum: int) -> None:
    """Stop now, as a crash: no store close, no flush (recovery at the next open reclaims whatever the
    interrupted call left), one line on stderr."""
    with contextlib.suppress(OSError):
        os.write(2, (message(signum) + " (at once)\n").encode())
    os._exit(exit_status(signum))


def _in_finalizer(frame) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` (a finalizer the garbage collector called)."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _redeliver(_alarm: int, frame) -> None:
    """SIGALRM: handle the signal a finalizer would have swallowed (:func:`_handler`)."""
    global _dropped
    signum, _dropped = _dropped, None
    if signum is not None:
        _handler(signum, frame)


def _handler(signum: int, frame) -> None:
    global _pending, _received, _dropped
    if _depth == 0:
        if _in_finalizer(frame):
            # Python prints an exception raised in a finalizer ("Exception ignored in ... __del__")
            # and drops it, so the command would go on as if no signal had come: hold the signal and
            # handle it again a moment later (SIGALRM), until that lands after the finalizer returned
            _dropped = signum
            signal.signal(signal.SIGALRM, _redeliver)
            signal.setitimer(signal.ITIMER_REAL, 0.001)
            return
        raise Interrupted(signum)
    if _received is not None:     # a second signal: the first waits for a safe point, or its cleanup runs
        _hard_exit(signum)
    _pending = _received = signum


def ignore() -> None:
    """Ignore SIGINT/SIGTERM from now on (the command is reporting an interrupt and exiting)."""
    for s in SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(s, signal.SIG_IGN)


def install() -> dict:
    """Route SIGINT and SIGTERM to :class:`Interrupted` (the main thread only; a signal that is
    ignored, as in a background job of a non-interactive shell, stays ignored).

    Returns:
        The previous handlers, for :func:`restore`."""
    previous = {}
    for s in SIGNALS:
        with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
            old = signal.getsignal(s)
            if old != signal.SIG_IGN:
                signal.signal(s, _handler)
                previous[s] = old
    return previous


def restore(previous: dict) -> None:
    """Put back the handlers :func:`install` returned; a signal a finalizer held that has not been
    handled again yet (:func:`_redeliver`) is dropped: the command has finished."""
    global _dropped
    if _dropped is not None:
        _dropped = None
        with contextlib.suppress(ValueError, OSError):
            signal.setitimer(signal.ITIMER_REAL, 0)
    for s, old in previous.items():
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(s, old if old is not None else signal.SIG_DFL)


def checkpoint() -> None:
    """A safe point: raise the pending signal as :class:`Interrupted` (nothing pending: return).

    Raises:
        Interrupted: a signal arrived since the deferred region began."""
    global _pending
    if _pending is not None:
        signum, _pending = _pending, None
        raise Interrupted(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the body (raised at :func:`checkpoint` or at the end of the region).

    The cleanup that an :class:`Interrupted` raised at a checkpoint triggers (abort, close) also
    runs with signals held: a signal during it is remembered, and a further one stops at once.

    Raises:
        Interrupted: a signal arrived during the body and no checkpoint raised it.
    """
    global _depth, _received
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _received = None
    if _depth == 0:
        checkpoint()
