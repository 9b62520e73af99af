"""PyTorch DCP's own storage scenarios (issue 28.4), as our tests, on every face a DCP user can aim at:
``FileSystemWriter``/``Reader`` on the mount, DCP's ``FsspecWriter``/``Reader`` on the mount (fsspec's
local file system) and on ``retainz://``, and ``ZonedStorageWriter``/``Reader`` where the scenario
applies to it (it takes ``thread_count``: one shard per thread; it has no ``single_file_per_rank=False``
or file-system calls).

Each test names the upstream test it mirrors (pytorch/pytorch ``test/distributed/checkpoint/``
``test_file_system_checkpoint.py`` and ``test_fsspec.py``); the scenarios were learnt from there, the
code is ours.  Where the upstream test compares against nothing but itself, ours also runs the same
save on a local directory and checks the face lists the same files (a face must behave as a directory).
The two-rank scenarios (sharded state dicts, per-rank files, resharding on load) are in
``tests/peers/test_peers_dcp_ranks.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
fsspec = pytest.importorskip("fsspec", reason="the mount extra (make setup-mount)")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: E402
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as FsspecFileSystem  # noqa: E402
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from tests.mountcheck import fsck_clean, make_device, mounted, require_fuse  # noqa: E402

pytestmark = [pytest.mark.dcp, pytest.mark.mount,
              pytest.mark.filterwarnings("ignore:Detected an existing checkpoint:UserWarning")]


class Place:
    """One face a DCP writer and reader can be aimed at; ``name`` is a checkpoint directory under it."""

    def __init__(self, kind: str, root: str, device: str | None = None):
        self.kind, self.root, self.device = kind, root, device

    def __repr__(self) -> str:
        return self.kind

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def writer(self, name: str, **kw):
        if self.kind in ("local", "mount"):
            return FileSystemWriter(self.path(name), **kw)
        if self.kind in ("mount-fsspec", "retainz"):
            return FsspecWriter(self.path(name), **kw)
        from retainz.integrations.dcp import ZonedStorageWriter

        assert set(kw) <= {"overwrite", "thread_count"}, kw
        return ZonedStorageWriter(self.device, name, overwrite=kw.get("overwrite", True),
                                  thread_count=kw.get("thread_count", 1))

    def reader(self, name: str):
        if self.kind in ("local", "mount"):
            return FileSystemReader(self.path(name))
        if self.kind in ("mount-fsspec", "retainz"):
            return FsspecReader(self.path(name))
        from retainz.integrations.dcp import ZonedStorageReader

        return ZonedStorageReader(self.device, name)

    def listing(self, name: str) -> list[str]:
        if self.kind == "retainz":
            fs = fsspec.filesystem("retainz")
            return sorted(os.path.basename(p) for p in fs.ls(self.path(name), detail=False))
        if self.kind == "zoned":
            from retainz.jobs import stores

            with stores.using(self.device) as store:
                return sorted(next(g for g in store.generations() if g.id.split("#")[0] == name).shards)
        return sorted(os.listdir(self.path(name)))

    def fsspec_fs(self):
        """DCP's fsspec ``FileSystem`` over this face (its ``init_path`` picks fsspec's implementation)."""
        fs = FsspecFileSystem()
        return fs, fs.init_path(self.root)


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """The faces, each over its own device: one mount shared by the ``mount`` and ``mount-fsspec``
    faces (their checkpoints have different names), one device for ``retainz://``, one for
    ``ZonedStorageWriter``, and a local directory as the reference."""
    require_fuse()
    base = tmp_path_factory.mktemp("peers")
    for d in ("m", "r", "z", "local"):
        (base / d).mkdir()
    mdev = make_device(base / "m", zones=64)
    rdev = make_device(base / "r", zones=64)
    zdev = make_device(base / "z", zones=64)
    fsspec.config.conf.pop("retainz", None)
    with mounted(mdev, base / "m" / "mnt") as mnt:
        yield {"local": Place("local", str(base / "local")), "mount": Place("mount", str(mnt)),
               "mount-fsspec": Place("mount-fsspec", str(mnt)),
               "retainz": Place("retainz", f"retainz://{rdev}"), "zoned": Place("zoned", "", zdev)}
    from retainz.integrations.fsspec_fs import RetainZFileSystem

    RetainZFileSystem.close_all()
    RetainZFileSystem.clear_instance_cache()
    for dev in (mdev, rdev, zdev):
        assert fsck_clean(dev), dev


def _module_state(seed: int) -> dict:
    """A small module's state dict (two linears and an embedding bag, as the upstream test saves)."""
    torch.manual_seed(seed)
    m = torch.nn.ModuleDict({"a": torch.nn.Linear(6, 6), "b": torch.nn.Linear(6, 2), "e": torch.nn.EmbeddingBag(7, 4)})
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _zeros(sd: dict) -> dict:
    return {k: torch.zeros_like(v) for k, v in sd.items()}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


ALL = ["mount", "mount-fsspec", "retainz", "zoned"]
FILE_WRITERS = ["mount", "mount-fsspec", "retainz"]          # the faces whose writers take thread_count


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("thread_count", [1, 2])
@pytest.mark.parametrize("per_rank", [True, False], ids=["single_file_per_rank", "file_per_item"])
def test_read_write_only_tensor(places, kind, thread_count, per_rank):
    """Mirrors test_file_system_checkpoint.py ``TestDistributedStateDictSaveLoad.test_read_write_only_tensor``
    (thread_count 1 and 2, ``single_file_per_rank`` both ways): a plain state dict saved, then loaded
    into a fresh one without resharding, equal to the bit; the face lists the files a local directory
    holds after the same save."""
    kw = {"thread_count": thread_count, "single_file_per_rank": per_rank}
    if kind == "zoned" and not per_rank:
        pytest.skip("ZonedStorageWriter writes shards per rank (thread_count of them), not a file per item")
    place = places[kind]
    name = f"rw-{kind}-t{thread_count}-{'rank' if per_rank else 'item'}"
    sd = _module_state(1)
    dcp.save(sd, storage_writer=place.writer(name, **({"thread_count": thread_count} if kind == "zoned" else kw)))
    out = _zeros(sd)
    assert not _equal(out, sd)
    dcp.load(out, storage_reader=place.reader(name))
    assert _equal(out, sd)
    dcp.save(sd, storage_writer=places["local"].writer(name, **kw))
    assert place.listing(name) == places["local"].listing(name)
    assert len(place.listing(name)) == 1 + (thread_count if per_rank else len(sd))


@pytest.mark.parametrize("kind", ALL)
def test_fsspec_model_and_optimizer(places, kind):
    """Mirrors test_fsspec.py ``TestFSSpec.test_fsspec`` on CPU in one process (upstream shards with FSDP
    on two GPUs): a model and its Adam optimizer after one step, saved through
    ``get_state_dict``; a second model and optimizer, different before, equal to the bit after the load
    (``set_state_dict``), Adam's lazily created ``exp_avg``/``exp_avg_sq`` included.  Where the face has a
    path (the mount, ``retainz://``) the load finds its reader from ``checkpoint_id`` alone, as upstream."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def model_and_optim(seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8))
        opt = torch.optim.Adam(m.parameters(), lr=0.1)
        m(torch.rand(8, 8)).sum().backward()
        opt.step()
        return m, opt

    place = places[kind]
    name = f"fsspec-{kind}"
    m1, o1 = model_and_optim(7)
    msd, osd = get_state_dict(m1, o1)
    dcp.save({"model": msd, "optim": osd}, storage_writer=place.writer(name))
    m2, o2 = model_and_optim(8)
    assert not torch.equal(m1[0].weight, m2[0].weight)
    msd2, osd2 = get_state_dict(m2, o2)
    state = {"model": msd2, "optim": osd2}
    if kind == "zoned":
        dcp.load(state, storage_reader=place.reader(name))
    else:
        dcp.load(state, checkpoint_id=place.path(name))
    set_state_dict(m2, o2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters(), strict=True))
    for s1, s2 in zip(o1.state.values(), o2.state.values(), strict=True):
        assert torch.equal(s1["exp_avg"], s2["exp_avg"]) and torch.equal(s1["exp_avg_sq"], s2["exp_avg_sq"])


@pytest.mark.parametrize("kind", ALL)
def test_overwrite(places, kind):
    """Mirrors test_fsspec.py ``TestFSSpec.test_overwrite``: a save with overwrite=False, a second into
    the same directory with overwrite=True replaces it (the load sees the second), and a third with
    overwrite=False is refused with DCP's "Checkpoint already exists"."""
    place = places[kind]
    name = f"over-{kind}"
    t1, t2 = torch.randn(10), torch.randn(10)
    dcp.save({"random": t1}, storage_writer=place.writer(name, overwrite=False))
    dcp.save({"random": t2}, storage_writer=place.writer(name, overwrite=True))
    sd = {"random": torch.zeros(10)}
    dcp.load(sd, storage_reader=place.reader(name))
    assert torch.equal(sd["random"], t2)
    with pytest.raises(CheckpointException, match="Checkpoint already exists"):
        dcp.save({"random": t1}, storage_writer=place.writer(name, overwrite=False))
    sd = {"random": torch.zeros(10)}
    dcp.load(sd, storage_reader=place.reader(name))
    assert torch.equal(sd["random"], t2)


@pytest.mark.parametrize("kind", FILE_WRITERS)
def test_overwrite_with_fewer_files(places, kind):
    """Mirrors ``test_overwrite`` with the second save writing fewer files than the first
    (thread_count 2, then 1: ``__0_1.distcp`` is not rewritten): as on a local directory, the stale
    file stays, the metadata names only the new files, and the load gets the second save's values."""
    place = places[kind]
    name = f"over-fewer-{kind}"
    first, second = _module_state(2), _module_state(3)
    for p in (place, places["local"]):
        dcp.save(first, storage_writer=p.writer(name, thread_count=2))
        dcp.save(second, storage_writer=p.writer(name, thread_count=1))
    out = _zeros(second)
    dcp.load(out, storage_reader=place.reader(name))
    assert _equal(out, second)
    assert place.listing(name) == places["local"].listing(name) == [".metadata", "__0_0.distcp", "__0_1.distcp"]


@pytest.mark.parametrize("kind", ["mount-fsspec", "retainz"])
def test_remove_on_fail(places, kind):
    """Mirrors test_fsspec.py ``TestFileSystem.test_remove_on_fail``: DCP's fsspec ``create_stream``
    for writing removes the file when the block raises (the file is still open when it is removed);
    a reading block that raises leaves the file."""
    fs, root = places[kind].fsspec_fs()
    base = fs.concat_path(root, f"remove-on-fail-{kind.replace('-', '')}")
    fs.mkdir(base)
    written = fs.concat_path(base, "writeable")
    with pytest.raises(OSError, match="fail"):
        with fs.create_stream(written, "w") as s:
            s.write("aaa")
            raise OSError("fail")
    assert not fs.exists(written)
    readable = fs.concat_path(base, "readable")
    with fs.create_stream(readable, "w") as s:
        s.write("bbb")
    assert fs.exists(readable)
    with pytest.raises(OSError, match="fail"):
        with fs.create_stream(readable, "r") as s:
            raise OSError("fail")
    assert fs.exists(readable)
    with fs.create_stream(readable, "r") as s:
        assert s.read() == "bbb"


@pytest.mark.parametrize("kind", ALL)
def test_save_load_bytes(places, kind):
    """Mirrors test_file_system_checkpoint.py ``TestDistributedReshardOnLoad.test_save_load_bytes``:
    non-tensor values (a list, a string) are saved as bytes items and loaded over other values."""
    place = places[kind]
    name = f"bytes-{kind}"
    dcp.save({"bytes0": [1], "bytes1": "string"}, storage_writer=place.writer(name))
    out = {"bytes0": [2], "bytes1": "other"}
    dcp.load(out, storage_reader=place.reader(name))
    assert out == {"bytes0": [1], "bytes1": "string"}


@pytest.mark.parametrize("kind", ALL)
def test_async_save(places, kind):
    """Mirrors the async path of DCP's checkpointer (``dcp.async_save``, thread mode, as
    test_fsspec.py's FsspecWriter scenarios run in torch's async tests): the future completes, the
    checkpoint loads bit-identical, and the state the caller mutated after the call is not what was
    saved (async_save stages a copy first)."""
    place = places[kind]
    name = f"async-{kind}"
    sd = _module_state(4)
    saved = {k: v.clone() for k, v in sd.items()}
    fut = dcp.async_save(sd, storage_writer=place.writer(name))
    for v in sd.values():
        v.add_(1.0)
    fut.result()
    out = _zeros(saved)
    dcp.load(out, storage_reader=place.reader(name))
    assert _equal(out, saved)


def test_faces_see_each_others_checkpoints(places):
    """The same mount through DCP's two writers: a checkpoint ``FileSystemWriter`` wrote loads through
    ``FsspecReader`` on the same path and the other way round (one namespace, whichever client)."""
    m, mf = places["mount"], places["mount-fsspec"]
    a, b = _module_state(5), _module_state(6)
    dcp.save(a, storage_writer=m.writer("cross-a"))
    dcp.save(b, storage_writer=mf.writer("cross-b"))
    out_a, out_b = _zeros(a), _zeros(b)
    dcp.load(out_a, storage_reader=mf.reader("cross-a"))
    dcp.load(out_b, storage_reader=m.reader("cross-b"))
    assert _equal(out_a, a) and _equal(out_b, b)
    assert Path(m.path("cross-a")).is_dir() and sorted(os.listdir(m.path("cross-b")))[0] == ".metadata"


def test_async_save_in_a_background_process(tmp_path):
    """``dcp.async_save`` in PROCESS mode (torch's ``AsyncCheckpointerType.PROCESS``: the save runs in a
    background process that lives on for the next save, as ``test_async_process_executor`` in torch's
    test/distributed/checkpoint drives it), then a load in the training process: on the mount (one
    server for every process), on ``retainz://`` through a node service, and on ``retainz://`` with nothing
    started: the background process keeps the device open between saves and serves it meanwhile, so the
    load in the training process is its client (before, it waited "device busy" and timed out,
    docs/node.md "A process that holds a device serves it")."""
    import subprocess
    import sys

    from tests.mountcheck import ROOT, env
    from tests.node.test_node import start_service, stop_service

    require_fuse()
    (tmp_path / "m").mkdir()
    (tmp_path / "r").mkdir()
    (tmp_path / "n").mkdir()
    mdev = make_device(tmp_path / "m", zones=32)
    rdev = make_device(tmp_path / "r", zones=32)
    ndev = make_device(tmp_path / "n", zones=32)          # nothing started for it
    svc = start_service(rdev, tmp_path / "service.log")
    try:
        with mounted(mdev, tmp_path / "m" / "mnt") as mnt:
            ids = [str(mnt / "ck" / "step-1"), str(mnt / "ck" / "step-2"), f"retainz://{rdev}/ck/step-1",
                   f"retainz://{rdev}/ck/step-2"]
            r = subprocess.run([sys.executable, str(ROOT / "tests/workers/dcp_async_process.py"),
                                str(tmp_path / "pg"), *ids], capture_output=True, text=True, timeout=400,
                               env={**env(), "RETAINZ_JOB": "ck", "OMP_NUM_THREADS": "1"})
            assert r.stdout.split("\n")[:5] == [f"OK {i}" for i in ids] + ["DONE"], r.stdout + r.stderr[-4000:]
    finally:
        stop_service(svc)
    # nothing started, no RETAINZ_JOB; a device left busy fails within 20 s, not the default 120 s
    ids = [f"retainz://{ndev}/ck/step-1", f"retainz://{ndev}/ck/step-2"]
    run_env = {k: v for k, v in env().items() if k != "RETAINZ_JOB"}
    r = subprocess.run([sys.executable, str(ROOT / "tests/workers/dcp_async_process.py"), str(tmp_path / "pg2"),
                        *ids], capture_output=True, text=True, timeout=400,
                       env={**run_env, "OMP_NUM_THREADS": "1", "FSSPEC_RETAINZ_WAIT": "20"})
    assert r.stdout.split("\n")[:3] == [f"OK {i}" for i in ids] + ["DONE"], r.stdout + r.stderr[-4000:]
    from tests.mountcheck import generations

    for dev in (mdev, rdev, ndev):
        assert sorted(generations(dev)) == ["ck%2Fstep-1", "ck%2Fstep-2"], dev
        assert fsck_clean(dev)


@pytest.mark.parametrize("bins", [1, 2, 3, 5])
def test_zoned_writer_deals_items_over_its_shards_as_file_system_writer_deals_them_over_files(bins):
    """``thread_count`` (issue 28.4f): ``split_items`` deals a rank's items over its shards by DCP's own
    rule (torch ``filesystem.py`` ``_split_by_size_and_type``: byte items round-robin, tensors largest
    first to the emptiest file), compared item by item with torch's function on a plan of mixed sizes
    with byte items; one shard keeps plan order, byte items first."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.filesystem import _split_by_size_and_type

    from retainz.integrations.dcp import split_items

    torch.manual_seed(5)
    sd = {f"t{i}": torch.randn(n) for i, n in enumerate([7, 300, 41, 300, 2, 1000, 64, 5, 128])}
    sd.update({"step": 12, "note": "bytes", "lr": [0.1, 0.2]})
    planner = DefaultSavePlanner()
    planner.set_up_planner(sd, is_coordinator=True)
    items = planner.create_local_plan().items
    assert sum(i.type.name == "BYTE_IO" for i in items) == 3
    ours = split_items(list(items), bins)
    assert len(ours) == bins
    if bins == 1:
        assert [i.type.name == "BYTE_IO" for i in ours[0]] == [True] * 3 + [False] * 9
        assert {i.index for i in ours[0]} == {i.index for i in items}
    else:
        theirs = _split_by_size_and_type(bins, list(items))
        assert [[i.index for i in b] for b in ours] == [[i.index for i in b] for b in theirs]


def test_zoned_writer_thread_count_writes_one_shard_per_thread_and_loads_back(tmp_path):
    """``ZonedStorageWriter(thread_count=4)`` writes ``__0_0..3.distcp``, each from its own thread,
    with the tensor bytes balanced as DCP balances its files; the load is equal to the bit; a bad
    ``thread_count`` is refused at construction."""
    import threading

    from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter
    from retainz.jobs import stores

    device = make_device(tmp_path, zones=32)
    torch.manual_seed(9)
    sd = {f"w{i}": torch.randn(64 << 10) for i in range(8)}     # 8 tensors of 256 KiB
    seen: set[str] = set()
    orig = torch.Tensor.detach

    def detach(t):
        seen.add(threading.current_thread().name.split("_")[0])
        return orig(t)

    torch.Tensor.detach = detach
    try:
        dcp.save(sd, storage_writer=ZonedStorageWriter(device, "step-1", thread_count=4))
    finally:
        torch.Tensor.detach = orig
    assert {n for n in seen if n.startswith("retainz-dcp")} == {"retainz-dcp"}
    with stores.using(device) as store:
        info = store.generation("step-1")
        shards = {n: s.size for n, s in info.shards.items()}
    assert shards.keys() == {".metadata", "__0_0.distcp", "__0_1.distcp", "__0_2.distcp", "__0_3.distcp"}
    assert [shards[f"__0_{i}.distcp"] for i in range(4)] == [2 * (256 << 10)] * 4
    out = _zeros(sd)
    dcp.load(out, storage_reader=ZonedStorageReader(device, "step-1"))
    assert _equal(out, sd)
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="thread_count must be a positive int"):
            ZonedStorageWriter(device, "step-2", thread_count=bad)
    assert fsck_clean(device)
