"""The mount is a node service too (issue 27 item 5(d), issue 29 item 3): while ``retainz mount DEV MNT``
holds the device it serves ``DEV.sock`` over its own store, so the store commands, ``ZonedStorageWriter``
and ``retainz://`` of other processes use the mounted device, and what they commit shows under the mount
point by the time their commit returns; the socket goes away at unmount.  A mount that is the client of a
``retainz serve`` unmounts without waiting for the device lock the service keeps."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

pytest.importorskip("fsspec", reason="the mount extra (make setup-mount)")

from tests.mountcheck import (  # noqa: E402
    env,
    fsck_clean,
    make_device,
    mounted,
    paths,
    require_fuse,
    retainz,
    serve_foreground,
)

pytestmark = pytest.mark.mount


@pytest.fixture(autouse=True)
def _fuse():
    require_fuse()


def _sock(device: str) -> str:
    from retainz.node import socket_path

    return socket_path(device)


def _tree(mnt) -> dict[str, bytes]:
    """``{relative path: bytes}`` of every file under the mount point, read through the kernel."""
    out = {}
    for root, _, files in os.walk(mnt):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, mnt)] = fh.read()
    return out


def test_store_commands_work_on_a_mounted_device_and_the_mount_shows_their_changes(tmp_path):
    device = make_device(tmp_path, zones=32, zone_size="1MiB")
    model = os.urandom(3_000_000)
    src = tmp_path / "in"
    src.mkdir()
    (src / "weights.bin").write_bytes(os.urandom(1_500_000))
    with mounted(device, tmp_path / "mnt") as mnt:
        sock = _sock(device)
        st = os.stat(sock)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600    # as retainz serve makes it
        os.makedirs(mnt / "run" / "step-1")
        (mnt / "run" / "step-1" / "model.pt").write_bytes(model)
        fd = os.open(mnt / "run" / "step-1", os.O_RDONLY)
        try:
            os.fsync(fd)                      # a directory without a commit point of its own commits here
        finally:
            os.close(fd)
        (mnt / "notes.txt").write_bytes(b"n" * 10)    # committed at close

        listing = json.loads(retainz("ls", device, "--json").stdout)
        assert sorted((g["id"], g["size"]) for g in listing) == [("@notes.txt", 10), ("run%2Fstep-1", 3_000_000)]
        df = json.loads(retainz("df", device, "--json").stdout)
        assert df["generations"] == 2 and df["used"] >= 3_000_010
        r = retainz("fsck", device)
        assert r.stdout.splitlines()[-1] == "clean" and "2 generations, 2 shards" in r.stdout
        retainz("get", device, "run%2Fstep-1", "-o", str(tmp_path / "out"))
        assert (tmp_path / "out" / "model.pt").read_bytes() == model

        # a put from another process shows under the mount, byte for byte; an rm takes it away
        assert "run%2Fstep-2: 1 shard" in retainz("put", device, "run%2Fstep-2", str(src / "weights.bin"),
                                                  "--step", "2").stdout
        assert sorted(os.listdir(mnt / "run")) == ["step-1", "step-2"]
        assert (mnt / "run" / "step-2" / "weights.bin").read_bytes() == (src / "weights.bin").read_bytes()
        assert "@notes.txt: deleted" in retainz("rm", device, "@notes.txt").stdout
        assert sorted(os.listdir(mnt)) == ["run"]
        assert _tree(mnt) == {"run/step-1/model.pt": model,
                              "run/step-2/weights.bin": (src / "weights.bin").read_bytes()}

        # what needs the device itself still says where it is mounted and by which pid, in one line
        from retainz.mount.runner import lock_holders

        pids = lock_holders(device)
        assert len(pids) == 1
        for args in (["mkfs", device, "--force"], ["fsck", device, "--repair"], ["serve", device]):
            r = retainz(*args, check=False)
            line = r.stderr.strip()
            assert r.returncode == 1 and "\n" not in line, (args, r.stderr)
            assert f"it is mounted at {mnt} (retainz mount, pid {pids[0]})" in line and "retainz umount" in line, line
    assert not os.path.exists(sock)           # gone at unmount
    assert sorted(paths(device)) == ["run/step-1", "run/step-2"]
    assert fsck_clean(device)


_SAVE = r"""
import hashlib, json, sys
import torch
import torch.distributed.checkpoint as dcp

device, how, ckpt = sys.argv[1:4]
sd = {"w": torch.arange(400_000, dtype=torch.float32).reshape(800, 500) * (1 + len(ckpt)),
      "b": torch.full((3000,), float(len(ckpt)))}
if how == "zoned":
    from retainz.integrations.dcp import ZonedStorageWriter
    from retainz.jobs import stores

    dcp.save(sd, storage_writer=ZonedStorageWriter(device, series="run"), checkpoint_id=ckpt)
    gid = "run%2F" + ckpt
else:
    import fsspec

    dcp.save(sd, checkpoint_id=f"retainz://{device}/{ckpt}")
    fsspec.filesystem("retainz").close_devices()
    gid = ckpt.replace("/", "%2F")
from retainz.node import NodeStore

with NodeStore.connect(device, job="*") as store:      # what the service committed, read back through it
    g = store.generation(gid)
    print(json.dumps({s: hashlib.sha256(b"".join(store.read_shard(gid, s))).hexdigest() for s in g.shards}))
"""


def _save_elsewhere(device: str, how: str, ckpt: str) -> dict[str, str]:
    """A DCP save by another process (``ZonedStorageWriter`` or DCP's ``FsspecWriter`` on ``retainz://``)
    to the mounted device; returns ``{shard: sha256}`` of what it committed."""
    job = {"RETAINZ_JOB": ckpt.rsplit("/", 1)[0]} if how == "fsspec" else {}   # its job, as docs/node.md says
    r = subprocess.run([sys.executable, "-c", _SAVE, device, how, ckpt], capture_output=True, text=True,
                       env={**env(), "OMP_NUM_THREADS": "1", **job}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("how,ckpt,folder", [("zoned", "step-5", "run/step-5"),
                                             ("fsspec", "fs/step-6", "fs/step-6")])
def test_another_process_s_dcp_save_appears_under_the_mount(tmp_path, how, ckpt, folder):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    device = make_device(tmp_path, zones=32, zone_size="4MiB")
    with mounted(device, tmp_path / "mnt") as mnt:
        (mnt / "before.txt").write_bytes(b"b")
        committed = _save_elsewhere(device, how, ckpt)
        assert ".metadata" in committed and "__0_0.distcp" in committed
        # under the mount by the time the save returned: every file, byte for byte
        files = {f: hashlib.sha256((mnt / folder / f).read_bytes()).hexdigest() for f in os.listdir(mnt / folder)}
        assert files == committed
        assert sorted(os.listdir(mnt)) == sorted(["before.txt", folder.split("/")[0]])
        # and it loads: a retainz:// save from the mount with DCP's own file system reader; a
        # ZonedStorageWriter save (its .metadata names ZonedLocations, not files) with ZonedStorageReader,
        # through the mount's socket
        sd = {"w": torch.zeros(800, 500), "b": torch.zeros(3000)}
        if how == "fsspec":
            dcp.load(sd, storage_reader=FileSystemReader(str(mnt / folder)))
        else:
            from retainz.integrations.dcp import ZonedStorageReader
            from retainz.jobs import stores

            dcp.load(sd, storage_reader=ZonedStorageReader(device, series="run"), checkpoint_id=ckpt)
            assert stores.open_count() == 0
        assert torch.equal(sd["w"], torch.arange(400_000, dtype=torch.float32).reshape(800, 500) * (1 + len(ckpt)))
        assert torch.equal(sd["b"], torch.full((3000,), float(len(ckpt))))
    assert sorted(paths(device)) == sorted(["before.txt", folder])
    assert fsck_clean(device)


def test_umount_of_a_mount_served_by_retainz_serve_returns_without_waiting_for_its_lock(tmp_path):
    from retainz.mount.runner import is_mounted
    from tests.node.test_node import start_service, stop_service

    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    svc = start_service(device, tmp_path / "service.log")
    try:
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        retainz("mount", device, str(mnt), timeout=60)      # the service's client
        (mnt / "f.bin").write_bytes(b"f" * 70_000)
        # another client's commit shows under it at its next refresh (CLIENT_REFRESH; bounded wait)
        (tmp_path / "g.bin").write_bytes(b"g" * 3000)
        retainz("put", device, "other%2Fstep-3", str(tmp_path / "g.bin"), "--step", "3")
        deadline = time.monotonic() + 60
        while "other" not in os.listdir(mnt) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (mnt / "other" / "step-3" / "g.bin").read_bytes() == b"g" * 3000
        retainz("rm", device, "other%2Fstep-3")
        deadline = time.monotonic() + 60
        while "other" in os.listdir(mnt) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(os.listdir(mnt)) == ["f.bin"]
        # bounded well below the 120 s the device lock would take (the service keeps it)
        r = retainz("umount", str(mnt), timeout=30)
        assert r.returncode == 0 and not is_mounted(str(mnt))
        assert svc.poll() is None and stat.S_ISSOCK(os.stat(_sock(device)).st_mode)   # the service serves on
        listing = json.loads(retainz("ls", device, "--json").stdout)     # through the service
        assert [(g["id"], g["size"]) for g in listing] == [("@f.bin", 70_000)]
        # a second mount while the first is mounted through the service is refused in one line
        retainz("mount", device, str(mnt), timeout=60)
        other = tmp_path / "other"
        other.mkdir()
        r = retainz("mount", device, str(other), check=False, timeout=30)
        err = r.stderr.strip()
        assert r.returncode == 1 and "\n" not in err and f"already mounted at {mnt}" in err, err
        retainz("umount", str(mnt), timeout=30)
    finally:
        stop_service(svc)
    assert sorted(paths(device)) == ["f.bin"]


def test_a_killed_mount_s_stale_socket_is_replaced_and_the_access_flags_reach_the_socket(tmp_path):
    from retainz.mount.runner import is_mounted

    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    sock = _sock(device)
    mnt = tmp_path / "mnt"
    proc = serve_foreground(device, mnt)
    try:
        os.makedirs(mnt / "jobs" / "x" / "step-1")
        (mnt / "jobs" / "x" / "step-1" / "__0_0.distcp").write_bytes(b"d" * 1000)
        (mnt / "jobs" / "x" / "step-1" / ".metadata").write_bytes(b"m")        # DCP's commit point
        (mnt / "own.txt").write_bytes(b"o")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert stat.S_ISSOCK(os.stat(sock).st_mode)            # left behind by the killed server
    retainz("umount", str(mnt), timeout=30)                 # the stale mount
    assert not is_mounted(str(mnt))
    # nobody listens: the commands open the device directly
    assert sorted(g["id"] for g in json.loads(retainz("ls", device, "--json").stdout)) == [
        "@own.txt", "jobs%2Fx%2Fstep-1"]
    with mounted(device, mnt, "--grant", "jobs/y=jobs/x") as m:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        e = {**env(), "RETAINZ_JOB": "jobs/y"}
        r = subprocess.run([sys.executable, "-m", "retainz.cli", "ls", device], capture_output=True, text=True,
                           env=e, timeout=120)
        assert r.returncode == 0 and r.stdout.split("\t")[0] == "jobs%2Fx%2Fstep-1", r.stderr   # granted, own.txt not
        r = subprocess.run([sys.executable, "-m", "retainz.cli", "rm", device, "@own.txt"], capture_output=True,
                           text=True, env=e, timeout=120)
        assert r.returncode == 1 and "may not" in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert sorted(os.listdir(m)) == ["jobs", "own.txt"]
    assert not os.path.exists(sock)


def test_the_mount_s_writes_and_another_process_s_saves_interleave_on_one_store(tmp_path):
    """One store, one placement decision stream: files written through the mount while another process
    saves DCP checkpoints through the mount's socket all commit, each byte for byte, fsck clean."""
    pytest.importorskip("torch")
    import threading

    device = make_device(tmp_path, zones=48, zone_size="4MiB")
    blobs = {f"data/f{i:02d}.bin": os.urandom(150_000 + 7_000 * i) for i in range(16)}
    blobs.update({f"data/big{i}.bin": os.urandom(6_000_000 + i) for i in range(3)})   # these stream (> 4 MiB)
    with mounted(device, tmp_path / "mnt") as mnt:
        os.makedirs(mnt / "data")
        errors = []

        def write_files():
            try:
                for p, b in blobs.items():
                    (mnt / p).write_bytes(b)
            except BaseException as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)
        t = threading.Thread(target=write_files)
        t.start()
        committed = {ckpt: _save_elsewhere(device, "zoned", ckpt) for ckpt in ("step-1", "step-2", "step-3")}
        t.join(timeout=300)
        assert not t.is_alive() and not errors, errors
        for p, b in blobs.items():
            assert (mnt / p).read_bytes() == b, p
        for ckpt, shards in committed.items():
            got = {f: hashlib.sha256((mnt / "run" / ckpt / f).read_bytes()).hexdigest()
                   for f in os.listdir(mnt / "run" / ckpt)}
            assert got == shards, ckpt
        r = retainz("fsck", device)             # through the mount's socket, while mounted
        assert r.stdout.splitlines()[-1] == "clean"
    assert sorted(paths(device)) == sorted([*blobs, "run/step-1", "run/step-2", "run/step-3"])
    assert fsck_clean(device)
