"""One device-spec parser and one store opener for every command and face (retainz.jobs.stores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from retainz.errors import DeviceFormatError
from retainz.jobs import stores
from retainz.node import socket_path
from retainz.tier import state_path_for
from retainz.zoned import Geometry, parse_device

ROOT = Path(__file__).resolve().parents[2]
GEOMETRY = Geometry(nr_zones=16, zone_size=1 << 20, zone_capacity=1 << 20)


@pytest.mark.parametrize("text, kind, path", [
    ("dev.img", "file", "dev.img"),
    ("file:dev.img", "file", "dev.img"),
    ("file:/dev/shm/x.img", "file", "/dev/shm/x.img"),
    ("/dev/nvme0n1", "zbd", "/dev/nvme0n1"),
    ("zbd:/dev/nvme0n1", "zbd", "/dev/nvme0n1"),
    ("mem:zones=8", "mem", ""),
    ("mem", "mem", ""),
    ("remote:socket=/tmp/s.sock", "remote", ""),
])
def test_every_spec_form_parses_to_its_kind_and_path(text, kind, path):
    spec = parse_device(text)
    assert (spec.kind, spec.path, spec.text) == (kind, path, text)
    assert spec.persistent == (kind != "mem")


@pytest.mark.parametrize("text", ["file:", "zbd:"])
def test_a_prefix_without_a_path_is_refused(text):
    with pytest.raises(DeviceFormatError, match=f"no path after {text}"):
        parse_device(text)


def test_zbd_and_dev_name_one_block_device_everywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("RETAINZ_RUN_DIR", str(tmp_path))
    # the node service's socket, the tier's settings file: one answer for both spellings
    assert socket_path("zbd:/dev/nullb0") == socket_path("/dev/nullb0") == str(tmp_path / "nullb0.sock")
    assert state_path_for("zbd:/dev/nullb0") is None and state_path_for("/dev/nullb0") is None
    assert parse_device("zbd:/dev/nullb0").key == parse_device("/dev/nullb0").key
    assert stores.present("zbd:/dev/nullb0")


def test_file_prefix_names_the_same_device_file(tmp_path):
    dev = tmp_path / "d.img"
    assert socket_path(f"file:{dev}") == socket_path(str(dev)) == f"{dev}.sock"
    assert state_path_for(f"file:{dev}") == f"{dev}.tier.json"
    with stores.using(str(dev), geometry=GEOMETRY) as a, stores.using(f"file:{dev}") as b:
        assert a is b                     # one store per device in a process, whatever the spelling
        assert stores.open_count() == 1
    assert stores.open_count() == 0


def test_a_zbd_spec_is_never_taken_for_a_file_to_create(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = f"zbd:{tmp_path}/nullb9"
    with pytest.raises(FileNotFoundError, match="no such block device"):
        with stores.using(missing, geometry=GEOMETRY, wait=0):
            pass
    assert list(tmp_path.iterdir()) == []          # no device file "zbd:..." made on the way
    assert stores.open_count() == 0


def test_a_blank_mem_device_is_formatted_by_the_opener():
    store = stores.open_store("mem:zones=16,zone_size=1MiB")
    try:
        assert store.generations() == [] and store.device.geometry.nr_zones == 16
    finally:
        stores.close_store(store)


def test_serve_reads_a_zbd_spec_as_a_block_device(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), RETAINZ_RUN_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "retainz.cli", "serve", f"zbd:{tmp_path}/nullb9"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "no such block device" in r.stderr and "device file" not in r.stderr


# -- a process that opened a device serves it to the others (issue 42.5) ------------------------------

def _device(tmp_path) -> str:
    from retainz.store import Store
    from retainz.zoned import FileDevice

    path = str(tmp_path / "dev.img")
    with FileDevice.create(path, GEOMETRY) as dev:
        Store.format(dev).close()
    return path


def _python(code: str, **env) -> subprocess.CompletedProcess:
    import textwrap

    run_env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", **env)
    run_env.pop("RETAINZ_JOB", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env=run_env)


#: Another process writes generation ``ID`` (one shard ``a``: 5000 bytes of ``x``) through ``using``, 2 s wait.
_WRITE = """
    from retainz.jobs import stores
    with stores.using({dev!r}, wait=2) as s:
        print(type(s).__name__)
        w = s.begin_generation({gen!r}, 1)
        w.write_shard("a", [b"x" * 5000])
        w.commit()
"""


def test_a_process_that_opened_a_device_serves_it_to_another_process(tmp_path):
    """A process that holds a device through ``using`` (one rank, the store itself) no longer blocks
    another process that wants it: the other becomes the client of the service the holder runs on the
    device's socket and writes a generation the holder sees at once; the holder's last release closes
    the service and the device (socket gone, lock free).  Before, the other process waited ``wait``
    seconds and failed ``device busy``."""
    from retainz.store import Store
    from retainz.zoned import FileDevice

    dev = _device(tmp_path)
    with stores.using(dev, wait=0) as store:
        assert isinstance(store, Store)                  # this process: the store itself, no socket hop
        assert os.path.exists(socket_path(dev))
        r = _python(_WRITE.format(dev=dev, gen="from-other"))
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.split() == ["NodeStore"]
        assert [g.id for g in store.generations()] == ["from-other"]
        assert b"".join(store.read_shard("from-other", "a")) == b"x" * 5000
    assert stores.open_count() == 0 and not os.path.exists(socket_path(dev))
    with FileDevice(dev) as d, Store.open(d) as s:          # the lock is free, the journal whole
        assert [g.id for g in s.generations()] == ["from-other"] and s.fsck().ok


def test_a_device_opened_without_serving_keeps_other_processes_waiting(tmp_path):
    """``serve=False`` (the mount serves its device itself, with its own access rules): no socket, and
    another process times out ``device busy``, as every holder did before."""
    dev = _device(tmp_path)
    with stores.using(dev, wait=0, serve=False):
        assert not os.path.exists(socket_path(dev))
        r = _python(_WRITE.format(dev=dev, gen="g"))
        assert "TimeoutError" in r.stderr and "device busy in another process for 2 s" in r.stderr, r.stderr[-2000:]
    assert stores.open_count() == 0


#: Another process connects (prints the store's type), waits for a line on stdin, then commits ``late``.
_LATE = """
import sys
from retainz.jobs import stores
s = stores.open_store({dev!r})
print(type(s).__name__, flush=True)
sys.stdin.readline()
w = s.begin_generation("late", 2)
w.write_shard("a", [b"y" * 3000])
w.commit()
stores.close_store(s)
print("CHILD DONE", flush=True)
"""


def test_a_holder_releasing_while_another_process_is_connected_serves_it_until_that_one_leaves(tmp_path):
    """The holder's last user releases the device while another process's client is still connected: the
    device stays open and served (the client's later commit lands), and closes once that client has left
    (socket gone, lock free), the holder still running."""
    dev = _device(tmp_path)
    r = _python(f"""
        import os, subprocess, sys, time
        from retainz.jobs import stores
        from retainz.node import socket_path
        from retainz.zoned import FileDevice
        dev = {dev!r}
        child = subprocess.Popen([sys.executable, "-c", {_LATE.format(dev=dev)!r}], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        with stores.using(dev) as store:
            print(child.stdout.readline().strip())          # connected
        print("served after release:", os.path.exists(socket_path(dev)))
        child.stdin.write("go\\n")
        child.stdin.flush()
        print(child.stdout.readline().strip())
        child.wait()
        end = time.monotonic() + 10
        while os.path.exists(socket_path(dev)) and time.monotonic() < end:
            time.sleep(0.02)
        FileDevice(dev).close()                             # the lock is free: this would raise busy
        print("closed after it left:", not os.path.exists(socket_path(dev)), stores.open_count())
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:4] == ["NodeStore", "served after release: True", "CHILD DONE",
                                        "closed after it left: True 0"], r.stdout
    from retainz.store import Store
    from retainz.zoned import FileDevice

    with FileDevice(dev) as d, Store.open(d) as s:
        assert [g.id for g in s.generations()] == ["late"] and s.fsck().ok
        assert b"".join(s.read_shard("late", "a")) == b"y" * 3000


def test_share_after_a_direct_use_is_a_client_of_the_process_own_service(tmp_path):
    """In one process, ``share`` (a rank of a job) after a direct use of the device gets a client of the
    process's own service, never a second open of the device: what it commits is in the store the
    direct user holds.  The device is then held until exit (more ranks may come) and closed clean."""
    dev = _device(tmp_path)
    r = _python(f"""
        import os
        from retainz.jobs import stores
        from retainz.node import NodeStore, socket_path
        from retainz.store import Store
        dev = {dev!r}
        with stores.using(dev) as store:
            assert isinstance(store, Store)
            with stores.using(dev, share=True) as client:
                assert isinstance(client, NodeStore)
                w = client.begin_generation("via-own-client", 1)
                w.write_shard("a", [b"z" * 100])
                w.commit()
            print([g.id for g in store.generations()])
        print("held until exit:", os.path.exists(socket_path(dev)))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["['via-own-client']", "held until exit: True"], r.stdout
    assert not os.path.exists(socket_path(dev))
    from retainz.store import Store
    from retainz.zoned import FileDevice

    with FileDevice(dev) as d, Store.open(d) as s:
        assert [g.id for g in s.generations()] == ["via-own-client"] and s.fsck().ok
