"""The rest of POSIX that checkpoint code uses, through the mount (issue 28.3), each compared with a
local directory where the local result is the rule: ``os.replace``/``rename`` of directories and files
over each other and their errnos, ``fsync`` of a file (it commits a file outside checkpoints: the server
killed right after keeps it), ``ls -l`` sizes and mtimes (HF's ``sort_checkpoints(use_mtime=True)`` in
commit order, also after a remount), ``EXDEV`` across the mount's boundary and ``shutil.move`` falling
back to a copy both ways, and ``df`` promising exactly what a new file can take.

Already tested elsewhere and not repeated here: ``torch.load(mmap=True)``, safetensors ``safe_open`` and
``numpy.memmap`` reads (tests/mount/test_mount_runtimes.py, tests/mount/test_mount.py), ``fsync`` of a directory,
``ENOSPC`` near a full device (tests/mount/test_mount_edges.py), ``statvfs`` after a commit
(tests/mount/test_mount.py).  ``EROFS``: neither face mounts a store read-only; a read-only store's refusal
is ``EROFS`` at the namespace (tests/namespace/test_namespace.py).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip("fsspec", reason="the mount extra (make setup-mount)")

from tests.mountcheck import env, fsck_clean, make_device, mounted, paths, require_fuse, serve_foreground  # noqa: E402

pytestmark = pytest.mark.mount


@pytest.fixture(autouse=True)
def _fuse():
    require_fuse()


def _outcome(fn) -> str:
    try:
        fn()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"


def _replace_sequence(root) -> list:
    """Renames of directories and files over each other, as checkpoint code makes them (HF 4.3x's
    ``tmp-checkpoint-N`` rename, ``os.replace`` of a state file, a retry over what a crash left), and
    the refusals POSIX gives; each step's result (``ok`` or the errno name), then the listing."""
    a = root / "run"
    os.makedirs(a / "checkpoint-1")
    (a / "checkpoint-1" / "model.pt").write_bytes(b"1" * 1000)
    (a / "checkpoint-1" / "trainer_state.json").write_bytes(b"{}")
    os.makedirs(a / "checkpoint-2")
    (a / "checkpoint-2" / "model.pt").write_bytes(b"2" * 1000)
    (a / "checkpoint-2" / "trainer_state.json").write_bytes(b"{}")
    os.makedirs(a / "tmp-checkpoint-3")                  # an empty directory left behind
    (a / "state.json").write_bytes(b"old")
    (a / "state.json.tmp").write_bytes(b"new")
    steps = {
        "dir over a non-empty dir": lambda: os.replace(a / "checkpoint-1", a / "checkpoint-2"),
        "dir over a file": lambda: os.replace(a / "checkpoint-1", a / "state.json"),
        "file over a dir": lambda: os.replace(a / "state.json", a / "tmp-checkpoint-3"),
        "dir into itself": lambda: os.rename(a / "checkpoint-2", a / "checkpoint-2" / "sub"),
        "dir over an empty dir": lambda: os.replace(a / "checkpoint-1", a / "tmp-checkpoint-3"),
        "file over a file": lambda: os.replace(a / "state.json.tmp", a / "state.json"),
        "a missing source": lambda: os.replace(a / "nothing", a / "state.json"),
        "dir onto itself": lambda: os.replace(a / "checkpoint-2", a / "checkpoint-2"),
        "rmdir of a non-empty dir": lambda: os.rmdir(a / "checkpoint-2"),
        "unlink of a dir": lambda: os.unlink(a / "checkpoint-2"),
        "mkdir of an existing dir": lambda: os.mkdir(a / "checkpoint-2"),
        "O_EXCL of an existing file": lambda: os.close(os.open(a / "state.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
        "a file as a parent": lambda: open(a / "state.json" / "x", "wb").close(),
    }
    out = [(what, _outcome(fn)) for what, fn in steps.items()]
    out.append(("listing", sorted(os.listdir(a))))
    out.append(("moved", (a / "tmp-checkpoint-3" / "model.pt").read_bytes()[:1]))
    out.append(("replaced", (a / "state.json").read_bytes()))
    return out


def test_replace_and_rename_as_a_local_directory(tmp_path):
    """os.replace/rename of directories and files over each other: every result and errno is the
    local directory's (ENOTEMPTY, ENOTDIR, EISDIR, EINVAL, EEXIST, ENOENT), and so is what is left;
    after a remount the renamed checkpoint is where the rename put it."""
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    (tmp_path / "local").mkdir()
    local = _replace_sequence(tmp_path / "local")
    with mounted(device, tmp_path / "mnt") as mnt:
        assert _replace_sequence(mnt) == local
    assert local[-3] == ("listing", ["checkpoint-2", "state.json", "tmp-checkpoint-3"])
    with mounted(device, tmp_path / "mnt") as mnt:
        assert (mnt / "run" / "tmp-checkpoint-3" / "model.pt").read_bytes() == b"1" * 1000
        assert sorted(os.listdir(mnt / "run")) == ["checkpoint-2", "state.json", "tmp-checkpoint-3"]
    assert fsck_clean(device)


_FSYNC = """
import os, sys
mnt = sys.argv[1]
os.makedirs(os.path.join(mnt, 'run', 'step-4'))
with open(os.path.join(mnt, 'run', 'log.jsonl'), 'wb') as f:      # a file of its own: fsync commits it
    f.write(b'{"step": 4}' * 100)
    f.flush()
    os.fsync(f.fileno())
    os.fsync(f.fileno())                                            # nothing new: still fine
    with open(os.path.join(mnt, 'run', 'step-4', 'model.pt'), 'wb') as g:    # a checkpoint's file
        g.write(b'w' * 70000)
        g.flush()
        os.fsync(g.fileno())                                        # reports no error; commits with step-4
        print('synced', flush=True)
        os.kill(int(sys.argv[2]), 9)                                # the server dies before any close
"""


def test_fsync_of_a_file_commits_it(tmp_path):
    """``os.fsync`` of a file outside checkpoints commits it at that call (the server killed before the
    close keeps it whole); ``fsync`` of a file of a checkpoint returns 0 and the checkpoint, which never
    reached its commit point, is absent."""
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    mnt = tmp_path / "mnt"
    proc = serve_foreground(device, mnt)
    try:
        r = subprocess.run([sys.executable, "-c", _FSYNC, str(mnt), str(proc.pid)], capture_output=True,
                           text=True, env=env(), timeout=120)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
    assert r.stdout.split() == ["synced"], r.stderr     # every fsync returned 0 (the closes after the
    #                                                     server died fail with ENOTCONN: not checked)
    assert sorted(paths(device)) == ["run/log.jsonl"]
    with mounted(device, mnt) as m:
        assert (m / "run" / "log.jsonl").read_bytes() == b'{"step": 4}' * 100
    assert fsck_clean(device)


def _ls_l(d) -> dict[str, int]:
    """``{name: size}`` from ``ls -l`` (what a user sees)."""
    out = subprocess.run(["ls", "-l", str(d)], capture_output=True, text=True, check=True).stdout
    return {f[-1]: int(f[4]) for f in (ln.split() for ln in out.splitlines()[1:])}


def test_ls_l_sizes_and_mtimes_in_commit_order(tmp_path):
    """``ls -l`` sizes are the bytes written; checkpoints written in the order 10, 2, 30 sort by mtime in
    that order (HF's ``sort_checkpoints(use_mtime=True)``, ``ls -t``), as on a local directory, and
    still after a remount (mtimes of earlier sessions are the commit order)."""
    from transformers.trainer_utils import sort_checkpoints

    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    sizes = {"model.safetensors": 150_001, "optimizer.pt": 300_000, "trainer_state.json": 17}

    def save(root):
        for step in (10, 2, 30):
            d = root / f"checkpoint-{step}"
            os.makedirs(d)
            for name, n in sizes.items():
                (d / name).write_bytes(bytes([step]) * n)
            time.sleep(0.6)         # HF trusts mtimes only when they span 1 s or more

    def order(root):
        return [os.path.basename(p) for p in sort_checkpoints(str(root), use_mtime=True)]

    (tmp_path / "local").mkdir()
    save(tmp_path / "local")
    want = order(tmp_path / "local")
    assert want == ["checkpoint-10", "checkpoint-2", "checkpoint-30"]
    with mounted(device, tmp_path / "mnt") as mnt:
        save(mnt)
        assert order(mnt) == want
        assert _ls_l(mnt / "checkpoint-2") == sizes == _ls_l(tmp_path / "local" / "checkpoint-2")
        assert all(os.stat(mnt / "checkpoint-30" / n).st_mtime_ns >= os.stat(mnt / "checkpoint-2").st_mtime_ns
                   for n in sizes)
    with mounted(device, tmp_path / "mnt") as mnt:
        assert order(mnt) == want
        assert _ls_l(mnt / "checkpoint-10") == sizes
        t = subprocess.run(["ls", "-t", str(mnt)], capture_output=True, text=True, check=True).stdout.split()
        assert t == want[::-1]
    assert fsck_clean(device)


def test_exdev_and_shutil_move_across_the_mount(tmp_path):
    """``rename(2)`` between the mount and another file system is ``EXDEV`` (the kernel's answer), and
    ``shutil.move`` falls back to copy-then-remove: a checkpoint moved out of the mount is whole on the
    local disk and retired from the store; one moved in commits as a generation."""
    device = make_device(tmp_path, zones=16, zone_size="1MiB")
    local = tmp_path / "local"
    os.makedirs(local / "checkpoint-7")
    (local / "checkpoint-7" / "model.pt").write_bytes(b"7" * 200_000)
    (local / "checkpoint-7" / "trainer_state.json").write_bytes(b'{"global_step": 7}')
    with mounted(device, tmp_path / "mnt") as mnt:
        os.makedirs(mnt / "run" / "checkpoint-5")
        (mnt / "run" / "checkpoint-5" / "model.pt").write_bytes(b"5" * 200_000)
        (mnt / "run" / "checkpoint-5" / "trainer_state.json").write_bytes(b'{"global_step": 5}')
        with pytest.raises(OSError) as e:
            os.rename(mnt / "run" / "checkpoint-5", local / "checkpoint-5")
        assert e.value.errno == errno.EXDEV
        shutil.move(mnt / "run" / "checkpoint-5", local / "checkpoint-5")
        shutil.move(local / "checkpoint-7", mnt / "run" / "checkpoint-7")
        assert os.listdir(mnt / "run") == ["checkpoint-7"]
    assert (local / "checkpoint-5" / "model.pt").read_bytes() == b"5" * 200_000
    assert not (local / "checkpoint-7").exists()
    gens = paths(device)
    assert sorted(gens) == ["run/checkpoint-7"] and sorted(gens["run/checkpoint-7"].shards) == [
        "model.pt", "trainer_state.json"]
    assert fsck_clean(device)


@pytest.mark.parametrize("where", ["file", "checkpoint"])
def test_df_promises_exactly_what_a_new_file_can_take(tmp_path, where):
    """``df`` (statvfs ``f_bavail``) on the mountpoint is what the store can still admit for a new file:
    a file of exactly that many bytes is written whole (streamed in 1 MiB writes), then ``df`` shows
    nothing left and one more block is ``ENOSPC`` at the write; the GC reserve is untouched.
    (It promised one block more than a file could take: every new generation keeps a block for its
    layout record, and the last 1 MiB write failed with ENOSPC.)"""
    device = make_device(tmp_path, zones=24, zone_size="1MiB")
    with mounted(device, tmp_path / "mnt") as mnt:
        (mnt / "small.bin").write_bytes(b"s" * 12_345)
        st = os.statvfs(mnt)
        avail = st.f_bavail * st.f_frsize
        assert avail > 16 << 20
        target = mnt / "f.bin" if where == "file" else mnt / "run" / "step-1" / "model.pt"
        os.makedirs(target.parent, exist_ok=True)
        with open(target, "wb") as f:
            left = avail
            while left:
                left -= f.write(b"q" * min(left, 1 << 20))
        if where == "checkpoint":
            (mnt / "run" / "step-1" / ".metadata").write_bytes(b"")     # its commit point (no bytes)
        assert os.path.getsize(target) == avail
        st = os.statvfs(mnt)
        assert st.f_bavail * st.f_frsize == 0
        with pytest.raises(OSError) as e:
            with open(mnt / "more.bin", "wb") as f:
                f.write(b"m" * 4096)
        assert e.value.errno == errno.ENOSPC
    from retainz.jobs import stores

    with stores.using(device) as store:
        df = store.df()
        # the reserve is untouched; the store could admit one block more, the block the mount's next
        # generation would keep for its layout record, so the mount said 0
        assert df.free >= df.gc_reserve and df.admissible == 4096
    assert fsck_clean(device)
