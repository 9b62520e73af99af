"""Progress bars (issue 27, item 2's last sentence): a terminal gets a tqdm bar for ``put``, ``get``,
``fsck`` and ``crashtest``; piped output and ``--json`` stay quiet (no bar, no carriage returns).

Issue 44, item 1: a bar appears only once its operation has run ``progress.DELAY`` (0.5 s) and is
removed at the end, interrupted or not; what a command leaves on a real terminal's screen (a
pseudo-terminal read through pyte, a VT100 emulator) is its output and nothing else.  Tests that
need a bar from a quick command run it with the delay set to 0 (:func:`at_once`)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios

import pyte

from retainz.cli import main
from tests.interrupts import ENV, retainz


def at_once(argv) -> list[str]:
    """``argv`` (a :func:`retainz` command line) run with the bar's delay and its least interval
    between redraws set to 0: a quick command draws its bars as a long one does after half a second,
    and redraws at every update (a ``get`` from the page cache may otherwise end within tqdm's 0.1 s
    between two redraws, before any redraw showing MiB moved)."""
    assert argv[1:3] == ["-m", "retainz.cli"]
    code = ("import sys; from retainz.cli import main, progress; progress.DELAY = 0.0; "
            "progress.MININTERVAL = 0.0; sys.exit(main())")
    return [sys.executable, "-c", code, *argv[3:]]


def on_pty(argv) -> tuple[int, str]:
    """Run ``argv`` with stderr on a pseudo-terminal; returns (status, what the terminal received)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a terminal has a size
    p = subprocess.Popen(argv, env={**ENV, "COLUMNS": "100"}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:       # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    os.close(master)
    return p.wait(), out.decode(errors="replace")


def store(tmp_path):
    path = tmp_path / "d.img"
    assert main(["device", "create", str(path), "--zones", "16", "--zone-size", "1MiB"]) == 0
    assert main(["mkfs", str(path)]) == 0
    f = tmp_path / "model.bin"
    f.write_bytes(os.urandom(3 << 20))
    return path, f


def test_a_terminal_gets_a_bar_for_put_and_get(tmp_path):
    path, f = store(tmp_path)
    code, tty = on_pty(at_once(retainz("put", path, "g", f, "--step", 1)))
    assert code == 0
    assert "put g" in tty and "%|" in tty and "\r" in tty
    code, tty = on_pty(at_once(retainz("get", path, "g", "-o", tmp_path / "out")))
    assert code == 0
    assert "get model.bin" in tty and "%|" in tty
    assert (tmp_path / "out" / "model.bin").read_bytes() == f.read_bytes()
    code, tty = on_pty(at_once(retainz("fsck", path)))
    assert code == 0 and "fsck" in tty and "%|" in tty
    code, tty = on_pty(retainz("fsck", path, "--json"))
    assert code == 0 and tty == ""


def test_gc_bar_on_a_terminal_and_none_with_json(tmp_path):
    path, f = store(tmp_path)
    for i in range(3):
        assert main(["put", str(path), f"g{i}", str(f), "--step", str(i)]) == 0
    assert main(["rm", str(path), "g0"]) == 0
    code, tty = on_pty(retainz("gc", path, "--force", "--json"))
    assert code == 0 and tty == ""
    assert main(["rm", str(path), "g1"]) == 0
    code, tty = on_pty(at_once(retainz("gc", path, "--force")))
    assert code == 0 and "gc" in tty and "zone" in tty and "\r" in tty


def test_piped_output_stays_quiet(tmp_path):
    path, f = store(tmp_path)
    p = subprocess.run(retainz("put", path, "g", f, "--step", 1), env=ENV, capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "" and p.stdout == "g: 1 shard, 3 MiB committed at step 1\n"
    out = tmp_path / "out"
    p = subprocess.run(retainz("get", path, "g", "-o", out), env=ENV, capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == f"{out / 'model.bin'}: 3145728 bytes, crc32c verified\n"
    p = subprocess.run(retainz("fsck", path), env=ENV, capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "" and p.stdout.endswith("clean\n")


def test_crashtest_bar_on_a_terminal_and_none_with_json():
    spec = "mem:zones=12,zone_size=64KiB,zone_capacity=48KiB,max_open=3,max_active=4"
    code, tty = on_pty(at_once(retainz("crashtest", spec, "--workload", "basic", "--max-points", "5")))
    assert code == 0 and "crashtest basic" in tty and "point" in tty
    code, tty = on_pty(retainz("crashtest", spec, "--workload", "basic", "--max-points", "5", "--json"))
    assert code == 0 and tty == ""


def test_opening_a_store_reports_replayed_records():
    from retainz.store import Store
    from retainz.store.recovery import PROGRESS_RECORDS
    from retainz.zoned import Geometry, MemoryDevice

    dev = MemoryDevice(Geometry(nr_zones=16, zone_size=64 << 20, zone_capacity=64 << 20))
    s = Store.format(dev)
    for i in range(5000):
        w = s.begin_generation(f"g{i}", i)
        w.write_shard("a", [b"x"])
        w.commit()
    s.close()
    calls = []
    s = Store.open(dev, progress=lambda done, total: calls.append((done, total)))
    n = s.recovery.records
    s.close()
    assert n > 5000
    assert calls == [(i, n) for i in range(0, n, PROGRESS_RECORDS)] + [(n, n)]


def test_open_bar_drawn_on_a_terminal_and_not_with_json(tmp_path, monkeypatch, capsys):
    from retainz.cli import progress as progress_mod

    path, f = store(tmp_path)
    assert main(["put", str(path), "g", str(f), "--step", "1"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(progress_mod, "DELAY", 0.0)
    monkeypatch.setattr(progress_mod.sys.stderr, "isatty", lambda: True, raising=False)
    assert main(["ls", str(path)]) == 0
    err = capsys.readouterr().err
    assert "open" in err and "record" in err
    assert main(["ls", str(path), "--json"]) == 0
    assert "record" not in capsys.readouterr().err


def test_run_draws_its_bar_on_a_terminal_only(tmp_path):
    """``retainz run``'s case bar follows the same rule as every command (``progress.enabled``): a
    terminal on stderr gets it, stderr redirected to a file gets the summary lines and no bar frames
    (it drew them whenever ``--no-progress`` was not given: a fresh-user trial's log was full of them)."""
    import json

    manifest = tmp_path / "tiny.json"
    manifest.write_text(json.dumps({
        "manifest": "tiny", "format": 1,
        "defaults": {"layout": "smollm2-135m-dcp", "rule": "torchtitan:interval=500,keep_latest_k=3", "steps": 2000,
                     "zone_size": "256MiB", "zone_capacity": "256MiB", "max_active": 8, "max_open": 8,
                     "reserve_zones": 2, "pressure": 0.9},
        "blocks": [{"experiment": "pressure", "axes": {"policy": ["retainz", "greedy"]}}]}))
    code, tty = on_pty(retainz("run", manifest, "-o", tmp_path / "a", "-j", "1"))
    assert code == 0 and "cases: 2/2 |" in tty and "\r" in tty
    with open(tmp_path / "log", "w") as log:
        p = subprocess.run(retainz("run", manifest, "-o", tmp_path / "b", "-j", "1"), env=ENV, stdout=log,
                           stderr=subprocess.STDOUT)
    text = (tmp_path / "log").read_text()
    assert p.returncode == 0 and "\r" not in text and "|" not in text and "2 ok" in text, text


def screen(raw: bytes, newline_is_crlf: bool = False) -> list[str]:
    """The lines a 200x24 terminal shows after receiving ``raw`` (trailing blanks dropped); a pipe's
    output is given ``newline_is_crlf`` (a terminal's line discipline turns ``\\n`` into ``\\r\\n``)."""
    s = pyte.Screen(200, 24)
    pyte.ByteStream(s).feed(raw.replace(b"\n", b"\r\n") if newline_is_crlf else raw)
    lines = [line.rstrip() for line in s.display]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def on_terminal(argv, *, interrupt_on: bytes | None = None) -> tuple[int, bytes]:
    """Run ``argv`` with stdout and stderr on one pseudo-terminal, as in a user's shell; returns
    (status, the bytes the terminal received).  ``interrupt_on``: once those bytes have arrived
    (a bar drawn), stop the process, send it SIGINT, and let it go on (Ctrl-C mid-operation; the
    stop makes sure the operation is still running when the signal lands)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    p = subprocess.Popen(argv, env={**ENV, "COLUMNS": "200"}, stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    out = b""
    while True:
        if interrupt_on is not None and interrupt_on in out:
            p.send_signal(signal.SIGSTOP)
            p.send_signal(signal.SIGINT)
            p.send_signal(signal.SIGCONT)
            interrupt_on = None
        select.select([master], [], [], 60)
        try:
            data = os.read(master, 65536)
        except OSError:       # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    os.close(master)
    return p.wait(), out


def piped(argv) -> list[str]:
    """What ``argv`` shows on a terminal when its output goes through a pipe (no bar can be drawn)."""
    p = subprocess.run(argv, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return screen(p.stdout, newline_is_crlf=True)


def session(tmp_path) -> list[list]:
    """A store's life on the command line: every store command once."""
    path, f = store(tmp_path)
    return [["put", path, "g", f, "--step", 1], ["put", path, "h", f, "--step", 2, "--reclaim-step", 3],
            ["ls", path, "-l"], ["get", path, "g", "-o", tmp_path / "out"], ["df", path], ["rm", path, "g"],
            ["gc", path, "--force"], ["fsck", path]]


def test_a_quick_command_leaves_only_its_output_on_the_screen(tmp_path):
    """Every store command opens the store (a journal replay of a few records, in milliseconds): no
    ``open: 100%|...|`` bar is drawn, so the terminal shows exactly what a pipe carries (issue 44.1:
    the open bar was drawn at once, never cleared, and ``gc``'s summary came out inside it)."""
    for cmd in session(tmp_path):
        code, raw = on_terminal(retainz(*cmd))
        assert code == 0, raw
        assert b"%|" not in raw and b"\r" not in raw.replace(b"\r\n", b""), (cmd[0], raw)
        if cmd[0] in ("ls", "df", "fsck"):       # read-only: the same command again, piped
            assert screen(raw) == piped(retainz(*cmd)), cmd[0]


def test_a_drawn_bar_is_removed_when_the_command_ends(tmp_path):
    """With every bar drawn (delay 0), each command's screen afterwards is its output alone, the
    same lines a pipe carries: the open bar, put's, get's, gc's and fsck's bars are all erased."""
    out = tmp_path / "out-tty"
    said = {"put": ["g: 1 shard, 3 MiB committed at step 1"], "get": [f"{out / 'model.bin'}: 3145728 bytes, crc32c verified"],
            "rm": ["g: deleted"], "gc": ["GC: 0 zones collected [], 0 extents (0 B) moved, 0 zones reset"]}
    for cmd in session(tmp_path):
        if cmd[0] == "get":
            cmd[-1] = out
        if cmd[0] == "put" and cmd[2] == "h":
            continue
        code, raw = on_terminal(at_once(retainz(*cmd)))
        assert code == 0, raw
        assert b"\ropen: " in raw, (cmd[0], raw)       # the open bar was drawn
        assert screen(raw) == (said.get(cmd[0]) or piped(retainz(*cmd))), cmd[0]
    assert (out / "model.bin").read_bytes() == (tmp_path / "model.bin").read_bytes()


def test_an_interrupted_put_or_get_leaves_only_the_interrupt_line(tmp_path):
    """Ctrl-C while put's or get's bar is on the screen (at a redraw showing MiB moved): the bar is
    erased and the screen holds the one line ``retainz: interrupted`` (no bar above it, no empty line)."""
    path = tmp_path / "d.img"
    assert main(["device", "create", str(path), "--zones", "12", "--zone-size", "64MiB"]) == 0
    assert main(["mkfs", str(path)]) == 0
    f = tmp_path / "model.bin"
    f.write_bytes(os.urandom(1 << 20) * 256)
    code, raw = on_terminal(at_once(retainz("put", path, "g", f, "--step", 1)), interrupt_on=b"M/256M")
    assert code == 130 and b"put g:" in raw
    assert screen(raw) == ["retainz: interrupted"]
    assert main(["put", str(path), "g", str(f), "--step", "1"]) == 0
    code, raw = on_terminal(at_once(retainz("get", path, "g", "-o", tmp_path / "out")), interrupt_on=b"M/256M")
    assert code == 130 and b"get model.bin:" in raw
    assert screen(raw) == ["retainz: interrupted"], raw[-300:]
    assert not (tmp_path / "out" / "model.bin").exists()


def test_a_bar_a_signal_caught_mid_draw_is_erased(monkeypatch):
    """tqdm records a draw (``last_print_t``) after making it; a signal in between (``get`` stops
    wherever it lands) made tqdm's close think the bar was never shown and leave it on the screen."""
    import io

    from retainz.cli import progress as progress_mod
    from retainz.cli.interrupt import Interrupted

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    monkeypatch.setattr(progress_mod.sys, "stderr", tty)
    b = progress_mod.bar(100, "get model.bin")
    b.start_t -= 1.0                  # the operation has run past the delay
    b.last_print_t -= 1.0
    drawn = b.refresh

    def refresh_then_signal(*args, **kwargs):
        drawn(*args, **kwargs)
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(b, "refresh", refresh_then_signal)
    try:
        with b:
            b.update(10)
    except Interrupted:
        pass
    raw = tty.getvalue().encode()
    assert b"get model.bin:  10%" in raw
    assert screen(raw) == []


def test_mkfs_reports_its_meta_zones_and_draws_its_bar_on_a_terminal_only(tmp_path):
    """Issue 44.2: mkfs of the largest device takes seconds (every zone-state change writes the
    whole zone state): ``Store.format`` reports each meta zone written, and the CLI draws a bar on
    a terminal that is gone when the command ends; piped, mkfs prints only its lines."""
    from retainz.store import Store
    from retainz.zoned import FileDevice, Geometry

    seen = []
    path = tmp_path / "api.img"
    with FileDevice.create(path, Geometry(nr_zones=64, zone_size=1 << 20, zone_capacity=1 << 20)) as dev:
        Store.format(dev, meta_zones=5, progress=lambda done, total: seen.append((done, total))).close()
    assert seen == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    path = tmp_path / "d.img"
    assert main(["device", "create", str(path), "--zones", "16", "--zone-size", "1MiB"]) == 0
    code, raw = on_terminal(at_once(retainz("mkfs", path)))
    assert code == 0, raw
    assert b"\rmkfs: " in raw and b"zone" in raw, raw             # the bar was drawn
    lines = screen(raw)
    assert lines[0].startswith(f"{path}: RetainZ store ") and "%|" not in "".join(lines), lines
    assert main(["device", "create", str(path), "--zones", "16", "--zone-size", "1MiB", "--force"]) == 0
    p = subprocess.run(retainz("mkfs", path), env=ENV, capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "" and p.stdout.startswith(f"{path}: RetainZ store "), p
