"""dcp.save / dcp.load with 2 ranks (torchrun --standalone, gloo on CPU), one device file per rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")


pytestmark = pytest.mark.dcp
ROOT = Path(__file__).resolve().parents[2]


def test_two_ranks_sync_and_async_roundtrip(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(ROOT / "tests/workers/dcp_ranks.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "RANK 0 OK" in proc.stdout and "RANK 1 OK" in proc.stdout

    # the layout: DIR/rank{N}.img; rank 0 holds its data shard and the metadata, rank 1 its data shard
    from retainz.store import Store
    from retainz.zoned import FileDevice

    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.img", "rank1.img"]
    sizes, owners = {}, {}
    for rank in (0, 1):
        dev = FileDevice(tmp_path / f"rank{rank}.img")
        with Store.open(dev) as store:
            gens = {g.id: g for g in store.generations()}
            assert sorted(gens) == ["step-10", "step-20"]
            for gid, g in gens.items():
                expected = [f"__{rank}_0.distcp"] + ([".metadata"] if rank == 0 else [])
                assert list(g.shards) == expected, (rank, gid)
                assert g.step == int(gid.split("-")[1])
                assert g.hint.reclaim_step == g.step + 20
            sizes[rank] = gens["step-10"].shards[f"__{rank}_0.distcp"].size
            if rank == 0:
                import pickle

                md = pickle.loads(b"".join(store.read_shard("step-10", ".metadata")))
                owners = {idx.fqn: loc.rank for idx, loc in md.storage_data.items()}
        dev.close()
    # rank r's half of the sharded 64x16 fp32 tensor is 32*16*4 = 2048 bytes; DCP deduplicates the
    # replicated tensor (33 fp32) and the two byte items and gives them to one rank (here rank 1), so
    # loading them on rank 0 reads rank 1's device
    assert sizes[0] == 2048
    assert sizes[1] > 2048 + 33 * 4
    assert owners["replicated"] == 1 and owners["meta.step"] == 1


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_on_one_device_through_the_node_service(tmp_path, ranks):
    """Every rank saves to and loads from ONE device file served by `retainz serve`: one generation per
    checkpoint holding every rank's shard and the metadata, committed by the coordinator."""
    from retainz.store import Store
    from retainz.zoned import FileDevice, Geometry
    from tests.node.test_node import start_service, stop_service

    device = str(tmp_path / "node.img")
    dev = FileDevice.create(device, Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20))
    Store.format(dev).close()
    dev.close()
    svc = start_service(device, tmp_path / "service.log")
    try:
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
             str(ROOT / "tests/workers/dcp_ranks.py"), str(tmp_path / "ckpt"), device],
            capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        assert all(f"RANK {r} OK" in proc.stdout for r in range(ranks))
    finally:
        stop_service(svc)
    dev = FileDevice(device)
    with Store.open(dev) as store:
        gens = {g.id: g for g in store.generations()}
        assert sorted(gens) == ["step-10", "step-20"]
        for gid, g in gens.items():
            assert sorted(g.shards) == [".metadata", *(f"__{r}_0.distcp" for r in range(ranks))], gid
            assert g.hint.reclaim_step == g.step + 20
        assert gens["step-10"].shards["__0_0.distcp"].size == 64 // ranks * 16 * 4   # its rows of fp32
        assert store.fsck().ok
    dev.close()


def test_two_ranks_through_retainz_urls_on_one_device_through_the_node_service(tmp_path):
    """DCP's own FsspecWriter/FsspecReader (retainz://DEVICE/ckpt/step-N), both ranks on one served
    device: one generation per checkpoint directory with both ranks' files and the metadata."""
    from retainz.store import Store
    from retainz.zoned import FileDevice, Geometry
    from tests.node.test_node import start_service, stop_service

    device = str(tmp_path / "node.img")
    dev = FileDevice.create(device, Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20))
    Store.format(dev).close()
    dev.close()
    svc = start_service(device, tmp_path / "service.log")
    try:
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
             str(ROOT / "tests/workers/dcp_fsspec_ranks.py"), device],
            capture_output=True, text=True, timeout=300, env={**env, "RETAINZ_JOB": "ckpt"}, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        assert "RANK 0 OK" in proc.stdout and "RANK 1 OK" in proc.stdout
    finally:
        stop_service(svc)
    dev = FileDevice(device)
    with Store.open(dev) as store:
        gens = {g.id: g for g in store.generations()}
        assert sorted(gens) == ["ckpt%2Fstep-10", "ckpt%2Fstep-20"]
        for gid, g in gens.items():
            assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(g.shards), (gid, list(g.shards))
            assert g.hint.reclaim_step == g.step + 20
        assert store.fsck().ok
    dev.close()


def test_two_jobs_of_eight_ranks_on_one_device_each_with_its_own_retention(tmp_path):
    """World size 8, twice at once on ONE served device: job jobs/a through ZonedStorageWriter/Reader
    (HF Trainer, save_total_limit=1), job jobs/b through DCP's FsspecWriter on retainz:// (TorchTitan, keep the latest 2).  Each
    job's retention retires only its own checkpoints; every kept checkpoint holds its 8 ranks' shards."""
    from retainz.store import Store
    from retainz.zoned import FileDevice, Geometry
    from tests.node.test_node import start_service, stop_service

    device = str(tmp_path / "node.img")
    dev = FileDevice.create(device, Geometry(nr_zones=64, zone_size=1 << 20, zone_capacity=1 << 20))
    Store.format(dev).close()
    dev.close()
    svc = start_service(device, tmp_path / "service.log")
    base = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    jobs = {
        "jobs/a": ("dcp_ranks.py", [str(tmp_path / "a"), device], "hf:save_steps=10,save_total_limit=1", "20"),
        "jobs/b": ("dcp_fsspec_ranks.py", [device], "torchtitan:interval=10,keep_latest_k=2", "10,20"),
    }
    try:
        procs = {job: subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8",
             str(ROOT / "tests/workers" / worker), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**base, "RETAINZ_JOB": job, "DCP_SERIES": job, "DCP_RULE": rule, "DCP_LOAD": load,
                  "DCP_PREFIX": "checkpoint-" if rule.startswith("hf") else "step-"}, cwd=ROOT)
            for job, (worker, args, rule, load) in jobs.items()}
        for job, p in procs.items():
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, (job, out[-3000:] + err[-6000:])
            assert all(f"RANK {r} OK" in out for r in range(8)), job
    finally:
        stop_service(svc)
    dev = FileDevice(device)
    with Store.open(dev) as store:
        gens = {g.id: g for g in store.generations()}
        assert sorted(gens) == ["jobs%2Fa%2Fcheckpoint-20", "jobs%2Fb%2Fstep-10", "jobs%2Fb%2Fstep-20"]
        for gid, g in gens.items():
            assert {".metadata", *(f"__{r}_0.distcp" for r in range(8))} <= set(g.shards), (gid, list(g.shards))
        assert gens["jobs%2Fa%2Fcheckpoint-20"].shards["__0_0.distcp"].size == 64 // 8 * 16 * 4   # its 8 rows of fp32
        assert store.fsck().ok
    dev.close()
