"""The mount's edges (issue 27, items 3, 5 and 6) through the kernel: names the store cannot keep are
refused at the call that creates them; a device already held is refused at once and no server stays
behind; SIGINT/SIGTERM of a foreground server unmount cleanly (exit 0), also during a copy into the
mount; near a full device every call that returned success corresponds to data present after a
remount and every refused one got an errno; fsync of a directory works; readers of a file being
replaced see the committed version until the new one commits."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("fsspec", reason="the mount extra (make setup-mount)")

from tests.interrupts import default_sigint  # noqa: E402
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


# -- 5(a) names ------------------------------------------------------------------------------------------
def _errno_of(fn) -> int:
    try:
        fn()
    except OSError as e:
        return e.errno
    return 0


def test_names_the_store_cannot_keep_are_refused_at_creation(tmp_path):
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    with mounted(device, tmp_path / "mnt") as mnt:
        # "@" + 251 bytes + "#99" = 255: the longest file name at the top level
        (mnt / ("a" * 251)).write_bytes(b"kept")
        cases = {
            "file, id over 255 bytes": lambda: open(mnt / ("b" * 252), "wb").close(),
            "file, multibyte": lambda: open(mnt / ("é" * 126), "wb").close(),     # 252 bytes of UTF-8
            "file, escapes": lambda: open(mnt / ("%" * 90), "wb").close(),        # %25 each: 270 bytes
            "directory": lambda: os.mkdir(mnt / ("d" * 253)),
            "rename": lambda: os.rename(mnt / ("a" * 251), mnt / ("c" * 252)),
        }
        got = {what: _errno_of(fn) for what, fn in cases.items()}
        assert got == dict.fromkeys(cases, errno.ENAMETOOLONG)
        os.mkdir(mnt / "run")
        os.mkdir(mnt / "run" / "checkpoint-1")
        # a shard name (the path inside the checkpoint) over 255 bytes
        assert _errno_of(lambda: open(mnt / "run" / "checkpoint-1" / ("s" * 256), "wb").close()) == \
            errno.ENAMETOOLONG
        # not UTF-8
        bad = os.fsencode(str(mnt)) + b"/x\xff\xfe"
        assert _errno_of(lambda: os.close(os.open(bad, os.O_CREAT | os.O_WRONLY))) == errno.EINVAL
        names = sorted(os.listdir(mnt))
        assert names == ["a" * 251, "run"]
    after = paths(device)
    assert sorted(after) == ["a" * 251]              # nothing accepted then dropped at unmount
    assert fsck_clean(device)


# -- 5(c) a held device ---------------------------------------------------------------------------------
def test_a_second_mount_is_refused_at_once_and_leaves_no_server(tmp_path):
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    other = tmp_path / "other"
    other.mkdir()
    with mounted(device, tmp_path / "mnt") as mnt:
        (mnt / "f").write_bytes(b"x")
        r = retainz("mount", device, str(other), check=False, timeout=30)
        assert r.returncode == 1
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and "the device is in use" in err[0] and str(mnt) in err[0]
        r = retainz("mount", device, str(other), "--foreground", check=False, timeout=30)
        assert r.returncode == 1 and "the device is in use" in r.stderr
        # the detached server of the refused mount is gone: nothing of it runs
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert f"{other} --foreground" not in ps
    from retainz.mount.runner import is_mounted

    assert not is_mounted(str(other))                # never mounts itself later
    assert sorted(paths(device)) == ["f"]


# -- 5(e) and 3: signals --------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_unmounts_a_foreground_server_cleanly(tmp_path, sig):
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    mnt = tmp_path / "mnt"
    proc = serve_foreground(device, mnt)
    try:
        (mnt / "kept.bin").write_bytes(b"k" * 100_000)
        os.makedirs(mnt / "run" / "step-1")
        (mnt / "run" / "step-1" / "model.pt").write_bytes(b"m" * 5000)   # commit point: closed
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    from retainz.mount.runner import is_mounted

    assert proc.returncode == 0, err.decode()[-1000:]
    assert "Traceback" not in err.decode() and "error: 8" not in err.decode()
    assert not is_mounted(str(mnt))
    got = paths(device)
    assert sorted(got) == ["kept.bin", "run/step-1"]
    assert fsck_clean(device)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_copy_into_the_mount_interrupted(tmp_path, sig):
    """A copy killed by a signal: what was committed before it is intact; the file it was writing
    is absent or a prefix of the source (what it had written when killed), never garbage."""
    device = make_device(tmp_path, zones=48, zone_size="4MiB")
    src = tmp_path / "big.bin"
    data = random.Random(1).randbytes(60 << 20)
    src.write_bytes(data)
    with mounted(device, tmp_path / "mnt") as mnt:
        (mnt / "before.bin").write_bytes(data[:1 << 20])
        cp = subprocess.Popen(["dd", f"if={src}", f"of={mnt}/copy.bin", "bs=1M", "status=none"],
                              preexec_fn=default_sigint)
        while not (mnt / "copy.bin").exists() or os.stat(mnt / "copy.bin").st_size < (8 << 20):
            assert cp.poll() is None, "the copy ended before it could be interrupted"
        cp.send_signal(sig)
        cp.wait(timeout=60)
        assert cp.returncode == -sig
    got = paths(device)
    assert "before.bin" in got
    from retainz.jobs import stores

    with stores.using(device, wait=30) as store:
        assert b"".join(store.read_shard(got["before.bin"].id, "file")) == data[:1 << 20]
        if "copy.bin" in got:
            copied = b"".join(store.read_shard(got["copy.bin"].id, "file"))
            assert data.startswith(copied)
    assert fsck_clean(device)


# -- 6 near a full device -------------------------------------------------------------------------------
def _attempt(calls: list, fn) -> bool:
    try:
        fn()
    except OSError as e:
        calls.append(e.errno)
        return False
    return True


def _write_file(path, data: bytes, *, fsync: bool) -> int:
    """Write a file; 0 on success, else the errno of the first call that failed (open, write,
    fsync or close: the descriptor is closed whatever happens)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    except OSError as e:
        return e.errno
    failed = 0
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:1 << 20]):]
        if fsync:
            os.fsync(fd)
    except OSError as e:
        failed = e.errno
    try:
        os.close(fd)
    except OSError as e:
        failed = failed or e.errno
    return failed


def test_filling_with_small_files_loses_nothing_acknowledged(tmp_path):
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    rnd = random.Random(2)
    ok: dict[str, bytes] = {}
    refused: dict[str, int] = {}
    data_of: dict[str, bytes] = {}
    with mounted(device, tmp_path / "mnt") as mnt:
        for i in range(2000):
            name = f"f{i:04d}.bin"
            data = data_of[name] = rnd.randbytes(rnd.choice([100, 5000, 40_000, 200_000]))
            code = _write_file(mnt / name, data, fsync=i % 3 == 0)
            if code:
                refused[name] = code
                if len(refused) >= 20:
                    break
            else:
                ok[name] = data
        st = os.statvfs(mnt)
        avail = st.f_bavail * st.f_frsize
        fd = os.open(mnt, os.O_RDONLY)
        try:
            os.fsync(fd)                               # fsync of a directory works
        finally:
            os.close(fd)
    assert len(ok) > 20 and refused, (len(ok), refused)
    assert set(refused.values()) == {errno.ENOSPC}
    assert avail < 200_000 + 8192                      # df is honest: no room claimed that was refused
    got = paths(device)
    from retainz.jobs import stores

    with stores.using(device, wait=30) as store:
        for name, data in ok.items():
            assert name in got, f"{name} acknowledged and lost"
            assert b"".join(store.read_shard(got[name].id, "file")) == data
        for name in set(refused) & set(got):         # created, then refused: what was accepted
            assert data_of[name].startswith(b"".join(store.read_shard(got[name].id, "file")))
    assert fsck_clean(device)


def test_filling_with_hf_checkpoints_loses_nothing_acknowledged(tmp_path):
    """HF Trainer's save order until the device refuses: a checkpoint whose trainer_state.json
    closed with success is complete after remount; the one refused got ENOSPC and is absent."""
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    rnd = random.Random(3)
    committed: dict[str, dict[str, bytes]] = {}
    codes = []
    with mounted(device, tmp_path / "mnt") as mnt:
        for step in range(1, 40):
            ck = mnt / "run" / f"checkpoint-{step}"
            files = {"config.json": b'{"a": 1}', "model.safetensors": rnd.randbytes(1_500_000),
                     "optimizer.pt": rnd.randbytes(300_000), "scheduler.pt": b"s", "rng_state.pth": b"r",
                     "trainer_state.json": b'{"global_step": %d}' % step}
            try:
                os.makedirs(ck)
            except OSError as e:
                codes.append(e.errno)
                break
            failed = 0
            for name, data in files.items():
                failed = _write_file(ck / name, data, fsync=False)
                if failed:
                    break
            if failed:
                codes.append(failed)
                break
            committed[f"run/checkpoint-{step}"] = files
    assert committed and codes == [errno.ENOSPC], (len(committed), codes)
    got = paths(device)
    assert sorted(got) == sorted(committed)            # the refused checkpoint is absent, whole
    from retainz import ids
    from retainz.jobs import stores

    with stores.using(device, wait=30) as store:
        for root, files in committed.items():
            g = got[root]
            assert {ids.shard_path(s) for s in g.shards} == set(files)
            for name, data in files.items():
                assert b"".join(store.read_shard(g.id, ids.shard_name(name))) == data
    assert fsck_clean(device)


def test_a_step_folder_whose_write_was_refused_is_absent_after_unmount(tmp_path):
    """Issue 41.4's reproduction through the kernel: ``step-2/model.pt`` (100 MiB, torch.save's
    order: one file, 1 MiB writes) refused with ENOSPC part way was committed at unmount and ``get``
    called its prefix verified; filling the mount committed step folders of 0-byte files.  Now the
    refused write's errno is also the close's, the folder leaves the listing at once, every later
    refused save likewise, and after unmount only the saves whose calls all succeeded exist."""
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    with mounted(device, tmp_path / "mnt") as mnt:
        (mnt / "run" / "step-1").mkdir(parents=True)
        assert _write_file(mnt / "run/step-1/model.pt", b"1" * 100_000, fsync=False) == 0
        (mnt / "run" / "step-2").mkdir()
        fd = os.open(mnt / "run/step-2/model.pt", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        written, block = 0, b"m" * (1 << 20)
        with pytest.raises(OSError) as e:
            while written < 100 << 20:
                written += os.write(fd, block)
        assert e.value.errno == errno.ENOSPC and 4 << 20 < written < 16 << 20
        with pytest.raises(OSError) as e:
            os.close(fd)
        assert e.value.errno == errno.ENOSPC
        assert os.listdir(mnt / "run/step-2") == []
        codes = {}
        for step in range(3, 30):             # a runtime that carries on (the refused save's space is back)
            (mnt / "run" / f"step-{step}").mkdir()
            codes[step] = _write_file(mnt / f"run/step-{step}/model.pt", b"x" * (3 << 20), fsync=False)
    ok = [f"run/step-{s}" for s, code in codes.items() if code == 0]
    assert ok and set(codes.values()) == {0, errno.ENOSPC}, codes
    got = paths(device)
    assert sorted(got) == sorted(["run/step-1", *ok])      # no refused save, no 0-byte file
    assert all(g.shards["model.pt"].size == 3 << 20 for p, g in got.items() if p != "run/step-1")
    assert fsck_clean(device)


def test_readers_see_the_committed_version_until_the_replacement_commits(tmp_path):
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    with mounted(device, tmp_path / "mnt") as mnt:
        (mnt / "latest").write_bytes(b"old version\n")
        w = open(mnt / "latest", "wb")
        try:
            w.write(b"NEW, not committed")
            w.flush()
            # another process (a cat spawned meanwhile: its close-on-exec of the inherited
            # descriptor must not commit the half-written file either)
            seen = subprocess.run(["cat", str(mnt / "latest")], capture_output=True).stdout
            assert seen == b"old version\n"
            assert os.stat(mnt / "latest").st_size == len(b"old version\n")
        finally:
            w.close()
        seen = subprocess.run(["cat", str(mnt / "latest")], capture_output=True).stdout
        assert seen == b"NEW, not committed"


def test_fsync_of_a_checkpoint_directory_commits_it(tmp_path):
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    code = (
        "import os, sys\n"
        "d = os.path.join(sys.argv[1], 'run', 'step-3')\n"
        "os.makedirs(d)\n"
        "open(os.path.join(d, 'model.pt'), 'wb').write(b'w' * 1000)\n"
        "fd = os.open(d, os.O_RDONLY); os.fsync(fd); os.close(fd)\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.close(fd)\n"
        "os.kill(int(sys.argv[2]), 9)\n"               # the server dies: no unmount commit
    )
    mnt = tmp_path / "mnt"
    proc = serve_foreground(device, mnt)
    try:
        r = subprocess.run([sys.executable, "-c", code, str(mnt), str(proc.pid)], capture_output=True, text=True,
                           env=env(), timeout=120)
        assert r.returncode == 0, r.stderr
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
    assert sorted(paths(device)) == ["run/step-3"]


def test_a_checkpoint_whose_commit_point_never_came_is_named_by_umount(tmp_path):
    """Issue 44: a ``checkpoint-N/`` folder written without ``trainer_state.json`` (HF Trainer's
    completion marker) was dropped at unmount with only a line in the server's log, while the docs
    said checkpoints commit at a clean unmount.  Such a folder is an unfinished save: it is dropped,
    as after a crash of the server, and ``retainz umount`` names it and why (with the way to commit
    a folder written without the marker: ``fsync`` of the directory); likewise a DCP folder without
    ``.metadata``, an unfinished re-save (its committed version stays) and a checkpoint whose write
    failed (never committed, issue 41.4).  A folder fsync'ed without its marker is committed."""
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    mnt = tmp_path / "mnt"
    os.makedirs(mnt)
    retainz("mount", device, str(mnt))
    try:
        (mnt / "run" / "checkpoint-2").mkdir(parents=True)          # a complete HF save
        (mnt / "run/checkpoint-2/model.safetensors").write_bytes(b"m2" * 1000)
        (mnt / "run/checkpoint-2/trainer_state.json").write_bytes(b'{"global_step": 2}')
        (mnt / "run" / "checkpoint-4").mkdir()                       # its marker never comes
        (mnt / "run/checkpoint-4/model.safetensors").write_bytes(b"m4" * 1000)
        (mnt / "run/checkpoint-4/optimizer.pt").write_bytes(b"o4" * 3000)
        (mnt / "dcp" / "step-9").mkdir(parents=True)                 # DCP without .metadata
        (mnt / "dcp/step-9/__0_0.distcp").write_bytes(b"d" * 5000)
        (mnt / "mine" / "checkpoint-7").mkdir(parents=True)          # no marker, but fsync'ed: committed
        (mnt / "mine/checkpoint-7/weights.pt").write_bytes(b"w" * 4000)
        fd = os.open(mnt / "mine/checkpoint-7", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        (mnt / "run/checkpoint-2/model.safetensors").write_bytes(b"NEW" * 10)   # a re-save, unfinished
        (mnt / "run" / "checkpoint-6").mkdir()                       # a write failed: never kept (41.4)
        (mnt / "run/checkpoint-6/config.json").write_bytes(b"{}")
        with open(mnt / "run/checkpoint-6/model.safetensors", "wb") as f:
            f.write(b"x")
            f.seek(300 << 20)                                        # past the hole limit: EFBIG
            with pytest.raises(OSError) as e:
                f.write(b"y")
                f.flush()
            assert e.value.errno == errno.EFBIG
            with pytest.raises(OSError):
                f.close()
    finally:
        r = retainz("umount", str(mnt))
    said = r.stdout.splitlines()
    refused = [line for line in said if line.startswith("dropped run/checkpoint-6/ (")]
    assert len(refused) == 1 and "a call on one of its files failed (" in refused[0] \
        and refused[0].endswith("a checkpoint any of whose writes failed never commits"), said
    said.remove(refused[0])
    hf = "HF Trainer closes trainer_state.json, the last file _save_checkpoint writes"
    dcp = "DCP closes (or renames .metadata.tmp to) .metadata, written after every data file"
    tail = "; fsync of the directory commits a folder written without that marker"
    assert sorted(said) == sorted([
        f"dropped run/checkpoint-2/ (1 file): its commit point never came ({hf}): an unfinished save, absent as "
        f"after a crash; its committed version stays{tail}",
        f"dropped run/checkpoint-4/ (2 files): its commit point never came ({hf}): an unfinished save, absent as "
        f"after a crash{tail}",
        f"dropped dcp/step-9/ (1 file): its commit point never came ({dcp}): an unfinished save, absent as after "
        f"a crash{tail}",
    ]), r.stdout
    from retainz import ids
    from retainz.jobs import stores

    got = paths(device)
    assert sorted(got) == ["mine/checkpoint-7", "run/checkpoint-2"]
    with stores.using(device, wait=30) as store:
        def read(path, name):
            return b"".join(store.read_shard(got[path].id, ids.shard_name(name)))
        assert read("run/checkpoint-2", "model.safetensors") == b"m2" * 1000
        assert read("mine/checkpoint-7", "weights.pt") == b"w" * 4000
    assert fsck_clean(device)


def test_a_relative_mount_point_gets_the_mounts_read_ahead(tmp_path):
    """Issue 44.8: libfuse changes the server's working directory to "/", so a mount point given as a
    relative path (``retainz mount dev.img ckpt``, as the README and ``make bench`` do) was never found
    by the thread that raises the mount's read-ahead: sequential reads came in the kernel's 128 KiB
    requests.  Its bdi's ``read_ahead_kb`` is the mount's :data:`READ_AHEAD` whatever the paths."""
    from retainz.mount.fs import READ_AHEAD
    from retainz.mount.runner import is_mounted

    make_device(tmp_path, zones=16, zone_size="1MiB")
    os.makedirs(tmp_path / "ckpt")
    run = [sys.executable, "-m", "retainz.cli"]
    subprocess.run([*run, "mount", "dev.img", "ckpt"], cwd=tmp_path, env=env(), check=True, timeout=120)
    try:
        dev = os.stat(tmp_path / "ckpt").st_dev
        path = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
        deadline = time.monotonic() + 30         # the server raises it once the mount point is mounted
        while int(open(path).read()) != READ_AHEAD >> 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert int(open(path).read()) == READ_AHEAD >> 10
        (tmp_path / "ckpt" / "a.bin").write_bytes(b"a" * 5000)
    finally:
        if is_mounted(str(tmp_path / "ckpt")):
            subprocess.run([*run, "umount", "ckpt"], cwd=tmp_path, env=env(), check=True, timeout=120)
    assert sorted(paths(str(tmp_path / "dev.img"))) == ["a.bin"]
    assert not os.path.exists(tmp_path / "dev.img.sock")
