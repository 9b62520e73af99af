"""retainz:// on a served device with no setup: the default job may write any folder a single-job node
would use, and a scope refusal is a permission error (EACCES), not EIO."""

from __future__ import annotations

import errno

import pytest

pytest.importorskip("fsspec", reason="needs fsspec (the tier extra)")

from retainz.errors import AccessDeniedError, ServiceGoneError  # noqa: E402
from retainz.integrations.fsspec_fs import RetainZFileSystem  # noqa: E402
from retainz.jobs import stores  # noqa: E402
from retainz.namespace import errno_of  # noqa: E402
from tests.node.test_node import make_device  # noqa: E402
from tests.node.test_node_access import SMALL, serving  # noqa: E402


@pytest.fixture
def device(tmp_path):
    return make_device(tmp_path, SMALL)


def test_a_scope_refusal_is_a_permission_error_with_eacces():
    e = AccessDeniedError("job 'jobs/b' may not write generation 'jobs%2Fa%2Fstep-1'")
    assert isinstance(e, PermissionError) and e.errno == errno.EACCES and errno_of(e) == errno.EACCES
    assert str(e) == "job 'jobs/b' may not write generation 'jobs%2Fa%2Fstep-1'"


def test_the_errors_ranks_hand_each_other_survive_pickling():
    """DCP gathers a failed rank's exception to the others pickled: it must come back whole."""
    import pickle

    for e in (AccessDeniedError("job 'a' may not"), ServiceGoneError("dev.img: the node service went away")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e) and back.errno == e.errno


def test_retainz_on_a_served_device_writes_any_folder_without_retainz_job(device, monkeypatch):
    monkeypatch.delenv("RETAINZ_JOB", raising=False)
    svc, stop = serving(device)
    fs = RetainZFileSystem(skip_instance_cache=True)
    try:
        for folder in ("ckpt", "runs/a"):            # folders a single-job node would use
            with fs.open(f"{device}/{folder}/step-2/.metadata", "wb") as f:
                f.write(b"m" * 100)
        assert sorted(g.id for g in svc.store.generations()) == ["ckpt%2Fstep-2", "runs%2Fa%2Fstep-2"]
    finally:
        fs.close_devices()
        stop()
    assert stores.open_count() == 0


def test_a_declared_job_is_kept_to_its_series_with_eacces(device, monkeypatch):
    monkeypatch.setenv("RETAINZ_JOB", "jobs/b")
    svc, stop = serving(device)
    fs = RetainZFileSystem(skip_instance_cache=True)
    try:
        with pytest.raises(PermissionError) as e:
            with fs.open(f"{device}/jobs/a/step-1/.metadata", "wb") as f:
                f.write(b"m" * 100)
        assert e.value.errno == errno.EACCES, e.value
        assert svc.store.generations() == []
    finally:
        fs.close_devices()
        stop()


def _torchrun(worker: str, *args: str, ranks: int = 2, env: dict | None = None):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run_env = {k: v for k, v in os.environ.items() if k != "RETAINZ_JOB"}
    run_env.update(PYTHONPATH=f"{root}{os.pathsep}{root / 'src'}", OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                           str(root / "tests/workers" / worker), *args],
                          capture_output=True, text=True, timeout=300, env=run_env, cwd=root)


def _generations(device: str) -> dict:
    from retainz.store import Store
    from retainz.zoned import FileDevice

    with FileDevice(device) as dev, Store.open(dev) as store:
        assert store.fsck().ok
        return {g.id: sorted(g.shards) for g in store.generations()}


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_save_to_one_device_file_with_nothing_started(device, ranks):
    """ZonedStorageWriter on one device file from N ranks, no `retainz serve`, no RETAINZ_JOB: the first
    rank to open the device serves it to the others, and each checkpoint is one generation."""
    pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    proc = _torchrun("dcp_ranks.py", "/ckpt", device, ranks=ranks)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert all(f"RANK {r} OK" in proc.stdout for r in range(ranks))
    want = [".metadata", *(f"__{r}_0.distcp" for r in range(ranks))]
    assert _generations(device) == {"step-10": want, "step-20": want}


def test_retainz_urls_from_two_ranks_with_nothing_started_and_no_job(device):
    """DCP's own FsspecWriter on retainz://DEVICE/ckpt/step-N from two ranks, nothing started, no
    RETAINZ_JOB: one generation per checkpoint directory with both ranks' files."""
    pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    proc = _torchrun("dcp_fsspec_ranks.py", device)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    gens = _generations(device)
    assert sorted(gens) == ["ckpt%2Fstep-10", "ckpt%2Fstep-20"]
    assert all({"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(s) for s in gens.values()), gens


def test_ranks_started_by_multiprocessing_spawn_share_the_device_with_nothing_started(device, tmp_path):
    """torch.multiprocessing.spawn, no torchrun variables, nothing started: the process group says the
    ranks (retainz.jobs.ranks), and the two ranks' files are one checkpoint."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("RETAINZ_JOB", "WORLD_SIZE", "RANK")}
    env.update(PYTHONPATH=f"{root}{os.pathsep}{root / 'src'}", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(root / "tests/workers/dcp_spawn_ranks.py"), device,
                           str(tmp_path / "rendezvous")], capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "RANK 0 OK" in proc.stdout and "RANK 1 OK" in proc.stdout
    gens = _generations(device)
    assert sorted(gens) == ["ckpt%2Fstep-2"] and {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(gens["ckpt%2Fstep-2"])


def test_ranks_spawned_by_a_process_that_used_the_device_itself_share_it(device, tmp_path):
    """A process of one rank writes through ``retainz://DEV`` (a file, a one-rank ``dcp.save``), keeps its
    filesystem cached (no ``close_all``: it holds the device), then ``torch.multiprocessing.spawn``\\ s two
    ranks (gloo, ``MASTER_ADDR``/``MASTER_PORT`` set here, as torch's own test harness runs its
    single-process tests and then its two-rank tests in one parent) that ``dcp.save`` to
    ``retainz://DEV/ckpt/step-2``; the parent then loads their checkpoint and ``retainz ls`` lists the device
    while the parent still holds it.  Before, the ranks found the device held and not served and timed out
    (``device busy``)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
    root = Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RETAINZ_JOB", "WORLD_SIZE", "RANK")}
    # a device left busy fails within 20 s rather than the default wait of 120 s
    env.update(PYTHONPATH=f"{root}{os.pathsep}{root / 'src'}", OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), FSSPEC_RETAINZ_WAIT="20")
    proc = subprocess.run([sys.executable, str(root / "tests/workers/dcp_spawn_ranks.py"), device, "env",
                           "--parent-first"], capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "RANK 0 OK" in proc.stdout and "RANK 1 OK" in proc.stdout and "PARENT OK" in proc.stdout, proc.stdout
    listed = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("LS "))
    for gen in ("@notes%2Freadme.txt", "solo%2Fstep-1", "ckpt%2Fstep-2"):
        assert gen in listed, listed
    gens = _generations(device)
    assert sorted(gens) == ["@notes%2Freadme.txt", "ckpt%2Fstep-2", "solo%2Fstep-1"], gens
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(gens["ckpt%2Fstep-2"])
    assert gens["@notes%2Freadme.txt"] == ["readme.txt"] or len(gens["@notes%2Freadme.txt"]) == 1, gens
    assert not os.path.exists(device + ".sock")      # the parent closed its service at exit
