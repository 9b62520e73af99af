"""Reading and writing trace files (format v1, :mod:`retainz.trace.format`), one validated line at a time.

Reading validates every line against the format *and* the event sequence
(:mod:`retainz.trace.validate`); the first problem raises
:class:`~retainz.trace.format.TraceFormatError` naming the file, the line number and what is wrong.
Unknown versions are refused.  Writing goes through the same validator, so a writer cannot produce a
trace the reader refuses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import BinaryIO, TextIO

from retainz.trace.format import Event, Trace, TraceFormatError, TraceHeader
from retainz.trace.validate import LineProblem, Validator, load_line, parse_event, parse_header

__all__ = ["TraceReader", "TraceWriter", "read_trace", "sha256_file", "write_trace"]


class TraceReader:
    """Stream a trace: the header is read and checked on open; iterating yields validated events.

    Example::

        with TraceReader("run.jsonl") as r:
            print(r.header.retention)
            for ev in r:
                ...
    """

    def __init__(self, source: str | TextIO, *, name: str | None = None):
        if isinstance(source, str):
            # bytes, decoded line by line: a text-mode file decodes ahead in 8 KiB chunks, so a bad
            # byte would be blamed on whichever line was being read when its chunk was decoded
            self._f: TextIO | BinaryIO = open(source, "rb")
            self.path = source
            self._own = True
        else:
            self._f = source
            self.path = name or getattr(source, "name", "<trace>")
            self._own = False
        self.line = 0
        self.validator = Validator()
        first = self._next_line()
        if first is None:
            self._fail(1, "empty trace: no header")
        try:
            self.header = parse_header(load_line(first))
        except LineProblem as e:
            self._fail(1, str(e))

    def _fail(self, line: int, msg: str):
        self.close()
        raise TraceFormatError(self.path, line, msg)

    def _next_line(self) -> str | None:
        try:
            raw = self._f.readline()
            if isinstance(raw, bytes):
                raw = raw.decode("utf-8-sig" if self.line == 0 else "utf-8")   # an editor's BOM is not data
        except UnicodeDecodeError as e:
            self._fail(self.line + 1, f"not a trace: byte 0x{e.object[e.start]:02x} is not UTF-8 text (a binary "
                                      "file? a trace is JSON lines, docs/trace-format.md)")
        if not raw:
            return None
        self.line += 1
        return raw

    def __iter__(self) -> Iterator[Event]:
        while True:
            raw = self._next_line()
            if raw is None:
                return
            if not raw.strip():
                self._fail(self.line, "empty line")
            try:
                ev = parse_event(load_line(raw))
                self.validator.check(ev)
            except LineProblem as e:
                cut = "" if raw.endswith("\n") else " (the file ends mid-line: a truncated trace?)"
                self._fail(self.line, f"{e}{cut}")
            yield ev

    def close(self) -> None:
        if self._own:
            self._f.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_trace(path: str) -> Trace:
    """Read and validate a whole trace.

    Raises:
        TraceFormatError: the first malformed line (file, line number, what is wrong).
        FileNotFoundError: no such file.
    """
    with TraceReader(path) as r:
        return Trace(r.header, list(r))


# -- writing ------------------------------------------------------------------------------------------

class TraceWriter:
    """Write a trace line by line, validating as the reader will.

    Example::

        with TraceWriter("run.jsonl", header) as w:
            w.write(SaveEvent(...))
    """

    def __init__(self, target: str | TextIO, header: TraceHeader):
        if isinstance(target, str):
            self._f: TextIO = open(target, "w", encoding="utf-8")
            self._own = True
            self.path = target
        else:
            self._f = target
            self._own = False
            self.path = getattr(target, "name", "<trace>")
        self.validator = Validator()
        self.line = 1
        self.bytes_written = 0
        self._put(header.to_json())

    def _put(self, obj: dict) -> None:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"
        self._f.write(text)
        self.bytes_written += len(text)

    def write(self, ev: Event) -> None:
        self.line += 1
        try:
            self.validator.check(ev)
        except LineProblem as e:
            raise TraceFormatError(self.path, self.line, str(e)) from None
        self._put(ev.to_json())

    def close(self) -> None:
        if self._own:
            self._f.close()
        else:
            self._f.flush()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_trace(path: str, trace: Trace) -> None:
    """Write a whole trace (validated as it is written)."""
    with TraceWriter(path, trace.header) as w:
        for ev in trace.events:
            w.write(ev)


def sha256_file(path: str) -> str:
    """Hex sha256 of a trace file's bytes: the hash records and mixes name a trace by."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
