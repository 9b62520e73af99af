"""``retainz mount``/``umount`` through the kernel (FUSE): checkpoint directories become generations at
their runtime's commit point, files read back verified (whole, random, mmap), tracker files and
atomic replace, renames, ``rm -r`` retirement, statfs, a SIGKILL of the server mid-save, bad input and
a missing FUSE."""

from __future__ import annotations

import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fsspec", reason="the mount extra (make setup-mount)")

from tests.mountcheck import (  # noqa: E402
    env,
    fsck_clean,
    generations,
    make_device,
    mounted,
    require_fuse,
    retainz,
    serve_foreground,
)

pytestmark = pytest.mark.mount


@pytest.fixture(autouse=True)
def _fuse():
    require_fuse()


def _write(path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _hf_save(ck, model: bytes) -> None:
    """The file order of HF Trainer's ``_save_checkpoint`` (transformers 5.x): model, optimizer,
    scheduler, RNG state, then trainer_state.json last."""
    os.makedirs(ck, exist_ok=True)
    _write(ck / "config.json", b'{"model_type": "llama"}')
    _write(ck / "model.safetensors", model)
    _write(ck / "optimizer.pt", model[:1000])
    _write(ck / "scheduler.pt", b"sched")
    _write(ck / "rng_state.pth", b"rng")
    _write(ck / "trainer_state.json", b'{"global_step": 1}')


def test_checkpoint_directory_commits_and_reads_back(tmp_path):
    device = make_device(tmp_path)
    rnd = random.Random(0)
    model = rnd.randbytes(9 << 20)                 # > 4 MiB: streamed into the store as it is written
    with mounted(device, tmp_path / "mnt") as mnt:
        run = mnt / "run"
        _hf_save(run / "checkpoint-1", model)
        _hf_save(run / "checkpoint-2", model[::-1])
        del_before = run / "checkpoint-3"          # no trainer_state.json: its commit point never comes
        os.makedirs(del_before)
        _write(del_before / "model.safetensors", b"partial")
        assert sorted(os.listdir(run)) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
        ck = run / "checkpoint-1"
        assert sorted(os.listdir(ck)) == ["config.json", "model.safetensors", "optimizer.pt", "rng_state.pth",
                                          "scheduler.pt", "trainer_state.json"]
        assert os.stat(ck / "model.safetensors").st_size == len(model)
        assert os.path.isdir(ck) and not os.path.isdir(ck / "config.json")
        with open(ck / "model.safetensors", "rb") as f:
            assert f.read() == model
            for _ in range(20):                    # random reads
                off = rnd.randrange(len(model))
                n = rnd.randrange(1, 3 << 20)
                f.seek(off)
                assert f.read(n) == model[off:off + n]
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                assert m[5_000_000:5_000_100] == model[5_000_000:5_000_100]
                assert m[-10:] == model[-10:]
        assert (run / "checkpoint-2" / "model.safetensors").read_bytes() == model[::-1]
        # a shell's redirection and dd write through a duplicated descriptor (close of the original
        # first): the file is finished at the last close only
        subprocess.run(f"echo tag > {mnt}/note.txt && dd if=/dev/zero of={mnt}/zeros.bin bs=1M count=6 status=none",
                       shell=True, check=True)
        assert (mnt / "note.txt").read_text() == "tag\n"
        assert (mnt / "zeros.bin").read_bytes() == bytes(6 << 20)
        # mtime order is commit order (HF's sort_checkpoints(use_mtime=True))
        assert os.path.getmtime(run / "checkpoint-1") <= os.path.getmtime(run / "checkpoint-2")
    gens = generations(device)
    assert sorted(gens) == ["@note.txt", "@zeros.bin", "run%2Fcheckpoint-1", "run%2Fcheckpoint-2"]   # not checkpoint-3
    g = gens["run%2Fcheckpoint-1"]
    assert g.step == 1 and set(g.shards) == {"config.json", "model.safetensors", "optimizer.pt", "rng_state.pth",
                                             "scheduler.pt", "trainer_state.json"}
    assert g.shards["model.safetensors"].size == len(model)
    assert fsck_clean(device)
    with mounted(device, tmp_path / "mnt") as mnt:  # a remount shows the same tree
        assert (mnt / "run/checkpoint-1/model.safetensors").read_bytes() == model
        assert not (mnt / "run/checkpoint-3").exists()


_MEMMAP = """
import sys, numpy as np
path, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "w+":
    a = np.memmap(path, dtype=np.uint32, mode="w+", shape=(n // 4,))
    a[:] = np.arange(n // 4, dtype=np.uint32)
    a.flush()
    del a
else:
    a = np.memmap(path, dtype=np.uint32, mode="r")
    assert (a == np.arange(n // 4, dtype=np.uint32)).all()
print("ok")
"""


def test_a_shared_writable_mmap_of_a_large_file_works_or_fails_with_an_errno(tmp_path):
    """numpy.memmap 'w+' of a file past the stream threshold (issue 28.3(e)): it used to kill the
    process with SIGBUS at 8 MiB.  Up to the namespace's hole_limit (256 MiB) it works and commits
    what the mapping wrote; past it the extension fails with EFBIG at the write, never a signal."""
    device = make_device(tmp_path, zones=96)
    run = lambda *a: subprocess.run([sys.executable, "-c", _MEMMAP, *map(str, a)], env=env(),  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    n = 12 << 20
    with mounted(device, tmp_path / "mnt") as mnt:
        for name in ("a.bin", "run/step-1/a.bin"):
            os.makedirs((mnt / name).parent, exist_ok=True)
            out = run(mnt / name, n, "w+")
            assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr[-500:]
            assert run(mnt / name, n, "r").returncode == 0
        (mnt / "run/step-1/.metadata").write_bytes(b"m")      # the checkpoint's commit point
        again = run(mnt / "a.bin", n, "w+")      # a committed version exists: its writer bypasses the cache
        assert again.returncode == 1 and "[Errno 19] No such device" in again.stderr, again.stderr[-300:]
        big = run(mnt / "huge.bin", 300 << 20, "w+")
        assert big.returncode == 1 and "[Errno 27] File too large" in big.stderr, (big.returncode, big.stderr[-300:])
    with mounted(device, tmp_path / "mnt") as mnt:             # what the mappings wrote is committed
        out = run(mnt / "run/step-1/a.bin", n, "r")
        assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr[-500:]
        # the refused w+ had truncated a.bin and written its last byte, as on a local file system
        assert (mnt / "a.bin").read_bytes() == bytes(n)
    assert fsck_clean(device)


def test_megatron_tracker_commits_and_rm_r_retires(tmp_path):
    """Megatron-LM's order: every rank's iter_NNNNNNN/mp_rank_XX/model_optim_rng.pt, then rank 0 rewrites
    latest_checkpointed_iteration.txt (the commit point); older iterations are removed with rm -r."""
    device = make_device(tmp_path)
    with mounted(device, tmp_path / "mnt") as mnt:
        save = mnt / "megatron"
        os.makedirs(save)
        for it in (10, 20, 30):
            d = save / f"iter_{it:07d}"
            for rank in (0, 1):
                os.makedirs(d / f"mp_rank_{rank:02d}", exist_ok=True)
                _write(d / f"mp_rank_{rank:02d}" / "model_optim_rng.pt", bytes([it, rank]) * 50_000)
            if it != 30:                           # iteration 30: the job dies before the tracker
                _write(save / "latest_checkpointed_iteration.txt", str(it).encode())
        assert (save / "latest_checkpointed_iteration.txt").read_text() == "20"
        shutil.rmtree(save / "iter_0000010")
        assert sorted(os.listdir(save)) == ["iter_0000020", "iter_0000030", "latest_checkpointed_iteration.txt"]
    gens = generations(device)
    assert sorted(gens) == ["@megatron%2Flatest_checkpointed_iteration.txt#1", "megatron%2Fiter_0000020"]
    assert set(gens["megatron%2Fiter_0000020"].shards) == {"mp_rank_00%2Fmodel_optim_rng.pt",
                                                          "mp_rank_01%2Fmodel_optim_rng.pt"}
    with mounted(device, tmp_path / "mnt") as mnt:
        assert (mnt / "megatron/latest_checkpointed_iteration.txt").read_text() == "20"
        assert (mnt / "megatron/iter_0000020/mp_rank_01/model_optim_rng.pt").read_bytes() == bytes([20, 1]) * 50_000
    assert fsck_clean(device)


def test_deepspeed_latest_and_tmp_rename(tmp_path):
    """DeepSpeed: global_stepN/ files then ``latest`` holding the tag; HF 4.3x: tmp-checkpoint-N renamed to
    checkpoint-N; a committed file renamed over another (os.replace) is an atomic replace."""
    device = make_device(tmp_path)
    with mounted(device, tmp_path / "mnt") as mnt:
        ds = mnt / "ds"
        os.makedirs(ds)
        for step in (5, 10):
            d = ds / f"global_step{step}"
            os.makedirs(d)
            _write(d / "mp_rank_00_model_states.pt", b"m" * step * 1000)
            _write(d / "zero_pp_rank_0_mp_rank_00_optim_states.pt", b"o" * step * 1000)
            _write(ds / "latest", f"global_step{step}".encode())
        tmp = mnt / "hf" / "tmp-checkpoint-4"
        os.makedirs(tmp)
        _write(tmp / "model.safetensors", b"w" * 5_000_000)
        _write(tmp / "trainer_state.json", b"{}")
        os.rename(tmp, mnt / "hf" / "checkpoint-4")
        assert os.listdir(mnt / "hf") == ["checkpoint-4"]
        _write(mnt / "hf" / "state.json", b"old")
        _write(mnt / "hf" / "state.json.tmp", b"new")
        with open(mnt / "hf" / "state.json", "rb") as old:
            os.replace(mnt / "hf" / "state.json.tmp", mnt / "hf" / "state.json")
            assert (mnt / "hf" / "state.json").read_bytes() == b"new"
            del old
        os.rename(mnt / "ds" / "global_step5", mnt / "ds" / "kept_global_step5")   # a committed dir moves
    gens = generations(device)
    # the renamed tmp-checkpoint-4 commits under its final name (issue 27.5(b): no temporary id)
    assert set(gens) == {"ds%2Fglobal_step10", "@ds%2Flatest#1", "hf%2Fcheckpoint-4", "@hf%2Fstate.json#1",
                         "ds%2Fkept_global_step5"}
    assert "%layout" not in gens["hf%2Fcheckpoint-4"].shards
    with mounted(device, tmp_path / "mnt") as mnt:
        assert (mnt / "ds/latest").read_text() == "global_step10"
        assert sorted(os.listdir(mnt / "hf")) == ["checkpoint-4", "state.json"]
        assert (mnt / "hf/checkpoint-4/model.safetensors").read_bytes() == b"w" * 5_000_000
        assert (mnt / "ds/kept_global_step5/mp_rank_00_model_states.pt").read_bytes() == b"m" * 5000
        shutil.rmtree(mnt / "ds" / "kept_global_step5")
        shutil.rmtree(mnt / "hf" / "checkpoint-4")
    assert set(generations(device)) == {"ds%2Fglobal_step10", "@ds%2Flatest#1", "@hf%2Fstate.json#1"}
    assert fsck_clean(device)


def test_statfs_reports_admissible_space(tmp_path):
    device = make_device(tmp_path, zones=40, zone_size="4MiB")
    from retainz.jobs import stores

    with stores.using(device) as store:
        reserve = store.gc_reserve_zones
        capacity = store.df().capacity
    with mounted(device, tmp_path / "mnt") as mnt:
        st = os.statvfs(mnt)
        assert st.f_frsize == 4096
        assert st.f_blocks * st.f_frsize == capacity
        # less one block: the block a new generation keeps for its layout record
        assert st.f_bavail * st.f_frsize == capacity - reserve * (4 << 20) - 4096
        _write(mnt / "blob.bin", b"x" * (8 << 20))
        # the kernel sends FUSE_RELEASE after close() returns; an open of the path waits for it, so the
        # blob is committed (no longer counted as a writer's reservation) when statfs asks
        with open(mnt / "blob.bin", "rb") as f:
            assert f.read(1) == b"x"
        st2 = os.statvfs(mnt)
        assert st2.f_bavail * st2.f_frsize == capacity - reserve * (4 << 20) - (8 << 20) - 4096
        assert shutil.disk_usage(mnt).free == st2.f_bavail * st2.f_frsize


def test_sigkill_mid_save_then_remount(tmp_path):
    """The server is killed (SIGKILL) while a checkpoint streams in: the stale mount is unmounted, the
    remount shows the previous checkpoint intact and not the torn one, and fsck is clean."""
    device = make_device(tmp_path)
    mnt = tmp_path / "mnt"
    proc = serve_foreground(device, mnt)
    try:
        _hf_save(mnt / "run" / "checkpoint-1", b"A" * (6 << 20))
        started = threading.Event()

        def writer():
            os.makedirs(mnt / "run" / "checkpoint-2")
            try:
                with open(mnt / "run" / "checkpoint-2" / "model.safetensors", "wb") as f:
                    for _ in range(64):
                        f.write(b"B" * (1 << 20))
                        started.set()
            except OSError:
                pass                               # the server died under it
            started.set()

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        assert started.wait(60)
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        t.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    retainz("umount", str(mnt))                    # a stale mount (server dead) unmounts too
    assert fsck_clean(device)
    assert sorted(generations(device)) == ["run%2Fcheckpoint-1"]
    with mounted(device, mnt):
        assert (mnt / "run/checkpoint-1/model.safetensors").read_bytes() == b"A" * (6 << 20)
        assert os.listdir(mnt / "run") == ["checkpoint-1"]
    assert fsck_clean(device)


def test_retention_auto_infers_keep_latest(tmp_path):
    """HF-like saves with save_total_limit=2 (rm -r of the oldest after each save): the mount infers
    keep-latest k=2 and later saves carry that hint (journaled with their commit)."""
    device = make_device(tmp_path, zones=64)
    with mounted(device, tmp_path / "mnt", "--retention", "auto") as mnt:
        run = mnt / "out"
        for step in range(10, 110, 10):
            _hf_save(run / f"checkpoint-{step}", bytes([step]) * 10_000)
            kept = sorted(os.listdir(run), key=lambda n: int(n.split("-")[1]))
            for old in kept[:-2]:
                shutil.rmtree(run / old)
        assert sorted(os.listdir(run)) == ["checkpoint-100", "checkpoint-90"]
    gens = generations(device)
    assert sorted(gens) == ["out%2Fcheckpoint-100", "out%2Fcheckpoint-90"]
    for g in gens.values():
        assert g.hint.condition == "inferred:keep_latest:k=2,interval=10"
        assert g.hint.reclaim_step == g.step + 20
    log = open(device + ".mount.log").read()
    assert "retention inferred for out/: inferred:keep_latest:k=2,interval=10" in log


def test_mount_bad_input_and_already_mounted(tmp_path):
    device = make_device(tmp_path)
    r = retainz("mount", str(tmp_path / "nope.img"), str(tmp_path), check=False)
    assert r.returncode == 2 and "no such device file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = retainz("mount", device, str(tmp_path / "missing"), check=False)
    assert r.returncode == 2 and "no such directory" in r.stderr
    r = retainz("mount", device, device, check=False)                    # a regular file
    assert r.returncode == 2 and f"{device}: not a directory (the mount point must be one)" in r.stderr
    r = retainz("mount", device, str(tmp_path), "--retention", "nosuchrule:x=1", "--foreground", check=False)
    assert r.returncode == 2 and "nosuchrule" in r.stderr
    # detached: the rule is checked before a server starts (bad input, exit 2, nothing in the server log)
    log = tmp_path / (os.path.basename(device) + ".mount.log")
    before = log.read_bytes() if log.exists() else b""
    r = retainz("mount", device, str(tmp_path), "--retention", "auto,foo", check=False)
    assert r.returncode == 2 and "auto,foo" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    from retainz.mount.runner import is_mounted

    assert (log.read_bytes() if log.exists() else b"") == before and not is_mounted(str(tmp_path))
    r = retainz("mount", str(tmp_path), str(tmp_path), check=False)            # a directory as the device
    assert r.returncode == 2 and r.stderr == (f"retainz: error: {tmp_path}: a directory, not a device file (make one "
                                              "with `retainz device create FILE` and `retainz mkfs FILE`)\n")
    other = str(tmp_path / "other.img")
    retainz("device", "create", other, "--zones", "16", "--zone-size", "1MiB")
    retainz("mkfs", other)
    with mounted(device, tmp_path / "mnt") as mnt:
        # a second mount of the device is "in use" (exit 1) whichever mount point it names (issue 44.5:
        # the same mount point said exit 2, another one exit 1)
        for point in (mnt, tmp_path):
            r = retainz("mount", device, str(point), check=False)
            assert r.returncode == 1 and r.stderr == (f"retainz: error: {device}: the device is in use: it is already "
                                                      f"mounted at {mnt} (one mount per device): use the files "
                                                      f"there, or `retainz umount {mnt}` first\n"), r.stderr
        r = retainz("mount", other, str(mnt), check=False)                  # another device onto the mount point
        assert r.returncode == 2 and "already a RetainZ mount" in r.stderr
        r = retainz("umount", device, check=False)                      # the device, not the mount point
        assert r.returncode == 2 and (f"{device}: is the device, not a mount point; it is mounted at {mnt}: "
                                      f"retainz umount {mnt}") in r.stderr
        assert is_mounted(str(mnt))
    r = retainz("umount", str(tmp_path / "mnt"), check=False)
    assert r.returncode == 2 and "not a RetainZ mount" in r.stderr
    # the mount's log holds the mount's own lines only: libfuse's "Ignoring invalid max threads value
    # 4294967295" (an unset max_idle_threads through the 3.0 ABI) is gone
    lines = log.read_text().splitlines()
    assert lines and all(" retainz." in line for line in lines), lines


@pytest.mark.parametrize("foreground", [False, True])
def test_mount_of_a_device_without_a_store_is_one_line_and_leaves_nothing(tmp_path, foreground):
    """A device made by `retainz device create` but never formatted: one line saying to run mkfs,
    exit 2 (bad input, as `ls` and `put` say it), no server started, no log, nothing mounted, the
    device unchanged."""
    from retainz.mount.runner import is_mounted

    device = str(tmp_path / "dev.img")
    retainz("device", "create", device, "--zones", "16", "--zone-size", "1MiB")
    before = open(device, "rb").read()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = retainz("mount", device, str(mnt), *(["--foreground"] if foreground else []), check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"retainz: error: {device} holds no RetainZ store (no superblock in "
                                             f"its first zones); format it with `retainz mkfs {device}`"]
    assert not os.path.exists(device + ".mount.log") and not is_mounted(str(mnt))
    assert open(device, "rb").read() == before
    assert retainz("ls", device, check=False).returncode == 2          # the same verdict as the store commands


def test_a_mount_over_a_non_empty_directory_says_what_it_hides(tmp_path):
    """libfuse 3 mounts over a non-empty directory (as mount(8) does); the command warns in one line, and
    the files are back after umount."""
    device = make_device(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "a").write_text("x")
    (mnt / "b").mkdir()
    r = retainz("mount", device, str(mnt))
    try:
        assert r.stderr.strip().splitlines() == [f"retainz: warning: {mnt} is not empty: its 2 entries are hidden "
                                                 f"until `retainz umount {mnt}`"]
        assert os.listdir(mnt) == []
    finally:
        retainz("umount", str(mnt))
    assert sorted(os.listdir(mnt)) == ["a", "b"]
    r = retainz("mount", device, str(tmp_path / "nope"), check=False)       # no warning before an error
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "warning" not in r.stderr


def test_fuse_unavailable_is_one_clear_line(tmp_path):
    """Without the binding (or libfuse 3, or /dev/fuse) the command says what is missing: exit 1."""
    device = make_device(tmp_path)
    code = ("import sys; sys.modules['mfusepy'] = None; from retainz.cli import main; "
            f"sys.exit(main(['mount', {device!r}, {str(tmp_path)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip() == ("retainz: error: FUSE is unavailable: the Python binding mfusepy is not installed "
                                "(pip install 'retainz[mount]', or make setup-mount)")
    code = ("import sys; sys.modules['mfusepy'] = None; from retainz.cli import main; "
            f"sys.exit(main(['mount', {device!r}, {str(tmp_path)!r}, '--retention', 'bogus']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=60)
    assert r.returncode == 2 and "bogus" in r.stderr and "FUSE" not in r.stderr   # bad input is named first


def _resident_pages(path) -> tuple[int, int]:
    """``(pages of path in the page cache, pages)`` after an open of it (``mincore`` of a shared
    read-only mapping: the pages the kernel kept at the open)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw), pages
        finally:
            libc.munmap(addr, size)


def test_a_resaved_file_is_loaded_from_the_page_cache(tmp_path):
    """Issue 44.8: a file written again under the same name (``O_TRUNC``, nobody reading it) is written
    through the page cache, and the first open after its commit keeps those pages: its load is served
    by the kernel's cache, not read through the mount's server."""
    device = make_device(tmp_path)
    rnd = random.Random(8)
    old, new = rnd.randbytes(8 << 20), rnd.randbytes(8 << 20)
    with mounted(device, tmp_path / "mnt") as mnt:
        _write(mnt / "model.bin", old)
        # no read in between: a reader's RELEASE reaches the server after its close(2) has returned
        # (the writer's open waits for it only RELEASE_WAIT; tests/mount/test_mount_reads.py covers that)
        _write(mnt / "model.bin", new)                    # the re-save, committed at its close
        kept, pages = _resident_pages(mnt / "model.bin")
        assert kept >= pages * 0.9, (kept, pages)         # before: 0 (the writer bypassed the cache)
        assert (mnt / "model.bin").read_bytes() == new
