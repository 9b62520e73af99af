"""Claims on zoned block devices (docs/node.md, "Who writes where"): several client processes write
their bytes straight to a real zoned block device through one node service, each zone in write-pointer
order (:mod:`retainz.zoned.claims`), and a client killed mid-claim leaves a lease the service fills.

The ``linux:`` cases run in the QEMU guest lane (tests/test_zns_guest.py: QEMU's NVMe ZNS namespace and
null_blk zoned); the host runs the turn-taking rules against a model write pointer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from retainz.errors import ZoneInvalidWriteError
from retainz.zoned.claims import ZoneClaims
from tests.conftest import DEVICE_KINDS, make_device

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(ROOT / "tests" / "workers" / "node_zbd_client.py")
REAL = [k for k in DEVICE_KINDS if k.startswith("linux:")]


# -- the turn-taking rules, against a model write pointer (host) ----------------------------------------
class _Zones:
    """Write pointers of a pretend device: ``write`` lands only at the write pointer, as a zone does."""

    def __init__(self):
        self.wp: dict[int, int] = {}
        self.filled: list = []

    def written(self, z: int) -> int:
        return self.wp.get(z, 0)

    def write(self, z: int, pos: int, n: int) -> None:
        if pos != self.written(z):
            raise ZoneInvalidWriteError(f"zone {z}: write at {pos}, write pointer {self.written(z)}")
        self.wp[z] = pos + n

    def fill(self, z: int, pos: int, n: int) -> None:
        self.filled.append((z, pos, n))
        self.write(z, pos, n)


def test_leases_tile_a_zone_and_each_waits_for_its_turn():
    dev = _Zones()
    c = ZoneClaims(1 << 20, dev.written, dev.fill)
    c.lease(3, 0, 8192, wp=0)
    c.lease(3, 8192, 4096, wp=0)
    with pytest.raises(ZoneInvalidWriteError, match="claim pointer is at byte 12288"):
        c.lease(3, 4096, 4096, wp=0)
    assert c.pointer(3) == 12288 and c.pointer(4) is None
    c.wait_turn([(3, 0, 8192)], timeout=0)              # the first lease: its turn at once
    with pytest.raises(ZoneInvalidWriteError, match="waiting for its turn"):
        c.wait_turn([(3, 8192, 4096)], timeout=0)       # the second waits for the first
    done = threading.Event()

    def second():
        c.wait_turn([(3, 8192, 4096)])
        dev.write(3, 8192, 4096)                        # lands: the first was written before
        done.set()

    t = threading.Thread(target=second)
    t.start()
    assert not done.wait(0.05)
    assert c.settle([(3, 0, 8192)]) == [(3, 0, 8192)]   # reported written, but the device says no
    dev.write(3, 0, 8192)
    assert c.settle([(3, 0, 8192)]) == []
    t.join(30)
    assert done.is_set() and c.settle([(3, 8192, 4096)]) == [] and c.pointer(3) is None
    assert not c.outstanding(3)


def test_a_lease_its_writer_left_half_written_is_filled_in_its_turn_and_the_next_writer_goes_on():
    dev = _Zones()
    c = ZoneClaims(1 << 20, dev.written, dev.fill)
    c.lease(0, 0, 16384, wp=0)                          # a client that will die after 4 KiB
    c.lease(0, 16384, 8192, wp=0)                       # another client behind it
    dev.write(0, 0, 4096)
    assert c.fill([(0, 0, 16384)]) == 12288 and dev.filled == [(0, 4096, 12288)]
    c.wait_turn([(0, 16384, 8192)], timeout=0)
    dev.write(0, 16384, 8192)
    assert c.settle([(0, 16384, 8192)]) == [] and not c.outstanding(0)
    # a reset zone drops its leases; filling one of them then writes nothing
    c.lease(1, 0, 4096, wp=0)
    c.reset(1)
    assert c.fill([(1, 0, 4096)]) == 0 and not c.outstanding(1)
    # the device's own writes wait for the zone's leases, and say so when they never end
    c.lease(2, 0, 4096, wp=0)
    with pytest.raises(ZoneInvalidWriteError, match="the device's own write or zone operation"):
        c.wait_settled(2, timeout=0)
    dev.write(2, 0, 4096)
    c.wait_settled(2, timeout=0)


# -- real zoned block devices (the QEMU guest lane) -------------------------------------------------------
def _env(run_dir: Path) -> dict:
    return dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", RETAINZ_RUN_DIR=str(run_dir),
                OMP_NUM_THREADS="1")


def _serve(path: str, env: dict, log: Path) -> subprocess.Popen:
    from retainz.node import NodeStore

    proc = subprocess.Popen([sys.executable, "-m", "retainz.cli", "serve", path], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            os.environ["RETAINZ_RUN_DIR"] = env["RETAINZ_RUN_DIR"]
            NodeStore.connect(path).close()
            return proc
        except (FileNotFoundError, ConnectionRefusedError):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)


@pytest.mark.parametrize("kind", REAL)
def test_clients_write_a_zoned_block_device_at_once_and_one_killed_mid_claim_leaves_a_filled_lease(
        kind, tmp_path, monkeypatch):
    """Three client processes write through one service to a real zoned block device at once (their
    claims share zones: the greedy policy fills one zone at a time), then a client claims an extent,
    writes a quarter of it and is SIGKILLed while a fourth client claims the place after it in the same
    zone, which it can write only once the lease is: the service fills the lease, the fourth goes on.  Every commit reads back byte for byte from
    a fresh process, fsck is clean, and the live bytes are exactly the committed extents."""
    from retainz.node import NodeStore
    from retainz.store import Store
    from retainz.zoned import open_device
    from tests.workers.node_zbd_client import shards

    path = kind.split(":", 1)[1]
    dev = make_device(kind, tmp_path)
    Store.format(dev).close()
    dev.close()
    monkeypatch.setenv("RETAINZ_RUN_DIR", str(tmp_path))
    env = _env(tmp_path)
    log = tmp_path / "serve.log"
    svc = _serve(path, env, log)
    try:
        writers = [subprocess.Popen([sys.executable, WORKER, "write", path, f"j{i}", "2"], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
        outs = [p.communicate(timeout=300) for p in writers]
        for p, (_out, err) in zip(writers, outs, strict=True):
            assert p.returncode == 0, err[-3000:]
        committed = [line.split()[1] for out, _ in outs for line in out.splitlines() if line.startswith("committed")]
        assert len(committed) == 6
        # a client dies mid-claim: 64 KiB claimed, 16 KiB written
        staller = subprocess.Popen([sys.executable, WORKER, "stall", path, "dead", str(64 << 10), str(16 << 10)],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = staller.stdout.readline()
        assert line.startswith("stalled"), staller.stderr.read()[-3000:]
        zone, off, length = map(int, line.split()[1:])
        assert length == 64 << 10
        after = subprocess.Popen([sys.executable, WORKER, "write", path, "late", "1"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        staller.send_signal(signal.SIGKILL)
        staller.wait(30)
        out, err = after.communicate(timeout=300)
        assert after.returncode == 0, err[-3000:]
        committed += [line.split()[1] for line in out.splitlines() if line.startswith("committed")]
        with NodeStore.connect(path, job="*") as c:
            assert sorted(g.id for g in c.generations()) == sorted(committed)
            for gen in committed:
                for name, data in shards(gen).items():
                    assert b"".join(c.read_shard(gen, name)) == data, (gen, name)
            rep = c.fsck()
            assert rep.ok, rep.problems
            first = c._locations(committed[-1], "a")[2][0]
            if off + length < c.device.geometry.zone_capacity:   # the late client's place: right after the lease
                assert first[:2] == (zone, off + length)
        svc.send_signal(signal.SIGTERM)
        assert svc.wait(60) == 0, log.read_text()[-3000:]
        raw = open_device(path)
        try:
            # the killed client's lease: its 16 KiB, then the service's zeros to the lease's end
            got = raw.read(zone * raw.geometry.zone_size + off, length)
            assert got[:16 << 10] == b"\x5a" * (16 << 10) and got[16 << 10:] == bytes(length - (16 << 10))
            assert raw.zone(zone).written >= off + length
            store = Store.open(raw)
            try:
                assert store.fsck().ok
                live = sum(round_up_extent(e[2], raw.geometry.block_size)
                           for g in store.generations() for s in g.shards.values() for e in s.extents)
                assert store.table.live == live
                assert sorted(g.id for g in store.generations()) == sorted(committed)
            finally:
                store.close()
        finally:
            raw.close()
    finally:
        if svc.poll() is None:
            svc.kill()
            svc.wait()


def round_up_extent(n: int, bs: int) -> int:
    return -(-n // bs) * bs
