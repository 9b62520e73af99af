"""Progress bars for long ``retainz`` operations (docs/cli.md, "Progress").

A bar (tqdm, on stderr) is drawn only when stderr is a terminal and the command was not asked for
``--json``; otherwise :func:`bar` returns a bar that draws nothing, so piped output and JSON stay
clean.  A bar appears only once its operation has run :data:`DELAY` seconds (tqdm's ``delay``), so a
quick command draws nothing, and it is removed when the operation ends, interrupted or not (tqdm's
``leave=False``: the close overwrites the line).  Every update goes through ``tqdm.update``: a hand
``refresh()`` draws before the delay and leaves ``last_print_t`` behind, so tqdm's close believes
the bar was never shown and leaves it on the screen.  One helper, so every command decides the same way.
"""

from __future__ import annotations

import functools
import sys

__all__ = ["DELAY", "MININTERVAL", "enabled", "bar", "callback"]

#: Seconds an operation runs before its bar appears (docs/cli.md, "Progress").
DELAY = 0.5

#: Least seconds between two redraws of a bar (tqdm's ``mininterval``, its default).
MININTERVAL = 0.1


def enabled(args=None) -> bool:
    """True when a bar may be drawn: stderr is a terminal and ``args.json`` is not set."""
    if args is not None and getattr(args, "json", False):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def bar(total: int | None, desc: str, args=None, *, unit: str = "B"):
    """A tqdm bar of ``total`` ``unit`` (bytes scaled to KiB/MiB/... with ``unit="B"``), disabled
    unless :func:`enabled`, drawn only once :data:`DELAY` seconds have passed and removed at its
    close; use as a context manager and call ``update(n)`` (never ``refresh()``)."""
    import shutil

    scale = unit == "B"
    size = shutil.get_terminal_size()   # COLUMNS/LINES, else the terminal's, else 80x24 (a 0x0 pty too)
    return _bar_class()(total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000,
                        file=sys.stderr, leave=False, ncols=size.columns or 80, nrows=size.lines or 24,
                        delay=DELAY, mininterval=MININTERVAL, disable=not enabled(args))


@functools.cache
def _bar_class():
    """tqdm, whose close also erases a bar that a signal caught half-recorded (built on first use:
    a command that draws no bar does not import tqdm).

    tqdm's close erases the line only when its ``last_print_t`` says the bar was shown; that time is
    set after the draw, so an interrupt between the two (``get`` stops wherever the signal lands:
    docs/cli.md, "Interrupts") would leave the bar above ``retainz: interrupted``.  Every draw is
    noted before it starts, and a noted bar's line is erased again at the close (ECMA-48 EL 2, then
    a carriage return: idempotent after tqdm's own erase, and the cursor ends at the line's start)."""
    from tqdm import tqdm

    class Bar(tqdm):
        drawn = False

        def display(self, msg=None, pos=None):
            if msg is None:
                self.drawn = True
            return super().display(msg, pos)

        def close(self):
            erase = self.drawn and not self.disable and not self.leave
            super().close()
            if erase:
                self.fp.write("\x1b[2K\r")
                self.fp.flush()

    return Bar


def callback(b):
    """A ``progress(done, total)`` callback (the crash campaigns', GC's and recovery's interface)
    driving bar ``b`` through ``update`` (so the bar keeps tqdm's delay and rate limit)."""
    def progress(done: int, total: int) -> None:
        if b.total != total:
            b.total = total
        b.update(done - b.n)
    return progress
