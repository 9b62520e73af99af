"""The node service's data paths for clients that cannot write the device themselves (docs/node.md,
"Data paths"): the bytes go through a shared memfd the service writes from, or over the socket; the
client picks the best that works and says which.  Run against a FileDevice the client may not open
(another uid), a MemoryDevice (only the service can reach it) and forced paths."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from retainz.node import NodeStore, Service, socket_path
from retainz.node.protocol import send_frame
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice
from tests.node.test_node import ask, make_device, raw

ROOT = Path(__file__).resolve().parents[2]
GEOMETRY = Geometry(nr_zones=32, zone_size=4 << 20, zone_capacity=4 << 20)


@pytest.fixture
def served(tmp_path):
    """A FileDevice served by an in-process Service; yields (device path, service)."""
    device = make_device(tmp_path, GEOMETRY)
    dev = FileDevice(device)
    store = Store.open(dev)
    svc = Service(store, socket_path(device))
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    yield device, svc
    svc.close()
    t.join()
    dev.close()


def _write_and_read(c: NodeStore, gen: str) -> dict[str, bytes]:
    shards = {"a": os.urandom((9 << 20) + 4097), "b": os.urandom(3), "empty": b""}
    w = c.begin_generation(gen, 5)
    for name, data in shards.items():
        info = w.write_shard(name, [data[i:i + 777_777] for i in range(0, len(data), 777_777)])
        assert info.size == len(data)
    w.commit()
    for name, data in shards.items():
        assert b"".join(c.read_shard(gen, name)) == data
    at, ext = c.read_shard_extent(gen, "a", (5 << 20) + 9)
    assert at <= (5 << 20) + 9 < at + len(ext) and ext == shards["a"][at:at + len(ext)]
    return shards


@pytest.mark.parametrize("path", ["shm", "socket"])
def test_a_forced_data_path_writes_through_the_service_and_reads_back_byte_for_byte(served, monkeypatch, path):
    device, svc = served
    monkeypatch.setenv("RETAINZ_NODE_DATA", path)
    with NodeStore.connect(device) as c:
        assert c.data_path == path and f"RETAINZ_NODE_DATA={path}" in c.data_reason and not c.direct
        assert f"data={path!r}" in repr(c)
        shards = _write_and_read(c, "g")
        # and reads through the service too, as a client that cannot read the device (no reader of its own)
        c.reader, reader = None, c.reader
        with monkeypatch.context() as m:
            m.setattr(reader.extents, "read_extent", lambda *a: pytest.fail("read the device file itself"))
            for name, data in shards.items():
                assert b"".join(c.read_shard("g", name)) == data
            at, ext = c.read_shard_extent("g", "a", 1 << 20)
            assert at == 1 << 20 and ext == shards["a"][at:at + len(ext)]
        c.reader = reader
    monkeypatch.delenv("RETAINZ_NODE_DATA")
    with NodeStore.connect(device) as d:      # a direct client reads what the service wrote
        assert d.data_path == "direct"
        assert {n: b"".join(d.read_shard("g", n)) for n in shards} == shards
    assert svc.store.fsck().ok


def test_a_device_only_the_service_reaches_takes_bytes_through_shared_memory(tmp_path):
    dev = MemoryDevice(GEOMETRY)
    store = Store.format(dev)
    svc = Service(store, str(tmp_path / "mem.sock"))
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    try:
        with NodeStore.connect("memory", socket_file=str(tmp_path / "mem.sock")) as c:
            assert c.data_path == "shm" and "offers no direct region" in c.data_reason
            _write_and_read(c, "m")
        assert store.fsck().ok and store.table.live > 0
    finally:
        svc.close()
        t.join()


def test_a_bad_data_path_name_is_one_line(served, monkeypatch):
    device, _ = served
    monkeypatch.setenv("RETAINZ_NODE_DATA", "pigeon")
    with pytest.raises(ValueError, match="RETAINZ_NODE_DATA='pigeon': expected auto, direct, shm, socket"):
        NodeStore.connect(device)


def _memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def test_the_service_refuses_shared_buffers_and_puts_it_cannot_trust(served, tmp_path):
    device, svc = served
    s = raw(device)
    assert ask(s, {"op": "hello", "protocol": 1})["ok"]
    w = ask(s, {"op": "begin", "gen": "x", "step": 1})["writer"]
    sh = ask(s, {"op": "open_shard", "writer": w, "name": "s"})["shard"]

    def shm(fds, size):
        send_frame(s, {"op": "shm", "size": size}, None, tuple(fds))
        from retainz.node.protocol import recv_frame
        return recv_frame(s, 1 << 20)

    assert "before a shared buffer" in ask(s, {"op": "put", "shard": sh, "nbytes": 4096, "via": "shm"})["message"]
    assert "not one memfd" in shm([], 4096)["message"]
    plain = os.open(tmp_path / "plain", os.O_RDWR | os.O_CREAT)
    os.ftruncate(plain, 8192)
    assert "takes no seals" in shm([plain], 4096)["message"]
    unsealed = _memfd(8192, 0)
    assert "not sealed against shrinking" in shm([unsealed], 4096)["message"]
    small = _memfd(4096, fcntl.F_SEAL_SHRINK)
    assert "holds 4096 bytes, not the 8192" in shm([small], 8192)["message"]
    two = [_memfd(8192, fcntl.F_SEAL_SHRINK), _memfd(8192, fcntl.F_SEAL_SHRINK)]
    assert "carries 2 file descriptors" in shm(two, 4096)["message"]
    good = _memfd(8192, fcntl.F_SEAL_SHRINK)
    assert shm([good], 8192) == {"size": 8192, "ok": True}
    with pytest.raises(OSError):               # sealed: the client cannot shrink it under the service
        os.ftruncate(good, 0)
    # a descriptor sent with any other request is closed unread, and that request answered as usual
    send_frame(s, {"op": "now"}, None, (_memfd(4096, 0),))
    from retainz.node.protocol import recv_frame
    assert recv_frame(s, 1 << 20)["ok"]
    assert "outside the 8192-byte shared buffer" in ask(
        s, {"op": "put", "shard": sh, "nbytes": 4096, "offset": 4097, "via": "shm"})["message"]
    os.pwrite(good, b"z" * 8192, 0)
    assert ask(s, {"op": "put", "shard": sh, "nbytes": 5000, "via": "shm"}) == {"written": 5000, "ok": True}
    assert "takes its bytes through the service" in ask(s, {"op": "claim", "shard": sh, "nbytes": 4096})["message"]
    sh2 = ask(s, {"op": "open_shard", "writer": w, "name": "t"})["shard"]
    assert ask(s, {"op": "claim", "shard": sh2, "nbytes": 4096})["ok"]
    assert "takes claims" in ask(s, {"op": "put", "shard": sh2, "nbytes": 1, "via": "shm"})["message"]
    assert ask(s, {"op": "abort_shard", "shard": sh2})["ok"]
    assert ask(s, {"op": "close_shard", "shard": sh})["info"][:2] == ["s", 5000]
    assert ask(s, {"op": "commit", "writer": w})["ok"]
    for fd in (plain, unsealed, small, good, *two):
        os.close(fd)
    # bytes on the socket: a put with no valid length loses the framing, so the service hangs up
    s2 = raw(device)
    assert ask(s2, {"op": "hello", "protocol": 1})["ok"]
    reply = ask(s2, {"op": "put", "shard": 1, "nbytes": -5, "via": "socket"})
    assert reply["ok"] is False and "nbytes" in reply["message"]
    assert s2.recv(1) == b""
    s2.close()
    s.close()
    with NodeStore.connect(device) as c:        # the service goes on, the store intact
        assert b"".join(c.read_shard("x", "s")) == b"z" * 5000
        assert c.fsck().ok


CLIENT = r"""
import json, logging, os, sys
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from retainz.node import NodeStore
device, sock = sys.argv[1], sys.argv[2]
with NodeStore.connect(device, socket_file=sock) as c:
    data = bytes(range(256)) * 40000 + b"tail"
    w = c.begin_generation("u", 3)
    w.write_shard("x", [data])
    w.commit()
    back = b"".join(c.read_shard("u", "x"))
    print(json.dumps({"path": c.data_path, "reason": c.data_reason, "same": back == data,
                      "fd": c._fd}))
"""


def _without_file_permission_override() -> None:
    """In the child before exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set
    (prctl(2) PR_CAPBSET_DROP), so even root then obeys a file's mode bits (capabilities(7): a root
    process's permitted set after execve is the bounding set)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):                           # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:    # PR_CAPBSET_DROP
            os._exit(97)


def test_a_client_not_allowed_to_open_the_device_falls_back_on_its_own_and_says_so(tmp_path):
    """A client that may not open the device file (mode 000; as root, without the capability that
    overrides it) writes and reads through shared memory, picked automatically and said in its log."""
    device = make_device(tmp_path, GEOMETRY)
    dev = FileDevice(device)
    store = Store.open(dev)
    svc = Service(store, socket_path(device))
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    os.chmod(device, 0)
    try:
        env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
        env.pop("RETAINZ_NODE_DATA", None)
        p = subprocess.run([sys.executable, "-c", CLIENT, device, socket_path(device)], env=env,
                           capture_output=True, text=True, timeout=120,
                           preexec_fn=_without_file_permission_override if os.geteuid() == 0 else None)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out["path"] == "shm" and out["same"] and out["fd"] == -1
        assert "Permission denied" in out["reason"] and "shared memfd" in out["reason"]
        assert f"retainz.node: {device}: data path shm (cannot write " in p.stderr
        assert store.fsck().ok and [g.id for g in store.generations()] == ["u"]
    finally:
        os.chmod(device, 0o644)
        svc.close()
        t.join()
        dev.close()


def test_a_put_on_the_socket_path_is_bounded_like_a_claim(served):
    device, _ = served
    s = raw(device)
    assert ask(s, {"op": "hello", "protocol": 1})["ok"]
    reply = ask(s, {"op": "put", "shard": 1, "nbytes": (64 << 20) + 1, "via": "socket"})
    assert reply["ok"] is False and "1 .. 67108864" in reply["message"]
    with contextlib.suppress(OSError):
        assert s.recv(1) == b""
    s.close()


def test_a_client_reading_through_the_service_stops_at_a_shard_replaced_mid_stream_as_the_store_does(served, monkeypatch):
    """A stream through the service (a client that cannot read the device) of a generation deleted and
    written again meanwhile ends with the in-process store's refusal, not with the new bytes spliced
    onto the old ones."""
    from retainz.errors import GenerationNotFoundError

    device, svc = served
    old, new = os.urandom(3 << 20), os.urandom(2 << 20)
    monkeypatch.setenv("RETAINZ_NODE_DATA", "socket")
    with NodeStore.connect(device) as c:
        c.reader = None
        for store in (c, svc.store):
            with store.begin_generation("g", 1) as w:
                w.write_shard("a", [old])
            stream = store.read_shard("g", "a")
            assert next(stream) == old[:1 << 20]
            store.delete("g")
            with store.begin_generation("g", 2) as w:
                w.write_shard("a", [new])
            with pytest.raises(GenerationNotFoundError, match=r"^generation 'g' was deleted while being read$"):
                next(stream)
            store.delete("g")
