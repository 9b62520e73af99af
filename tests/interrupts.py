"""Helpers for interrupt tests: run a real process and signal it once it has moved N bytes.

Progress is read from ``/proc/PID/io`` (``wchar``: bytes the process passed to write calls,
``rchar``: bytes it read), not from the clock, so each point lands at a known amount of work however
loaded the machine is.  A point can overshoot by what the process moves between two polls; a process
that finishes first is a valid outcome (the "complete" case) and is reported as not signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def default_sigint() -> None:
    """``preexec_fn`` for a child a test will Ctrl-C: restore SIGINT's default disposition.

    A test run from a background job (``cmd &`` in a script, nohup) ignores SIGINT and every child
    inherits that; Python then installs no KeyboardInterrupt handler and dd never sees the signal,
    so the interrupt under test would silently not happen."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Outcome:
    """What one signalled run did: ``signalled`` False when it ended before the point."""
    returncode: int
    stdout: bytes
    stderr: str
    signalled: bool


def proc_io(pid: int) -> dict[str, int] | None:
    """``/proc/PID/io`` as a dict (None once the process is gone)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return {k: int(v) for k, v in (line.split(": ") for line in f)}
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def holds(pid: int, path: str | os.PathLike) -> bool:
    """True when process ``pid`` has ``path`` open."""
    want = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError):
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == want:
                return True
        except OSError:
            pass
    return False


def signal_after(argv: list[str], sig: int, nbytes: int, *, opened: str | os.PathLike,
                 counter: str = "wchar", cwd=None, times: int = 1) -> Outcome:
    """Run ``argv``; once it holds ``opened`` open and then has moved ``nbytes`` more bytes (``counter``
    of ``/proc/PID/io``), send ``sig`` (``times`` times in a row); wait for it to end."""
    p = subprocess.Popen(argv, env=ENV, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=default_sigint)
    signalled = False
    base = None
    while p.poll() is None:
        if base is None:
            if holds(p.pid, opened):
                io = proc_io(p.pid)
                base = io[counter] if io else None
            time.sleep(0.0002)   # a poll interval, not a timed assertion
            continue
        io = proc_io(p.pid)
        if io is not None and io[counter] - base >= nbytes:
            for _ in range(times):
                try:
                    p.send_signal(sig)
                    signalled = True
                except ProcessLookupError:
                    pass
            break
        time.sleep(0.0002)
    out, err = p.communicate(timeout=600)
    return Outcome(p.returncode, out, err.decode(errors="replace"), signalled)


def retainz(*args) -> list[str]:
    """The argv running the ``retainz`` command in a fresh interpreter."""
    return [sys.executable, "-m", "retainz.cli", *map(str, args)]


SIGNALS = [(signal.SIGINT, 130, "retainz: interrupted"), (signal.SIGTERM, 143, "retainz: terminated")]
