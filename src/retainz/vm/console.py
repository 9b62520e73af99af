"""The guest console as plain text: terminal control sequences stripped before they reach stdout.

The guest's serial console carries what a terminal would act on: the kernel's and busybox's terminal
reset (``ESC c``), clear screen (``ESC [2J``), cursor moves and colours (ECMA-48 CSI sequences
``ESC [ params final``), operating-system commands (``ESC ] ... BEL``), and ``CR LF`` line ends.
Streamed as they are, they reset or clear the user's terminal and garble a captured log.
:class:`ConsoleFilter` removes them (ECMA-48 section 5: C0 controls, ``ESC Fe/Fp/Fs`` escapes, CSI,
OSC and DCS strings), keeps ``TAB``, ``LF`` and text, and turns ``CR LF`` into ``LF``; a reset or a
clear screen becomes a line end where the text before it had not ended its line.  It keeps state
across chunks, so a sequence split between two reads is removed whole.  The console log file
(``<out>/.retainz-guest/console.log``) keeps the raw bytes.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from typing import BinaryIO

__all__ = ["ConsoleFilter", "strip_control", "pump"]

_ESC = b"\x1b"
#: Complete control sequences (bytes): CSI, OSC / DCS / SOS / PM / APC strings, other ESC escapes,
#: and the C0 controls other than TAB, LF, CR (and ESC, which starts the others), plus DEL.
_SEQUENCE = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]"                     # CSI: ESC [ parameters intermediates final
    rb"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)"   # OSC, DCS, SOS, PM, APC: ... BEL or ST
    rb"|\x1b[ -/]*[0-OQ-WYZ\\`-~]"                  # ESC c (reset), ESC 7, ESC ( B ...
    rb"|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]"  # other C0 controls and DEL
)
#: Terminal reset (``ESC c``) and erase in display (``ESC [ n J``): a new screen, so a line break.
_SCREEN = re.compile(rb"\x1bc|\x1b\[[0-9;]*J")
#: Stands for a screen break between the two passes (a NUL never survives the first).
_BREAK = b"\x00"


def _replacement(m: re.Match) -> bytes:
    return _BREAK if _SCREEN.fullmatch(m.group()) else b""


#: The start of a sequence that the next chunk may complete.
_OPEN = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*|[\]PX^_][^\x07\x1b]*\x1b?|[ -/]*)\Z")
#: A string sequence still open after this many bytes is not one: its ESC is dropped, the text kept.
_MAX_PENDING = 4096


class ConsoleFilter:
    """Strips terminal control sequences from a byte stream fed in chunks.

    ``feed(chunk)`` returns the text that is complete so far; ``close()`` returns what was held back
    (an unfinished sequence at the very end is dropped).
    """

    def __init__(self) -> None:
        self._held = b""
        self._at_line_start = True

    def feed(self, chunk: bytes) -> bytes:
        data = _SEQUENCE.sub(_replacement, self._held + chunk)
        self._held = b""
        m = _OPEN.search(data, max(0, len(data) - _MAX_PENDING))
        if m:                                          # a sequence the read split: keep it for later
            data, self._held = data[:m.start()], data[m.start():]
        elif data.endswith(b"\r"):                     # maybe the CR of a CR LF split by the read
            data, self._held = data[:-1], b"\r"
        return self._breaks(data.replace(_ESC, b"").replace(b"\r\n", b"\n"))

    def _breaks(self, data: bytes) -> bytes:
        """Each run of screen breaks becomes one line end, unless the text already ends a line."""
        out = []
        start = 0
        for m in re.finditer(_BREAK + b"+", data):
            out.append(data[start:m.start()])
            before = data[m.start() - 1:m.start()] if m.start() else (b"" if self._at_line_start else b"x")
            if before not in (b"", b"\n"):
                out.append(b"\n")
            start = m.end()
        out.append(data[start:])
        text = b"".join(out)
        if text:
            self._at_line_start = text.endswith(b"\n")
        return text

    def close(self) -> bytes:
        rest = self._held
        self._held = b""
        if rest.startswith(_ESC):
            return b""
        return rest


def strip_control(data: bytes) -> bytes:
    """``data`` without terminal control sequences (see :class:`ConsoleFilter`)."""
    f = ConsoleFilter()
    return f.feed(data) + f.close()


def pump(src: BinaryIO, dst: BinaryIO | None = None) -> threading.Thread:
    """Start a daemon thread copying ``src`` (a pipe) to ``dst`` (default: this process's stdout)
    through a :class:`ConsoleFilter` until end of file; join it after the writer exits."""

    def run() -> None:
        out = dst if dst is not None else getattr(sys.stdout, "buffer", None)
        f = ConsoleFilter()
        fd = src.fileno()
        while True:
            chunk = os.read(fd, 65536)
            text = f.feed(chunk) if chunk else f.close()
            if text:
                if out is not None:
                    out.write(text)
                    out.flush()
                else:   # a text-only stdout (captured output)
                    sys.stdout.write(text.decode("utf-8", "replace"))
                    sys.stdout.flush()
            if not chunk:
                return

    t = threading.Thread(target=run, name="guest-console", daemon=True)
    t.start()
    return t
