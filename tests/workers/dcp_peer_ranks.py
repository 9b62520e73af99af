"""torchrun worker for tests/peers/test_peers_dcp_ranks.py: PyTorch DCP's two-rank storage scenarios (gloo on
CPU) on one face, each scenario checked on every rank; prints "RANK r OK" and, from rank 0, writes a JSON
file (``$PEER_RANKS_OUT``) with the files of the sharded checkpoint on the face and in a local directory
after the same saves.

Usage: torchrun --standalone --nproc_per_node=2 tests/workers/dcp_peer_ranks.py FACE ROOT LOCAL [DEVICE]
FACE: ``mount`` (FileSystemWriter on ROOT, a directory of the mount), ``retainz`` (DCP's FsspecWriter on
ROOT, a ``retainz://`` URL) or ``zoned`` (ZonedStorageWriter on DEVICE, series ``ck``, checkpoints named ROOT/NAME);
LOCAL: a local directory where the same saves are made as the reference listing.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from retainz.integrations.dcp import ZonedStorageReader, ZonedStorageWriter

ROWS, COLS, N = 11, 20, 33          # uneven over 2 ranks: rows 6 + 5, N 17 + 16


def full(step: int) -> dict[str, torch.Tensor]:
    """The unsharded values of save ``step`` (the same on every rank and in the test)."""
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(ROWS, COLS, generator=g), "v": torch.randn(N, generator=g),
            "rep": torch.randn(N, generator=g)}


def sharded(step: int, mesh) -> dict:
    f = full(step)
    return {"w": distribute_tensor(f["w"], mesh, [Shard(0)]), "v": distribute_tensor(f["v"], mesh, [Shard(0)]),
            "rep": f["rep"].clone(), "meta": {"step": step}}


class Face:
    def __init__(self, kind: str, root: str, device: str | None):
        self.kind, self.root, self.device = kind, root, device

    def writer(self, name: str, **kw):
        path = f"{self.root}/{name}"
        if self.kind in ("mount", "local"):
            return FileSystemWriter(path, **kw)
        if self.kind == "retainz":
            return FsspecWriter(path, **kw)
        return ZonedStorageWriter(self.device, path, overwrite=True, series="ck")

    def reader(self, name: str):
        path = f"{self.root}/{name}"
        if self.kind in ("mount", "local"):
            return FileSystemReader(path)
        if self.kind == "retainz":
            return FsspecReader(path)
        return ZonedStorageReader(self.device, path, series="ck")

    def listing(self, name: str) -> list[str] | None:
        if self.kind in ("mount", "local"):
            return sorted(os.listdir(f"{self.root}/{name}"))
        if self.kind == "retainz":
            import fsspec

            fs, path = fsspec.core.url_to_fs(f"{self.root}/{name}")
            return sorted(os.path.basename(p) for p in fs.ls(path, detail=False))
        return None          # the store's shards: read by the test once the service is stopped


def _eq(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and torch.equal(a, b), what


def scenarios(face: Face, mesh, rank: int, kw: dict) -> None:
    # test_file_system_checkpoint.py TestDistributedStateDictSaveLoadWithSharedTensor.test_read_write_shard_tensor:
    # a sharded state dict saved (thread_count 2), loaded into the same sharding
    dcp.save(sharded(1, mesh), storage_writer=face.writer("sharded", **kw))
    f = full(1)
    out = {"w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(0)]),
           "v": distribute_tensor(torch.zeros(N), mesh, [Shard(0)]), "rep": torch.zeros(N), "meta": {"step": -1}}
    dcp.load(out, storage_reader=face.reader("sharded"))
    _eq(out["w"].full_tensor(), f["w"], "same sharding: w")
    _eq(out["v"].full_tensor(), f["v"], "same sharding: v")
    _eq(out["rep"], f["rep"], "same sharding: rep")
    assert out["meta"] == {"step": 1}, out["meta"]
    # TestDistributedReshardOnLoad.test_load_rowwise_to_colwise / test_load_with_different_shard_plan: rows
    # saved, columns loaded (each rank reads parts of both ranks' files)
    out = {"w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(1)])}
    dcp.load(out, storage_reader=face.reader("sharded"))
    cols = COLS // dist.get_world_size()
    _eq(out["w"].to_local(), f["w"][:, rank * cols:(rank + 1) * cols], "rowwise to colwise")
    # TestDistributedReshardOnLoad.test_switch_between_sharded_tensor_to_tensor: the sharded value loaded
    # as a plain tensor on every rank, the plain one loaded sharded, and a replicated DTensor
    out = {"v": torch.zeros(N), "rep": distribute_tensor(torch.zeros(N), mesh, [Shard(0)]),
           "w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Replicate()])}
    dcp.load(out, storage_reader=face.reader("sharded"))
    _eq(out["v"], f["v"], "sharded to tensor")
    _eq(out["rep"].full_tensor(), f["rep"], "tensor to sharded")
    _eq(out["w"].to_local(), f["w"], "sharded to replicated")
    # test_fsspec.py TestFSSpec.test_overwrite at world size 2: a re-save into the same directory replaces
    # the first (DCP's writers default to overwrite=True)
    dcp.save(sharded(2, mesh), storage_writer=face.writer("sharded", **kw))
    f = full(2)
    out = {"w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(1)]), "meta": {"step": -1}}
    dcp.load(out, storage_reader=face.reader("sharded"))
    _eq(out["w"].full_tensor(), f["w"], "overwrite")
    assert out["meta"] == {"step": 2}, out["meta"]
    # test_load_with_different_shard_plan itself: every ordered pair of shard plans, each saved into the
    # SAME directory (every save after the first replaces the one before) and loaded with the other plan
    plans = {"rows": [Shard(0)], "cols": [Shard(1)], "replicated": [Replicate()]}
    for n, (a, b) in enumerate((a, b) for a in plans for b in plans if a != b):
        g = torch.Generator().manual_seed(100 + n)
        whole = torch.randn(ROWS, COLS, generator=g)
        dcp.save({"t": distribute_tensor(whole, mesh, plans[a]), "n": n}, storage_writer=face.writer("plans", **kw))
        out = {"t": distribute_tensor(torch.zeros(ROWS, COLS), mesh, plans[b]), "n": -1}
        dcp.load(out, storage_reader=face.reader("plans"))
        _eq(out["t"].full_tensor(), whole, f"saved {a}, loaded {b}")
        assert out["n"] == n, (a, b, out["n"])
    # dcp.async_save at world size 2 (thread mode), then loaded resharded
    fut = dcp.async_save(sharded(3, mesh), storage_writer=face.writer("async", **kw))
    fut.result()
    out = {"v": distribute_tensor(torch.zeros(N), mesh, [Replicate()]), "rep": torch.zeros(N)}
    dcp.load(out, storage_reader=face.reader("async"))
    _eq(out["v"].to_local(), full(3)["v"], "async")
    _eq(out["rep"], full(3)["rep"], "async rep")


def main() -> None:
    kind, root, local = sys.argv[1:4]
    device = sys.argv[4] if len(sys.argv) > 4 else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    kw = {} if kind == "zoned" else {"thread_count": 2}
    face = Face(kind, root, device)
    scenarios(face, mesh, rank, kw)
    dist.barrier()
    ref = Face("local", local, None)
    dcp.save(sharded(1, mesh), storage_writer=ref.writer("sharded", **kw))
    dcp.save(sharded(2, mesh), storage_writer=ref.writer("sharded", **kw))
    dist.barrier()
    if rank == 0:   # a file, not stdout: the ranks share torchrun's stdout and their writes can interleave
        out = os.environ["PEER_RANKS_OUT"]
        with open(out + ".tmp", "w") as f:
            json.dump({"face": face.listing("sharded"), "local": ref.listing("sharded")}, f)
        os.replace(out + ".tmp", out)
    print(f"RANK {rank} OK", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # torch 2.13's gloo threads left by async_save occasionally abort at interpreter exit (see
    # tests/workers/dcp_fsspec_ranks.py): every check has passed and been reported by now
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
