"""The mount's read path without a kernel: whole extents straight into the request's buffer
(``Store.read_shard_into``), the rest through the namespace's windows, and the store's lock free while
a device read runs (issue 44 item 8)."""

from __future__ import annotations

import errno
import os
import random
import threading

import pytest

pytest.importorskip("fsspec", reason="the mount streams through the fsspec filesystem's sink (mount extra)")

from retainz.errors import ChecksumError, GenerationNotFoundError  # noqa: E402
from retainz.mount.fs import MAX_BACKGROUND, READ_AHEAD, MountedStore  # noqa: E402
from retainz.namespace import NamespaceError  # noqa: E402
from retainz.store import Store  # noqa: E402
from retainz.zoned import FileDevice, Geometry, MemoryDevice  # noqa: E402

MiB = 1 << 20
GEOM = Geometry(nr_zones=24, zone_size=4 * MiB, zone_capacity=4 * MiB)
DATA = random.Random(44).randbytes(5 * MiB + 1000)     # five whole extents and a partial one


def _put(ms: MountedStore, path: str, data: bytes) -> None:
    fh = ms.create(path, 0o644)
    for at in range(0, len(data), MiB):
        ms.write(path, memoryview(data)[at:at + MiB], at, fh)
    ms.flush(path, fh)
    ms.release(path, fh)


def _shard(ms: MountedStore, path: str) -> tuple[str, str]:
    """``(generation id, shard)`` a committed path reads."""
    fh = ms.open(path, os.O_RDONLY)
    h = ms.ns.handle(fh)
    try:
        return h.gen.id, h.shard
    finally:
        ms.release(path, fh)


def _read(ms: MountedStore, fh: int, size: int, offset: int) -> bytes:
    buf = bytearray(size)
    n = ms.read_into(fh, buf, offset)
    return bytes(buf[:n])


@pytest.fixture(params=["file", "memory"])
def ms(request, tmp_path):
    if request.param == "file":
        dev = FileDevice.create(str(tmp_path / "dev.img"), GEOM)
    else:
        dev = MemoryDevice(GEOM)
    ms = MountedStore(Store.format(dev))
    _put(ms, "/a.bin", DATA)
    yield ms
    ms.store.close()


def test_whole_extent_requests_are_read_straight_into_the_buffer(ms, monkeypatch):
    given = []
    real = ms.store.read_shard_into

    def spy(gen_id, name, pos, out):
        n = real(gen_id, name, pos, out)
        given.append((pos, n))
        return n

    monkeypatch.setattr(ms.store, "read_shard_into", spy)
    fh = ms.open("/a.bin", os.O_RDONLY)
    got = b"".join(_read(ms, fh, MiB, at) for at in range(0, len(DATA), MiB))
    assert got == DATA
    # the five whole extents came straight from the device; the last, partial one (1000 bytes, not a
    # block multiple) through the namespace
    assert given[:5] == [(at, MiB) for at in range(0, 5 * MiB, MiB)]
    assert given[5] == (5 * MiB, 0)
    assert list(ms.ns.handle(fh).windows) == [5 * MiB]
    # a request of two extents takes both; one ending past the file gives what there is
    assert _read(ms, fh, 2 * MiB, MiB) == DATA[MiB:3 * MiB]
    assert given[-1] == (MiB, 2 * MiB)
    assert _read(ms, fh, 2 * MiB, 4 * MiB) == DATA[4 * MiB:]
    ms.release("/a.bin", fh)


@pytest.mark.parametrize("size, offset", [(MiB, 4096), (128 << 10, 3 * MiB - 4096), (MiB + 4096, MiB),
                                          (4096, 5 * MiB + 512), (3 * MiB, 2 * MiB + 1)])
def test_requests_across_extents_read_the_same_bytes(ms, size, offset):
    fh = ms.open("/a.bin", os.O_RDONLY)
    assert _read(ms, fh, size, offset) == DATA[offset:offset + size]
    ms.release("/a.bin", fh)


def test_a_bad_extent_is_refused_on_the_direct_path_and_by_the_mount(tmp_path):
    dev = MemoryDevice(GEOM)
    ms = MountedStore(Store.format(dev))
    _put(ms, "/a.bin", DATA)
    gid, shard = _shard(ms, "/a.bin")
    z, off, length, _ = ms.store.catalog.gens[gid].shards[shard].extents[2]
    dev._data[z][off + 100] ^= 0xFF               # one flipped byte in the third extent
    buf = bytearray(MiB)
    with pytest.raises(ChecksumError):
        ms.store.read_shard_into(gid, shard, 2 * MiB, buf)
    assert ms.store.read_shard_into(gid, shard, MiB, buf) == MiB     # the one before is good
    fh = ms.open("/a.bin", os.O_RDONLY)
    with pytest.raises(NamespaceError) as e:
        ms.read_into(fh, bytearray(MiB), 2 * MiB)
    assert e.value.errno == errno.EIO
    ms.release("/a.bin", fh)
    ms.store.close()


class _HeldDevice(MemoryDevice):
    """A MemoryDevice whose reads, once armed, stop after reading until ``go`` is set."""

    def __init__(self, geometry):
        super().__init__(geometry)
        self.armed = False
        self.reading = threading.Event()
        self.go = threading.Event()

    def read(self, offset, length):
        data = super().read(offset, length)
        if self.armed:
            self.armed = False
            self.reading.set()
            self.go.wait(5)
        return data

    def read_into(self, offset, out):
        out[:] = self.read(offset, len(out))


@pytest.mark.parametrize("how", ["extent", "into"])
def test_the_store_lock_is_free_while_an_extent_is_read_and_a_deletion_meanwhile_is_seen(how):
    dev = _HeldDevice(GEOM)
    ms = MountedStore(Store.format(dev))
    _put(ms, "/a.bin", DATA)
    gid, shard = _shard(ms, "/a.bin")
    store = ms.store
    outcome = []

    def reader():
        try:
            if how == "extent":
                outcome.append(store.read_shard_extent(gid, shard, MiB))
            else:
                outcome.append(store.read_shard_into(gid, shard, MiB, bytearray(MiB)))
        except Exception as e:  # noqa: BLE001 - the outcome is what is checked
            outcome.append(e)

    dev.armed = True
    t = threading.Thread(target=reader)
    t.start()
    assert dev.reading.wait(5)
    # the read is in the device: the store's lock is free, so another request's read (or a deletion)
    # goes ahead, here the generation's deletion
    got = store.lock.acquire(timeout=2)
    assert got, "the store's lock is held across the device read"
    try:
        store.delete(gid)
    finally:
        store.lock.release()
        dev.go.set()
        t.join(10)
    # what was read belongs to a deleted generation: the read says so, it does not hand the bytes out
    assert len(outcome) == 1 and isinstance(outcome[0], GenerationNotFoundError)
    store.close()


def test_the_kernel_may_keep_two_read_ahead_windows_in_flight():
    class Conn:
        max_write = max_readahead = want = 0
        max_background, congestion_threshold = 12, 9       # libfuse's defaults

    c = Conn()
    MountedStore(Store.format(MemoryDevice(GEOM))).init_with_config(c, None)
    assert c.max_readahead == READ_AHEAD
    assert c.max_background == MAX_BACKGROUND == 2 * READ_AHEAD // MiB
    assert c.congestion_threshold == MAX_BACKGROUND * 3 // 4


# -- the page cache of a re-saved file (issue 44.8) ------------------------------------------------------
def _open_read(ms: MountedStore, path: str) -> tuple[int, bool, bool]:
    """A read open as the binding makes it: ``(fh, direct_io, keep_cache)``."""
    fh = ms.open(path, os.O_RDONLY)
    direct = ms.direct_io(fh)
    return fh, direct, (not direct and ms.keep_cache(fh))


def _resave(ms: MountedStore, path: str, data: bytes, during=None, flags: int = os.O_WRONLY | os.O_TRUNC) -> bool:
    """Rewrite ``path`` (opened with ``flags``) with ``data``, calling ``during()`` between the writes; returns
    whether the writer's open bypassed the page cache."""
    fh = ms.open(path, flags)
    direct = ms.direct_io(fh, flags)
    for at in range(0, len(data), MiB):
        ms.write(path, memoryview(data)[at:at + MiB], at, fh)
        if during is not None and at == 0:
            during()
    ms.flush(path, fh)
    ms.release(path, fh)
    return direct


def test_a_resave_with_no_reader_open_goes_through_the_page_cache_which_the_next_open_keeps(ms):
    fh, _, _ = _open_read(ms, "/a.bin")                  # the committed version was read (its pages cached)
    ms.release("/a.bin", fh)
    new = DATA[::-1]
    assert _resave(ms, "/a.bin", new) is False           # no reader: the writer fills the page cache
    fh, direct, keep = _open_read(ms, "/a.bin")
    # the cache now holds exactly the committed new version: the first load after the re-save keeps it
    assert (direct, keep) == (False, True)
    assert _read(ms, fh, len(new), 0) == new
    ms.release("/a.bin", fh)


def test_a_resave_while_a_reader_is_open_bypasses_the_cache_and_the_next_open_drops_it(ms):
    reader, _, _ = _open_read(ms, "/a.bin")
    new = DATA[::-1]
    assert _read(ms, reader, 100, 0) == DATA[:100]       # its pages cached, the old version's
    assert _resave(ms, "/a.bin", new) is True            # so the writer bypasses the cache
    ms.release("/a.bin", reader)
    fh, direct, keep = _open_read(ms, "/a.bin")
    assert (direct, keep) == (False, False)               # the old pages are dropped at this open
    assert _read(ms, fh, len(new), 0) == new
    ms.release("/a.bin", fh)


def test_a_reader_opened_during_a_cached_resave_reads_the_old_version_and_the_cache_is_not_kept(ms):
    seen = {}

    def reader_opens():
        fh, direct, _ = _open_read(ms, "/a.bin")
        seen["direct"] = direct
        seen["bytes"] = _read(ms, fh, 2 * MiB, 0)
        ms.release("/a.bin", fh)

    new = DATA[::-1]
    assert _resave(ms, "/a.bin", new, during=reader_opens) is False
    # the reader bypassed the cache and read the committed (old) version from the mount
    assert seen == {"direct": True, "bytes": DATA[:2 * MiB]}
    # its open dropped the writer's pages and its reads may have refilled them: none is kept
    fh, direct, keep = _open_read(ms, "/a.bin")
    assert (direct, keep) == (False, False)
    assert _read(ms, fh, len(new), 0) == new
    ms.release("/a.bin", fh)


def test_a_read_write_resave_bypasses_the_cache(ms):
    """Only a read-write descriptor can be mapped shared and writable, which would write into the
    committed version's cached pages: such a writer keeps bypassing the cache (``mmap`` then ``ENODEV``)."""
    new = DATA[::-1]
    assert _resave(ms, "/a.bin", new, flags=os.O_RDWR | os.O_TRUNC) is True
    fh, direct, keep = _open_read(ms, "/a.bin")
    assert (direct, keep) == (False, False)
    assert _read(ms, fh, len(new), 0) == new
    ms.release("/a.bin", fh)


def test_a_resave_right_after_a_load_waits_for_the_closed_readers_release(ms):
    """The kernel sends ``RELEASE`` after ``close(2)`` has returned (``flush`` is the synchronous part):
    a load closed just before the re-save is still open to the server when the writer opens.  The
    writer's open waits for it (at most ``RELEASE_WAIT``), so the re-save still fills the page cache."""
    fh, _, _ = _open_read(ms, "/a.bin")
    ms.flush("/a.bin", fh)                                # the loader's close(2)
    late = threading.Timer(0.05, ms.release, ("/a.bin", fh))
    late.start()
    try:
        assert _resave(ms, "/a.bin", DATA[::-1]) is False
    finally:
        late.join()
    assert _open_read(ms, "/a.bin")[1:] == (False, True)


def test_a_closed_reader_never_released_still_makes_the_writer_bypass_the_cache(ms):
    fh, _, _ = _open_read(ms, "/a.bin")
    ms.flush("/a.bin", fh)                                # closed once, but a duplicate still reads
    assert _resave(ms, "/a.bin", DATA[::-1]) is True
    ms.release("/a.bin", fh)
