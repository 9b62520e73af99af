"""Progress bars for long ``retainz`` operations (docs/cli.md, "Progress").

A bar (tqdm, on stderr) is drawn only when stderr is a terminal and the command was not asked for
``--json``; otherwise :func:`bar` returns a bar that draws nothing, so piped output and JSON stay
clean.  One helper, so every command decides the same way.
"""

from __future__ import annotations

import sys

__all__ = ["enabled", "bar", "callback"]


def enabled(args=None) -> bool:
    """True when a bar may be drawn: stderr is a terminal and ``args.json`` is not set."""
    if args is not None and getattr(args, "json", False):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def bar(total: int | None, desc: str, args=None, *, unit: str = "B", delay: float = 0.0):
    """A tqdm bar of ``total`` ``unit`` (bytes scaled to KiB/MiB/... with ``unit="B"``), disabled
    unless :func:`enabled`, drawn only once ``delay`` seconds have passed; use as a context manager
    and call ``update(n)``."""
    import shutil

    from tqdm import tqdm

    scale = unit == "B"
    size = shutil.get_terminal_size()   # COLUMNS/LINES, else the terminal's, else 80x24 (a 0x0 pty too)
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000,
                file=sys.stderr, leave=False, ncols=size.columns or 80, nrows=size.lines or 24,
                delay=delay, disable=not enabled(args))


def callback(b):
    """A ``progress(done, total)`` callback (the crash campaigns' interface) driving bar ``b``."""
    def progress(done: int, total: int) -> None:
        if b.total != total:
            b.total = total
        b.n = done
        b.refresh()
    return progress
