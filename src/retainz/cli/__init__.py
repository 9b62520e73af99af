"""The ``retainz`` command.

Each command group lives in its own module under ``retainz.cli`` and exposes
``register(subparsers)``, which adds its sub-commands and sets ``func`` on each parser; ``func(args)``
returns the exit status.  Add a module to :data:`COMMAND_MODULES` to add commands.

Exit status: 0 success; 1 the operation failed (a device or store error, a failed check);
2 bad usage or bad input (unknown option, missing device file, malformed value, a file that is not what
the command takes), with one line on stderr; 130 / 143 interrupted by SIGINT / SIGTERM (one line;
:mod:`retainz.cli.interrupt` says what an interrupt leaves); 141 standard output closed by its reader.
The full list is docs/cli.md's.

``--json`` output is strict JSON (RFC 8259: no ``Infinity`` or ``NaN``, which strict parsers refuse): a step that is infinite (a permanent generation's ``reclaim_step``) is the
string ``"inf"``, as in the trace format (docs/trace-format.md); a float that is not a number is
``null``.  :func:`print_json` is the one writer.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import signal
import sys

from retainz import __version__
from retainz.errors import RetainZError

#: Command modules, each with ``register(subparsers)``.
COMMAND_MODULES = [
    "retainz.cli.trace",
    "retainz.cli.device",
    "retainz.cli.demo",
    "retainz.cli.store",
    "retainz.cli.crashtest",
    "retainz.cli.replay",
    "retainz.cli.experiments",
    "retainz.cli.vm",
    "retainz.cli.payload",
    "retainz.cli.mount",
    "retainz.cli.node",
    "retainz.cli.tier",
]


def size_arg(text: str) -> int:
    """argparse type for byte sizes with units (``64MiB``, ``64M``, ``64MB``), read by
    :func:`retainz.zoned.model.parse_size`, the project's one size parser (units exactly as written;
    docs/cli.md, "Sizes"); the error names the value and the problem.

    Raises:
        argparse.ArgumentTypeError: a malformed or ambiguous size (``64mb``), one line."""
    from retainz.zoned.model import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_size_arg(text: str) -> int:
    """argparse type for a byte size or rate that must be above zero (``--write-bandwidth``,
    ``--write-unit``, ``--promote-bandwidth``): :func:`size_arg`, and 0 refused.

    Raises:
        argparse.ArgumentTypeError: a malformed size, or 0, one line."""
    v = size_arg(text)
    if v == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is zero: give a positive size")
    return v


def check_blocks(flag: str, value: int | None, block_size: int) -> None:
    """Refuse a size flag's value that is not a whole number of blocks.

    Raises:
        ValueError: one line naming the flag, the value and the block size (exit status 2)."""
    if value and value % block_size:
        from retainz.zoned.model import format_sizes

        down, up = value // block_size * block_size, (value // block_size + 1) * block_size
        nearest = f"{down:,} or {up:,} B" if down else f"{up:,} B"      # 0 is no size to suggest
        raise ValueError(f"{flag} {format_sizes(value)} is not a multiple of the block size ({block_size} B); "
                         f"round it to {nearest}")


def geometry_lines(g) -> list[str]:
    """The geometry a device was created or formatted with, for people: zones, zone size and capacity,
    block size, limits, and the totals, each size in IEC and SI units and in bytes (:func:`format_sizes`)."""
    from retainz.zoned.model import format_sizes

    lim = lambda n: "no limit" if n == 0 else str(n)  # noqa: E731
    return [f"    zones: {g.nr_zones:,} of {format_sizes(g.zone_size)}",
            f"    zone capacity: {format_sizes(g.zone_capacity)} writable per zone",
            f"    block size: {g.block_size} B; max open zones {lim(g.max_open)}, max active {lim(g.max_active)}",
            f"    total: {format_sizes(g.size)} ({format_sizes(g.capacity)} writable)"]


def int_arg(low: int = 0, high: int | None = None, *, too_low: str = "", too_high: str = ""):
    """An argparse type for whole numbers in ``low..high`` (``high`` None: no bound); the error names
    the problem.  ``too_low``/``too_high`` override the messages (``str.format`` fields ``v``,
    ``low``, ``high``)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < low:
            msg = too_low or ("{v} is negative" if low == 0 else "{v} must be at least {low}")
            raise argparse.ArgumentTypeError(msg.format(v=v, low=low, high=high))
        if high is not None and v > high:
            raise argparse.ArgumentTypeError((too_high or "{v} is above {high}").format(v=v, low=low, high=high))
        return v

    return parse


#: A count or an index: a non-negative integer.
count_arg = int_arg(0)


def fraction_arg(text: str) -> float:
    """argparse type for a fraction in (0, 1] (``--pressure``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be above 0 and at most 1")
    return value


def seconds_arg(text: str) -> float:
    """argparse type for a duration: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} must be a positive, finite number of seconds")
    return value


def error_line(e: BaseException) -> str:
    """The one line an error is reported with: for an operating-system error on a path, ``PATH:
    reason`` as coreutils prints it (not Python's ``[Errno N] ...: 'PATH'``); else the message."""
    from retainz.errors import NoSpaceError

    if isinstance(e, NoSpaceError) and e.cause == "admission" and e.needed:
        # the store's refusal names its bytes exactly; a person needs the sizes and the way out
        from retainz.zoned.model import format_size

        what = str(e).split(" needs ", 1)[0]
        return (f"{what} needs {format_size(e.needed)}, and {format_size(e.available)} can be reserved on this "
                "device (free space less the GC reserve and other writers' reservations): delete generations "
                "to make room (`retainz rm DEVICE ID`; `retainz ls DEVICE` lists them) or use a larger device")
    if isinstance(e, OSError) and not isinstance(e, RetainZError) and e.strerror:
        if e.filename is None:
            return e.strerror                  # e.g. writing to a full standard output
        where = f"{e.filename} -> {e.filename2}" if e.filename2 is not None else str(e.filename)
        return f"{where}: {e.strerror}"
    return str(e)


def strict_json(obj):
    """``obj`` with every non-finite float made JSON-safe: ``inf`` -> ``"inf"``, ``-inf`` -> ``"-inf"``,
    NaN -> ``None``; dicts, lists and tuples are walked, anything else is returned as is."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict_json(v) for v in obj]
    return obj


def print_json(obj, **kwargs) -> None:
    """Print ``obj`` as strict JSON (see :func:`strict_json`); ``kwargs`` go to :func:`json.dumps`.

    Raises:
        ValueError: never for floats (they are converted); TypeError for an object JSON cannot hold.
    """
    print(json.dumps(strict_json(obj), allow_nan=False, **kwargs))


def plural(n: int, noun: str, plural_form: str | None = None) -> str:
    """``"1 shard"``, ``"2 shards"``: ``n`` and the noun, plural unless ``n == 1``."""
    return f"{n} {noun if n == 1 else plural_form or noun + 's'}"


class UsageError(Exception):
    """Bad command-line input: exit status 2 with one line."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.set_defaults(command_prog=self.prog)     # the innermost (sub)command's parser wins
        # A word starting with "-" and a digit is a value, never a flag (no flag starts with a digit):
        # `--zone-size -64MiB` then reaches the flag's own check ("a size cannot be negative")
        # instead of argparse's "expected one argument" (its default reads only -5 and -1.5 as values).
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message):  # one clear line, status 2 (argparse prints usage + message)
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="retainz", description="Retention-aware checkpoint storage on zoned SSDs.")
    parser.add_argument("--version", action="version", version=f"retainz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``retainz`` command; returns the exit status (the module docstring's convention).

    SIGINT and SIGTERM are handled as :mod:`retainz.cli.interrupt` says while it runs.  Run as the
    command (``argv`` None) it leaves them ignored on return, so a signal between the return and the
    process exit cannot raise; called with ``argv`` (tests, embedding) it restores the caller's handlers."""
    from retainz.cli import interrupt

    previous = interrupt.install()
    stderr = sys.stderr = interrupt.LineTrackingStream(sys.stderr)
    try:
        args, extra = build_parser().parse_known_args(argv)
        if extra:     # argparse names the top command only; name the (sub)command that refused them
            raise UsageError(f"{args.command_prog}: unrecognized arguments: {' '.join(extra)}")
        return int(args.func(args) or 0)
    except UsageError as e:
        print(str(e), file=sys.stderr)
        return 2
    except BrokenPipeError:  # `retainz ... | head`: the reader went away; stay quiet like other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, ValueError) as e:
        print(f"retainz: error: {error_line(e)}", file=sys.stderr)
        return getattr(e, "exit_status", 2)   # bad input is a usage error unless it says otherwise
    except (RetainZError, OSError) as e:
        print(f"retainz: error: {error_line(e)}", file=sys.stderr)
        return 1
    except (MemoryError, OverflowError) as e:  # last resort: a value too large got past validation
        what = "out of memory" if isinstance(e, MemoryError) else f"a number is too large ({e})"
        print(f"retainz: error: {what}: the request is too large for this machine; use smaller values",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        interrupt.ignore()        # a second signal while reporting the first: no traceback
        signum = getattr(e, "signum", signal.SIGINT)
        print(stderr.line_break() + interrupt.message(signum), file=sys.stderr)
        return interrupt.exit_status(signum)
    finally:
        sys.stderr = stderr.stream
        if argv is None:
            interrupt.ignore()    # the command is over: a signal now must not raise past main()
        else:
            interrupt.restore(previous)


if __name__ == "__main__":
    sys.exit(main())
