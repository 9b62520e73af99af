"""Atomic replace through the mount's operations, with the power cut at every device write.

The mount's FUSE operations (:class:`retainz.mount.fs.MountedStore`) are driven directly (no kernel)
over a store on a :class:`FaultyDevice`: a tracker file rewritten in place (``O_TRUNC``, as Megatron
and DeepSpeed do), a JSON state written to ``X.tmp`` and renamed over ``X``, and a file-generation
rename.  The workload is run once to count its device writes, then once per write with the power cut
there (whole write landed, torn to nothing, and unflushed writes dropped): after recovery and a new
mount, each replaced path holds exactly one version, the old or the new one, whole, and fsck is clean.
"""

from __future__ import annotations

import errno
import os
import stat

import pytest

pytest.importorskip("fsspec", reason="the mount streams through the fsspec filesystem's sink (mount extra)")

from retainz.errors import PowerCutError  # noqa: E402
from retainz.mount.fs import MountedStore  # noqa: E402
from retainz.store import Store  # noqa: E402
from retainz.zoned import Geometry, MemoryDevice  # noqa: E402
from retainz.zoned.faulty import FaultyDevice

GEOM = Geometry(nr_zones=24, zone_size=256 << 10, zone_capacity=256 << 10)
OLD = {"run/latest_checkpointed_iteration.txt": b"10", "run/state.json": b'{"step": 10}',
       "run/keep.bin": b"k" * 300_000}
NEW = {"run/latest_checkpointed_iteration.txt": b"20", "run/state.json": b'{"step": 20, "loss": 1.5}'}


def _put(ms: MountedStore, path: str, data: bytes, *, create: bool = True) -> None:
    fh = ms.create("/" + path, 0o644) if create else ms.open("/" + path, os.O_WRONLY | os.O_TRUNC)
    ms.write("/" + path, data, 0, fh)
    ms.release("/" + path, fh)


def _get(ms: MountedStore, path: str) -> bytes:
    fh = ms.open("/" + path, os.O_RDONLY)
    try:
        return ms.read("/" + path, 1 << 22, 0, fh)
    finally:
        ms.release("/" + path, fh)


def _setup(dev) -> MountedStore:
    store = Store.format(dev)
    ms = MountedStore(store)
    ms.mkdir("/run", 0o755)
    for p, data in OLD.items():
        _put(ms, p, data)
    return ms


def _workload(ms: MountedStore) -> None:
    _put(ms, "run/latest_checkpointed_iteration.txt", NEW["run/latest_checkpointed_iteration.txt"], create=False)
    _put(ms, "run/state.json.tmp", NEW["run/state.json"])
    ms.rename("/run/state.json.tmp", "/run/state.json")          # atomic replace by rename
    ms.rename("/run/keep.bin", "/run/kept.bin")                  # a committed file moves (copy, then retire)


def test_replace_semantics_without_faults():
    dev = MemoryDevice(GEOM)
    ms = _setup(dev)
    ids_before = {g.id for g in ms.store.generations()}
    _workload(ms)
    for p, data in NEW.items():
        assert _get(ms, p) == data
    assert _get(ms, "run/kept.bin") == OLD["run/keep.bin"]
    assert set(ms.readdir("/run", 0)) == {".", "..", "latest_checkpointed_iteration.txt", "state.json", "kept.bin"}
    with pytest.raises(OSError) as e:
        ms.getattr("/run/keep.bin")
    assert e.value.errno == errno.ENOENT
    # every old version was retired after its replacement committed: one generation per path
    gens = ms.store.generations()
    assert len(gens) == 3 and not ({g.id for g in gens} & ids_before)
    assert sorted(g.id for g in gens) == ["@run%2Fkept.bin", "@run%2Flatest_checkpointed_iteration.txt#1",
                                          "@run%2Fstate.json#1"]
    assert ms.getattr("/run/state.json")["st_size"] == len(NEW["run/state.json"])
    assert stat.S_ISDIR(ms.getattr("/run")["st_mode"])
    ms.store.close()


def _count_writes() -> tuple[int, int]:
    dev = FaultyDevice(MemoryDevice(GEOM))
    ms = _setup(dev)
    start = dev.writes
    _workload(ms)
    end = dev.writes
    ms.store.close()
    return start, end


@pytest.mark.parametrize("torn, keep", [(None, True), (0, True), (None, False)],
                         ids=["whole-write", "torn-write", "unflushed-dropped"])
def test_replace_survives_a_cut_at_every_write(torn, keep):
    start, end = _count_writes()
    assert end - start >= 8                        # the workload really writes (journal + data)
    outcomes = set()
    for cut in range(start + 1, end + 1):
        inner = MemoryDevice(GEOM)
        dev = FaultyDevice(inner, torn_blocks=torn, keep_unflushed=keep)
        ms = _setup(dev)
        dev.cut_after_writes = cut
        with pytest.raises((PowerCutError, OSError)):
            _workload(ms)
            ms.store.delete("nothing")             # the power is cut by now: any store call fails
        try:
            ms.store.close()
        except PowerCutError:
            pass
        dev.reboot()
        store = Store.open(inner)
        ms2 = MountedStore(store)
        seen = []
        for p in NEW:
            got = _get(ms2, p)
            assert got in (OLD[p], NEW[p]), (cut, p, got)
            seen.append(got == NEW[p])
        # the moved file is whole at its new path, its old one, or both (the copy commits before the
        # source is retired)
        at = [p for p in ("run/keep.bin", "run/kept.bin") if ms2.ns.view.has_file(p)]
        assert len(at) >= 1, cut
        for p in at:
            assert _get(ms2, p) == OLD["run/keep.bin"]
        # one committed version per path after the mount's recovery rule
        paths = [ms2.ns.view.get(g.id).path for g in store.generations()]
        assert len(paths) == len(set(paths)), (cut, paths)
        rep = store.fsck()
        assert rep.ok, (cut, rep.problems)
        outcomes.add(tuple(seen))
        store.close()
    # the cuts cover before, between and after the two replaces
    assert (False, False) in outcomes and (True, True) in outcomes
