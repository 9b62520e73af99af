"""Claims on zoned block devices (docs/node.md, "Who writes where"): several client processes write
their bytes straight to a real zoned block device through one node service, each zone in write-pointer
order (:mod:`retainz.zoned.claims`), and a client killed mid-claim leaves a lease the service fills.

The ``linux:`` cases run in the QEMU guest lane (tests/vm/test_zns_guest.py: QEMU's NVMe ZNS namespace and
null_blk zoned); the host runs the turn-taking rules against a model write pointer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from retainz.errors import ZoneInvalidWriteError
from retainz.zoned.claims import ZoneClaims
from tests.conftest import DEVICE_KINDS, make_device

ROOT = Path(__file__).resolve().parents[2]
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
                OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")


@pytest.mark.parametrize("policy", ["retainz", "greedy"])
@pytest.mark.parametrize("kind", REAL)
def test_clients_write_a_zoned_block_device_at_once_and_one_killed_mid_claim_leaves_a_filled_lease(
        kind, policy, tmp_path, monkeypatch):
    """Two client processes write a real zoned block device at once through a node service and commit
    a generation each (under greedy their claims share zones: it fills one zone at a time, and the
    device takes only write-pointer order; under retainz, the default, each job's generations get
    zones of their own, within the device's open and active limits: null_blk's max_open 3 <
    max_active 4 once refused such writes with ETOOMANYREFS, issue 40); a third claims 64 KiB, writes 16 KiB and stalls;
    the two start their second generations (their claims queue behind the lease) and the staller is
    SIGKILLed: the service fills its lease, the two go on.  Every commit reads back byte for byte,
    fsck is clean after a fresh open, the live bytes are exactly the committed extents, and a lease in
    a zone that kept live data holds the killed client's 16 KiB and then zeros.  All processes start
    at once (each waits for the socket and its cue), to keep the guest's time small."""
    from retainz.store import Store
    from retainz.zoned import open_device
    from tests.workers.node_zbd_client import shards

    path = kind.split(":", 1)[1]
    dev = make_device(kind, tmp_path)
    Store.format(dev, policy=policy).close()
    dev.close()
    monkeypatch.setenv("RETAINZ_RUN_DIR", str(tmp_path))
    env = _env(tmp_path)
    log = tmp_path / "serve.log"
    start, go = str(tmp_path / "start"), str(tmp_path / "go")
    svc = subprocess.Popen([sys.executable, "-m", "retainz.cli", "serve", path], env=env,
                           stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    procs = []
    try:
        def spawn(*args):
            p = subprocess.Popen([sys.executable, WORKER, *args], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            procs.append(p)
            return p

        writers = [spawn("write", path, f"j{i}", go) for i in range(2)]
        staller = spawn("stall", path, "dead", str(64 << 10), str(16 << 10), start)

        def line_of(p) -> str:
            line = p.stdout.readline()
            assert line, (p.wait(60), p.stderr.read()[-3000:], log.read_text()[-2000:])
            return line.strip()

        committed = [line_of(p).split()[1] for p in writers]       # each writer's first generation
        Path(start).touch()
        line = line_of(staller)
        zone, off, length, part = map(int, line.split()[1:])
        Path(go).touch()
        assert [line_of(p) for p in writers] == ["go", "go"]
        staller.send_signal(signal.SIGKILL)
        staller.wait(30)
        for p in writers:
            try:
                out, err = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:      # a hang: every process's threads, then fail
                for q in (p, svc):
                    q.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER=1: the tracebacks go to stderr
                    q.wait(30)
                pytest.fail(f"a writer hung; its stderr:\n{p.stderr.read()[-6000:]}\nservice log:\n"
                            f"{log.read_text()[-6000:]}")
            assert p.returncode == 0, err[-3000:]
            committed += [x.split()[1] for x in out.splitlines() if x.startswith("committed")]
        assert len(committed) == 4
        svc.send_signal(signal.SIGTERM)
        assert svc.wait(60) == 0, log.read_text()[-3000:]
        raw = open_device(path)
        try:
            store = Store.open(raw)
            try:
                g = raw.geometry         # a Linux zoned device: no more data zones active than can be open
                assert store.zones.max_active == min(g.max_open, g.max_active) - 1 == store.table.max_active
                gens = store.generations()
                assert sorted(g.id for g in gens) == sorted(committed)
                for gen in committed:
                    for name, data in shards(gen).items():
                        assert b"".join(store.read_shard(gen, name)) == data, (gen, name)
                rep = store.fsck()
                assert rep.ok, rep.problems
                bs = raw.geometry.block_size
                ext = [(g.id, e) for g in gens for s in g.shards.values() for e in s.extents]
                assert store.table.live == sum(-(-e[2] // bs) * bs for _, e in ext)
                jobs: dict[int, set] = {}
                for gid, e in ext:
                    jobs.setdefault(e[0], set()).add(gid.split("%2F")[0])
                if policy == "greedy":
                    assert any(len(j) == 2 for j in jobs.values()), jobs   # the two writers shared a zone
                kept = any(e[0] == zone and e[1] < off and gid.endswith("g0") for gid, e in ext)
            finally:
                store.close()
            assert raw.zone(zone).written >= off + length
            if kept:       # the zone was never reset: the lease shows the killed client's bytes, then zeros
                got = raw.read(zone * raw.geometry.zone_size + off, length)
                assert got[:part] == b"\x5a" * part and got[part:] == bytes(length - part)
        finally:
            raw.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if svc.poll() is None:
            svc.kill()
            svc.wait()


def test_a_fill_the_device_refuses_breaks_the_zone_and_its_waiters_fail_instead_of_waiting_forever():
    """A lease its writer left is filled with zeros; when the device refuses that fill (here with the
    ETOOMANYREFS null_blk gave), the writers queued behind it in the zone get an error at once rather
    than waiting for a turn that can never come, and a reset of the zone ends it."""
    import errno

    dev = _Zones()

    def refuse(z, pos, n):
        raise OSError(errno.ETOOMANYREFS, "Too many references: cannot splice")

    c = ZoneClaims(1 << 20, dev.written, refuse)
    c.lease(0, 0, 16384, wp=0)                          # the client that dies
    c.lease(0, 16384, 8192, wp=0)                       # a client queued behind it
    got = []

    def behind():
        try:
            c.wait_turn([(0, 16384, 8192)])             # no timeout: before, this waited forever
        except ZoneInvalidWriteError as e:
            got.append(str(e))

    t = threading.Thread(target=behind)
    t.start()
    with pytest.raises(OSError, match="Too many references"):
        c.fill([(0, 0, 16384)])
    t.join(10)
    assert not t.is_alive() and len(got) == 1
    assert "could not be filled (OSError: [Errno 109] Too many references" in got[0]
    with pytest.raises(ZoneInvalidWriteError, match="could not be filled"):
        c.wait_settled(0, timeout=0)                    # the device's own write there fails too
    c.reset(0)                                          # a reset ends the broken leases
    c.wait_settled(0, timeout=0)
    c.lease(0, 0, 4096, wp=0)
    c.wait_turn([(0, 0, 4096)], timeout=0)
