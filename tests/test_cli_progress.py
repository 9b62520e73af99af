"""Progress bars (issue 27, item 2's last sentence): a terminal gets a tqdm bar for ``put``, ``get``,
``fsck`` and ``crashtest``; piped output and ``--json`` stay quiet (no bar, no carriage returns)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios

from retainz.cli import main
from tests.interrupts import ENV, retainz


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
    code, tty = on_pty(retainz("put", path, "g", f, "--step", 1))
    assert code == 0
    assert "put g" in tty and "%|" in tty and "\r" in tty
    code, tty = on_pty(retainz("get", path, "g", "-o", tmp_path / "out"))
    assert code == 0
    assert "get model.bin" in tty and "%|" in tty
    assert (tmp_path / "out" / "model.bin").read_bytes() == f.read_bytes()
    code, tty = on_pty(retainz("fsck", path))
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
    code, tty = on_pty(retainz("gc", path, "--force"))
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
    code, tty = on_pty(retainz("crashtest", spec, "--workload", "basic", "--max-points", "5"))
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
    from retainz.cli import store as store_cli

    path, f = store(tmp_path)
    assert main(["put", str(path), "g", str(f), "--step", "1"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(store_cli, "OPEN_BAR_DELAY", 0.0)
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
