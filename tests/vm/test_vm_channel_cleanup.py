"""The channel's socket folders and shared-memory windows that a killed ``retainz vm serve`` left
behind are removed by the next serving process; those of running processes are kept."""

from __future__ import annotations

import os
import subprocess
import sys

from retainz.vm.channel import CHANNEL_PREFIX, WINDOW_PREFIX, remove_stale_channels


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid       # reaped: no process has it (pids are not reused this fast)


def test_leftovers_of_dead_processes_go_and_the_rest_stays(tmp_path):
    tmp, shm = tmp_path / "tmp", tmp_path / "shm"
    tmp.mkdir()
    shm.mkdir()
    dead, alive = dead_pid(), os.getpid()
    stale_dir = tmp / f"{CHANNEL_PREFIX}{dead}-abc123"
    stale_dir.mkdir()
    (stale_dir / "port.sock").write_text("")
    stale_window = shm / f"{WINDOW_PREFIX}{dead}-xyz"
    stale_window.write_bytes(bytes(4096))
    kept = [tmp / f"{CHANNEL_PREFIX}{alive}-def", shm / f"{WINDOW_PREFIX}{alive}-uvw",
            shm / f"{WINDOW_PREFIX}abcdef",              # an older name without a pid: not ours to judge
            shm / f"other-{dead}-file", tmp / f"{WINDOW_PREFIX}{dead}-x"]   # wrong folder for its kind
    kept[0].mkdir()
    for p in kept[1:]:
        p.write_bytes(b"x")
    removed = remove_stale_channels(str(tmp), str(shm))
    assert sorted(removed) == sorted([str(stale_dir), str(stale_window)])
    assert not stale_dir.exists() and not stale_window.exists()
    assert all(p.exists() for p in kept)
    assert remove_stale_channels(str(tmp), str(shm)) == []         # nothing left to remove
    assert remove_stale_channels(str(tmp_path / "missing"), str(shm)) == []   # a missing folder is no error
