"""The namespace model on its own (:class:`retainz.namespace.Namespace`, no FUSE, no fsspec), over the
real store on a MemoryDevice: ids and name rules, re-save as a new version, unlink and discard of open
files, rename to the final id, ``rm -r``, implied parents, and a view refreshed from other writers."""

from __future__ import annotations

import contextlib
import errno
import logging

import pytest

from retainz import ids
from retainz.errors import GenerationExistsError
from retainz.namespace import Face, Namespace, NamespaceError
from retainz.namespace import names as L
from retainz.store import Store
from retainz.zoned import Geometry, MemoryDevice

GEOM = Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20)


@pytest.fixture
def store():
    s = Store.format(MemoryDevice(GEOM))
    yield s
    s.close()


def _ns(store, **kw) -> Namespace:
    return Namespace(store, stream_threshold=64 << 10, implicit_dirs=True, **kw)


class _Process(Face):
    """A face whose calls come from process ``pid[0]``."""

    def __init__(self, pid: list[int]):
        self.pid = pid

    def caller(self) -> int:
        return self.pid[0]


def _put(ns: Namespace, path: str, data: bytes) -> None:
    fh = ns.open_write(path)
    ns.write(fh, data, 0)
    ns.close(fh)
    ns.release(fh)


def _get(ns: Namespace, path: str) -> bytes:
    fh = ns.open_read(path)
    try:
        return ns.read(fh, 1 << 24, 0)
    finally:
        ns.release(fh)


def _ids(store) -> dict[str, list[str]]:
    return {g.id: sorted(g.shards) for g in store.generations()}


@pytest.mark.parametrize("path, gid, shard", [
    ("run/step-5/__0_0.distcp", "run%2Fstep-5", "__0_0.distcp"),
    ("run..1/step-5/model.pt", "run%2E%2E1%2Fstep-5", "model.pt"),       # '..' encoded: the store refuses it
    ("m/iter_0000100/mp_rank_00/model_optim_rng.pt", "m%2Fiter_0000100", "mp_rank_00%2Fmodel_optim_rng.pt"),
    ("any/dir/.metadata", "any%2Fdir", ".metadata"),
    ("l/epoch=0-step=10.ckpt", "@l%2Fepoch=0-step=10.ckpt", "file"),
    ("a..b", "@a%2E%2Eb", "file"),
    ("r/lr:3e-4,bs=8 (x)/m.pt", "@r%2Flr:3e-4,bs=8%20(x)%2Fm.pt", "file"),   # 27.5(b): ordinary names as written
    ("@x/#1%", "@%40x%2F%231%25", "file"),                     # '@', '#', '%' stay encoded
])
def test_one_encoding_of_paths_into_ids(path, gid, shard):
    from retainz.store.format import check_id

    assert L.generation_for(path)[:2] == (gid, shard)
    check_id(gid)
    check_id(shard, "shard name")
    kind, back, _ = ids.parse_generation_id(gid)
    assert back == (path if kind == "file" else L.checkpoint_root(path))


def test_ids_written_by_the_older_full_encoding_still_resolve(store):
    """Stores written before the minimal encoding hold ``@l%2Fepoch%3D0-step%3D10.ckpt``: its path is the
    same, and its next version replaces it (the view goes by path, not by id)."""
    w = store.begin_generation("@l%2Fepoch%3D0-step%3D10.ckpt", 10)
    w.write_shard("file", [b"old"])
    w.commit()
    ns = _ns(store)
    assert ns.listdir("l") == ["epoch=0-step=10.ckpt"] and _get(ns, "l/epoch=0-step=10.ckpt") == b"old"
    _put(ns, "l/epoch=0-step=10.ckpt", b"new")
    assert _ids(store) == {"@l%2Fepoch=0-step=10.ckpt": ["file"]}
    assert _get(_ns(store), "l/epoch=0-step=10.ckpt") == b"new"


@pytest.mark.parametrize("path, code", [
    ("x" * 252, errno.ENAMETOOLONG),                          # '@' + 252 + '#99' > 255 bytes
    ("ck/step-1/" + "s" * 256, errno.ENAMETOOLONG),           # the shard name
    ("d" * 253 + "/f", errno.ENAMETOOLONG),                   # the directory's own id
    ("bad\udcff", errno.EINVAL),                              # not UTF-8
    (".metadata", errno.EINVAL),                              # a DCP file needs a checkpoint directory
    ("a//b", errno.EINVAL),
])
def test_names_the_store_refuses(store, path, code):
    with pytest.raises(L.NameRefused) as e:
        L.check_name(path)
    assert e.value.errno == code
    ns = _ns(store)
    with pytest.raises(NamespaceError) as e:
        ns.open_write(path)
    assert e.value.errno == code and not ns.exists(path) and _ids(store) == {}


def test_resave_into_a_committed_checkpoint_is_its_next_version_with_the_rest_carried_over(store):
    ns = _ns(store)
    for name, data in (("__0_0.distcp", b"a" * 100_000), ("__1_0.distcp", b"b" * 50), (".metadata", b"m1")):
        _put(ns, f"ck/step-5/{name}", data)
    assert _ids(store) == {"ck%2Fstep-5": [".metadata", "__0_0.distcp", "__1_0.distcp"]}
    _put(ns, "ck/step-5/__0_0.distcp", b"A" * 90_000)              # a re-save with one rank fewer
    other = _ns(store)                                            # another face: the old version until the commit
    assert _get(other, "ck/step-5/__0_0.distcp") == b"a" * 100_000
    _put(ns, "ck/step-5/.metadata", b"m2")
    assert _ids(store) == {"ck%2Fstep-5#1": [".metadata", "__0_0.distcp", "__1_0.distcp"]}
    other.refresh()
    assert [_get(other, f"ck/step-5/{n}") for n in ("__0_0.distcp", "__1_0.distcp", ".metadata")] == [
        b"A" * 90_000, b"b" * 50, b"m2"]


def test_a_committed_checkpoint_file_is_not_changed_in_place(store):
    ns = _ns(store)
    _put(ns, "ck/step-1/__0_0.distcp", b"x")
    _put(ns, "ck/step-1/.metadata", b"m")
    with pytest.raises(NamespaceError) as e:
        ns.open_write("ck/step-1/__0_0.distcp", truncate=False)
    assert e.value.errno == errno.EPERM


@pytest.mark.parametrize("size", [100, 200_000], ids=["buffered", "streamed"])
def test_unlink_of_a_file_open_for_writing_drops_it(store, size):
    ns = _ns(store)
    _put(ns, "run/old.bin", b"o" * 10)
    fh = ns.open_write("run/new.bin")
    ns.write(fh, b"n" * size, 0)
    ns.unlink("run/new.bin")
    assert not ns.exists("run/new.bin")
    assert ns.write(fh, b"more", size) == 4                       # the descriptor still takes bytes
    ns.close(fh)
    ns.release(fh)
    assert ns.listdir("run") == ["old.bin"] and _ids(store) == {"@run%2Fold.bin": ["file"]}
    assert ns.slot.acquire(blocking=False)                        # a streamed shard gave the slot back
    ns.slot.release()


def test_discard_leaves_the_committed_version_and_drops_a_pending_checkpoint(store):
    ns = _ns(store)
    _put(ns, "run/last.ckpt", b"old")
    fh = ns.open_write("run/last.ckpt")
    ns.write(fh, b"partial" * 30_000, 0)
    ns.discard(fh)
    ns.release(fh)
    assert _get(ns, "run/last.ckpt") == b"old"
    _put(ns, "ck/step-2/__0_0.distcp", b"d")
    fh = ns.open_write("ck/step-2/__1_0.distcp")
    ns.write(fh, b"x", 0)
    ns.discard(fh)
    ns.release(fh)
    assert not ns.exists("ck/step-2") and not ns.exists("ck")
    assert _ids(store) == {"@run%2Flast.ckpt": ["file"]}


def test_a_file_renamed_while_streaming_commits_under_its_final_id(store):
    ns = _ns(store)
    fh = ns.open_write("run/tmpXYZ")
    ns.write(fh, b"s" * 300_000, 0)                                # streaming by now
    ns.rename("run/tmpXYZ", "run/model.safetensors")
    ns.close(fh)
    ns.release(fh)
    assert _ids(store) == {"@run%2Fmodel.safetensors": ["file"]}
    assert _get(_ns(store), "run/model.safetensors") == b"s" * 300_000


def test_a_checkpoint_renamed_while_streaming_commits_under_its_final_id(store):
    ns = _ns(store)
    _put(ns, "hf/tmp-checkpoint-4/model.safetensors", b"w" * 300_000)
    _put(ns, "hf/tmp-checkpoint-4/config.json", b"{}")
    ns.rename("hf/tmp-checkpoint-4", "hf/checkpoint-4")                 # HF 4.3x's commit point
    assert _ids(store) == {"hf%2Fcheckpoint-4": ["config.json", "model.safetensors"]}


def test_the_store_renames_an_uncommitted_generation(store):
    w = store.begin_generation("tmp", 1)
    w.write_shard("a", [b"x" * 5000])
    store.begin_generation("taken", 1).commit()
    with pytest.raises(GenerationExistsError):
        w.rename("taken")
    w.rename("final")
    with pytest.raises(GenerationExistsError):
        store.begin_generation("final", 1)                        # the new id is in flight now
    store.begin_generation("tmp", 1).abort()                      # the old one is free
    w.commit()
    assert _ids(store) == {"final": ["a"], "taken": []}
    assert b"".join(store.read_shard("final", "a")) == b"x" * 5000 and store.fsck().ok


def test_remove_tree_is_rm_r(store):
    ns = _ns(store)
    for step in (10, 20):
        _put(ns, f"ck/step-{step}/__0_0.distcp", bytes([step]) * 1000)
        _put(ns, f"ck/step-{step}/.metadata", b"m")
    _put(ns, "ck/notes.txt", b"n")
    _put(ns, "ck/step-30/__0_0.distcp", b"pending")                   # being written: dropped
    _put(ns, "keep/last.ckpt", b"L")
    ns.remove_tree("ck/step-10")
    assert ns.listdir("ck") == ["notes.txt", "step-20", "step-30"]
    ns.remove_tree("ck")
    assert ns.listdir("") == ["keep"] and _ids(store) == {"@keep%2Flast.ckpt": ["file"]}
    with pytest.raises(NamespaceError) as e:
        ns.remove_tree("ck")
    assert e.value.errno == errno.ENOENT


def test_implied_parents_and_their_absence(store):
    ns = _ns(store)
    _put(ns, "a/b/c.bin", b"c")
    assert ns.stat("a/b").is_dir and ns.listdir("a") == ["b"]
    with pytest.raises(NamespaceError) as e:
        ns.open_write("a/b/c.bin/d")
    assert e.value.errno == errno.ENOTDIR
    strict = Namespace(store)                                     # the mount's: parents must exist
    with pytest.raises(NamespaceError) as e:
        strict.open_write("x/y.bin")
    assert e.value.errno == errno.ENOENT


def test_a_missing_path_is_logged_at_debug_and_a_real_refusal_as_a_warning(store, caplog):
    """Probes for missing paths (imports, "is there a checkpoint yet?") stay out of the mount log's
    warnings; a refused write still warns."""
    ns = _ns(store)
    _put(ns, "run/x.bin", b"x")
    caplog.set_level(logging.DEBUG, logger="retainz.namespace")
    for _ in range(3):
        with pytest.raises(NamespaceError) as e:
            ns.stat("run/missing.bin")
        assert e.value.errno == errno.ENOENT
    with pytest.raises(NamespaceError) as e:
        ns.open_write("run/x.bin/y")
    assert e.value.errno == errno.ENOTDIR
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [m for lv, m in levels if lv == logging.DEBUG] == ["run/missing.bin: no such file or directory"] * 3
    assert len([m for lv, m in levels if lv == logging.WARNING]) == 1
    assert all("missing" not in m for lv, m in levels if lv >= logging.WARNING)


def test_a_lookup_of_a_name_over_name_max_is_enametoolong(store):
    ns = _ns(store)
    for path in ("x" * 256, "run/" + "y" * 300 + "/model.pt", "é" * 128):      # 256 bytes of UTF-8 too
        with pytest.raises(NamespaceError) as e:
            ns.stat(path)
        assert e.value.errno == errno.ENAMETOOLONG, path
    with pytest.raises(NamespaceError) as e:
        ns.stat("x" * 255)
    assert e.value.errno == errno.ENOENT


def test_refresh_sees_what_other_writers_commit_and_delete(store):
    a, b = _ns(store), _ns(store)
    _put(a, "run/step-1/model.pt", b"1")
    a.fsyncdir("run/step-1")                                          # no commit point of its own: fsync
    assert not b.exists("run/step-1")
    b.refresh()
    assert _get(b, "run/step-1/model.pt") == b"1"
    _put(a, "run/x.bin", b"x")
    a.remove_tree("run/step-1")
    b.refresh()
    assert b.listdir("run") == ["x.bin"] and b.stat("run/x.bin").size == 1
    _put(b, "run/x.bin", b"xx")                                        # a new version, written by b
    a.refresh()
    assert _get(a, "run/x.bin") == b"xx" and a.listdir("run") == ["x.bin"]


def test_refresh_drops_what_another_writer_deleted_even_when_the_listing_is_back_to_the_last_refresh(store):
    """The mount refreshes its view after a node-service client's delete: a file this namespace
    committed since its last refresh, deleted by another writer, leaves the view (the store's listing
    then equals the one of the last refresh), and a reader still holding it gets ``ESTALE``."""
    ns = _ns(store)
    _put(ns, "a.bin", b"a" * 1000)
    fh = ns.open_read("a.bin")
    store.delete("@a.bin")                    # another writer (a client of the mount's socket)
    ns.refresh()
    assert not ns.exists("a.bin") and ns.listdir("") == []
    with pytest.raises(OSError) as e:
        ns.read(fh, 10, 0)
    assert e.value.errno == errno.ESTALE
    ns.release(fh)


@pytest.mark.parametrize("extend", ["write past the end", "truncate up"])
@pytest.mark.parametrize("inside", [False, True], ids=["file", "in a checkpoint"])
def test_a_file_extended_past_its_end_stays_in_memory_and_takes_writes_in_any_order(store, extend, inside):
    """numpy.memmap 'w+' writes the last byte first and then the pages of a shared mapping, in any
    order (issue 28.3(e)): a file with a hole never streams, so every later write lands, up to
    hole_limit; past it the extension is refused with EFBIG and nothing of the call is taken.  The
    refused call decides the file (issue 41.4): its close returns EFBIG and neither the file nor its
    checkpoint commits."""
    ns = _ns(store, hole_limit=1 << 20)
    n = 256 << 10                                   # 4 x the stream threshold of these tests
    path = "run/step-3/arr.bin" if inside else "arr.bin"
    fh = ns.open_write(path)
    if extend == "truncate up":
        ns.truncate(path, n, fh)
    else:
        ns.write(fh, b"\0", n - 1)
    data = bytes(range(256)) * (n // 256)
    for off in reversed(range(0, n, 4096)):         # pages written back last first
        ns.write(fh, data[off:off + 4096], off)
    assert ns.read(fh, n, 0) == data
    with pytest.raises(NamespaceError) as e:
        ns.write(fh, b"x", 1 << 20)
    assert e.value.errno == errno.EFBIG and "write it in order" in str(e.value)
    assert ns.read(fh, n + 1, 0) == data                # nothing of the refused call was taken
    with pytest.raises(NamespaceError) as e:
        ns.close(fh)
    assert e.value.errno == errno.EFBIG
    ns.release(fh)
    if inside:
        with pytest.raises(NamespaceError) as e:
            _put(ns, "run/step-3/.metadata", b"m")  # DCP's commit point: the refusal's errno
        assert e.value.errno == errno.EFBIG
    assert not ns.exists(path)
    ns.unmount()
    assert store.generations() == []


def test_a_large_ftruncate_up_then_writes_in_order_streams(store):
    """safetensors sets a file's final length, then writes it in order: past hole_limit the file
    still streams once its writes reach the end (no EFBIG for a length set ahead)."""
    ns = _ns(store, hole_limit=128 << 10)
    fh = ns.open_write("m.safetensors")
    data = bytes(range(256)) * 1024                 # 256 KiB, over hole_limit
    ns.truncate("m.safetensors", len(data), fh)
    for off in range(0, len(data), 32 << 10):
        ns.write(fh, data[off:off + (32 << 10)], off)
    assert ns.handle(fh).streaming
    ns.close(fh)
    ns.release(fh)
    assert _get(ns, "m.safetensors") == data


def test_a_length_set_ahead_is_not_held_and_its_writes_stream_in_order(store):
    """safetensors sets the final length, then writes in order: past hole_limit the zeros set ahead
    are never held in memory and the writes stream once the threshold is reached (not when they reach
    the end: a 2 GiB save_file used to sit whole in the server's memory), so the buffer stays below
    the threshold plus one write; bytes never written read back as zeros."""
    ns = _ns(store, hole_limit=128 << 10)
    fh = ns.open_write("m.safetensors")
    data = bytes(range(256)) * 1024                 # 256 KiB, over hole_limit and the 64 KiB threshold
    ns.truncate("m.safetensors", len(data) + 8192, fh)      # the last 8 KiB are never written
    h = ns.handle(fh)
    assert len(h.buf) == 0 and ns.stat("m.safetensors").size == len(data) + 8192
    peak = 0
    for off in range(0, len(data), 16 << 10):
        ns.write(fh, data[off:off + (16 << 10)], off)
        peak = max(peak, len(h.buf))
    assert h.streaming and peak < (64 << 10) + (16 << 10)
    assert ns.stat("m.safetensors").size == len(data) + 8192
    ns.close(fh)
    ns.release(fh)
    assert _get(ns, "m.safetensors") == data + bytes(8192)


@pytest.mark.parametrize("written", [0, 100 << 10], ids=["never written", "partly written"])
def test_a_length_set_ahead_and_left_unwritten_commits_as_zeros(store, written):
    """An ftruncate up past hole_limit followed by fewer writes (or none) commits the zeros up to the
    length, whether the file streamed or not."""
    ns = _ns(store, hole_limit=128 << 10)
    fh = ns.open_write("sparse.bin")
    n = 300 << 10
    ns.truncate("sparse.bin", n, fh)
    data = bytes(range(256)) * (written // 256)
    if data:
        ns.write(fh, data, 0)
    ns.close(fh)
    ns.release(fh)
    assert _get(ns, "sparse.bin") == data + bytes(n - len(data))


def test_a_write_skipping_into_a_length_set_ahead_is_held_until_the_end(store):
    """A write that skips part of a length set ahead past hole_limit is taken (the gap is zeros) and
    the file streams only once its writes reach the end, so the gap can still be written."""
    ns = _ns(store, hole_limit=128 << 10)
    fh = ns.open_write("g.bin")
    n = 256 << 10
    ns.truncate("g.bin", n, fh)
    data = bytes(range(256)) * (n // 256)
    ns.write(fh, data[:4096], 0)
    ns.write(fh, data[128 << 10:(192 << 10)], 128 << 10)     # skips ahead
    ns.write(fh, data[4096:128 << 10], 4096)                  # the gap, behind the last write
    assert not ns.handle(fh).streaming
    ns.write(fh, data[192 << 10:], 192 << 10)                 # reaches the end: streams
    assert ns.handle(fh).streaming
    ns.close(fh)
    ns.release(fh)
    assert _get(ns, "g.bin") == data


@pytest.mark.parametrize("inside", [False, True], ids=["file", "in a checkpoint"])
def test_a_device_error_while_a_file_streams_reaches_its_writer_and_nothing_commits(inside):
    """A streamed file's chunks are written into the store while the next write arrives (the mount's
    pump): a device error on one of them is the errno (EIO) of a later write, fsync or the close, and
    neither the file nor its checkpoint commits; the store stays usable."""
    from retainz.zoned.faulty import FaultyDevice

    dev = FaultyDevice(MemoryDevice(GEOM))
    store = Store.format(dev)
    try:
        ns = _ns(store)
        path = "run/step-4/big.bin" if inside else "big.bin"
        fh = ns.open_write(path)
        chunk = bytes(range(256)) * 64                      # 16 KiB
        dev.fail("write", count=-1)                         # every device write from now on
        failed = None
        for i in range(256):                                # 4 MiB: streams past 64 KiB
            try:
                ns.write(fh, chunk, i * len(chunk))
            except NamespaceError as e:
                failed = e
                break
        if failed is None:
            with pytest.raises(NamespaceError) as e:
                ns.fsync(fh)
            failed = e.value
        assert failed.errno == errno.EIO
        with pytest.raises(NamespaceError) as e:
            ns.close(fh)
        assert e.value.errno == errno.EIO
        ns.release(fh)
        if inside:
            with pytest.raises(NamespaceError):
                _put(ns, "run/step-4/.metadata", b"m")
        assert not ns.exists(path)
        dev.faults.clear()
        _put(ns, "after.bin", b"ok")                         # the store is usable again
        assert _get(ns, "after.bin") == b"ok"
    finally:
        store.close()


def test_unlinking_a_file_while_its_chunks_are_queued_drops_them(store):
    """torch's cleanup of a failed write unlinks the file it was streaming: the chunks still queued
    for the store are dropped with it, the descriptor keeps taking bytes, and nothing commits."""
    ns = _ns(store)
    fh = ns.open_write("tmp.bin")
    chunk = bytes(range(256)) * 256                         # 64 KiB
    for i in range(32):
        ns.write(fh, chunk, i * len(chunk))
    assert ns.handle(fh).streaming
    ns.unlink("tmp.bin")
    assert ns.write(fh, chunk, 32 * len(chunk)) == len(chunk)
    ns.close(fh)
    ns.release(fh)
    assert not ns.exists("tmp.bin")
    _put(ns, "after.bin", b"ok")                             # the store slot is free again
    assert _get(ns, "after.bin") == b"ok"


def test_a_file_written_in_order_still_streams_past_the_threshold(store):
    ns = _ns(store, hole_limit=1 << 20)
    fh = ns.open_write("big.bin")
    data = bytes(range(256)) * 4096                 # 1 MiB, written in order: streamed, no hole limit
    for off in range(0, len(data), 64 << 10):
        ns.write(fh, data[off:off + (64 << 10)], off)
    assert ns.handle(fh).streaming
    ns.write(fh, b"tail", len(data))               # past hole_limit, in order: fine
    ns.close(fh)
    ns.release(fh)
    assert _get(ns, "big.bin") == data + b"tail"


def test_a_read_only_store_refuses_every_change_with_erofs():
    """Over a store opened read-only every call that would change the tree is ``EROFS`` before
    anything changes, as on a read-only file system (it used to be EIO at the first write, a bare
    PermissionError without errno from unlink, with the file already gone from the view, and
    ENOENT from rename); reads work and the store is unchanged."""
    dev = MemoryDevice(GEOM)
    s = Store.format(dev)
    ns = _ns(s)
    _put(ns, "run/log.txt", b"log")
    _put(ns, "run/step-1/model.pt", b"m" * 1000)
    _put(ns, "run/step-1/.metadata", b"md")
    before = _ids(s)
    s.close()
    ro = Store.open(dev, readonly=True)
    ns = _ns(ro)
    calls = {
        "create": lambda: ns.open_write("run/new.bin"),
        "rewrite": lambda: ns.open_write("run/log.txt"),
        "mkdir": lambda: ns.mkdir("run/d"),
        "unlink": lambda: ns.unlink("run/log.txt"),
        "unlink in a checkpoint": lambda: ns.unlink("run/step-1/model.pt"),
        "rmdir": lambda: ns.rmdir("run/step-1"),
        "rm -r": lambda: ns.remove_tree("run"),
        "rename": lambda: ns.rename("run/log.txt", "run/log2.txt"),
        "truncate": lambda: ns.truncate("run/log.txt", 0),
    }
    got = {}
    for what, fn in calls.items():
        with pytest.raises(OSError) as e:
            fn()
        got[what] = e.value.errno
    assert got == dict.fromkeys(calls, errno.EROFS)
    assert _get(ns, "run/log.txt") == b"log" and _get(ns, "run/step-1/model.pt") == b"m" * 1000
    assert sorted(ns.listdir("run")) == ["log.txt", "step-1"]
    assert _ids(ro) == before
    ro.close()


# -- a refused checkpoint never commits (issue 41.4) -----------------------------------------------------
def _fill(ns: Namespace, path: str, size: int, *, chunk: int = 1 << 20) -> int | None:
    """Write ``size`` bytes into ``path`` in ``chunk`` writes, as torch.save does, stopping at the
    first refused call; returns its errno (``None``: every write and the close succeeded)."""
    try:
        fh = ns.open_write(path)
    except NamespaceError as e:
        return e.errno
    failed = None
    block = (bytes(range(256)) * (chunk // 256 + 1))[:chunk]
    try:
        for off in range(0, size, chunk):
            ns.write(fh, block[:min(chunk, size - off)], off)
    except NamespaceError as e:
        failed = e.errno
    try:
        ns.close(fh)
    except NamespaceError as e:
        failed = failed or e.errno
    ns.release(fh)
    return failed


def test_a_checkpoint_whose_write_was_refused_never_commits(store):
    """The reproduction of issue 41.4: ``step-2/model.pt`` of 100 MiB refused with ENOSPC part way was
    committed at unmount (a prefix, listed and "verified").  Now its close returns ENOSPC, the folder
    leaves the view, and nothing of it is in the store after unmount."""
    ns = _ns(store)
    _put(ns, "run/step-1/model.pt", b"w" * 5000)
    ns.fsyncdir("run/step-1")
    fh = ns.open_write("run/step-2/model.pt")
    block = b"m" * (1 << 20)
    with pytest.raises(NamespaceError) as e:
        for off in range(0, 100 << 20, 1 << 20):
            ns.write(fh, block, off)
    assert e.value.errno == errno.ENOSPC
    assert 10 << 20 < off < 32 << 20                     # refused part way (a 32 MiB device)
    with pytest.raises(NamespaceError) as e:              # the close says so too
        ns.close(fh)
    assert e.value.errno == errno.ENOSPC
    ns.release(fh)
    assert not ns.exists("run/step-2") and ns.listdir("run") == ["step-1"]
    with pytest.raises(NamespaceError) as e:              # its commit point returns the same errno
        ns.fsyncdir("run/step-2")
    assert e.value.errno == errno.ENOSPC
    ns.unmount()
    assert _ids(store) == {"run%2Fstep-1": ["model.pt"]}
    assert store.df().used < 1 << 20                      # the refused bytes were returned


def test_filling_to_enospc_commits_no_step_folder_of_empty_files(store):
    """Filling a mount to ENOSPC committed step folders holding 0-byte files (a file created, its
    first write refused, closed).  Every save refused anywhere is absent after unmount; every save
    whose calls all succeeded is there, byte for byte."""
    ns = _ns(store)
    ok, refused = [], []
    for step in range(1, 40):
        root = f"run/step-{step}"
        codes = [_fill(ns, f"{root}/model.pt", 3 << 20), _fill(ns, f"{root}/optim.pt", 900_000, chunk=300_000)]
        (refused if any(codes) else ok).append(root)
        if len(refused) >= 4:
            break
    assert ok and len(refused) == 4 and all(not ns.exists(r) for r in refused)
    ns.unmount()
    got = {g.id: g for g in store.generations()}
    assert sorted(got) == sorted(L.dir_generation_id(r, 0) for r in ok)
    for g in got.values():
        assert {s: i.size for s, i in g.shards.items()} == {"model.pt": 3 << 20, "optim.pt": 900_000}


def test_more_files_of_a_refused_checkpoint_are_refused_until_it_is_removed(store):
    """A program that ignores the refusal and writes the rest of the checkpoint cannot commit the rest
    as the checkpoint: its later files are refused with the first errno.  ``rm -r`` ends the refusal
    (a save again begins afresh), and so does a save by another process (a restarted job)."""
    pid = [100]
    ns = _ns(store, face=_Process(pid))
    _put(ns, "big.bin", b"b" * (20 << 20))
    assert _fill(ns, "run/step-2/model.pt", 30 << 20) == errno.ENOSPC
    assert _fill(ns, "run/step-2/extra.pt", 10) == errno.ENOSPC
    ns.unlink("big.bin")
    assert _fill(ns, "run/step-2/extra.pt", 10) == errno.ENOSPC          # space now, still refused
    ns.remove_tree("run/step-2")
    assert _fill(ns, "run/step-2/model.pt", 2 << 20) is None
    ns.fsyncdir("run/step-2")
    assert _ids(store) == {"run%2Fstep-2": ["model.pt"]}
    _put(ns, "big.bin", b"b" * (20 << 20))
    assert _fill(ns, "run/step-3/model.pt", 30 << 20) == errno.ENOSPC
    ns.unlink("big.bin")
    pid[0] = 200                                                          # the job restarted
    assert _fill(ns, "run/step-3/model.pt", 2 << 20) is None
    ns.unmount()
    assert sorted(_ids(store)) == ["run%2Fstep-2", "run%2Fstep-3"]
    assert store.generation("run%2Fstep-3").shards["model.pt"].size == 2 << 20


def test_a_refused_rewrite_of_a_file_keeps_the_previous_version(store):
    """``last.ckpt`` rewritten (O_TRUNC) and refused part way: the close returns ENOSPC and the whole
    previous version stays (before, the prefix replaced it)."""
    ns = _ns(store)
    _put(ns, "run/last.ckpt", b"old" * 1000)
    assert _fill(ns, "run/last.ckpt", 100 << 20) == errno.ENOSPC
    assert _get(ns, "run/last.ckpt") == b"old" * 1000
    ns.unmount()
    assert _ids(store) == {"@run%2Flast.ckpt": ["file"]}
    assert b"".join(store.read_shard("@run%2Flast.ckpt", "file")) == b"old" * 1000


@pytest.mark.parametrize("op", ["write", "flush"])
def test_injected_io_errors_at_every_point_of_a_save(op):
    """The kind, with injected device errors (``FaultyDevice``): a save of three files (two streamed)
    into ``step-N`` with the N-th device ``op`` failing.  A save any of whose calls returned an error
    is absent after unmount; a save whose calls all succeeded is present, byte for byte; fsck clean."""
    from retainz.zoned.faulty import FaultyDevice

    files = {"model.pt": 1 << 20, "optim.pt": 300_000, "meta.json": 100}
    ok, refused = [], []
    for n in range(0, 40, 3):
        dev = FaultyDevice(MemoryDevice(GEOM))
        store = Store.format(dev)
        try:
            ns = _ns(store)
            fault = dev.fail(op, after=n)
            root = f"run/step-{n}"
            codes = [_fill(ns, f"{root}/{name}", size, chunk=100_000) for name, size in files.items()]
            try:
                ns.fsyncdir(root)
            except NamespaceError as e:
                codes.append(e.errno)
            ns.unmount()
            dev.faults.clear()
            got = _ids(store)
            if any(codes):
                refused.append(n)
                assert got == {}, (n, codes)
            elif fault.seen > n:                              # the fault fired, in the store's own work
                assert got in ({}, {L.dir_generation_id(root, 0): sorted(files)}), (n, got)
            else:
                ok.append(n)
                assert got == {L.dir_generation_id(root, 0): sorted(files)}
                for name, size in files.items():
                    assert len(b"".join(store.read_shard(L.dir_generation_id(root, 0), name))) == size
            assert store.fsck().ok
        finally:
            store.close()
    assert refused, "no fault reached a call of the save"


@pytest.mark.parametrize("op", ["write", "flush"])
def test_a_commit_whose_journal_write_failed_is_absent_after_a_restart(op):
    """The commit point's own device error decides it: a commit record written but not flushed (or
    torn) may still be on the device; the store withdraws it (a journal rollover whose snapshot lacks
    the generation) before the error reaches the program, so after a restart the checkpoint is absent
    and the store opens clean (before: present, or "zone N is empty on the device but the journal has
    ... committed data in it" once the abort had reset its zone)."""
    from retainz.zoned.faulty import FaultyDevice

    outcomes = set()
    for after in range(4):
        inner = MemoryDevice(GEOM)
        dev = FaultyDevice(inner)
        store = Store.format(dev)
        ns = _ns(store)
        _put(ns, "run/step-1/model.pt", b"w" * 5000)
        dev.fail(op, after=after)
        try:
            ns.fsyncdir("run/step-1")
            outcomes.add("committed")
        except NamespaceError as e:
            assert e.errno == errno.EIO
            outcomes.add("refused")
        dev.faults.clear()
        listed = [g.id for g in store.generations()]
        store.close()
        again = Store.open(inner)
        try:
            assert [g.id for g in again.generations()] == listed, (after, listed)
            assert again.fsck().ok
        finally:
            again.close()
    assert outcomes == {"committed", "refused"}


def _tracker_waiting_for_a_rank(ns):
    """Megatron's save of ``m/iter_0000100`` with rank 1's file still open (written 1,000 bytes) and rank
    0's closed, and ``latest_checkpointed_iteration.txt`` rewritten from ``50`` to ``100``, its commit
    queued behind the checkpoint's; returns rank 1's open handle."""
    _put(ns, "m/latest_checkpointed_iteration.txt", b"50")
    fh = ns.open_write("m/iter_0000100/mp_rank_01/model_optim_rng.pt")
    ns.write(fh, b"x" * 1000, 0)
    _put(ns, "m/iter_0000100/mp_rank_00/model_optim_rng.pt", b"y" * 1000)
    _put(ns, "m/latest_checkpointed_iteration.txt", b"100")        # queued behind the checkpoint
    return fh


def test_a_tracker_waiting_for_a_checkpoint_that_is_refused_never_commits(store):
    """Megatron's order with one rank still writing: rank 0 rewrites ``latest_checkpointed_iteration.txt``
    while rank 1's file of ``iter_0000100`` is open, so the tracker's commit waits for the checkpoint's.
    Rank 1's next write is refused: the checkpoint never commits, and neither does the tracker naming
    it (before, the abort ran the tracker's queued commit: a tracker pointing at a missing iteration);
    the previous tracker stays."""
    ns = _ns(store)
    fh = _tracker_waiting_for_a_rank(ns)
    with pytest.raises(NamespaceError) as e:
        ns.write(fh, b"z" * (64 << 20), 1000)                       # more than the device holds
    assert e.value.errno == errno.ENOSPC
    with pytest.raises(NamespaceError):
        ns.close(fh)
    ns.release(fh)
    assert not ns.exists("m/iter_0000100")
    assert _get(ns, "m/latest_checkpointed_iteration.txt") == b"50"
    ns.unmount()
    assert _ids(store) == {"@m%2Flatest_checkpointed_iteration.txt": ["file"]}
    assert b"".join(store.read_shard("@m%2Flatest_checkpointed_iteration.txt", "file")) == b"50"


@pytest.mark.parametrize("how", ["unlink", "rename"])
def test_a_tracker_removed_while_waiting_for_its_checkpoint_never_commits(store, how):
    """A tracker file waiting for the checkpoint it names (a rank of ``iter_0000100`` still writing) is
    removed (``rm``, or renamed away) before that checkpoint commits: when the checkpoint commits, the
    removed file does not come back (before, its queued commit still ran and published it), and the
    version it replaced, retired by the removal, stays retired.  A rename's destination commits."""
    ns = _ns(store)
    fh = _tracker_waiting_for_a_rank(ns)
    assert _get(ns, "m/latest_checkpointed_iteration.txt") == b"100"
    if how == "unlink":
        ns.unlink("m/latest_checkpointed_iteration.txt")
    else:
        ns.rename("m/latest_checkpointed_iteration.txt", "m/tracker.bak")
    assert not ns.exists("m/latest_checkpointed_iteration.txt")
    ns.close(fh)
    ns.release(fh)
    assert ns.exists("m/iter_0000100")
    assert not ns.exists("m/latest_checkpointed_iteration.txt")
    ns.unmount()
    files = {g for g in _ids(store) if g.startswith("@")}
    assert "@m%2Flatest_checkpointed_iteration.txt" not in files
    if how == "rename":
        assert files == {"@m%2Ftracker.bak"}
        assert b"".join(store.read_shard("@m%2Ftracker.bak", "file")) == b"100"
    else:
        assert files == set()


def test_a_commit_that_cannot_be_withdrawn_keeps_its_zones():
    """When the rollover that withdraws a failed commit fails as well (the journal's flush fails, then
    the rollover's first zone operation), the generation's zones are kept at the abort: after a
    restart the store opens clean, with the generation either intact or absent, never a journaled
    commit whose zone the abort reset ("data lost")."""
    from retainz.zoned.faulty import FaultyDevice

    for after in range(0, 3):
        inner = MemoryDevice(GEOM)
        dev = FaultyDevice(inner)
        store = Store.format(dev)
        ns = _ns(store)
        _put(ns, "run/step-1/model.pt", b"w" * (1 << 20))    # fills its zone: the abort would reset it
        dev.fail("flush", after=after)
        dev.fail("finish", count=-1)
        with contextlib.suppress(NamespaceError):
            ns.fsyncdir("run/step-1")
        dev.faults.clear()
        again = Store.open(inner)           # a crash now: no clean close (whose record would withdraw it)
        try:
            assert again.fsck().ok
            for g in again.generations():
                assert b"".join(again.read_shard(g.id, "model.pt")) == b"w" * (1 << 20)
        finally:
            again.close()


def test_renaming_a_path_onto_itself_is_enoent_when_it_does_not_exist_and_nothing_when_it_does(store):
    """rename(2): "If oldpath and newpath are existing hard links referring to the same file, then
    rename() does nothing"; a missing oldpath is ENOENT, whatever newpath is."""
    ns = _ns(store)
    with pytest.raises(NamespaceError) as e:
        ns.rename("missing.bin", "missing.bin")
    assert e.value.errno == errno.ENOENT
    assert not ns.exists("missing.bin")
    fh = ns.open_write("here.bin")
    ns.write(fh, b"abc", 0)
    ns.close(fh)
    ns.release(fh)
    assert ns.rename("here.bin", "here.bin") == 0
    ns.mkdir("d")
    assert ns.rename("d", "d") == 0
    fh = ns.open_read("here.bin")
    assert ns.read(fh, 10, 0) == b"abc"
    ns.release(fh)
    assert ns.stat("d").is_dir
