"""The store contract (retainz.store.contract): both implementations, the in-process ``Store`` and a node
service's client ``NodeStore``, keep it with the same signatures and the same behaviour (one suite runs on
both: the ``store`` fixture), and the code outside the store (integrations, mount, CLI, jobs, replay,
experiments, the guest lane) calls nothing else on a store; only the replay driver and the experiments,
which run the store in process, read its placement state (``PlacementView``)."""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
import re
from pathlib import Path

import pytest

from retainz.errors import (
    AccessDeniedError,
    ChecksumError,
    GenerationExistsError,
    GenerationNotFoundError,
    NoSpaceError,
)
from retainz.hint import Hint
from retainz.node.client import NodeGenerationWriter, NodeShardStream, NodeStore
from retainz.store import GenerationWriter, ShardWriter, Store
from retainz.store.contract import CheckpointStore, GenerationWriting, PlacementView, ShardStream
from retainz.zoned import FileDevice, Geometry, MemoryDevice

SRC = Path(__file__).resolve().parents[2] / "src" / "retainz"
CALLERS = ["integrations", "mount", "cli", "trace", "experiments", "vm", "node", "jobs", "namespace", "tier"]
#: The packages that run a store in process and may read its placement state.
IN_PROCESS = {"trace", "experiments"}
GEOMETRY = Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20)
#: Real zoned block devices (``RETAINZ_TEST_ZBD``, as tests/conftest.py's device kinds): the suite runs
#: on a NodeStore served over each too.  Everything on them is erased.
REAL = [p for p in os.environ.get("RETAINZ_TEST_ZBD", "").split(",") if p]


def _members(proto) -> set[str]:
    names: set[str] = set()
    for cls in proto.__mro__:
        if cls is object or not getattr(cls, "_is_protocol", False):
            continue
        names |= {n for n in vars(cls) if not n.startswith("_")} | set(getattr(cls, "__annotations__", {}))
    return names


IMPLEMENTATIONS = [(CheckpointStore, Store), (GenerationWriting, GenerationWriter), (ShardStream, ShardWriter),
                   (CheckpointStore, NodeStore), (GenerationWriting, NodeGenerationWriter),
                   (ShardStream, NodeShardStream)]


@pytest.mark.parametrize("proto, impl", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_every_method_of_the_contract_has_the_same_signature_on_both_implementations(proto, impl):
    """The contract's parameters, in order, open each implementation's (a served store may take more:
    ``ranks`` of a join, keyword-only with a default)."""
    for name, member in vars(proto).items():
        if name.startswith("_") or not callable(member):
            continue
        mine = inspect.signature(getattr(impl, name)).parameters
        theirs = list(inspect.signature(member).parameters)
        assert list(mine)[:len(theirs)] == theirs, f"{impl.__name__}.{name}: {list(mine)} vs {theirs}"
        assert all(p.default is not p.empty for p in list(mine.values())[len(theirs):]), (impl.__name__, name)


def test_the_placement_view_is_the_in_process_store_s_alone():
    assert set(vars(PlacementView)) & {"table", "admission_reserve_zones", "stop_state"}
    assert not {"table", "allocator", "admission_reserve_zones", "stop_state"} & _members(CheckpointStore)
    with Store.format(MemoryDevice(GEOMETRY)) as s:
        assert isinstance(s, PlacementView)


def _serve(dev, *, allow_all: bool = True):
    """``dev`` formatted and served in this process (a thread); a NodeStore connected to it, and the stop."""
    import threading

    from retainz.node.protocol import socket_path
    from retainz.node.service import Service

    store = Store.format(dev)
    svc = Service(store, socket_path(dev.name), allow_all=allow_all)   # True: no setup, as a single-job node
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    client = NodeStore.connect(dev.name)

    def stop():
        client.close()
        svc.stop()
        svc.close()
        t.join()
        dev.close()
    return client, stop


@pytest.fixture(params=["store-memory", "node-file"] + [f"node-linux:{p}" for p in REAL])
def store(request, tmp_path):
    """An empty store of each implementation: in process on a MemoryDevice, and a NodeStore served over
    a FileDevice (and over each real zoned block device named in RETAINZ_TEST_ZBD)."""
    kind = request.param
    if kind == "store-memory":
        with Store.format(MemoryDevice(GEOMETRY)) as s:
            yield s
        return
    if kind == "node-file":
        dev = FileDevice.create(tmp_path / "dev.img", GEOMETRY)
    else:
        from retainz.zoned import open_device

        dev = open_device(kind.split(":", 1)[1])
        for z in range(dev.geometry.nr_zones):
            dev.reset_zone(z)
    client, stop = _serve(dev)
    try:
        yield client
    finally:
        stop()


def test_an_open_store_and_its_writers_are_instances_of_the_contract(store):
    assert isinstance(store, CheckpointStore)
    w = store.begin_generation("g", 1)
    assert isinstance(w, GenerationWriting) and w.joined is False and w.id == "g"
    shard = w.open_shard("a")
    assert isinstance(shard, ShardStream)
    shard.write(b"abc")
    assert shard.close().size == 3
    w.commit()
    assert b"".join(store.read_shard("g", "a")) == b"abc"


def test_a_generation_round_trips_with_its_hint_and_step(store):
    data = os.urandom(3 * (1 << 20) // 2)                 # crosses a zone boundary
    with store.begin_generation("ckpt%2Fstep-5", 5, hint=Hint(reclaim_step=9)) as w:
        w.write_shard("__0_0.distcp", [data[:1000], data[1000:]])
        w.write_shard("x", [b""])
    g = store.generation("ckpt%2Fstep-5")
    assert (g.step, g.hint.reclaim_step, sorted(g.shards)) == (5, 9, ["__0_0.distcp", "x"])
    assert [x.id for x in store.generations()] == ["ckpt%2Fstep-5"]
    assert b"".join(store.read_shard("ckpt%2Fstep-5", "__0_0.distcp")) == data
    pos, first = store.read_shard_extent("ckpt%2Fstep-5", "__0_0.distcp", 0)
    assert pos == 0 and data.startswith(first) and first
    assert store.now >= 5


def test_admission_refuses_what_cannot_fit_before_a_byte_is_written(store):
    w = store.begin_generation("big", 1)
    with store.lock, store.lock:                          # reentrant: check, then admit
        store.admit(w, 1 << 20)
        with pytest.raises(NoSpaceError) as e:
            store.admit(w, 64 << 20)                      # twice the device
    assert e.value.cause == "admission"
    w.abort()
    assert store.generations() == []


def test_rename_leave_and_abort(store):
    w = store.begin_generation("tmp-1", 1)
    w.write_shard("a", [b"x"])
    w.rename("final")
    assert w.id == "final"
    w.commit()
    assert [g.id for g in store.generations()] == ["final"]
    v = store.begin_generation("other", 2)
    with pytest.raises(GenerationExistsError):
        v.rename("final")
    v.leave()                      # its only holder lets go: aborted
    u = store.begin_generation("other", 2)           # the id is free again
    u.abort()
    with pytest.raises(GenerationNotFoundError):
        store.generation("other")


def test_delete_update_hint_unknown_restore_and_space(store):
    with store.begin_generation("s-1", 1) as w:
        w.write_shard("a", [b"abc"])
    store.update_hint("s-1", Hint(reclaim_step=7), step=2)
    assert store.generation("s-1").hint.reclaim_step == 7
    assert store.unknown() == [] and store.readonly is False
    with pytest.raises(GenerationNotFoundError):
        store.restore("s-1")                              # committed, not unknown
    before = store.df()
    store.delete("s-1", step=3)
    assert store.generations() == [] and store.df().used < before.used
    assert store.fsck().ok


def test_a_scope_refusal_of_a_served_store_is_eacces(tmp_path):
    dev = FileDevice.create(tmp_path / "dev.img", GEOMETRY)
    client, stop = _serve(dev, allow_all=False)
    try:
        scoped = NodeStore.connect(dev.name, job="jobs/a")           # a declared job keeps its scope
        with contextlib.closing(scoped):
            with pytest.raises(AccessDeniedError) as e:
                scoped.begin_generation("jobs%2Fb%2Fstep-1", 1)
            assert e.value.errno == errno.EACCES and isinstance(e.value, PermissionError)
            w = scoped.begin_generation("jobs%2Fa%2Ftmp", 1)
            with pytest.raises(AccessDeniedError):
                w.rename("jobs%2Fb%2Fstep-1")             # a rename out of the scope is refused too
            w.abort()
    finally:
        stop()


def test_code_outside_the_store_calls_only_the_contract():
    allowed, placement = _members(CheckpointStore), _members(PlacementView)
    used: dict[str, set[str]] = {}
    for pkg in CALLERS:
        for path in (SRC / pkg).rglob("*.py"):
            for name in re.findall(r"(?:(?<=self\.)|(?<![\w.]))store\.([A-Za-z_]\w*)", path.read_text()):
                ok = placement if pkg in IN_PROCESS else allowed
                if name not in ok:
                    used.setdefault(name, set()).add(str(path.relative_to(SRC)))
    assert not used, f"store members used outside the contract: {used}"
    assert _members(CheckpointStore) > {"admit", "lock", "unknown", "restore", "readonly"}


def test_no_face_asks_which_store_it_holds():
    """No ``isinstance(..., NodeStore)`` / ``Store`` tests and no ``getattr`` probes of a store or writer
    in the faces (the mount's runner asks whether its process holds the device, to serve it: a question of
    who owns the device, not of the contract)."""
    found = []
    for pkg in ["integrations", "namespace", "jobs", "cli"]:
        for path in (SRC / pkg).rglob("*.py"):
            text = path.read_text()
            found += [f"{path.relative_to(SRC)}: {m}" for m in re.findall(
                r"isinstance\([\w.]*store\w*, (?:NodeStore|Store)\)|getattr\([\w.]*(?:store|writer|_gen)\b[^)]*\)",
                text)]
    assert not found, found


def test_both_implementations_say_the_store_format_version(store):
    """``format_version`` (the contract's): the in-process store's journal's, a served store's from
    its service's hello; a writable store is always at the current version."""
    from retainz.store.format import FORMAT_VERSION

    assert store.format_version == FORMAT_VERSION


def _refusal(e: BaseException) -> tuple:
    return (type(e), str(e), e.generation, e.shard, e.zone, e.offset, e.length, e.expected, e.actual)


def test_a_corrupt_extent_is_refused_exactly_alike_in_process_and_served(tmp_path):
    """One read path (``store.reader.Reader``): one flipped byte in a shard's second extent on the device
    file makes the stream and the random access raise the same ChecksumError, message and fields
    (generation, shard, zone, offset, length, expected and actual crc32c), whether the in-process store
    or a NodeStore served over the same device reads it; the first extent still reads."""
    data = os.urandom(5 * (1 << 20) // 2)                    # three extents, the last one half full
    refused, z, off = {}, 0, 0
    for kind in ("store", "node"):
        dev = FileDevice.create(tmp_path / f"{kind}.img", GEOMETRY)
        if kind == "store":
            store = Store.format(dev)
            stop = store.close
        else:
            store, stop = _serve(dev)
        try:
            with store.begin_generation("g", 1) as w:
                w.write_shard("a", [data])
            if kind == "store":       # the same requests place the same extents through the service
                z, off, _length, _crc = store.generation("g").shards["a"].extents[1]
            file, region = dev.direct_region()
            at = region + z * GEOMETRY.zone_size + off + 7
            fd = os.open(file, os.O_RDWR)
            try:
                os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0x10]), at)
            finally:
                os.close(fd)
            assert store.read_shard_extent("g", "a", 0) == (0, data[:1 << 20])
            with pytest.raises(ChecksumError) as streamed:
                b"".join(store.read_shard("g", "a"))
            with pytest.raises(ChecksumError) as random:
                store.read_shard_extent("g", "a", (1 << 20) + 5)
            refused[kind] = (_refusal(streamed.value), _refusal(random.value))
        finally:
            stop()
    first = refused["store"][0]
    zone, offset, length = first[4:7]
    assert first[1] == f"generation 'g' shard 'a': extent at zone {zone} offset {offset} ({length} bytes) fails its crc32c"
    assert first[6] == 1 << 20 and first[8] is not None and first[8] != first[7]
    assert refused["store"][1] == first
    assert refused["node"] == refused["store"]


def test_read_shard_into_gives_whole_verified_extents_alike_in_process_and_served(store):
    """``read_shard_into`` (the mount's direct reads) on either implementation: from an extent's first
    byte, the whole extents that fit in ``out``, read into it; 0 from a byte inside an extent; the
    last extent (not a block multiple) is left to ``read_shard_extent``; a bad crc32c raises."""
    data = os.urandom((5 << 19) + 100)      # three extents, the last not a block multiple
    with store.begin_generation("g", 1) as w:
        w.write_shard("a", [data])
    out = bytearray(3 << 20)
    assert store.read_shard_into("g", "a", 0, out) == 2 << 20
    assert bytes(out[:2 << 20]) == data[:2 << 20]
    small = bytearray((1 << 20) + 4096)
    assert store.read_shard_into("g", "a", 1 << 20, small) == 1 << 20
    assert bytes(small[:1 << 20]) == data[1 << 20:2 << 20]
    assert store.read_shard_into("g", "a", 4096, out) == 0
    assert store.read_shard_into("g", "a", 2 << 20, out) == 0
    assert store.read_shard_extent("g", "a", 2 << 20) == (2 << 20, data[2 << 20:])
    with pytest.raises(ValueError):
        store.read_shard_into("g", "a", len(data), out)
