"""The node service (retainz.node, docs/node.md): one service owns a device file, many client processes
write their bytes to it directly and commit through the service.

Campaign counts (rounds, kills, acknowledged commits, losses) are printed with ``-s``."""

from __future__ import annotations

import os
import random
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from retainz.errors import (
    DeviceBusyError,
    GenerationExistsError,
    ProtocolError,
    ServiceGoneError,
    ZoneOpNotSupportedError,
)
from retainz.node import NodeStore, Service, socket_path
from retainz.node.protocol import MAX_REQUEST, recv_frame, send_frame
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice
from retainz.zoned.model import round_up
from tests.workers.node_client import content, sizes

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1")
WORKER = str(ROOT / "tests" / "workers" / "node_client.py")
#: The kill campaigns' size: kills per campaign (service kills at random moments, service kills at
#: commit points; client rounds of 3 clients are a third of it).  CI size by default; a soak sets it higher.
KILLS = int(os.environ.get("RETAINZ_NODE_KILLS", "") or 0) or None
GEOMETRY = Geometry(nr_zones=256, zone_size=8 << 20, zone_capacity=8 << 20)   # 2 GiB, sparse: the campaigns never delete


def make_device(tmp_path: Path, geometry: Geometry = GEOMETRY) -> str:
    path = str(tmp_path / "dev.img")
    dev = FileDevice.create(path, geometry)
    Store.format(dev).close()
    dev.close()
    return path


def start_service(device: str, log: Path) -> subprocess.Popen:
    """``retainz serve DEVICE`` in a process; returns once a client can say hello."""
    proc = subprocess.Popen([sys.executable, "-m", "retainz.cli", "serve", device], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            NodeStore.connect(device).close()
            return proc
        except (ConnectionRefusedError, FileNotFoundError):
            time.sleep(0.05)


def stop_service(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def start_client(device: str, log: Path, job: str, n: int, seed: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, device, str(log), job, str(n), str(seed)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def acknowledged(log: Path) -> tuple[set[str], set[str]]:
    """(generations whose commit was acknowledged, generations begun but not acknowledged)."""
    begun, done = set(), set()
    if log.exists():
        for line in log.read_text().splitlines():
            kind, _, gen = line.partition(" ")
            (done if kind == "committed" else begun).add(gen)
    return done, begun - done


def verify(store, must: set[str], may: set[str]) -> set[str]:
    """Every generation in ``must`` is committed with every byte right; anything else committed is in
    ``may`` and intact too.  Returns the committed ids."""
    ids = {g.id for g in store.generations()}
    assert must <= ids, f"acknowledged commits lost: {sorted(must - ids)}"
    assert ids <= must | may, f"generations nobody began: {sorted(ids - must - may)}"
    for gid in ids:
        want = sizes(gid)
        g = store.generation(gid)
        assert {n: s.size for n, s in g.shards.items()} == want, gid
        for name, size in want.items():
            assert b"".join(store.read_shard(gid, name)) == content(gid, name, size), (gid, name)
    return ids


def check_direct(device: str, must: set[str], may: set[str]) -> set[str]:
    """Open the device without the service: the same generations, fsck clean, and the live bytes the
    zone table counts are exactly the committed extents' (nothing an aborted claim left counts)."""
    dev = FileDevice(device)
    try:
        with Store.open(dev) as store:
            ids = verify(store, must, may)
            rep = store.fsck()
            assert rep.ok, rep.problems
            bs = dev.geometry.block_size
            live = sum(round_up(e[2], bs) for g in store.generations() for s in g.shards.values()
                       for e in s.extents)
            assert store.table.live == live
            return ids
    finally:
        dev.close()


# -- one service, several client processes ------------------------------------------------------------
def test_several_client_processes_write_concurrently_through_one_service(tmp_path):
    device = make_device(tmp_path)
    svc = start_service(device, tmp_path / "service.log")
    try:
        mode = os.stat(socket_path(device)).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        logs = {f"job{i}": tmp_path / f"job{i}.log" for i in range(4)}
        procs = [start_client(device, log, job, 4, i) for i, (job, log) in enumerate(logs.items())]
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
        must = set().union(*(acknowledged(log)[0] for log in logs.values()))
        assert len(must) == 16
        with NodeStore.connect(device, job="*") as client:
            assert verify(client, must, set()) == must
            assert client.fsck().ok
    finally:
        stop_service(svc)
    assert not os.path.exists(socket_path(device))       # a clean stop removes its socket
    assert check_direct(device, must, set()) == must
    # one placement stream on one device: a job that starts after the others have written continues in
    # the zone they left open (the greedy log: the lowest-index open zone while it has room), so it
    # shares a zone with them.  (Four clients writing at once need not: a client's write holds its
    # extent, and whether two of them meet in one zone depends on timing.)
    svc = start_service(device, tmp_path / "service.log")
    try:
        late = start_client(device, tmp_path / "late.log", "late", 1, 9)
        _, err = late.communicate(timeout=600)
        assert late.returncode == 0, err[-3000:]
    finally:
        stop_service(svc)
    dev = FileDevice(device)
    with Store.open(dev) as store:
        zones_of = {g.id.split("%2F")[0]: {e[0] for s in g.shards.values() for e in s.extents}
                    for g in store.generations()}
    dev.close()
    assert sorted(zones_of) == sorted([*logs, "late"])
    earlier = set.union(*(z for job, z in zones_of.items() if job != "late"))
    assert zones_of["late"] & earlier, zones_of


# -- SIGKILL campaigns --------------------------------------------------------------------------------
def test_clients_killed_at_random_moments_lose_no_acknowledged_commit(tmp_path):
    device = make_device(tmp_path)
    svc = start_service(device, tmp_path / "service.log")
    rng = random.Random(29)
    must: set[str] = set()
    may: set[str] = set()
    kills = rounds = 0
    try:
        for r in range(5 if KILLS is None else max(1, -(-KILLS // 3))):
            rounds += 1
            logs = [tmp_path / f"r{r}c{i}.log" for i in range(3)]
            procs = [start_client(device, log, f"r{r}c{i}", 40, rng.randrange(1 << 30))
                     for i, log in enumerate(logs)]
            for p in procs:            # each killed at its own random moment (or finishes first)
                time.sleep(rng.uniform(0.0, 0.8))
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    kills += 1
            for p in procs:
                p.communicate(timeout=120)
            for log in logs:
                done, open_ = acknowledged(log)
                must |= done
                may |= open_
            with NodeStore.connect(device, job="*") as client:     # the service goes on serving, intact
                verify(client, must, may)
                assert client.fsck().ok
    finally:
        stop_service(svc)
    check_direct(device, must, may)
    print(f"\nclient kill campaign: {rounds} rounds, {kills} clients SIGKILLed, {len(must)} acknowledged "
          "commits, 0 lost")
    assert kills >= (5 if KILLS is None else 1) and must


def test_service_killed_at_random_moments_loses_no_acknowledged_commit(tmp_path):
    """SIGKILL the service while clients write: clients end with ServiceGoneError (one line), a restarted
    service recovers from the journal, every acknowledged commit is there."""
    device = make_device(tmp_path)
    rng = random.Random(2929)
    must: set[str] = set()
    may: set[str] = set()
    kills = gone = 0
    for r in range(4 if KILLS is None else KILLS):
        svc = start_service(device, tmp_path / "service.log")
        with NodeStore.connect(device, job="*") as client:          # the restart recovered everything so far
            verify(client, must, may)
        logs = [tmp_path / f"r{r}c{i}.log" for i in range(3)]
        procs = [start_client(device, log, f"r{r}c{i}", 40, rng.randrange(1 << 30)) for i, log in enumerate(logs)]
        deadline = time.monotonic() + 120      # the clients are under way (a loaded machine starts them late)
        while not any(acknowledged(lg)[0] for lg in logs) and time.monotonic() < deadline \
                and all(p.poll() is None for p in procs):
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.0))
        svc.send_signal(signal.SIGKILL)
        svc.wait()
        kills += 1
        for p in procs:
            _, err = p.communicate(timeout=120)
            if p.returncode == 3:
                gone += 1
                line = err.strip().splitlines()[-1]
                assert "went away" in line and "retainz serve" in line, line
            elif p.returncode == 4:
                assert "Connection refused" in err           # started after the kill
            else:
                assert p.returncode == 0, err[-3000:]
        for log in logs:
            done, open_ = acknowledged(log)
            must |= done
            may |= open_
    svc = start_service(device, tmp_path / "service.log")
    try:
        with NodeStore.connect(device, job="*") as client:
            verify(client, must, may)
            assert client.fsck().ok
    finally:
        stop_service(svc)
    check_direct(device, must, may)
    print(f"\nservice kill campaign: {kills} service SIGKILLs, {gone} clients told ServiceGoneError, "
          f"{len(must)} acknowledged commits, 0 lost")
    assert gone >= 1 and must


# -- in-process service: protocol, errors, discovery ----------------------------------------------------
@pytest.fixture
def served(tmp_path):
    """A device file served by an in-process Service (a thread); yields (device path, service)."""
    device = make_device(tmp_path, Geometry(nr_zones=32, zone_size=4 << 20, zone_capacity=4 << 20))
    dev = FileDevice(device)
    store = Store.open(dev)
    svc = Service(store, socket_path(device))
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    yield device, svc
    svc.close()
    t.join()
    dev.close()


def raw(device: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    s.connect(socket_path(device))
    return s


def ask(s: socket.socket, req: dict) -> dict:
    send_frame(s, req)
    return recv_frame(s, 16 << 20)


def test_a_client_writes_reads_and_deletes_through_the_service(served):
    device, svc = served
    with NodeStore.connect(device, job="") as c:     # the root series: ids without a folder
        assert c.device.geometry == svc.store.device.geometry and c.device.name == device
        data = os.urandom((5 << 20) + 123)
        w = c.begin_generation("g", 7)
        info = w.write_shard("x", [data[i:i + 999_999] for i in range(0, len(data), 999_999)])
        assert info.size == len(data)
        w.write_shard("empty", [])
        gen = w.commit()
        assert list(gen.shards) == ["x", "empty"] and gen.step == 7
        assert b"".join(c.read_shard("g", "x")) == data
        at, ext = c.read_shard_extent("g", "x", (3 << 20) + 5)
        assert at == 3 << 20 and ext == data[at:at + (1 << 20)]
        assert b"".join(c.read_shard("g", "empty")) == b""
        with pytest.raises(GenerationExistsError):
            c.begin_generation("g", 8)
        c.delete("g")
        assert c.generations() == []
    # the service's own store saw the same: nothing live, every zone the generation used reset
    assert svc.store.table.live == 0 and svc.store.fsck().ok


def test_a_disconnected_client_leaves_only_aborted_extents(served):
    device, svc = served
    c = NodeStore.connect(device)
    w = c.begin_generation("half", 1)
    s = w.open_shard("x")
    s.write(os.urandom(9 << 20))        # two batches claimed and written, then the client vanishes
    c._sock.close()
    deadline = time.monotonic() + 60
    while svc.store.table.live and time.monotonic() < deadline:
        time.sleep(0.02)
    assert svc.store.table.live == 0 and svc.store.generations() == []
    assert svc.store.fsck().ok
    with NodeStore.connect(device) as c2:               # and the id is free again
        c2.begin_generation("half", 1).commit()


def test_refused_requests_get_one_line_errors_and_the_connection_goes_on(served):
    device, _ = served
    s = raw(device)
    r = ask(s, {"op": "list"})
    assert r["ok"] is False and r["error"] == "ProtocolError" and "before hello" in r["message"]
    assert ask(s, {"op": "hello", "protocol": 2})["error"] == "ProtocolError"
    assert ask(s, {"op": "hello", "protocol": 1, "job": "j"})["ok"] is True
    for bad in ({"op": "nope"}, {"op": "begin", "gen": "g"}, {"op": "begin", "gen": "g", "step": -1},
                {"op": "begin", "gen": "x" * 300, "step": 1}, {"op": "begin", "gen": "../x", "step": 1},
                {"op": "claim", "shard": 99, "nbytes": 4096}, {"op": "begin", "gen": "g", "step": True},
                {"op": "locations", "gen": "g", "shard": "s", "count": 1 << 40}):
        r = ask(s, bad)
        assert r["ok"] is False and "\n" not in r["message"], (bad, r)
    w = ask(s, {"op": "begin", "gen": "j%2Fg", "step": 1})["writer"]
    sh = ask(s, {"op": "open_shard", "writer": w, "name": "s"})["shard"]
    assert ask(s, {"op": "claim", "shard": sh, "nbytes": (64 << 20) + 1})["ok"] is False
    ext = ask(s, {"op": "claim", "shard": sh, "nbytes": 4096})["extents"]
    assert len(ext) == 1 and ext[0][2] == 4096
    assert ask(s, {"op": "written", "shard": sh, "crcs": [1, 2]})["ok"] is False    # more crcs than extents
    assert ask(s, {"op": "written", "shard": sh, "crcs": [1 << 32]})["ok"] is False
    assert ask(s, {"op": "close_shard", "shard": sh})["error"] == "ValueError"      # no crc reported
    assert ask(s, {"op": "list"})["ok"] is True
    s.close()


def test_a_frame_that_breaks_the_framing_ends_only_that_connection(served):
    device, _ = served
    s = raw(device)
    s.sendall((MAX_REQUEST + 1).to_bytes(4, "little"))
    r = recv_frame(s, 1 << 20)
    assert r["ok"] is False and "frame of" in r["message"]
    assert recv_frame(s, 1 << 20) is None             # hung up
    s2 = raw(device)
    s2.sendall((4).to_bytes(4, "little") + b"\xff\xfe{[")
    assert "not JSON" in recv_frame(s2, 1 << 20)["message"]
    with NodeStore.connect(device) as c:            # the service is fine
        assert c.generations() == []


def test_a_second_service_for_the_device_is_refused_and_a_stale_socket_replaced(served, tmp_path):
    device, svc = served
    with pytest.raises(DeviceBusyError):
        Service(svc.store, socket_path(device))
    other = tmp_path / "other.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(other))
    stale.close()                                   # a socket file nobody listens on
    mem = Store.format(MemoryDevice(Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20)))
    s2 = Service(mem, str(other))
    s2.close()
    assert not other.exists()
    (tmp_path / "plain").write_text("x")
    with pytest.raises(FileExistsError):
        Service(mem, str(tmp_path / "plain"))
    assert (tmp_path / "plain").read_text() == "x"  # never removed


def test_the_integrations_use_the_service_when_its_socket_exists(served, tmp_path):
    from retainz.jobs import stores

    device, _ = served
    with stores.using(device, wait=0) as store:
        assert isinstance(store, NodeStore)
        store.begin_generation("via-using", 3).commit()
    (tmp_path / "p").mkdir()
    plain = make_device(tmp_path / "p")
    with stores.using(plain, wait=0) as store:
        assert isinstance(store, Store)
    # a stale socket (a killed service's) beside a device: opened directly
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(socket_path(plain))
    stale.close()
    with stores.using(plain, wait=0) as store:
        assert isinstance(store, Store)


def test_a_client_of_a_stopped_service_gets_service_gone(served):
    device, svc = served
    c = NodeStore.connect(device)
    w = c.begin_generation("g", 1)
    svc.stop()
    for s in list(svc._sessions):
        s.sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(ServiceGoneError, match="went away.*retainz serve"):
        w.write_shard("x", [b"a" * (9 << 20)])
    with pytest.raises(ServiceGoneError):
        c.generations()
    c.close()


def test_a_claim_on_a_device_other_processes_cannot_write_is_refused_and_aborts_the_shard():
    with Store.format(MemoryDevice(Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20))) as s:
        w = s.begin_generation("g", 1)
        sh = w.open_shard("x")
        with pytest.raises(ZoneOpNotSupportedError):
            sh.claim(4096)
        assert w.open_shards == [] and s.table.live == 0


def test_claimed_extents_take_their_writers_crcs_and_read_back_verified(tmp_path):
    import crc32c

    path = str(tmp_path / "d.img")
    dev = FileDevice.create(path, Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20))
    region_file, region = dev.direct_region()
    with Store.format(dev) as s:
        w = s.begin_generation("g", 1)
        sh = w.open_shard("x")
        data = os.urandom((1 << 20) + 10)
        ext = sh.claim(len(data))
        assert sum(e[2] for e in ext) == len(data) and all(e[2] <= 1 << 20 for e in ext)
        fd = os.open(region_file, os.O_RDWR)
        p = 0
        for z, off, n in ext:
            os.pwrite(fd, data[p:p + n], region + z * (1 << 20) + off)
            p += n
        os.close(fd)
        with pytest.raises(ValueError):
            sh.claim(4096)               # the ragged tail was claimed: nothing follows it
        crcs = []
        p = 0
        for _, _, n in ext:
            crcs.append(crc32c.crc32c(data[p:p + n]))
            p += n
        info = sh.close(crcs)
        assert info.crc == crc32c.crc32c(data)
        w.commit()
        assert b"".join(s.read_shard("g", "x")) == data and s.fsck().ok
    dev.close()


def test_wrong_crc_counts_abort_the_claimed_shard(served):
    _, svc = served
    w = svc.store.begin_generation("c", 1)
    sh = w.open_shard("x")
    sh.claim(3 << 20)
    with pytest.raises(ValueError, match="need as many crcs"):
        sh.close([1])
    assert w.open_shards == []
    w.abort()
    assert svc.store.table.live == 0


# -- fuzzing -------------------------------------------------------------------------------------------
def test_a_fuzzed_request_stream_never_crashes_the_service(served):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    device, svc = served
    ops = ["hello", "begin", "open_shard", "claim", "written", "close_shard", "abort_shard", "commit", "abort",
           "delete", "list", "generation", "locations", "update_hint", "advance", "now", "df", "fsck", "gc",
           "metrics", "bye", "x", ""]
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-2, 1 << 70), st.floats(allow_nan=False, allow_infinity=False),
                       st.text(max_size=300), st.just("g"), st.just("s"), st.integers(0, 8))
    value = st.recursive(scalar, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c,
                                                                                       max_size=4), max_leaves=12)
    keys = st.sampled_from(["gen", "step", "hint", "declared_size", "replace", "writer", "name", "size", "shard",
                            "nbytes", "crcs", "start", "count", "force", "protocol", "job", "retention", "zz"])
    request = st.fixed_dictionaries({"op": st.sampled_from(ops)}, optional={}).flatmap(
        lambda d: st.dictionaries(keys, value, max_size=6).map(lambda extra: {**extra, **d}))
    stream = st.lists(st.one_of(request, st.binary(max_size=40)), min_size=1, max_size=25)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(stream, st.booleans())
    def run(frames, greet):
        s = raw(device)
        try:
            if greet:
                assert ask(s, {"op": "hello", "protocol": 1})["ok"] is True
            for f in frames:
                try:      # the service hangs up after a frame that breaks the framing
                    if isinstance(f, bytes):
                        s.sendall(len(f).to_bytes(4, "little") + f)
                    else:
                        send_frame(s, f)
                    r = recv_frame(s, 16 << 20)
                except (ProtocolError, OSError):
                    return
                if r is None:
                    return
                assert isinstance(r.get("ok"), bool)
                assert r.get("error") != "InternalError", r
        finally:
            s.close()

    run()
    with NodeStore.connect(device) as c:                # still serving, store consistent
        c.generations()
        rep = c.fsck()
        assert rep.ok, rep.problems
    assert svc.store.recompute_table().key() == svc.store.table.key()


def test_clients_that_join_a_generation_write_it_together_and_one_commits_it(served):
    device, svc = served
    with NodeStore.connect(device) as a, NodeStore.connect(device) as b, NodeStore.connect(device) as c:
        wa = a.begin_generation("ck", 5, join="run1")
        wb = b.begin_generation("ck", 5, join="run1")
        with pytest.raises(GenerationExistsError, match="different join token"):
            c.begin_generation("ck", 5, join="run2")
        with pytest.raises(GenerationExistsError):
            c.begin_generation("ck", 5)
        wb.write_shard("__1", [b"b" * 5000])
        wb.leave()                       # rank 1 done; the generation stays open for rank 0
        wa.write_shard("__0", [b"a" * 7000])
        gen = wa.commit()
        assert sorted(gen.shards) == ["__0", "__1"]
        assert b"".join(a.read_shard("ck", "__1")) == b"b" * 5000
        # every holder leaving without a commit aborts: nothing stays live
        x = a.begin_generation("ck2", 6, join="run1")
        y = b.begin_generation("ck2", 6, join="run1")
        y.write_shard("s", [b"y" * 9000])
        y.leave()
        assert [g.id for g in a.generations()] == ["ck"]
        x.leave()
    live = sum(round_up(e[2], 4096) for g in svc.store.generations() for s in g.shards.values() for e in s.extents)
    assert svc.store.table.live == live and svc.store.fsck().ok


def test_retainz_serve_refuses_bad_input_and_a_served_device_with_one_line(tmp_path):
    def serve(*args):
        return subprocess.run([sys.executable, "-m", "retainz.cli", "serve", *args], env=ENV,
                              capture_output=True, text=True, timeout=120)

    r = serve(str(tmp_path / "missing.img"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such device file" in r.stderr
    device = make_device(tmp_path)
    svc = start_service(device, tmp_path / "service.log")
    try:
        r = serve(device)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "in use" in r.stderr, r.stderr
    finally:
        stop_service(svc)


def test_a_reader_follows_a_shard_gc_moved_and_whose_old_zone_was_rewritten(served):
    device, svc = served
    with NodeStore.connect(device) as c:
        a = os.urandom(3 << 20)
        for gid, data in (("a", a), ("b", os.urandom(1 << 20))):
            w = c.begin_generation(gid, 1)
            w.write_shard("x", [data])
            w.commit()
        old = {e[0] for e in svc.store.generation("a").shards["x"].extents}
        stream = c.read_shard("a", "x")          # the extents are looked up now
        c.delete("b")
        rep = c.gc(force=True)
        new = {e[0] for e in svc.store.generation("a").shards["x"].extents}
        assert rep.extents_moved and not old & new, (old, new, rep)
        # fill the zones again so a's old place holds other bytes
        k = 0
        while not any(z in old for g in svc.store.generations() if g.id.startswith("f")
                      for s in g.shards.values() for z in (e[0] for e in s.extents)):
            w = c.begin_generation(f"f{k}", 2)
            w.write_shard("x", [os.urandom(1 << 20)])
            w.commit()
            k += 1
        assert b"".join(stream) == a             # failed its crc at the old place, looked up again


def test_a_flush_after_a_claim_syncs_the_file_even_with_no_zone_dirty(tmp_path, monkeypatch):
    """Claimed bytes are written by another process after the claim, maybe after a flush that already
    recorded the zone: every later flush (a commit's) must still sync the file's data."""
    dev = FileDevice.create(str(tmp_path / "d.img"), Geometry(nr_zones=8, zone_size=1 << 20, zone_capacity=1 << 20))
    syncs = []
    real = dev._sync_data
    monkeypatch.setattr(dev, "_sync_data", lambda: (syncs.append(1), real())[1])
    dev.flush()
    assert syncs == []                       # nothing claimed, nothing dirty: no sync
    dev.claim(0, 8192)
    dev.flush()
    assert len(syncs) == 1
    dev.flush()                              # the other process wrote its bytes meanwhile
    assert len(syncs) == 2
    dev.close()


def test_a_rank_that_finishes_before_the_committer_begins_leaves_its_shard_in_the_generation(served):
    """An async DCP save: rank 1 opens, writes and leaves the joined generation before rank 0 has begun
    it.  With ``ranks`` the generation waits for the rank still to come; rank 0 joins and commits both
    shards.  A lost connection still aborts, and another run's token takes over an abandoned one."""
    device, svc = served
    with NodeStore.connect(device) as r0, NodeStore.connect(device) as r1:
        w1 = r1.begin_generation("async", 20, join="run1", ranks=2)
        w1.write_shard("__1_0.distcp", [b"1" * 6000])
        w1.leave()                                   # nobody holds it now: kept for rank 0
        w0 = r0.begin_generation("async", 20, join="run1", ranks=2)
        w0.write_shard("__0_0.distcp", [b"0" * 5000])
        gen = w0.commit()
        assert sorted(gen.shards) == ["__0_0.distcp", "__1_0.distcp"]
        assert b"".join(r0.read_shard("async", "__1_0.distcp")) == b"1" * 6000
        # every rank joined and left without a commit: aborted
        a = r0.begin_generation("both-left", 21, join="run1", ranks=2)
        b = r1.begin_generation("both-left", 21, join="run1", ranks=2)
        b.write_shard("s", [b"b" * 100])
        b.leave()
        a.leave()
        assert "both-left" not in svc._shared
        # a rank left, its committer never came; a later run's begin replaces the abandoned writer
        x = r1.begin_generation("stale", 22, join="run1", ranks=2)
        x.write_shard("s", [b"x" * 100])
        x.leave()
        y = r0.begin_generation("stale", 22, join="run2", ranks=1)
        y.write_shard("t", [b"y" * 100])
        assert list(y.commit().shards) == ["t"]
    assert [g.id for g in svc.store.generations()] == ["async", "stale"]
    live = sum(round_up(e[2], 4096) for g in svc.store.generations() for s in g.shards.values() for e in s.extents)
    assert svc.store.table.live == live and svc.store.fsck().ok


KILL_POINTS = ("before-flush", "before-record", "after-record")


def test_the_service_killed_inside_a_commit_at_each_point_loses_no_acknowledged_commit(tmp_path):
    """SIGKILL the service inside its N-th commit: before the device file's sync, between the sync and
    the commit record, after the durable record but before the reply (tests/workers/node_service_kill.py).
    After each kill the next service recovers: every acknowledged commit is there and reads back right
    (crc), the killed commit is there only if its record was durable, nothing uncommitted stays live."""
    device = make_device(tmp_path)
    rng = random.Random(29_2)
    must: set[str] = set()
    may: set[str] = set()
    rounds = 6 if KILLS is None else KILLS
    gone = durable_unacked = 0
    log = tmp_path / "service.log"
    for r in range(rounds):
        point, n = KILL_POINTS[r % 3], rng.randint(1, 6)
        svc = subprocess.Popen([sys.executable, str(ROOT / "tests/workers/node_service_kill.py"), device, point,
                                str(n)], env=ENV, stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
        while True:
            assert svc.poll() is None, log.read_text()[-3000:]
            try:
                with NodeStore.connect(device, job="*") as client:     # the last kill recovered
                    before = verify(client, must, may)
                break
            except (ConnectionRefusedError, FileNotFoundError):
                time.sleep(0.05)
        logs = [tmp_path / f"p{r}c{i}.log" for i in range(2)]
        procs = [start_client(device, lg, f"p{r}c{i}", 40, rng.randrange(1 << 30)) for i, lg in enumerate(logs)]
        assert svc.wait(timeout=300) == -signal.SIGKILL        # it died where it was told to
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode in (3, 4), err[-3000:]          # every client told the service went away
            gone += p.returncode == 3
        for lg in logs:
            done, open_ = acknowledged(lg)
            must |= done
            may |= open_
        dev = FileDevice(device)
        with Store.open(dev) as store:       # recovery, as the next service's open does
            ids = {g.id for g in store.generations()}
        dev.close()
        new = ids - before
        assert len({g for g in new if g not in must}) == (1 if point == "after-record" else 0), (point, new - must)
        durable_unacked += len(new - must)
    svc = start_service(device, log)
    try:
        with NodeStore.connect(device, job="*") as client:
            verify(client, must, may)
            assert client.fsck().ok
    finally:
        stop_service(svc)
    check_direct(device, must, may)
    print(f"\nservice commit-point kill campaign: {rounds} SIGKILLs ({', '.join(KILL_POINTS)}), {gone} clients told "
          f"ServiceGoneError, {len(must)} acknowledged commits checked, {durable_unacked} durable but unacknowledged, "
          "0 lost")
    assert must and gone >= rounds
