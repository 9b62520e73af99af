"""The remote zoned device (retainz.zoned.remote): the store on a device served at the other end of a
stream, what a refusal looks like there, and what the protocol refuses.

The conformance suite runs against it too (``remote-memory`` and ``remote-window-file`` in
tests/conftest.py), the window one with a 3-block window so that every multi-block write and read
travels in parts.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
import threading
import time

import pytest

from retainz.errors import DeviceFormatError, TooManyActiveZonesError, ZoneFullError, ZoneInvalidWriteError
from retainz.hint import Hint
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry, MemoryDevice, open_device
from retainz.zoned.remote import FdStream, RemoteDeviceError, RemoteZonedDevice, SocketStream, serve
from tests.conftest import serve_in_thread

GEOMETRY = Geometry(nr_zones=16, zone_size=64 * 1024, zone_capacity=48 * 1024, block_size=4096,
                    max_open=3, max_active=4)


def _unix_server(path, device, window=None):
    """Serve ``device`` on a Unix socket, one connection after another, until a client says shutdown."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)
    counts = {"connections": 0}

    def run():
        try:
            while True:
                conn, _ = srv.accept()
                counts["connections"] += 1
                try:
                    if serve(device, SocketStream(conn), window):
                        return
                finally:
                    conn.close()
        finally:
            srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, counts


def test_store_survives_reconnects_through_a_unix_socket_with_a_shared_window(tmp_path):
    """Format, commit and delete through one connection; a second connection (a fresh process's)
    mounts the store from the device alone and reads every byte back; the window is 2 blocks, so
    every shard travels in parts."""
    dev = FileDevice.create(tmp_path / "dev.img", GEOMETRY)
    win_path = tmp_path / "window"
    win_path.write_bytes(bytes(2 * 4096))
    with open(win_path, "r+b") as f:
        server_window = mmap.mmap(f.fileno(), 0)
    sock = tmp_path / "s.sock"
    t, counts = _unix_server(sock, dev, server_window)
    spec = f"remote:socket={sock},window={win_path}"

    data = {f"g{i}": os.urandom(3 * 4096 + 100 * i) for i in range(5)}
    remote = open_device(spec)
    assert remote.info.kind == "remote(file)" and remote.geometry == GEOMETRY
    store = Store.format(remote)
    for i, (gid, payload) in enumerate(data.items()):
        w = store.begin_generation(gid, step=i, hint=Hint(reclaim_step=i + 2))
        w.write_shard("s", [payload])
        w.commit()
    store.delete("g0")
    store.close()
    remote.close()

    remote = open_device(spec)
    store = Store.open(remote)
    assert sorted(g.id for g in store.generations()) == ["g1", "g2", "g3", "g4"]
    for gid in ("g1", "g2", "g3", "g4"):
        assert b"".join(store.read_shard(gid, "s")) == data[gid]
    store.close()
    remote.shutdown()
    remote.close()
    t.join(timeout=10)
    assert not t.is_alive() and counts["connections"] == 2
    # what the store left is on the served device itself
    assert b"".join(Store.open(dev).read_shard("g4", "s")) == data["g4"]


def test_a_refusal_arrives_as_the_devices_own_error_and_a_refused_write_writes_nothing():
    inner = MemoryDevice(GEOMETRY)
    dev = serve_in_thread(inner, window_blocks=2)     # the 4-block write below travels in 2 parts
    try:
        z = dev.zone(3)
        with pytest.raises(ZoneInvalidWriteError) as ei:
            dev.write(z.start + 4096, bytes(4 * 4096))
        assert (ei.value.zone, ei.value.offset) == (3, z.start + 4096)
        assert str(ei.value) == str(_local_refusal(z.start + 4096))      # the same message
        assert dev.zone(3).wp == z.start                      # nothing of the staged parts landed
        dev.write(z.start, bytes(12 * 4096))                  # fills the zone: 12 blocks of capacity
        with pytest.raises(ZoneFullError):
            dev.write(z.start + 12 * 4096, bytes(4096))
        for k in range(4, 4 + GEOMETRY.max_active):           # zone 3 is full: 4 others may be active
            dev.write(dev.zone(k).start, bytes(4096))
        with pytest.raises(TooManyActiveZonesError):
            dev.write(dev.zone(10).start, bytes(4096))
        landed = dev.append(4, bytes(5 * 4096))               # append in parts lands contiguously
        assert landed == dev.zone(4).start + 4096 and dev.zone(4).wp == landed + 5 * 4096
    finally:
        dev.close()


def _local_refusal(offset):
    d = MemoryDevice(GEOMETRY)
    try:
        d.write(offset, bytes(4096))
    except ZoneInvalidWriteError as e:
        return e


@pytest.mark.parametrize("client_window", [4096, 8192, 0])
def test_a_window_that_is_not_the_servers_shared_memory_is_refused_at_hello(client_window):
    """Another size, the same size but another file (the server does not find the client's token in
    its window), or none at all: refused before anything is written through it."""
    a, b = socket.socketpair()
    t = threading.Thread(target=serve, args=(MemoryDevice(GEOMETRY), SocketStream(b), mmap.mmap(-1, 8192)),
                         daemon=True)
    t.start()
    window = mmap.mmap(-1, client_window) if client_window else None
    message = {0: "add window=FILE to the spec",
               4096: r"w.bin is not the shared memory of the remote device at peer \(its window is 8192 bytes, "
                     r"this one 4096\)",
               8192: r"w.bin is not the shared memory of the remote device at peer \(the server does not see "
                     r"what was written into it\)"}[client_window]
    with pytest.raises(DeviceFormatError, match=message):
        RemoteZonedDevice(SocketStream(a, timeout=10), window, name="peer", window_name="w.bin")
    a.close()
    t.join(timeout=10)


def test_a_reply_left_over_from_a_killed_client_is_dropped_by_the_next():
    """A virtio-serial port is one stream for every client: a client killed after sending a request
    leaves its reply to be read by the next one, which must skip it by its id."""
    dev = MemoryDevice(GEOMETRY)
    to_server, from_client = os.pipe()
    to_client, from_server = os.pipe()
    t = threading.Thread(target=serve, args=(dev, FdStream(to_server, from_server)), daemon=True)
    t.start()
    # the killed client: a whole request (a write), then gone without reading the reply
    header = json.dumps({"op": "report", "start": 0, "count": 0, "id": 7}).encode()
    os.write(from_client, struct.pack("<I", len(header)) + header)
    nxt = RemoteZonedDevice(FdStream(to_client, from_client), name="port")
    assert [z.index for z in nxt.report_zones(3, 2)] == [3, 4]
    nxt.shutdown()
    t.join(timeout=10)
    assert not t.is_alive()


def test_a_hello_that_waits_says_so_once(capsys):
    a, b = socket.socketpair()

    def slow():
        time.sleep(0.6)                                 # another client held the device for a while
        serve(MemoryDevice(GEOMETRY), SocketStream(b))

    t = threading.Thread(target=slow, daemon=True)
    t.start()
    dev = RemoteZonedDevice(SocketStream(a, timeout=10), name="busy.sock", notice=0.2)
    assert dev.geometry == GEOMETRY
    err = capsys.readouterr().err
    assert err.count("retainz: waiting for the remote device at busy.sock") == 1
    dev.close()
    t.join(timeout=10)


def test_a_server_that_goes_away_is_an_error_naming_the_request():
    a, b = socket.socketpair()
    t = threading.Thread(target=serve, args=(MemoryDevice(GEOMETRY), SocketStream(b)), daemon=True)
    t.start()
    dev = RemoteZonedDevice(SocketStream(a, timeout=10), name="peer")
    b.shutdown(socket.SHUT_RDWR)
    with pytest.raises(RemoteDeviceError, match="peer.*'report'|peer:"):
        dev.report_zones()
    dev.close()
    t.join(timeout=10)


@pytest.mark.parametrize("frame, message", [
    (struct.pack("<I", (1 << 20) + 1), "header of 1048577 bytes"),
    (struct.pack("<I", 3) + b"\xff{}", "malformed message header"),
    (struct.pack("<I", 2) + b"[]", "not a JSON object"),
    (struct.pack("<I", 11) + b'{"data":-1}', "data length of -1"),
])
def test_malformed_replies_are_refused_with_what_is_wrong(frame, message):
    """A server answering garbage: the client names the problem instead of misreading it."""
    a, b = socket.socketpair()

    def fake():
        SocketStream(b).recv_exact(4)                  # the hello's length; answer with the frame
        b.sendall(frame)

    threading.Thread(target=fake, daemon=True).start()
    with pytest.raises(RemoteDeviceError, match=message):
        RemoteZonedDevice(SocketStream(a, timeout=10))
    a.close()
    b.close()


def test_a_malformed_request_ends_only_that_connection():
    dev = MemoryDevice(GEOMETRY)
    a, b = socket.socketpair()
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("stop", serve(dev, SocketStream(b))), daemon=True)
    t.start()
    a.sendall(struct.pack("<I", 4) + b"nope")
    t.join(timeout=10)
    assert result == {"stop": False}                  # the connection ended; the server did not stop


def test_unknown_requests_and_bad_arguments_are_refusals_not_crashes():
    dev = serve_in_thread(MemoryDevice(GEOMETRY))
    try:
        with pytest.raises(RemoteDeviceError, match="unknown request 'format'"):
            dev._call({"op": "format"})
        with pytest.raises(RemoteDeviceError, match="KeyError"):
            dev._call({"op": "read"})
        assert dev.zone(0).wp == 0                     # still serving
    finally:
        dev.close()


@pytest.mark.parametrize("spec, message", [
    ("remote:", "expected remote:socket=PATH"),
    ("remote:window=/x", "expected remote:socket=PATH"),
    ("remote:socket=/x,port=3", "expected remote:socket=PATH"),
    ("remote:socket=", "expected remote:socket=PATH"),
])
def test_bad_remote_specs_name_the_expected_form(spec, message):
    with pytest.raises(DeviceFormatError, match=message):
        open_device(spec)


def test_a_missing_socket_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no remote zoned device socket"):
        open_device(f"remote:socket={tmp_path}/none.sock")


def test_a_path_that_is_not_a_socket_or_where_nothing_listens_is_named(tmp_path):
    (tmp_path / "plain.txt").write_text("x")
    with pytest.raises(DeviceFormatError, match=r"plain.txt: not a socket"):
        open_device(f"remote:socket={tmp_path}/plain.txt")
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "dead.sock"))             # the socket file of a server that is gone
    dead.close()
    with pytest.raises(RemoteDeviceError, match=r"dead.sock: cannot connect to a remote zoned device there \("):
        open_device(f"remote:socket={tmp_path}/dead.sock")


@pytest.mark.parametrize("window, message", [
    ("", "expected remote:socket=PATH"),
    ("{tmp}/none", "none: no such window file"),
    ("{tmp}/empty", "empty: cannot be mapped as a shared-memory window"),
    ("/dev/null", "/dev/null: cannot be mapped as a shared-memory window"),
])
def test_bad_window_files_are_named(tmp_path, window, message):
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises((DeviceFormatError, FileNotFoundError), match=message):
        open_device(f"remote:socket={tmp_path}/s.sock,window={window.format(tmp=tmp_path)}")


def test_the_integrations_format_a_blank_remote_device_and_reopen_a_formatted_one(tmp_path):
    """``integrations.stores.using`` with a ``remote:`` spec (what ``--device remote:...`` of the DCP
    writer and the payload capture reach): a blank device is formatted, a formatted one opened as is,
    the spec is not taken for a file path."""
    from retainz.jobs import stores

    dev = MemoryDevice(GEOMETRY)
    sock = tmp_path / "s.sock"
    t, counts = _unix_server(sock, dev)
    spec = f"remote:socket={sock}"
    assert stores.present(spec) and not stores.present(str(tmp_path / "none.img"))
    with stores.using(spec) as store:
        w = store.begin_generation("step-1", step=1)
        w.write_shard("s", [b"x" * 5000])
        w.commit()
    with stores.using(spec) as store:
        assert [g.id for g in store.generations()] == ["step-1"]
    remote = open_device(spec)
    remote.shutdown()
    remote.close()
    t.join(timeout=10)
    assert counts["connections"] == 3


def test_requests_beyond_the_window_or_a_zone_are_refused_and_the_server_keeps_serving():
    """A client that does not split (or a garbled request) cannot make the server overrun its window
    or hold more than a zone's worth of staged data."""
    dev = serve_in_thread(MemoryDevice(GEOMETRY), window_blocks=2)
    try:
        with pytest.raises(RemoteDeviceError, match=r"a read of 12288 bytes \(at most 8192 per request\)"):
            dev._call({"op": "read", "offset": 0, "length": 3 * 4096})
        for _ in range(GEOMETRY.zone_capacity // 8192):
            dev._call({"op": "stage"}, bytes(8192))
        with pytest.raises(RemoteDeviceError, match="staged data beyond the zone capacity 49152"):
            dev._call({"op": "stage"}, bytes(8192))
        dev.write(0, bytes(4096))                       # the refused staging left nothing behind
        assert dev.zone(0).wp == 4096 and dev.read(0, 8192) == bytes(8192)
    finally:
        dev.close()
