"""PyTorch DCP's two-rank storage scenarios (issue 28.4) at world size 2 (torchrun, gloo on CPU) on the
mount (``FileSystemWriter``, thread_count 2), on ``retainz://`` (DCP's ``FsspecWriter``, thread_count 2)
and through ``ZonedStorageWriter``, both ranks on one device (``retainz://`` and ZonedStorageWriter reach
it through a node service: ``retainz serve`` with ``RETAINZ_JOB``, and, for ``retainz://``, with nothing
started and no variable set, the first rank serving the device to the other; the mount is one server for
every process).

The worker (``tests/workers/dcp_peer_ranks.py``) runs, on each rank, the scenarios of pytorch/pytorch
``test/distributed/checkpoint/test_file_system_checkpoint.py``: ``test_read_write_shard_tensor`` (a
sharded state dict, uneven shards), ``test_load_rowwise_to_colwise`` and
``test_load_with_different_shard_plan`` (saved by rows, loaded by columns; then every ordered pair of
three plans, each saved into the same directory over the one before),
``test_switch_between_sharded_tensor_to_tensor``, and ``test_fsspec.py``'s ``test_overwrite`` at world
size 2, plus an ``async_save``; it reports the per-rank files of the checkpoint next to a local
directory's after the same saves.  This test then loads the two-rank checkpoint in one process, no
process group (a differently sharded model: world size 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
fsspec = pytest.importorskip("fsspec", reason="the mount extra (make setup-mount)")

import torch.distributed.checkpoint as dcp  # noqa: E402

from tests.mountcheck import ROOT, env, fsck_clean, make_device, mounted, require_fuse  # noqa: E402

pytestmark = [pytest.mark.dcp, pytest.mark.mount]

sys.path.insert(0, str(ROOT / "tests" / "workers"))
from dcp_peer_ranks import full  # noqa: E402


def _ranks(face: str, root: str, local, device: str | None = None, *, job: str | None = "ck") -> dict:
    """Run the worker on 2 ranks; its rank-0 JSON file (the checkpoint's files on the face and locally).
    Through a node service the ranks declare the job ``job`` (the series they write; ``None``: no
    ``RETAINZ_JOB`` at all)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests/workers/dcp_peer_ranks.py"), face, root, str(local)]
    out = os.path.join(os.path.dirname(local), "rank0.json")
    run_env = {k: v for k, v in env().items() if k != "RETAINZ_JOB"}
    run_env.update({"OMP_NUM_THREADS": "1", "PEER_RANKS_OUT": out}, **({"RETAINZ_JOB": job} if job else {}))
    r = subprocess.run(cmd + ([device] if device else []), capture_output=True, text=True, timeout=300,
                       env=run_env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert "RANK 0 OK" in r.stdout and "RANK 1 OK" in r.stdout
    with open(out) as f:
        return json.load(f)


def _load_whole(reader) -> dict:
    """The two-rank checkpoint loaded in this process without a process group, into whole tensors."""
    out = {k: torch.zeros_like(v) for k, v in full(2).items()}
    out["meta"] = {"step": -1}
    dcp.load(out, storage_reader=reader)
    return out


def _check_whole(out: dict) -> None:
    f = full(2)
    assert all(torch.equal(out[k], f[k]) for k in f) and out["meta"] == {"step": 2}


def _served(device: str, log):
    from tests.node.test_node import start_service

    return start_service(device, log)


PER_RANK = [".metadata", "__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp"]


def _generations(device: str) -> dict[str, list[str]]:
    """The device's generations and their shards' names, sorted."""
    from retainz.jobs import stores

    with stores.using(device) as store:
        return {g.id: sorted(g.shards) for g in store.generations()}


def _check_on_retainz(device: str, got: dict) -> None:
    """What the two ranks left on ``retainz://DEVICE/ck``: the per-rank files of a local directory
    (thread_count 2 each), one generation of the plans (each version retired the one before), and the
    sharded checkpoint loaded whole in this process."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    from retainz.integrations.fsspec_fs import RetainZFileSystem

    assert got["face"] == got["local"] == PER_RANK
    gens = _generations(device)
    assert sorted(gens) == ["ck%2Fasync", "ck%2Fplans#1", "ck%2Fsharded#1"]
    assert gens["ck%2Fasync"] == gens["ck%2Fsharded#1"] == PER_RANK
    try:
        _check_whole(_load_whole(FsspecReader(f"retainz://{device}/ck/sharded")))
    finally:
        RetainZFileSystem.close_all()


def test_two_ranks_on_the_mount(tmp_path):
    require_fuse()
    device = make_device(tmp_path, zones=32)
    with mounted(device, tmp_path / "mnt") as mnt:
        os.makedirs(mnt / "ck")
        (tmp_path / "local").mkdir()
        got = _ranks("mount", str(mnt / "ck"), tmp_path / "local")
        assert got["face"] == got["local"] == PER_RANK        # per-rank files, thread_count 2 each
        from torch.distributed.checkpoint import FileSystemReader

        _check_whole(_load_whole(FileSystemReader(str(mnt / "ck" / "sharded"))))
    from tests.mountcheck import generations

    gens = generations(device)
    # plans: saved 6 times, one generation left (each version retired the one before; ids alternate)
    assert sorted(gens) == ["ck%2Fasync", "ck%2Fplans#1", "ck%2Fsharded#1"]
    assert sorted(gens["ck%2Fsharded#1"].shards) == PER_RANK
    assert fsck_clean(device)


def test_two_ranks_on_retainz_with_nothing_started(tmp_path):
    """The same scenarios on ``retainz://DEVICE/ck`` with zero setup (issue 42.5): no ``retainz serve``,
    no ``RETAINZ_JOB``; the first rank to open the device serves it to the other (retainz.jobs.stores)."""
    device = make_device(tmp_path, zones=32)
    (tmp_path / "local").mkdir()
    fsspec.config.conf.pop("retainz", None)
    got = _ranks("retainz", f"retainz://{device}/ck", tmp_path / "local", device, job=None)
    _check_on_retainz(device, got)
    assert fsck_clean(device)


@pytest.mark.parametrize("face", ["retainz", "zoned"])
def test_two_ranks_through_the_node_service(tmp_path, face):
    from tests.node.test_node import stop_service

    device = make_device(tmp_path, zones=32)
    (tmp_path / "local").mkdir()
    fsspec.config.conf.pop("retainz", None)
    svc = _served(device, tmp_path / "service.log")
    try:
        root = f"retainz://{device}/ck" if face == "retainz" else "ck"
        got = _ranks(face, root, tmp_path / "local", device)
    finally:
        stop_service(svc)
    if face == "retainz":
        _check_on_retainz(device, got)
    else:
        # ZonedStorageWriter: one shard per rank (no thread_count), generations of the series ck
        gens = _generations(device)
        shards = [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert sorted(gens) == ["ck%2Fasync", "ck%2Fplans", "ck%2Fsharded"]    # its overwrite keeps the id
        assert gens["ck%2Fasync"] == gens["ck%2Fsharded"] == shards, gens
        from retainz.integrations.dcp import ZonedStorageReader

        # world size 1 reads both ranks' shards from the one device, the service stopped
        _check_whole(_load_whole(ZonedStorageReader(device, "ck/sharded", series="ck")))
    assert fsck_clean(device)
